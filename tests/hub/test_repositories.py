"""
One-repo save/load, the Hub (over HTTP, on localhost), the cache and offline mode, corpus references, publishing.

No test reaches the network. `HF_HUB_OFFLINE=1` (conftest.py) holds everywhere except inside the `local_hub` fixture.

- Local directories: `save_pretrained` -> `from_pretrained` answers identically (answers, scores, block ids), through
  `RealmForOpenQA.answer` and the pipeline.
- The Hub over HTTP: no Hub-compatible server with an upload API installs from PyPI here (`hf-local-hub` 3.0.0 is a
  thin client whose server is a Go binary the wheel does not ship; `olah` is a read-only mirror, see
  tests/hub/test_olah_mirror.py), so `LocalHub` (tests/support/hub_server.py) implements, in-process on 127.0.0.1, the
  part of the Hub API that huggingface_hub calls: repo and branch creation, preupload answering `lfs` or `regular` as
  the Hub does, the Git LFS batch API with its storage PUT and verify call, commits with inline and LFS files, repo
  info, tree listing, card YAML validation, `resolve` downloads (LFS files as a redirect to storage) and the Bearer
  token on every write call. Through it, with the real huggingface_hub and transformers clients: `push_to_hub` (model +
  tokenizer + Parquet corpus + FAISS index + manifest + card) uploads the weights, index and corpus through LFS ->
  `from_pretrained(repo_id)` and `realm_hf.pipeline(repo_id)` answer identically; only `retriever/*` is fetched for the
  retriever, pinned to one commit; the cache huggingface_hub filled then serves the model offline; a wrong token is
  refused; a hand-edited README on the Hub keeps its text and metadata across pushes; pushes to a branch load with
  `revision=`; a model repo referencing a corpus dataset repo (`push_corpus_to_hub` + `set_retriever_reference`) loads
  it; a repo without a retriever loads without one, online (404) and offline (the cached "does not exist" marker). Not
  covered by it: Xet uploads (huggingface_hub takes them whenever `hf_xet` is installed; the tests set
  `HF_HUB_DISABLE_XET`, which makes the client take the LFS path), multipart LFS, rate limits, and anything the real
  server does differently from this subset.
- The cache laid out by hand (`<cache>/models--org--name/snapshots/<commit>/` + `refs/main`) for offline loading
  by repo id and revision, and the clear error when the retriever is not in the cache.
- Publishing details with `HfApi` replaced by recorders: what exactly is uploaded (and deleted), branches, dataset
  repos and subfolders, and why `RealmForOpenQA` needs its own `push_to_hub` (transformers 5's `PushToHubMixin`
  uploads folders one level deep, so the retriever's `corpus/` and `tokenizer/` sub-folders make it fail).
"""

import hashlib
import json
import os
import shutil
from urllib.parse import unquote

import pytest
import torch
from huggingface_hub import constants
from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError

import realm_hf
from realm_hf import RealmForOpenQA
from realm_hf.hub.cards import parse_card_metadata
from realm_hf.hub.repositories import push_corpus_to_hub, push_to_hub, set_retriever_reference
from realm_hf.models.retriever_loading import download_retriever, load_referenced_retriever, load_retriever_from_hub
from realm_hf.retrieval.retriever import RealmRetriever
from tests.support.hub_server import LfsFile
from tests.support.tiny_model import (
    DOCS,
    QUESTIONS,
    answers_of,
    assert_same_answers,
    assert_same_model_answers,
    build_tiny_model,
    save_tiny_model,
)

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(autouse=True)
def _offline():
    # Guard: everything here must come from the cache.
    assert constants.HF_HUB_OFFLINE, "tests/conftest.py must set HF_HUB_OFFLINE=1 before huggingface_hub is imported"


def populate_cache(folder, repo_id, cache_dir, repo_type="model", commit=COMMIT, ignore=None, branch="main"):
    """Lay out `folder` as the cached snapshot of `repo_id` at `commit`, with `branch` pointing to it."""
    repo_dir = os.path.join(cache_dir, f"{repo_type}s--" + repo_id.replace("/", "--"))
    snapshot = os.path.join(repo_dir, "snapshots", commit)
    shutil.copytree(folder, snapshot, ignore=ignore, dirs_exist_ok=True)
    os.makedirs(os.path.join(repo_dir, "refs"), exist_ok=True)
    with open(os.path.join(repo_dir, "refs", branch), "w") as f:
        f.write(commit)
    return snapshot


# ------------------------------------------------------------------------------------------------------------------
# Local round trip
# ------------------------------------------------------------------------------------------------------------------


def test_save_from_pretrained_round_trip_answers_identically(tiny):
    model, _, path = tiny
    assert sorted(os.listdir(os.path.join(path, "retriever"))) == [
        "corpus",
        "index.faiss",
        "retriever_manifest.json",
        "tokenizer",
    ]
    reloaded = RealmForOpenQA.from_pretrained(path)
    assert reloaded.retriever is not None and len(reloaded.retriever) == len(DOCS)
    assert_same_model_answers(answers_of(reloaded), answers_of(model))
    original = realm_hf.pipeline("question-answering", model=model)
    pipe = realm_hf.pipeline("question-answering", model=path)
    for question in QUESTIONS:
        assert_same_answers(pipe(question, top_k=3), original(question, top_k=3))


# ------------------------------------------------------------------------------------------------------------------
# Hub ids through the cache, offline
# ------------------------------------------------------------------------------------------------------------------


def test_from_pretrained_repo_id_offline_from_cache(tiny, tmp_path):
    model, _, path = tiny
    cache = str(tmp_path / "cache")
    populate_cache(path, "realm-test/tiny", cache)
    for revision in (None, "main", COMMIT):
        reloaded = RealmForOpenQA.from_pretrained("realm-test/tiny", cache_dir=cache, revision=revision)
        assert reloaded.retriever is not None
        assert_same_model_answers(answers_of(reloaded), answers_of(model))


def test_pretraining_from_pretrained_repo_id_loads_its_corpus_as_open_qa_does(tiny, tmp_path):
    """RealmForPreTraining.from_pretrained(repo_id) fetched the weights but left the corpus behind."""
    from realm_hf import RealmForPreTraining

    model, tokenizer, _ = tiny
    pretraining = RealmForPreTraining(model.config, retriever=model.retriever)
    local = tmp_path / "pretraining"
    pretraining.save_pretrained(local, tokenizer=tokenizer)
    cache = str(tmp_path / "cache")
    populate_cache(local, "realm-test/tiny-pretraining", cache)
    for revision in (None, COMMIT):
        reloaded = RealmForPreTraining.from_pretrained(
            "realm-test/tiny-pretraining", cache_dir=cache, revision=revision
        )
        assert reloaded.retriever is not None and len(reloaded.retriever) == len(DOCS)
        assert reloaded.retriever.embedding_dim == model.retriever.embedding_dim
        torch.testing.assert_close(
            reloaded.retriever.store.embeddings(torch.arange(len(DOCS)).view(1, -1)),
            model.retriever.store.embeddings(torch.arange(len(DOCS)).view(1, -1)),
        )
    # Weights alone, as for Open-QA: nothing is fetched for the corpus.
    weights_only = RealmForPreTraining.from_pretrained(
        "realm-test/tiny-pretraining", cache_dir=cache, load_retriever=False
    )
    assert weights_only.retriever is None


def test_pipeline_repo_id_offline_from_cache(tiny, tmp_path):
    model, _, path = tiny
    cache = str(tmp_path / "cache")
    populate_cache(path, "realm-test/tiny", cache)
    pipe = realm_hf.pipeline("question-answering", model="realm-test/tiny", model_kwargs={"cache_dir": cache})
    original = realm_hf.pipeline("question-answering", model=model)
    for question in QUESTIONS:
        assert_same_answers(pipe(question, top_k=2), original(question, top_k=2))


def test_offline_without_cached_retriever_is_a_clear_error(tiny, tmp_path):
    cache = str(tmp_path / "cache")
    populate_cache(tiny[2], "realm-test/tiny", cache, ignore=shutil.ignore_patterns("retriever"))
    with pytest.raises(OSError, match="not in the local cache"):
        RealmForOpenQA.from_pretrained("realm-test/tiny", cache_dir=cache)
    # A repo that is not cached at all fails in transformers, before the retriever.
    with pytest.raises(OSError):
        RealmForOpenQA.from_pretrained("realm-test/absent", cache_dir=cache)


def _mark_missing(cache, repo_id, filename, repo_type="model", commit=COMMIT):
    # What huggingface_hub leaves in the cache after a 404 while online.
    marker = os.path.join(cache, f"{repo_type}s--" + repo_id.replace("/", "--"), ".no_exist", commit, filename)
    os.makedirs(os.path.dirname(marker), exist_ok=True)
    open(marker, "w").close()


def test_cached_absence_means_no_retriever(tiny, tmp_path):
    cache = str(tmp_path / "cache")
    populate_cache(tiny[2], "realm-test/bare", cache, ignore=shutil.ignore_patterns("retriever"))
    _mark_missing(cache, "realm-test/bare", "retriever/retriever_manifest.json")
    model = RealmForOpenQA.from_pretrained("realm-test/bare", cache_dir=cache)
    assert model.retriever is None
    assert download_retriever("realm-test/bare", cache_dir=cache) is None


def test_reference_to_a_dataset_repo_is_followed(tiny, tmp_path):
    model, _, path = tiny
    cache = str(tmp_path / "cache")
    # The model repo without its retriever, pointing at a dataset repo that holds it at the root.
    bare = tmp_path / "bare"
    shutil.copytree(path, bare, ignore=shutil.ignore_patterns("retriever"))
    config = json.loads((bare / "config.json").read_text())
    config.update(retriever_repo_id="realm-test/corpus", retriever_revision=COMMIT, retriever_repo_type="dataset")
    (bare / "config.json").write_text(json.dumps(config))
    populate_cache(str(bare), "realm-test/model-only", cache)
    _mark_missing(cache, "realm-test/model-only", "retriever/retriever_manifest.json")
    populate_cache(os.path.join(path, "retriever"), "realm-test/corpus", cache, repo_type="dataset")
    reloaded = RealmForOpenQA.from_pretrained("realm-test/model-only", cache_dir=cache)
    assert reloaded.retriever is not None
    assert_same_model_answers(answers_of(reloaded), answers_of(model))
    # A reference to a repo that does not hold a retriever is an error, not a silent `None`.
    reloaded.config.retriever_repo_id = "realm-test/model-only"
    reloaded.config.retriever_repo_type = "model"
    reloaded.config.retriever_revision = None
    _mark_missing(cache, "realm-test/model-only", "retriever_manifest.json")
    with pytest.raises(OSError, match="holds no"):
        load_referenced_retriever(reloaded, cache_dir=cache)


def test_a_downloaded_repo_cannot_reference_a_local_directory(tiny, tmp_path):
    """A Hub repo whose config names a directory of this machine as its retriever is refused."""
    _, _, path = tiny
    cache = str(tmp_path / "cache")
    bare = tmp_path / "bare"
    shutil.copytree(path, bare, ignore=shutil.ignore_patterns("retriever"))
    config = json.loads((bare / "config.json").read_text())
    config.update(retriever_repo_id=os.path.join(path, "retriever"))  # an existing retriever elsewhere on disk
    (bare / "config.json").write_text(json.dumps(config))
    populate_cache(str(bare), "realm-test/local-reference", cache)
    _mark_missing(cache, "realm-test/local-reference", "retriever/retriever_manifest.json")
    with pytest.raises(ValueError, match="may not make realm-hf read outside it"):
        RealmForOpenQA.from_pretrained("realm-test/local-reference", cache_dir=cache)


def test_reference_fields_round_trip_and_local_directory(tiny, tmp_path):
    model, tokenizer, path = tiny
    copy, _ = build_tiny_model(str(tmp_path))
    copy.load_state_dict(model.state_dict())
    set_retriever_reference(copy.config, os.path.join(path, "retriever"), revision=None, repo_type="dataset")
    save_tiny_model(copy, tokenizer, tmp_path / "ref")
    config = json.loads((tmp_path / "ref" / "config.json").read_text())
    assert config["retriever_repo_id"] == os.path.join(path, "retriever")
    assert config["retriever_repo_type"] == "dataset"
    reloaded = RealmForOpenQA.from_pretrained(str(tmp_path / "ref"), retriever=None)
    retriever = load_referenced_retriever(reloaded)
    assert len(retriever) == len(DOCS)
    reloaded.set_retriever(retriever)
    assert_same_model_answers(answers_of(reloaded), answers_of(model))
    set_retriever_reference(copy.config, None)
    assert load_referenced_retriever(copy) is None
    assert not hasattr(copy.config, "retriever_repo_id")


def test_load_retriever_from_hub_signature_matches_modeling_call(tiny, tmp_path):
    # retriever_loading.load_checkpoint_retriever calls load_retriever_from_hub(model, path, revision=, ...).
    cache = str(tmp_path / "cache")
    populate_cache(tiny[2], "realm-test/tiny", cache)
    retriever = load_retriever_from_hub(tiny[0], "realm-test/tiny", revision="main", cache_dir=cache, token=None)
    assert len(retriever) == len(DOCS)


# ------------------------------------------------------------------------------------------------------------------
# A Hub-compatible server on localhost
# ------------------------------------------------------------------------------------------------------------------


def test_push_and_load_through_a_local_hub(tiny, local_hub, monkeypatch):
    model = tiny[0]
    push_to_hub(model, "realm-test/tiny", model_card_kwargs={"eval_results": {"exact_match": 12.5}})
    files = sorted(
        local_hub.repos[("model", "realm-test/tiny")]["commits"][
            local_hub.repos[("model", "realm-test/tiny")]["branches"]["main"]
        ]
    )
    assert {
        "config.json",
        "model.safetensors",
        "README.md",
        "retriever/retriever_manifest.json",
        "retriever/index.faiss",
    } <= set(files)
    assert any(f.startswith("retriever/corpus/") and f.endswith(".parquet") for f in files)
    # The weights, the index and the corpus went through Git LFS (batch, storage PUT, verify), as on the Hub; the
    # config and manifest (text) inline.
    stored = local_hub.files("realm-test/tiny")
    lfs = {path for path, value in stored.items() if isinstance(value, LfsFile)}
    assert {"model.safetensors", "retriever/index.faiss"} <= lfs
    assert all(path.endswith(".parquet") for path in lfs - {"model.safetensors", "retriever/index.faiss"})
    assert not {"config.json", "retriever/retriever_manifest.json", "README.md"} & lfs
    uploaded = {oid for oid, _ in local_hub.lfs_uploads}
    assert {stored[p].oid for p in lfs} <= uploaded
    assert (
        stored["model.safetensors"].oid == hashlib.sha256(local_hub.content(stored["model.safetensors"])).hexdigest()
    )
    assert any(method == "POST" and path.endswith(".git/info/lfs/objects/batch") for method, path in local_hub.log)

    reloaded = RealmForOpenQA.from_pretrained("realm-test/tiny")
    assert_same_model_answers(answers_of(reloaded), answers_of(model))
    pipe = realm_hf.pipeline("question-answering", model="realm-test/tiny")
    original = realm_hf.pipeline("question-answering", model=model)
    assert_same_answers(pipe(QUESTIONS[0], top_k=3), original(QUESTIONS[0], top_k=3))
    # Only the retriever folder was fetched for the retriever (allow_patterns), pinned to one commit.
    resolved = [unquote(path) for method, path in local_hub.log if method in ("GET", "HEAD") and "/resolve/" in path]
    commit = local_hub.repos[("model", "realm-test/tiny")]["branches"]["main"]
    assert any(f"/resolve/{commit}/retriever/index.faiss" in path for path in resolved)
    # LFS content came from storage (the resolve call redirects there).
    fetched = {path for method, path, _ in local_hub.storage_log if method == "GET"}
    assert f"/objects/{stored['retriever/index.faiss'].oid}" in fetched
    assert f"/objects/{stored['model.safetensors'].oid}" in fetched

    # The cache huggingface_hub filled (blobs + symlinks) then serves the same model offline.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    offline = RealmForOpenQA.from_pretrained("realm-test/tiny")
    assert_same_model_answers(answers_of(offline), answers_of(model))


def test_write_calls_need_the_token(tiny, local_hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_wrong_token")
    with pytest.raises(HfHubHTTPError) as err:
        push_to_hub(tiny[0], "realm-test/denied", save_retriever=False)
    assert err.value.response.status_code == 401
    assert local_hub.unauthorized and not local_hub.repos and not local_hub.objects
    local_hub.unauthorized.clear()


def test_hand_written_readme_on_the_hub_survives_a_push(tiny, local_hub):
    from huggingface_hub import HfApi

    push_to_hub(tiny[0], "realm-test/card", save_retriever=False, model_card_kwargs={"license": "apache-2.0"})
    readme = HfApi().hf_hub_download("realm-test/card", "README.md")
    text = open(readme).read().replace("license: apache-2.0", "license: mit") + "\n## Notes\n\nWritten on the Hub.\n"
    HfApi().upload_file(path_or_fileobj=text.encode(), path_in_repo="README.md", repo_id="realm-test/card")
    card_kwargs = {"eval_results": {"f1": 55.0}, "eval_dataset": {"name": "FOLDOC links", "type": "foldoc-links"}}
    push_to_hub(tiny[0], "realm-test/card", save_retriever=False, model_card_kwargs=card_kwargs)
    card = open(HfApi().hf_hub_download("realm-test/card", "README.md")).read()
    assert "Written on the Hub." in card and card.count("## Notes") == 1
    metadata = parse_card_metadata(card)
    assert metadata["license"] == "mit"
    assert metadata["model-index"][0]["results"][0]["metrics"][0] == {"type": "f1", "value": 55.0, "name": "F1"}


def test_branches_references_and_absent_retrievers_through_a_local_hub(tiny, local_hub, monkeypatch):
    model, _, path = tiny
    # A corpus in a dataset repo; a model repo without a retriever that references it, on a branch.
    push_corpus_to_hub(model.retriever, "realm-test/corpus")
    corpus_commit = local_hub.repos[("dataset", "realm-test/corpus")]["branches"]["main"]
    referencing = RealmForOpenQA.from_pretrained(path, retriever=None)
    set_retriever_reference(referencing.config, "realm-test/corpus", revision=corpus_commit)
    push_to_hub(referencing, "realm-test/model-only", save_retriever=False, revision="v1")
    main = local_hub.repos[("model", "realm-test/model-only")]["branches"]["main"]
    assert "config.json" not in local_hub.repos[("model", "realm-test/model-only")]["commits"][main]
    reloaded = RealmForOpenQA.from_pretrained("realm-test/model-only", revision="v1")
    assert reloaded.config.retriever_repo_id == "realm-test/corpus"
    assert_same_model_answers(answers_of(reloaded), answers_of(model))

    # A model repo with neither a retriever nor a reference loads without one (the 404 is an answer, not an error)...
    bare = RealmForOpenQA.from_pretrained(path, retriever=None)
    bare.set_retriever(None)
    push_to_hub(bare, "realm-test/bare")
    assert RealmForOpenQA.from_pretrained("realm-test/bare").retriever is None
    # ... and offline too: huggingface_hub cached that the manifest does not exist.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert RealmForOpenQA.from_pretrained("realm-test/bare").retriever is None
    assert RealmForOpenQA.from_pretrained("realm-test/model-only", revision="v1").retriever is not None


# ------------------------------------------------------------------------------------------------------------------
# Publishing (HfApi replaced by recorders)
# ------------------------------------------------------------------------------------------------------------------


class RecordingHub:
    """Stands in for the HfApi calls publishing makes; keeps a copy of every uploaded folder."""

    def __init__(self, tmp_path, readme=None):
        self.tmp_path = tmp_path
        self.readme = readme
        self.uploads = []
        self.commits = []
        self.calls = []

    def install(self, monkeypatch):
        from huggingface_hub import HfApi, RepoUrl

        hub = self

        def create_repo(self, repo_id, **kwargs):
            hub.calls.append(("create_repo", repo_id, kwargs))
            prefix = "datasets/" if kwargs.get("repo_type") == "dataset" else ""
            return RepoUrl(f"https://huggingface.co/{prefix}{repo_id}")

        def create_branch(self, repo_id, **kwargs):
            hub.calls.append(("create_branch", repo_id, kwargs))

        def hf_hub_download(self, repo_id, filename, **kwargs):
            if filename != "README.md" or hub.readme is None:
                raise EntryNotFoundError(f"{filename} not in {repo_id}")
            readme = hub.tmp_path / "remote-README.md"
            readme.write_text(hub.readme)
            return str(readme)

        def upload_folder(self, *, repo_id, folder_path, **kwargs):
            copy = hub.tmp_path / f"upload-{len(hub.uploads)}"
            shutil.copytree(folder_path, copy)
            hub.uploads.append({"repo_id": repo_id, "folder": copy, **kwargs})
            return "commit-info"

        def create_commit(self, repo_id, operations, **kwargs):
            hub.commits.append({"repo_id": repo_id, "paths": [op.path_in_repo for op in operations], **kwargs})
            return "commit-info"

        for name, fn in [
            ("create_repo", create_repo),
            ("create_branch", create_branch),
            ("hf_hub_download", hf_hub_download),
            ("upload_folder", upload_folder),
            ("create_commit", create_commit),
        ]:
            monkeypatch.setattr(HfApi, name, fn)


def _files(folder):
    return sorted(
        os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/")
        for root, _, names in os.walk(folder)
        for name in names
    )


def test_push_to_hub_uploads_one_repo_that_loads_back(tiny, tmp_path, monkeypatch):
    model = tiny[0]
    readme = "---\nlicense: mit\n---\n\n# My REALM\n\nHand-written notes that must survive.\n"
    hub = RecordingHub(tmp_path, readme=readme)
    hub.install(monkeypatch)
    card_kwargs = {"eval_results": {"exact_match": 50.0}, "datasets": ["foldoc-links"]}
    assert push_to_hub(model, "realm-test/pushed", model_card_kwargs=card_kwargs) == "commit-info"
    (upload,) = hub.uploads
    files = _files(upload["folder"])
    for expected in [
        "config.json",
        "model.safetensors",
        "README.md",
        "tokenizer_config.json",
        "retriever/retriever_manifest.json",
        "retriever/index.faiss",
        "retriever/tokenizer/tokenizer_config.json",
    ]:
        assert expected in files
    assert any(f.startswith("retriever/corpus/") and f.endswith(".parquet") for f in files)
    assert upload["delete_patterns"] == ["retriever/*"]
    manifest = json.loads((upload["folder"] / "retriever" / "retriever_manifest.json").read_text())
    assert manifest["corpus_format"] == "parquet"
    card = (upload["folder"] / "README.md").read_text()
    assert "Hand-written notes that must survive." in card
    metadata = parse_card_metadata(card)
    assert metadata["license"] == "mit"  # the repo's own metadata wins
    assert metadata["library_name"] == "realm-hf"
    assert metadata["model-index"][0]["results"][0]["metrics"][0]["value"] == 50.0
    assert 'model="realm-test/pushed"' in card
    # Pull it back: the uploaded folder as the cached snapshot of the repo.
    cache = str(tmp_path / "cache")
    populate_cache(str(upload["folder"]), "realm-test/pushed", cache)
    reloaded = RealmForOpenQA.from_pretrained("realm-test/pushed", cache_dir=cache)
    assert_same_model_answers(answers_of(reloaded), answers_of(model))


def test_weights_pushed_beside_another_saves_index_are_refused_at_load(tiny, tmp_path, monkeypatch):
    """push_to_hub records the weights' sha256 with the index; a repo whose weights changed alone does not load."""
    model, _, _ = tiny
    hub = RecordingHub(tmp_path)
    hub.install(monkeypatch)
    push_to_hub(model, "realm-test/bound")
    (upload,) = hub.uploads
    folder = upload["folder"]
    manifest = json.loads((folder / "retriever" / "retriever_manifest.json").read_text())
    weights = (folder / "model.safetensors").read_bytes()
    assert manifest["model_files"] == {
        "model.safetensors": {"size": len(weights), "sha256": hashlib.sha256(weights).hexdigest()}
    }

    # Other weights of the same shapes (same size on disk) uploaded over the old ones, the old index kept.
    other = RealmForOpenQA(model.config)
    other.load_state_dict(model.state_dict())
    with torch.no_grad():
        other.embedder.cls.dense.weight.mul_(-1.0)
    other.save_pretrained(tmp_path / "other", save_retriever=False, model_card=False)
    shutil.copy(tmp_path / "other" / "model.safetensors", folder / "model.safetensors")
    cache = str(tmp_path / "cache")
    populate_cache(str(folder), "realm-test/bound", cache)
    with pytest.raises(ValueError, match="not the ones its retriever/ folder") as error:
        RealmForOpenQA.from_pretrained("realm-test/bound", cache_dir=cache)
    assert "push_to_hub" in str(error.value) and "load_retriever=False" in str(error.value)
    # The weights alone still load, for attaching a corpus by hand.
    alone = RealmForOpenQA.from_pretrained("realm-test/bound", cache_dir=cache, load_retriever=False)
    assert alone.retriever is None
    assert torch.equal(alone.embedder.cls.dense.weight, other.embedder.cls.dense.weight)


def test_save_pretrained_corpus_format_is_checked_and_used(tiny, tmp_path):
    model = tiny[0]
    with pytest.raises(ValueError, match="corpus_format.*'arrow'.*'parquet'"):
        model.save_pretrained(tmp_path / "bad", corpus_format="csv")
    assert not (tmp_path / "bad" / "model.safetensors").exists()
    model.save_pretrained(tmp_path / "pq", corpus_format="parquet", model_card=False)
    corpus = tmp_path / "pq" / "retriever" / "corpus"
    assert any(name.endswith(".parquet") for name in os.listdir(corpus))
    reloaded = RealmForOpenQA.from_pretrained(tmp_path / "pq")
    assert_same_model_answers(answers_of(reloaded), answers_of(model))


def test_push_to_hub_without_retriever_and_to_a_branch(tiny, tmp_path, monkeypatch):
    hub = RecordingHub(tmp_path)
    hub.install(monkeypatch)
    push_to_hub(tiny[0], "realm-test/pushed", save_retriever=False, revision="v1")
    (upload,) = hub.uploads
    assert not any(f.startswith("retriever/") for f in _files(upload["folder"]))
    assert upload["delete_patterns"] is None and upload["revision"] == "v1"
    assert ("create_branch", "realm-test/pushed", {"branch": "v1", "exist_ok": True}) in hub.calls


def test_transformers_push_to_hub_cannot_upload_the_retriever(tiny, tmp_path, monkeypatch):
    """Why RealmForOpenQA.push_to_hub must delegate to realm_hf.hub.repositories.push_to_hub (transformers 5 behaviour)."""
    from transformers.utils.hub import PushToHubMixin

    hub = RecordingHub(tmp_path)
    hub.install(monkeypatch)

    def no_card(*args, **kwargs):
        raise EntryNotFoundError("no README")

    monkeypatch.setattr("transformers.utils.hub.ModelCard.load", no_card)
    # It adds the files of each top-level folder only: `retriever/corpus` is a folder, which CommitOperationAdd refuses.
    with pytest.raises(ValueError, match="is not a file"):
        PushToHubMixin.push_to_hub(tiny[0], "realm-test/native")
    assert not hub.commits


def test_model_push_to_hub_is_the_realm_one(tiny, tmp_path, monkeypatch):
    hub = RecordingHub(tmp_path)
    hub.install(monkeypatch)
    tiny[0].push_to_hub("realm-test/method")
    (upload,) = hub.uploads
    assert "retriever/retriever_manifest.json" in _files(upload["folder"])
    assert parse_card_metadata((upload["folder"] / "README.md").read_text())["library_name"] == "realm-hf"


def test_push_corpus_to_hub_as_dataset_repo(tiny, tmp_path, monkeypatch):
    model, _, path = tiny
    hub = RecordingHub(tmp_path)
    hub.install(monkeypatch)
    push_corpus_to_hub(model.retriever, "realm-test/corpus", card_kwargs={"license": "cc-by-sa-4.0"})
    (upload,) = hub.uploads
    assert upload["repo_type"] == "dataset"
    files = _files(upload["folder"])
    assert "retriever_manifest.json" in files and "index.faiss" in files and "README.md" in files
    assert any(f.startswith("corpus/") and f.endswith(".parquet") for f in files)
    metadata = parse_card_metadata((upload["folder"] / "README.md").read_text())
    assert metadata["license"] == "cc-by-sa-4.0"
    assert metadata["configs"][0]["data_files"][0]["path"] == "corpus/*.parquet"
    assert (
        "create_repo",
        "realm-test/corpus",
        {"private": None, "exist_ok": True, "repo_type": "dataset"},
    ) in hub.calls
    # Referenced from a model, it loads from the cache as a dataset repo.
    cache = str(tmp_path / "cache")
    populate_cache(str(upload["folder"]), "realm-test/corpus", cache, repo_type="dataset")
    copy = RealmForOpenQA.from_pretrained(path, retriever=None)
    set_retriever_reference(copy.config, "realm-test/corpus")
    copy.set_retriever(load_referenced_retriever(copy, cache_dir=cache))
    assert_same_model_answers(answers_of(copy), answers_of(model))


def test_push_corpus_to_hub_in_a_subfolder(tiny, tmp_path, monkeypatch):
    hub = RecordingHub(tmp_path)
    hub.install(monkeypatch)
    push_corpus_to_hub(tiny[0].retriever, "realm-test/corpora", path_in_repo="foldoc")
    (upload,) = hub.uploads
    assert "foldoc/retriever_manifest.json" in _files(upload["folder"])
    assert upload["delete_patterns"] == ["foldoc/*"]
    cache = str(tmp_path / "cache")
    populate_cache(str(upload["folder"]), "realm-test/corpora", cache, repo_type="dataset")
    local = download_retriever("realm-test/corpora", subfolder="foldoc", repo_type="dataset", cache_dir=cache)
    assert local.endswith("foldoc") and os.path.isfile(os.path.join(local, "index.faiss"))
    assert torch.equal(
        torch.as_tensor(json.loads(open(os.path.join(local, "retriever_manifest.json")).read())["num_blocks"]),
        torch.tensor(len(DOCS)),
    )


@pytest.mark.parametrize("reference", ["absolute", "../", "relative to the working directory"])
def test_a_local_model_does_not_follow_a_local_corpus_reference_unasked(tiny, tmp_path, monkeypatch, reference):
    """`retriever_repo_id` naming another corpus on disk made a local model answer from it silently."""
    _, _, path = tiny
    model_dir = tmp_path / "models" / "bare"
    shutil.copytree(path, model_dir, ignore=shutil.ignore_patterns("retriever"))
    other = tmp_path / "other-corpus"
    shutil.copytree(os.path.join(path, "retriever"), other)
    shutil.copytree(other, tmp_path / "models" / "corpus-here")
    monkeypatch.chdir(tmp_path / "models")
    value = {"absolute": str(other), "../": "../other-corpus", "relative to the working directory": "corpus-here"}
    value = value[reference]
    config = json.loads((model_dir / "config.json").read_text())
    config.update(retriever_repo_id=value)
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="local path.*RealmRetriever.from_pretrained"):
        RealmForOpenQA.from_pretrained(model_dir)
    # Asked for explicitly, it loads.
    model = RealmForOpenQA.from_pretrained(model_dir, retriever=RealmRetriever.from_pretrained(other))
    assert len(model.retriever) == len(DOCS)
