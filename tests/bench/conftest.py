import pytest


@pytest.fixture(autouse=True)
def restore_threads():
    # The scripts run with --threads 1 here (two threads on a busy 2-core machine are many times slower than one);
    # torch's thread count is process-wide, so put it back for the tests that follow.
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
