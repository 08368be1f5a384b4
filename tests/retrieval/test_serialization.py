"""Saving and loading a retriever (`realm_hf.retrieval.serialization`): round trips in each corpus format, manifest
checks against the model, damaged or foreign indexes, a failed save that keeps the previous one, Hub ids offline."""

import json
import os
import warnings

import faiss
import numpy as np
import pytest
import torch

from realm_hf.constants import FORMAT_VERSION, INDEX_NAME, MANIFEST_NAME
from realm_hf.retrieval.encoding import fingerprint_module
from realm_hf.retrieval.refresh import is_stale
from realm_hf.retrieval.retriever import RealmRetriever
from tests.support.retrieval import MAX_BLOCK_LENGTH, PROJ, TinyEmbedder, embed_questions, structured_vectors


@pytest.mark.parametrize("corpus_format", ["arrow", "parquet"])
def test_save_load_round_trip(retriever, embedder, tokenizer, tmp_path, corpus_format):
    retriever.save_pretrained(tmp_path, corpus_format=corpus_format, max_shard_size="4KB")
    assert sorted(os.listdir(tmp_path)) == ["corpus", INDEX_NAME, MANIFEST_NAME, "tokenizer"]
    if corpus_format == "parquet":
        shards = sorted(os.listdir(tmp_path / "corpus"))
        assert len(shards) > 1 and shards[0] == f"data-00000-of-{len(shards):05d}.parquet"
    manifest = json.loads((tmp_path / MANIFEST_NAME).read_text())
    assert manifest["embedding_dim"] == PROJ and manifest["num_blocks"] == len(retriever)
    assert manifest["index_type"] == "Flat" and manifest["metric"] == "inner_product"
    assert manifest["embedder_fingerprint"] == fingerprint_module(embedder)
    assert manifest["max_block_length"] == MAX_BLOCK_LENGTH and manifest["format_version"] == FORMAT_VERSION
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # same embedder: not stale
        loaded = RealmRetriever.from_pretrained(tmp_path, embedder=embedder)
    assert loaded.store.index.source is not None  # the index's flat codes are memory-mapped
    queries = embed_questions(embedder, tokenizer, ["lighthouse of port estrel", "garbage collector", "wool market"])
    a, b = retriever.search(queries, k=6), loaded.search(queries, k=6)
    assert torch.equal(a.block_ids, b.block_ids) and torch.equal(a.scores, b.scores)
    assert a.blocks == b.blocks
    assert torch.equal(retriever.store.embeddings(a.block_ids), loaded.store.embeddings(a.block_ids))
    assert loaded.tokenizer("Velmora")["input_ids"] == tokenizer("Velmora")["input_ids"]


def test_manifest_and_model_mismatch_errors(retriever, tokenizer, tmp_path):
    retriever.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=f"{PROJ}-d.*32-d"):
        RealmRetriever.from_pretrained(tmp_path, expected_dim=32)
    with pytest.raises(ValueError, match="projection size"):
        RealmRetriever.from_pretrained(tmp_path, embedder=TinyEmbedder(len(tokenizer), proj=8))
    with pytest.raises(ValueError, match=f"{len(retriever)} blocks.*7"):
        RealmRetriever.from_pretrained(tmp_path, expected_num_blocks=7)
    manifest = json.loads((tmp_path / MANIFEST_NAME).read_text())
    (tmp_path / MANIFEST_NAME).write_text(json.dumps({**manifest, "num_blocks": len(retriever) + 1}))
    with pytest.raises(ValueError, match="manifest says"):
        RealmRetriever.from_pretrained(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text(json.dumps({**manifest, "embedding_dim": 8}))
    with pytest.raises(ValueError, match="8"):
        RealmRetriever.from_pretrained(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        RealmRetriever.from_pretrained(tmp_path)
    os.remove(tmp_path / MANIFEST_NAME)
    with pytest.raises(OSError, match="no retriever_manifest.json.*from_documents"):
        RealmRetriever.from_pretrained(tmp_path)
    with pytest.raises(OSError, match="not found"):
        RealmRetriever.from_pretrained(tmp_path / "missing")


def test_stale_embedder_warns(retriever, tokenizer, tmp_path):
    retriever.save_pretrained(tmp_path)
    trained = TinyEmbedder(len(tokenizer))
    with torch.no_grad():
        trained.dense.weight.add_(0.01)
    with pytest.warns(UserWarning, match="stale"):
        RealmRetriever.from_pretrained(tmp_path, embedder=trained)
    assert is_stale(retriever, trained) and not is_stale(retriever, TinyEmbedder(len(tokenizer)))


def test_corrupt_or_foreign_index_gives_clear_error(retriever, tmp_path):
    retriever.save_pretrained(tmp_path)
    index_path = tmp_path / INDEX_NAME
    size = index_path.stat().st_size
    index_path.write_bytes(np.random.default_rng(0).bytes(size))
    with pytest.raises(ValueError, match="index.faiss is corrupt.*sha256"):
        RealmRetriever.from_pretrained(tmp_path)
    # Without the checksums (trusted files), FAISS's own checks still refuse the file clearly.
    with pytest.raises(ValueError, match="not a FAISS index.*from_documents"):
        RealmRetriever.from_pretrained(tmp_path, verify_checksums=False)
    index_path.write_bytes(b"IxM2" + np.random.default_rng(0).bytes(size - 4))
    with pytest.raises(ValueError, match="FAISS index.*from_documents"):
        RealmRetriever.from_pretrained(tmp_path, verify_checksums=False)
    good_prefix = faiss.serialize_index(retriever.store.index.index).tobytes()[: size // 2]
    index_path.write_bytes(good_prefix)
    with pytest.raises(ValueError, match="truncated"):
        RealmRetriever.from_pretrained(tmp_path)
    # A valid FAISS file of another dimension (and the size check out of the way).
    other = faiss.IndexIDMap2(faiss.IndexFlatIP(8))
    other.add_with_ids(np.zeros((len(retriever), 8), np.float32), np.arange(len(retriever)))
    faiss.write_index(other, str(index_path))
    manifest = json.loads((tmp_path / MANIFEST_NAME).read_text())
    del manifest["index_file_size"], manifest["files"]  # as an older manifest, without sizes or checksums
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=f"8-d index.*manifest.*{PROJ}"):
        RealmRetriever.from_pretrained(tmp_path)


def test_failed_save_keeps_previous_corpus(retriever, tmp_path, monkeypatch):
    small = RealmRetriever.from_embeddings(structured_vectors(5, PROJ), [f"old {i}" for i in range(5)])
    small.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{}")  # a model's file in the same directory
    before = {p: (tmp_path / p).stat().st_mtime_ns for p in (INDEX_NAME, MANIFEST_NAME)}

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(faiss, "write_index", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        retriever.save_pretrained(tmp_path)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["config.json", "corpus", INDEX_NAME, MANIFEST_NAME]  # no temp leftovers
    assert {p: (tmp_path / p).stat().st_mtime_ns for p in before} == before
    loaded = RealmRetriever.from_pretrained(tmp_path)
    assert len(loaded) == 5 and loaded.store.texts([0, 4]) == ["old 0", "old 4"]
    # A successful save replaces the retriever's entries and keeps the model's.
    retriever.save_pretrained(tmp_path)
    assert len(RealmRetriever.from_pretrained(tmp_path)) == len(retriever)
    assert (tmp_path / "config.json").read_text() == "{}"


def test_hub_id_offline_gives_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError, match="Hub.*HF_HUB_OFFLINE"):
        RealmRetriever.from_pretrained("realm-hf-tests/no-such-corpus")
