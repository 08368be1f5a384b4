"""`realm-hf push`: a model and its corpus repo uploaded through a local Hub; offline is a clear error."""

import json
import os

from realm_hf import RealmForOpenQA
from tests.support.cli import QUESTIONS, run


def _repo_files(hub, repo_type, repo_id):
    repo = hub.repos[(repo_type, repo_id)]
    return repo["commits"][repo["branches"]["main"]]


def test_push_model_and_corpus_repo_through_a_local_hub(converted, legacy_model, local_hub):
    assert run("push", converted, "--repo-id", "realm-test/cli", "--corpus-repo-id", "realm-test/cli-corpus") == 0
    model_files = _repo_files(local_hub, "model", "realm-test/cli")
    corpus_files = _repo_files(local_hub, "dataset", "realm-test/cli-corpus")
    assert {"config.json", "model.safetensors", "README.md"} <= set(model_files)
    assert not any(name.startswith("retriever/") for name in model_files)  # the corpus lives in the dataset repo
    assert {"retriever_manifest.json", "index.faiss"} <= set(corpus_files)
    config = json.loads(model_files["config.json"])
    assert config["retriever_repo_id"] == "realm-test/cli-corpus" and config["retriever_revision"]
    # The pushed model loads from the Hub (following the corpus reference) and answers as the legacy model does.
    model = RealmForOpenQA.from_pretrained("realm-test/cli").eval()
    assert [r["answer"] for r in model.answer(QUESTIONS)] == [r["answer"] for r in legacy_model.answer(QUESTIONS)]


def test_push_offline_is_a_clear_error(converted, capsys):
    assert os.environ.get("HF_HUB_OFFLINE") == "1"  # set by conftest: no Hub in tests
    assert run("push", converted, "--repo-id", "me/realm-test", "--corpus-repo-id", "me/corpus") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: Cannot push") and "HF_HUB_OFFLINE" in err
