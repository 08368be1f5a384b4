"""
The corpus as a `datasets` citizen: memory-mapped from the moment it is built, and a saved retriever directory that
datasets' own FAISS API (`load_from_disk` + `load_faiss_index` + `get_nearest_examples`) reads with the same rows as
`RealmRetriever.search`, also after blocks were removed and added; saves from before (index labels = block ids) load
as they did.
"""

import gc
import json
import os
import shutil

import datasets
import faiss
import numpy as np
import pytest
import torch
from datasets.table import ConcatenationTable, MemoryMappedTable
from transformers import BertTokenizer

from realm_hf.constants import FORMAT_VERSION, INDEX_NAME, MANIFEST_NAME
from realm_hf.retrieval.refresh import embed_corpus
from realm_hf.retrieval.retriever import RealmRetriever
from tests.support.paths import CORPUS_DIR, FIXTURES
from tests.support.retrieval import MAX_BLOCK_LENGTH, NEW_DOC, TinyEmbedder, embed_questions, structured_vectors

QUESTIONS = ["lighthouse of port estrel", "garbage collector", "wool market", "volcanic island", "compiler"]
V1_FIXTURE = os.path.join(FIXTURES, "retriever_v1")


def all_memory_mapped(dataset):
    """Whether every Arrow block behind `dataset` is read from a file (none held in process memory)."""
    table = dataset.data
    blocks = [b for row in table.blocks for b in row] if isinstance(table, ConcatenationTable) else [table]
    return all(isinstance(b, MemoryMappedTable) for b in blocks) and bool(dataset.cache_files)


def corpus_files(retriever):
    return {entry["filename"] for entry in retriever.corpus.cache_files}


def datasets_nearest(directory, queries, k):
    """Block ids of the top `k` rows for each query, through datasets' own API only."""
    corpus = datasets.load_from_disk(os.path.join(directory, "corpus"))
    corpus.load_faiss_index("embeddings", os.path.join(directory, INDEX_NAME))
    _, examples = corpus.get_nearest_examples_batch("embeddings", np.asarray(queries, dtype=np.float32), k=k)
    return [example["block_id"] for example in examples]


@pytest.fixture(scope="module")
def tokenizer():
    return BertTokenizer(vocab=os.path.join(CORPUS_DIR, "vocab.txt"))


@pytest.fixture(scope="module")
def documents():
    with open(os.path.join(CORPUS_DIR, "documents.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def embedder(tokenizer):
    return TinyEmbedder(len(tokenizer)).eval()


@pytest.fixture(scope="module")
def questions(embedder, tokenizer):
    return embed_questions(embedder, tokenizer, QUESTIONS).numpy()


def test_corpus_is_memory_mapped_from_the_start_and_its_files_go_with_it(documents, embedder, tokenizer):
    retriever = RealmRetriever.from_documents(
        documents, embedder, tokenizer, max_block_length=MAX_BLOCK_LENGTH, show_progress=False
    )
    assert all_memory_mapped(retriever.corpus)
    files = corpus_files(retriever)
    # Added blocks and re-embedded columns are memory-mapped too, also after removals (an indices mapping).
    retriever.add_documents([NEW_DOC], embedder, show_progress=False)
    assert all_memory_mapped(retriever.corpus)
    embed_corpus(retriever, embedder, show_progress=False)
    assert all_memory_mapped(retriever.corpus)
    retriever.remove_documents(["doc-000"])
    before = retriever.store.embeddings(torch.as_tensor(retriever.store.block_ids))
    embed_corpus(retriever, embedder, show_progress=False)
    assert all_memory_mapped(retriever.corpus)
    assert torch.allclose(retriever.store.embeddings(torch.as_tensor(retriever.store.block_ids)), before, atol=1e-5)
    files |= corpus_files(retriever)
    assert all(os.path.isfile(f) for f in corpus_files(retriever))
    # Files the live corpus no longer reads are gone; the rest go with the retriever.
    gc.collect()
    assert {f for f in files if os.path.isfile(f)} <= corpus_files(retriever)
    del retriever
    gc.collect()
    assert not [f for f in files if os.path.isfile(f)]


def test_in_memory_corpus_stays_in_memory(documents, embedder, tokenizer, tmp_path):
    retriever = RealmRetriever.from_documents(
        documents[:4], embedder, tokenizer, max_block_length=MAX_BLOCK_LENGTH, show_progress=False
    )
    retriever.save_pretrained(tmp_path)
    loaded = RealmRetriever.from_pretrained(tmp_path, mmap=False)
    loaded.add_documents([NEW_DOC], embedder, show_progress=False)
    embed_corpus(loaded, embedder, show_progress=False)
    assert not loaded.corpus.cache_files  # mmap=False was asked for: nothing written to scratch files


@pytest.mark.parametrize("factory", ["Flat", "HNSW32", "IVF4,Flat"])
def test_saved_directory_gives_the_same_rows_through_datasets_faiss_api(
    documents, embedder, tokenizer, questions, tmp_path, factory
):
    retriever = RealmRetriever.from_documents(
        documents, embedder, tokenizer, max_block_length=MAX_BLOCK_LENGTH, index=factory, show_progress=False
    )
    # Removals and an addition: block ids are no longer row numbers.
    retriever.remove_documents(["doc-000", "doc-003"])
    retriever.add_documents([NEW_DOC], embedder, show_progress=False)
    assert not np.array_equal(retriever.store.block_ids, np.arange(len(retriever)))
    retriever.save_pretrained(tmp_path)
    manifest = json.loads((tmp_path / MANIFEST_NAME).read_text())
    assert manifest["index_labels"] == "row" and manifest["format_version"] == FORMAT_VERSION
    k = 6
    expected = retriever.search(questions, k=k).block_ids.tolist()
    assert datasets_nearest(tmp_path, questions, k) == expected

    # realm-hf maps the rows back to block ids on load, and a change after loading (the memory-mapped index is
    # re-read from its file before it is modified) keeps them.
    loaded = RealmRetriever.from_pretrained(tmp_path, embedder=embedder)
    assert loaded.search(questions, k=k).block_ids.tolist() == expected
    new_ids = loaded.add_documents([dict(NEW_DOC, doc_id="doc-new-2")], embedder, show_progress=False)
    retriever.add_documents([dict(NEW_DOC, doc_id="doc-new-2")], embedder, show_progress=False)
    assert (
        loaded.store.block_ids.tolist() == retriever.store.block_ids.tolist()
        and max(new_ids) == loaded.store.block_ids.max()
    )
    assert torch.equal(loaded.search(questions, k=k).block_ids, retriever.search(questions, k=k).block_ids)
    loaded.remove_documents(["doc-new"])
    retriever.remove_documents(["doc-new"])
    assert torch.equal(loaded.search(questions, k=k).block_ids, retriever.search(questions, k=k).block_ids)
    loaded.save_pretrained(tmp_path / "again")
    assert datasets_nearest(tmp_path / "again", questions, k) == retriever.search(questions, k=k).block_ids.tolist()


def _v1_expected(queries, k):
    """Brute-force top `k` block ids over the fixture's stored embeddings (what any correct load must return)."""
    corpus = datasets.load_from_disk(os.path.join(V1_FIXTURE, "corpus")).with_format("numpy")[:]
    scores = queries @ corpus["embeddings"].T
    return corpus["block_id"][np.argsort(-scores, axis=1, kind="stable")[:, :k]].tolist()


def test_saves_from_format_1_load_identically(tmp_path):
    manifest = json.loads(open(os.path.join(V1_FIXTURE, MANIFEST_NAME)).read())
    assert manifest["format_version"] == 1 and "index_labels" not in manifest
    queries = np.random.default_rng(0).standard_normal((4, manifest["embedding_dim"])).astype(np.float32)
    k = 5
    expected = _v1_expected(queries, k)
    # Its labels are block ids, which are not row numbers there (documents were removed before it was saved): the
    # trap this format had, wrong rows or ids past the end.
    with pytest.raises(IndexError, match="out of bounds"):
        datasets_nearest(V1_FIXTURE, queries, k)
    for mmap in (True, False):
        old = RealmRetriever.from_pretrained(V1_FIXTURE, mmap=mmap)
        assert old.search(queries, k=k).block_ids.tolist() == expected
    # Changed after loading (the index re-read from its file keeps block ids), then saved in the current format.
    old.remove_documents(block_ids=[expected[0][0]])
    shutil.copytree(V1_FIXTURE, tmp_path / "v1")
    mapped = RealmRetriever.from_pretrained(tmp_path / "v1")
    mapped.remove_documents(block_ids=[expected[0][0]])
    assert torch.equal(mapped.search(queries, k=k).block_ids, old.search(queries, k=k).block_ids)
    mapped.save_pretrained(tmp_path / "v2")
    assert datasets_nearest(tmp_path / "v2", queries, k) == old.search(queries, k=k).block_ids.tolist()
    assert RealmRetriever.from_pretrained(tmp_path / "v2").search(queries, k=k).block_ids.tolist() == (
        old.search(queries, k=k).block_ids.tolist()
    )


def test_row_labels_out_of_range_are_a_clear_error(tmp_path):
    shutil.copytree(V1_FIXTURE, tmp_path / "bad")
    manifest_path = tmp_path / "bad" / MANIFEST_NAME
    manifest = json.loads(manifest_path.read_text())
    # A format-1 index (labels = block ids up to 11) declared as row-labelled for an 8-row corpus.
    manifest.update(format_version=FORMAT_VERSION, index_labels="row")
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="labels outside the corpus rows"):
        RealmRetriever.from_pretrained(tmp_path / "bad")


def test_fast_scan_ivf_index_is_saved_with_row_labels(tmp_path):
    # Fast-scan IVF-PQ (`...x4fs`, BlockInvertedLists) keeps its ids in its lists like other IVF indexes: saved with
    # corpus rows as labels (what datasets' API reads), loaded back to block ids.
    vectors = structured_vectors(2000, 16, seed=1)
    queries = structured_vectors(5, 16, seed=2)
    block_ids = np.arange(2000) * 3 + 11  # not row numbers
    retriever = RealmRetriever.from_embeddings(
        vectors, [str(i) for i in range(2000)], index="IVF8,PQ8x4fs", block_ids=block_ids
    )
    retriever.save_pretrained(tmp_path)
    assert json.loads((tmp_path / MANIFEST_NAME).read_text())["index_labels"] == "row"
    _, live = retriever.store.index.index.search(queries, 20)
    _, saved_rows = faiss.read_index(str(tmp_path / INDEX_NAME)).search(queries, 20)
    assert block_ids[saved_rows].tolist() == live.tolist()
    loaded = RealmRetriever.from_pretrained(tmp_path)
    expected = retriever.search(queries, k=5, nprobe=8, rerank_factor=10)
    assert torch.equal(loaded.search(queries, k=5, nprobe=8, rerank_factor=10).block_ids, expected.block_ids)
