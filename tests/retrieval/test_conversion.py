"""The streamed legacy conversion (`write_legacy_retriever`, what `realm-hf convert` runs) against the in-memory one.

`RealmRetriever.from_legacy(...).save_pretrained(...)` holds every text and the whole `block_emb`; the streamed
conversion reads the pickle's opcodes a chunk at a time and writes the corpus and a Flat index file as it goes. Both
must give the same retriever: ids, texts, embeddings and search results.
"""

import json
import logging
import os
import pickle

import faiss
import numpy as np
import pytest
import torch

from realm_hf.retrieval import legacy
from realm_hf.retrieval.conversion import convert_legacy_checkpoint, write_legacy_retriever
from realm_hf.retrieval.faiss_build import new_index, write_flat_index
from realm_hf.retrieval.retriever import RealmRetriever
from tests.support.paths import LEGACY_OPENQA

DIM = 16


def write_records(path, items, protocol=4):
    """`np.save` of an object array (protocol 4, numpy 2), or the same with numpy 1.x's protocol 3 pickle."""
    records = np.empty(len(items), dtype=object)
    records[:] = items
    if protocol == 4:
        np.save(path, records, allow_pickle=True)
        return
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "|O", "fortran_order": False, "shape": (len(items),)})
        pickle.dump(records, f, protocol=protocol)


def make_legacy(path, tokenizer_dir, items, protocol=4, seed=0):
    os.makedirs(path)
    write_records(os.path.join(path, "block_records.npy"), items, protocol)
    block_emb = torch.from_numpy(np.random.default_rng(seed).normal(size=(len(items), DIM)).astype(np.float32))
    torch.save({"block_emb": block_emb, "embedder.cls.dense.weight": torch.zeros(DIM, 4)}, path / "pytorch_model.bin")
    for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        with open(os.path.join(tokenizer_dir, name), "rb") as src, open(path / name, "wb") as dst:
            dst.write(src.read())
    return block_emb


def texts(n, seed=1):
    rng = np.random.default_rng(seed)
    words = ["the", "torre", "alba", "is", "tall", "café", "ünïcode", "block", "metres", "north"]
    # Lengths around the 256-byte switch from SHORT_BINBYTES to BINBYTES, and one empty block.
    return [(" ".join(rng.choice(words, size=int(rng.integers(1, 80)))) if i != 7 else "").encode() for i in range(n)]


def assert_same_retriever(expected_dir, actual_dir, queries=8):
    a, b = RealmRetriever.from_pretrained(expected_dir), RealmRetriever.from_pretrained(actual_dir)
    assert len(a) == len(b)
    for column in ("block_id", "doc_id", "title", "text", "embeddings"):
        assert a.corpus[column] == b.corpus[column], column
    assert a.corpus.features == b.corpus.features
    q = np.random.default_rng(3).normal(size=(queries, a.embedding_dim)).astype(np.float32)
    k = min(5, len(a))
    ra, rb = a.search(q, k=k), b.search(q, k=k)
    assert torch.equal(torch.as_tensor(ra.block_ids), torch.as_tensor(rb.block_ids))
    assert torch.equal(torch.as_tensor(ra.scores), torch.as_tensor(rb.scores))
    ma, mb = (json.load(open(os.path.join(d, "retriever_manifest.json"))) for d in (expected_dir, actual_dir))
    for manifest in (ma, mb):
        for key in ("files", "created_at", "index_file_size"):
            manifest.pop(key)
    assert ma == mb
    return a, b


def convert_both(legacy, tmp_path, **kwargs):
    expected, actual = tmp_path / "in_memory", tmp_path / "streamed"
    index = kwargs.get("index", "Flat")
    RealmRetriever.from_legacy(legacy, allow_pickle=True, index=index).save_pretrained(
        expected, corpus_format=kwargs.get("corpus_format", "arrow")
    )
    write_legacy_retriever(legacy, actual, allow_pickle=True, **kwargs)
    return assert_same_retriever(expected, actual)


def test_transformers_4_fixture_converts_identically(tmp_path):
    """The block_records.npy transformers 4.57.6 wrote (tests/fixtures/legacy/openqa), in chunks smaller than it."""
    a, b = convert_both(LEGACY_OPENQA, tmp_path, chunk_rows=5, max_shard_size=1000)
    assert len(os.listdir(tmp_path / "streamed" / "corpus")) > 3  # several shards (and their two JSON files)
    assert b.store.texts([0]) == [
        json.load(open(os.path.join(LEGACY_OPENQA, "expected_outputs.json")))["block_records"][0]
    ]
    # The Flat index file is the one faiss writes.
    with (
        open(tmp_path / "in_memory" / "index.faiss", "rb") as f1,
        open(tmp_path / "streamed" / "index.faiss", "rb") as f2,
    ):
        assert f1.read() == f2.read()


@pytest.mark.parametrize(
    "protocol, options",
    [
        (4, {"chunk_rows": 7}),
        (3, {"chunk_rows": 1000}),  # numpy 1.x's np.save (the Hub's files): BINPUT memo opcodes, no frames
        (4, {"chunk_rows": 64, "corpus_format": "parquet", "max_shard_size": 2000}),
        (4, {"chunk_rows": 50, "index": "IVF4,Flat"}),  # trained and filled chunk by chunk
    ],
)
def test_streamed_conversion_matches_in_memory(tmp_path, protocol, options):
    items = texts(1203)  # past pickle's 1,000-item APPENDS batches
    make_legacy(tmp_path / "legacy", LEGACY_OPENQA, items, protocol)
    convert_both(tmp_path / "legacy", tmp_path, **options)


def test_repeated_objects_and_str_items_convert_identically(tmp_path):
    """One bytes object in several rows (pickled once, then BINGET) and str items, which the legacy loader accepted."""
    shared = b"a block repeated in many rows"
    items = [shared if i % 3 == 0 else f"row {i} é".encode() for i in range(600)]
    items[5] = "a str item, not bytes"
    make_legacy(tmp_path / "legacy", LEGACY_OPENQA, items)
    assert b"h" in open(tmp_path / "legacy" / "block_records.npy", "rb").read()  # BINGET present
    _, streamed = convert_both(tmp_path / "legacy", tmp_path, chunk_rows=64)
    assert streamed.store.texts([0, 3, 5, 7]) == [shared.decode()] * 2 + ["a str item, not bytes", "row 7 é"]


def test_records_are_streamed_without_unpickling(tmp_path, monkeypatch):
    make_legacy(tmp_path / "legacy", LEGACY_OPENQA, texts(300))

    def refuse(*args, **kwargs):
        raise AssertionError("unpickled")

    monkeypatch.setattr(np, "load", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    chunks = list(legacy.iter_record_chunks(str(tmp_path / "legacy" / "block_records.npy"), chunk_rows=64))
    assert [len(c) for c in chunks] == [64] * 4 + [44]
    assert sum((c.to_pylist() for c in chunks), []) == [t.decode() for t in texts(300)]


def test_unstreamable_records_fall_back_to_np_load(tmp_path, caplog):
    """A non-text item (the legacy loader turned it into str(item)): the pickle is read with np.load instead."""
    items = texts(40)
    items[30] = None
    make_legacy(tmp_path / "legacy", LEGACY_OPENQA, items)
    with caplog.at_level(logging.WARNING, logger="realm_hf.retrieval.conversion"):
        _, streamed = convert_both(tmp_path / "legacy", tmp_path, chunk_rows=8)
    assert "cannot be streamed" in caplog.text
    assert streamed.store.texts([30]) == ["None"]


def test_invalid_utf8_names_the_block(tmp_path):
    items = texts(20)
    items[13] = b"caf\xe9"
    make_legacy(tmp_path / "legacy", LEGACY_OPENQA, items)
    with pytest.raises(ValueError, match="block 13 is not valid UTF-8"):
        write_legacy_retriever(tmp_path / "legacy", tmp_path / "out", allow_pickle=True, chunk_rows=8)
    assert not (tmp_path / "out" / "retriever_manifest.json").exists()


def test_streamed_conversion_refuses_without_opt_in_and_on_mismatch(tmp_path, monkeypatch):
    monkeypatch.delenv("REALM_HF_ALLOW_PICKLE", raising=False)
    make_legacy(tmp_path / "legacy", LEGACY_OPENQA, texts(10))
    with pytest.raises(ValueError, match="allow_pickle=True"):
        write_legacy_retriever(tmp_path / "legacy", tmp_path / "out")
    write_records(tmp_path / "legacy" / "block_records.npy", texts(11))
    with pytest.raises(ValueError, match=r"\(11,\) records.*block_emb.*10 rows"):
        write_legacy_retriever(tmp_path / "legacy", tmp_path / "out", allow_pickle=True)
    assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")


def test_convert_legacy_checkpoint_returns_the_streamed_retriever(tmp_path):
    block_emb = make_legacy(tmp_path / "legacy", LEGACY_OPENQA, texts(50))
    retriever = convert_legacy_checkpoint(tmp_path / "legacy", tmp_path / "out", allow_pickle=True)
    assert torch.equal(retriever.store.embeddings(torch.arange(50).view(1, -1))[0], block_emb)
    assert retriever.store.texts(list(range(50))) == [t.decode() for t in texts(50)]


def test_flat_index_file_is_faiss_own(tmp_path):
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(1000, 24)).astype(np.float32)
    ids = np.arange(1000, dtype=np.int64)
    index = new_index("Flat", 24)
    index.add_with_ids(vectors, ids)

    def chunks():
        for start in range(0, 1000, 300):
            yield vectors[start : start + 300], ids[start : start + 300]

    write_flat_index(str(tmp_path / "index.faiss"), 24, 1000, chunks)
    assert (tmp_path / "index.faiss").read_bytes() == faiss.serialize_index(index).tobytes()
    vectors[17, 3] = np.nan
    with pytest.raises(ValueError, match=r"block ids \[17\]"):
        write_flat_index(str(tmp_path / "bad.faiss"), 24, 1000, chunks)


def test_block_emb_chunks_are_copies_of_the_mapped_rows(tmp_path):
    """Handing the mapped pages back must not change what is read: each chunk equals the saved rows."""
    from realm_hf.retrieval.legacy import LegacyBlockEmb

    block_emb = make_legacy(tmp_path / "legacy", LEGACY_OPENQA, texts(5000))
    source = LegacyBlockEmb(str(tmp_path / "legacy"))
    first = np.concatenate(list(source.chunks(777)))
    second = np.concatenate(list(source.chunks(1000)))
    assert np.array_equal(first, block_emb.numpy()) and np.array_equal(second, block_emb.numpy())
    rows = np.array([3, 999, 4999])
    assert np.array_equal(source.take(rows), block_emb.numpy()[rows])
