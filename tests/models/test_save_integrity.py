"""What a saved model directory guarantees on load: no file read from outside it, a tokenizer that loads or an error,
files checked against the sha256 sums recorded at save time, and weights and index from one and the same save."""

import json
import os
import shutil

import datasets
import numpy as np
import pytest

from realm_hf import RealmForOpenQA
from realm_hf.cli import main
from realm_hf.retrieval.retriever import RealmRetriever
from tests.support.tiny_model import DOCS, QUESTIONS, build_tiny_model

MANIFEST = os.path.join("retriever", "retriever_manifest.json")


@pytest.fixture(scope="module")
def saves(tmp_path_factory):
    """Two saves of same-shaped tiny models with different weights and corpora: `a` and `b`."""
    root = tmp_path_factory.mktemp("integrity")
    for name, seed in (("a", 0), ("b", 1)):
        model, _ = build_tiny_model(str(root), seed=seed)
        if name == "b":
            model.retriever.remove_documents(block_ids=[0])
        model.save_pretrained(root / name)
    return root


@pytest.fixture
def model_dir(saves, tmp_path):
    path = tmp_path / "model"
    shutil.copytree(saves / "a", path)
    return path


# A manifest as a format-1 save wrote it (before file lists and weight checksums): the files are not checked, so the
# checks behind them are reached.
FORMAT_1 = {"files": None, "model_files": None, "format_version": 1}


def _edit_manifest(model_dir, **changes):
    path = model_dir / MANIFEST
    manifest = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            manifest.pop(key, None)
        else:
            manifest[key] = value
    path.write_text(json.dumps(manifest))


# ------------------------------------------------------------------------------------------------------------------
# No reads outside the model directory
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [
        ("index_file", "../../../b/retriever/index.faiss"),
        ("index_file", "ABSOLUTE/retriever/index.faiss"),
        ("corpus_dir", "../../b/retriever/corpus"),
        ("corpus_dir", "ABSOLUTE/retriever/corpus"),
        ("tokenizer_dir", "ABSOLUTE/retriever/tokenizer"),
        ("tokenizer_dir", "..\\..\\b\\retriever\\tokenizer"),
    ],
)
def test_manifest_paths_cannot_leave_the_directory(saves, model_dir, field, value):
    value = value.replace("ABSOLUTE", str(saves / "b"))
    # The other save's files exist and are valid: without the check, the model would answer from them.
    _edit_manifest(model_dir, **{field: value, **FORMAT_1})
    with pytest.raises(ValueError, match=f"retriever_manifest.json.*'{field}'.*outside"):
        RealmForOpenQA.from_pretrained(model_dir)
    with pytest.raises(ValueError, match=f"'{field}'"):
        RealmRetriever.from_pretrained(model_dir / "retriever")


def test_symbolic_links_out_of_the_directory_are_refused(saves, model_dir):
    index = model_dir / "retriever" / "index.faiss"
    os.remove(index)
    os.symlink(saves / "b" / "retriever" / "index.faiss", index)
    _edit_manifest(model_dir, **FORMAT_1, index_file_size=None)
    with pytest.raises(ValueError, match="index_file.*symbolic link to .*outside"):
        RealmForOpenQA.from_pretrained(model_dir)
    os.remove(index)
    shutil.copy(saves / "a" / "retriever" / "index.faiss", index)
    # A link inside a saved folder, and the whole retriever folder as a link.
    tokenizer_json = model_dir / "retriever" / "tokenizer" / "tokenizer.json"
    os.remove(tokenizer_json)
    os.symlink(saves / "b" / "retriever" / "tokenizer" / "tokenizer.json", tokenizer_json)
    with pytest.raises(ValueError, match="tokenizer_dir.*symbolic link"):
        RealmForOpenQA.from_pretrained(model_dir)
    shutil.rmtree(model_dir / "retriever")
    os.symlink(saves / "b" / "retriever", model_dir / "retriever")
    with pytest.raises(ValueError, match="retriever folder.*symbolic link"):
        RealmForOpenQA.from_pretrained(model_dir)


def test_files_named_inside_saved_folders_cannot_leave_them(saves, model_dir):
    state = model_dir / "retriever" / "corpus" / "state.json"
    data = json.loads(state.read_text())
    data["_data_files"] = [{"filename": "../../../b/retriever/corpus/data-00000-of-00001.arrow"}]
    state.write_text(json.dumps(data))
    _edit_manifest(model_dir, **FORMAT_1)
    with pytest.raises(ValueError, match="state.json.*data file.*outside"):
        RealmForOpenQA.from_pretrained(model_dir)
    shutil.copy(saves / "a" / "retriever" / "corpus" / "state.json", state)
    config = model_dir / "retriever" / "tokenizer" / "tokenizer_config.json"
    config.write_text(
        json.dumps({**json.loads(config.read_text()), "fast_tokenizer_files": ["../x/tokenizer.1.json"]})
    )
    with pytest.raises(ValueError, match="fast_tokenizer_files.*outside"):
        RealmForOpenQA.from_pretrained(model_dir)


def test_hub_cache_snapshot_links_into_its_blobs_load(saves, tmp_path):
    """A Hub cache snapshot's files are links into the repo's blobs/ folder: that is inside the download."""
    repo = tmp_path / "models--me--tiny"
    snapshot = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    for folder, _dirs, files in os.walk(saves / "a"):
        for name in files:
            relative = os.path.relpath(os.path.join(folder, name), saves / "a")
            blob = repo / "blobs" / relative.replace(os.sep, "_")
            shutil.copy(os.path.join(folder, name), blob)
            (snapshot / relative).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.path.relpath(blob, (snapshot / relative).parent), snapshot / relative)
    model = RealmForOpenQA.from_pretrained(snapshot)
    assert len(model.retriever) == 6 and model.answer(QUESTIONS[0])["answer"]


# ------------------------------------------------------------------------------------------------------------------
# The retriever's tokenizer loads, or the load fails saying which file
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("checksums", [True, False])
def test_deleted_tokenizer_vocabulary_is_an_error_not_unk(model_dir, checksums):
    expected = RealmForOpenQA.from_pretrained(model_dir).retriever.tokenizer.tokenize(QUESTIONS[0])
    assert "[UNK]" not in expected
    if not checksums:
        _edit_manifest(model_dir, **FORMAT_1, tokenizer_vocab_size=None)  # as an older save
    os.remove(model_dir / "retriever" / "tokenizer" / "tokenizer.json")
    with pytest.raises(OSError, match="tokenizer.json"):
        RealmForOpenQA.from_pretrained(model_dir)


@pytest.mark.parametrize("checksums", [True, False])
def test_truncated_tokenizer_is_an_error_naming_the_file(model_dir, checksums):
    if not checksums:
        _edit_manifest(model_dir, **FORMAT_1, tokenizer_vocab_size=None)
    path = model_dir / "retriever" / "tokenizer" / "tokenizer.json"
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises((OSError, ValueError), match="tokenizer.json.*(truncated|corrupt)"):
        RealmForOpenQA.from_pretrained(model_dir)


def test_missing_tokenizer_folder_named_by_the_manifest_is_an_error(model_dir):
    shutil.rmtree(model_dir / "retriever" / "tokenizer")
    _edit_manifest(model_dir, **FORMAT_1)
    with pytest.raises(OSError, match="tokenizer.*folder is missing"):
        RealmRetriever.from_pretrained(model_dir / "retriever")


# ------------------------------------------------------------------------------------------------------------------
# Checksums
# ------------------------------------------------------------------------------------------------------------------


def _invert(path, start, count=200):
    data = bytearray(path.read_bytes())
    start = min(start, len(data) - count)
    data[start : start + count] = bytes(255 - b for b in data[start : start + count])
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("relative", ["index.faiss", "corpus/data-00000-of-00001.arrow"])
def test_corruption_in_place_is_detected(model_dir, relative):
    path = model_dir / "retriever" / relative
    size = path.stat().st_size
    _invert(path, size // 2)
    assert path.stat().st_size == size
    with pytest.raises(ValueError, match=f"{os.path.basename(relative)} is corrupt.*sha256"):
        RealmForOpenQA.from_pretrained(model_dir)


def test_checksums_can_be_skipped_and_old_manifests_load(model_dir):
    manifest = json.loads((model_dir / MANIFEST).read_text())
    assert set(manifest["files"]) >= {"index.faiss", "corpus/state.json", "tokenizer/tokenizer.json"}
    assert manifest["model_files"]["model.safetensors"]["sha256"]
    # Stored vectors of the index (a Flat index: the last bytes are the vectors and ids) silently changed ...
    _invert(model_dir / "retriever" / "index.faiss", 300, count=16)
    with pytest.raises(ValueError, match="sha256"):
        RealmForOpenQA.from_pretrained(model_dir)
    # ... load when the caller trusts the files (sizes are still checked).
    assert len(RealmForOpenQA.from_pretrained(model_dir, verify_checksums=False).retriever) == 6
    assert len(RealmRetriever.from_pretrained(model_dir / "retriever", verify_checksums=False)) == 6
    # A format-1 manifest (saved before file lists) records no checksums: it loads, unverified.
    _edit_manifest(model_dir, **FORMAT_1)
    assert len(RealmForOpenQA.from_pretrained(model_dir).retriever) == 6


@pytest.mark.parametrize("drop", [("files",), ("files", "model_files")])
def test_a_manifest_without_its_files_list_is_refused(model_dir, drop):
    """Dropping `files` from a manifest skipped every file check (an index or BM25 index of another save loaded)."""
    _edit_manifest(model_dir, **dict.fromkeys(drop))
    for load in (
        lambda: RealmForOpenQA.from_pretrained(model_dir),
        lambda: RealmRetriever.from_pretrained(model_dir / "retriever"),
    ):
        with pytest.raises(ValueError, match="has no `files` list"):
            load()


def test_data_file_added_to_the_corpus_is_refused(saves, model_dir):
    shutil.copy(
        saves / "b" / "retriever" / "corpus" / "data-00000-of-00001.arrow",
        model_dir / "retriever" / "corpus" / "data-00001-of-00001.arrow",
    )
    with pytest.raises(ValueError, match=r"data-00001-of-00001.arrow.*does not list"):
        RealmForOpenQA.from_pretrained(model_dir)


def test_the_corpus_opened_with_datasets_alone_keeps_the_directory_loadable(model_dir, capsys):
    # The documented route (docs/saved-layout.md): datasets' map and filter write their cache files beside the corpus.
    corpus_dir = model_dir / "retriever" / "corpus"
    datasets.enable_caching()  # datasets' default (the suite turns it off)
    try:
        corpus = datasets.load_from_disk(str(corpus_dir))
        lengths = corpus.map(lambda row: {"length": len(row["text"])})
        assert len(lengths.filter(lambda row: row["length"] > 0)) == 6
    finally:
        datasets.disable_caching()
    assert sorted(path.name for path in corpus_dir.glob("cache-*.arrow"))  # datasets wrote them there
    assert len(RealmForOpenQA.from_pretrained(model_dir).retriever) == 6
    assert len(RealmRetriever.from_pretrained(model_dir / "retriever")) == 6
    # `realm-hf ask` and `realm-hf serve` load the directory through the same check.
    assert main(["-q", "ask", QUESTIONS[0], "--model", str(model_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["question"] == QUESTIONS[0]
    # A damaged file of the save is still caught, whatever datasets left beside it.
    _invert(corpus_dir / "data-00000-of-00001.arrow", 300, count=16)
    with pytest.raises(ValueError, match="sha256"):
        RealmForOpenQA.from_pretrained(model_dir)


def test_a_data_file_under_a_datasets_cache_name_that_the_corpus_reads_is_refused(saves, model_dir):
    # Only files the saved corpus never reads pass under datasets' cache names: one its state.json names is checked.
    corpus_dir = model_dir / "retriever" / "corpus"
    shutil.copy(saves / "b" / "retriever" / "corpus" / "data-00000-of-00001.arrow", corpus_dir / "cache-0.arrow")
    state = json.loads((corpus_dir / "state.json").read_text())
    state["_data_files"].append({"filename": "cache-0.arrow"})
    (corpus_dir / "state.json").write_text(json.dumps(state))
    with pytest.raises(ValueError, match="state.json"):
        RealmForOpenQA.from_pretrained(model_dir, verify_checksums=False)


# ------------------------------------------------------------------------------------------------------------------
# Weights and index from one save
# ------------------------------------------------------------------------------------------------------------------


def test_retriever_copied_from_another_save_is_detected(saves, model_dir):
    shutil.rmtree(model_dir / "retriever")
    shutil.copytree(saves / "b" / "retriever", model_dir / "retriever")
    with pytest.raises(ValueError, match="different saves.*model.safetensors"):
        RealmForOpenQA.from_pretrained(model_dir)
    # Even without checksums: the weights file B's retriever was saved with has other bytes ... of the same size,
    # so only the sha256 tells them apart; sizes alone pass (documented: verify_checksums=False trusts the files).
    assert RealmForOpenQA.from_pretrained(model_dir, verify_checksums=False).retriever is not None


def test_index_copied_from_another_save_is_detected(saves, model_dir):
    shutil.copy(saves / "b" / "retriever" / "index.faiss", model_dir / "retriever" / "index.faiss")
    with pytest.raises(ValueError, match="index.faiss (has|is corrupt)"):
        RealmForOpenQA.from_pretrained(model_dir)


def test_weights_copied_from_another_save_are_detected(saves, model_dir):
    shutil.copy(saves / "b" / "model.safetensors", model_dir / "model.safetensors")
    with pytest.raises(ValueError, match="come from different saves"):
        RealmForOpenQA.from_pretrained(model_dir)


def test_deliberately_attached_or_kept_retrievers_load(saves, model_dir):
    # `RealmRetriever.save_pretrained` into a model's retriever/ (what `realm-hf index --attach-to` does) attaches a
    # corpus on purpose: it records no weights and loads with any of them.
    other = RealmRetriever.from_pretrained(saves / "b" / "retriever")
    other.save_pretrained(model_dir / "retriever")
    assert len(RealmForOpenQA.from_pretrained(model_dir).retriever) == 5
    # Weights saved without their retriever keep the directory's one, which then goes with the new weights.
    shutil.rmtree(model_dir)
    shutil.copytree(saves / "a", model_dir)
    model_b = RealmForOpenQA.from_pretrained(saves / "b")
    model_b.save_pretrained(model_dir, save_retriever=False)
    loaded = RealmForOpenQA.from_pretrained(model_dir)
    assert len(loaded.retriever) == 6
    np.testing.assert_array_equal(
        loaded.embedder.cls.dense.weight.detach().numpy(), model_b.embedder.cls.dense.weight.detach().numpy()
    )


def test_failed_model_save_keeps_the_previous_save(saves, model_dir, monkeypatch):
    import faiss

    before = {name: (model_dir / name).read_bytes() for name in ("config.json", "model.safetensors")}
    model_b = RealmForOpenQA.from_pretrained(saves / "b")

    def disk_full(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(faiss, "write_index", disk_full)
    with pytest.raises(OSError, match="No space left"):
        model_b.save_pretrained(model_dir)
    monkeypatch.undo()
    assert {name: (model_dir / name).read_bytes() for name in before} == before
    assert sorted(os.listdir(model_dir)) == [
        "README.md",
        "config.json",
        "model.safetensors",
        "realm_hf_auto.py",
        "retriever",
    ]
    assert len(RealmForOpenQA.from_pretrained(model_dir).retriever) == 6


# ------------------------------------------------------------------------------------------------------------------
# Every file a load reads, and the config written from the saved corpus
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "tokenizer.json"])
def test_top_level_files_linked_outside_are_refused_by_every_reader(saves, model_dir, tmp_path, name):
    from realm_hf import RealmConfig, RealmTokenizer

    _, tokenizer = build_tiny_model(str(tmp_path))
    tokenizer.save_pretrained(model_dir)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.move(model_dir / name, outside / name)
    os.symlink(outside / name, model_dir / name)
    for read in (RealmForOpenQA.from_pretrained, RealmConfig.from_pretrained, RealmTokenizer.from_pretrained):
        with pytest.raises(ValueError, match=f"{name}.*symbolic link.*outside"):
            read(model_dir)


def test_config_block_count_is_the_saved_corpus_even_with_documents_added_during_the_save(tmp_path, monkeypatch):
    """Documents added while a model saves made config.num_block_records disagree with the corpus."""
    import threading

    import realm_hf.models.modeling_base as modeling_base

    model, _ = build_tiny_model(str(tmp_path))
    real_write_auto_module = modeling_base.write_auto_module

    def write_auto_module_while_a_thread_adds_documents(folder):
        # Between the config (written first) and the retriever: another thread adds two documents.
        documents = [
            {"title": "unix", "text": "unix is an operating system ."},
            {"title": "c", "text": "c is a language ."},
        ]
        thread = threading.Thread(
            target=model.retriever.add_documents, args=(documents,), kwargs={"embedder": model.embedder}
        )
        thread.start()
        thread.join()
        return real_write_auto_module(folder)

    monkeypatch.setattr(modeling_base, "write_auto_module", write_auto_module_while_a_thread_adds_documents)
    model.save_pretrained(tmp_path / "saved")
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    manifest = json.loads((tmp_path / "saved" / MANIFEST).read_text())
    assert config["num_block_records"] == manifest["num_blocks"] == len(DOCS) + 2
    assert len(RealmForOpenQA.from_pretrained(tmp_path / "saved").retriever) == config["num_block_records"]
