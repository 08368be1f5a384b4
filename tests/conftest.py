import os

# Tests never reach the Hub: fail fast instead of retrying for ~47 s per file.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import datasets  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

datasets.disable_caching()
torch.set_num_threads(2)

from tests.support.hub_server import TOKEN, LocalHub, point_clients_at  # noqa: E402
from tests.support.paths import FIXTURES, LEGACY_OPENQA  # noqa: E402
from tests.support.tiny_bert import save_tiny_bert  # noqa: E402
from tests.support.tiny_model import build_tiny_model, save_tiny_model  # noqa: E402


@pytest.fixture
def fixtures_dir():
    return FIXTURES


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """`(model, tokenizer, saved directory)` of the tiny open-QA model (support/tiny_model.py), one per module."""
    tmp = tmp_path_factory.mktemp("tiny")
    model, tokenizer = build_tiny_model(str(tmp))
    return model, tokenizer, save_tiny_model(model, tokenizer, tmp / "model")


@pytest.fixture(scope="module")
def legacy_vocab_bert(tmp_path_factory):
    """A BertForPreTraining directory (hidden 32, 2 layers) with the legacy fixture's vocabulary, one per module."""
    from realm_hf import RealmTokenizer

    tokenizer = RealmTokenizer.from_pretrained(LEGACY_OPENQA)
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert"), tokenizer)


@pytest.fixture
def local_hub(tmp_path, monkeypatch):
    """Point huggingface_hub (and so transformers) at a LocalHub, online, with a fresh cache; offline again after."""
    with LocalHub() as hub:
        point_clients_at(monkeypatch, hub.url, str(tmp_path / "hf-cache"))
        monkeypatch.setenv("HF_TOKEN", TOKEN)  # never leaves 127.0.0.1
        hub.cache = str(tmp_path / "hf-cache")
        yield hub
        assert not hub.unauthorized, "every write call carries the token"
        # The token stays on the Hub: uploads to and downloads from storage carry no Authorization header.
        assert not [entry for entry in hub.storage_log if entry[2]]


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
