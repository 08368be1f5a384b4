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


@pytest.fixture(autouse=True)
def restore_transformers_verbosity():
    # realm-hf's loggers follow transformers' verbosity; a script run in-process (the bench smoke tests call their
    # main(), which turns transformers' logging down to errors) must not silence the warnings later tests check.
    import logging

    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    # A level set by hand on realm_hf's logger (the FOLDOC demo's main sets INFO) outranks transformers' verbosity.
    realm_level = logging.getLogger("realm_hf").level
    yield
    logging.getLogger("realm_hf").setLevel(realm_level)
    hf_logging.set_verbosity(verbosity)
    if bars:
        hf_logging.enable_progress_bar()
    else:
        hf_logging.disable_progress_bar()
