import os

# Tests never reach the Hub: fail fast instead of retrying for ~47 s per file.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import datasets  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

datasets.disable_caching()
torch.set_num_threads(2)

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


@pytest.fixture
def fixtures_dir():
    return FIXTURES
