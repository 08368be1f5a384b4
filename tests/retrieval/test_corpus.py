"""The saved corpus (`realm_hf.retrieval.corpus`): damaged corpora refused at load, and datasets' cache files kept out
of the saved folder."""

import os

import datasets
import pytest

from realm_hf import RealmForOpenQA
from tests.support.legacy_model import load_legacy_model


def _rewrite_corpus(directory, change):
    """Replace a saved retriever's corpus by `change(corpus)` and re-record its files, as a damaged save would be."""
    import json
    import shutil

    import datasets

    from realm_hf.constants import MANIFEST_NAME
    from realm_hf.retrieval.manifest import record_files

    corpus = change(datasets.load_from_disk(str(directory / "corpus")))
    corpus.save_to_disk(str(directory / "new_corpus"))
    shutil.rmtree(directory / "corpus")
    (directory / "new_corpus").rename(directory / "corpus")
    manifest = json.loads((directory / MANIFEST_NAME).read_text())
    manifest["files"] = record_files(str(directory))
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest))


def test_damaged_corpora_are_refused_at_load(tiny, tmp_path):
    import datasets

    from realm_hf.retrieval.retriever import RealmRetriever

    retriever = tiny[0].retriever
    numbers = tmp_path / "numbers"
    retriever.save_pretrained(numbers)
    _rewrite_corpus(numbers, lambda c: c.map(lambda _, i: {"text": i}, with_indices=True, remove_columns=["text"]))
    with pytest.raises(ValueError, match="`text` column.*int64.*strings"):
        RealmRetriever.from_pretrained(numbers)

    short = tmp_path / "short"
    retriever.save_pretrained(short)
    unsized = datasets.Sequence(datasets.Value("float32"))  # a schema without a length, as Parquet gives
    _rewrite_corpus(
        short, lambda c: c.map(lambda row: {"embeddings": row["embeddings"][:8]}).cast_column("embeddings", unsized)
    )
    with pytest.raises(ValueError, match="embeddings.*dimension 8.*index.*16"):
        RealmRetriever.from_pretrained(short)


def test_map_and_filter_on_a_loaded_corpus_leave_the_saved_folder_clean(tmp_path):
    load_legacy_model().save_pretrained(tmp_path / "m")
    corpus_dir = tmp_path / "m" / "retriever" / "corpus"
    before = sorted(os.listdir(corpus_dir))
    model = RealmForOpenQA.from_pretrained(tmp_path / "m")
    datasets.enable_caching()  # the suite disables it (conftest); a user's Python process has it on
    try:
        corpus = model.retriever.corpus
        mapped = corpus.map(lambda row: {"length": len(row["text"])})
        kept = corpus.filter(lambda row: "paris" in row["text"].lower())
        assert mapped.cache_files and kept.cache_files  # datasets did cache them, on disk ...
        assert all(not f["filename"].startswith(str(corpus_dir)) for f in mapped.cache_files + kept.cache_files)
    finally:
        datasets.disable_caching()
    assert sorted(os.listdir(corpus_dir)) == before  # ... but not in the saved folder
    assert len(mapped) == len(corpus) and 0 < len(kept) < len(corpus)
    reloaded = RealmForOpenQA.from_pretrained(tmp_path / "m")
    assert reloaded.retriever.corpus["text"] == corpus["text"]
