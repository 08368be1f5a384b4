"""
Metadata filters of `retriever.search` (`retrieval/filters.py` and the store's filtered search): a dict of conditions
on any corpus column or a callable over a block, exact on a Flat index (checked against brute force), kept to on
approximate indexes and by hybrid BM25, named when wrong, refused by a sharded corpus.
"""

import json
import logging

import numpy as np
import pytest
import torch

from realm_hf import ShardedRealmRetriever
from realm_hf.retrieval.retriever import RealmRetriever
from tests.support.paths import CORPUS_DOCUMENTS
from tests.support.retrieval import brute_force, embed_questions, structured_vectors

TOPICS = ("islands", "machines", "food")
QUESTION_TEXTS = ["where is velmora?", "who built the steam engine?", "what do people eat on the island?"]


@pytest.fixture(scope="module")
def retriever(tokenizer, embedder):
    """The fixture corpus with two metadata columns: `topic` (three values in turn) and `year`."""
    with open(CORPUS_DOCUMENTS, encoding="utf-8") as f:
        documents = [json.loads(line) for line in f]
    for number, document in enumerate(documents):
        document["topic"] = TOPICS[number % 3]
        document["year"] = 1900 + number
    return RealmRetriever.from_documents(documents, embedder, tokenizer, max_block_length=48, show_progress=False)


def rows_of(retriever):
    """Every block as a dict (without embeddings), and the stored embeddings, in corpus row order."""
    stored = [name for name in ("embeddings", "text_token_ids") if name in retriever.corpus.column_names]
    table = retriever.corpus.remove_columns(stored).to_list()
    matrix = np.asarray(retriever.corpus.with_format("numpy")["embeddings"], dtype=np.float32)
    return table, matrix


def brute_force_among(retriever, queries, k, keep):
    """Block ids and scores of the exact top `k` among the blocks `keep(block)` accepts, `-1` / `-inf` padded."""
    table, matrix = rows_of(retriever)
    rows = np.array([i for i, block in enumerate(table) if keep(block)], dtype=np.int64)
    ids = np.full((len(queries), k), -1, dtype=np.int64)
    scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
    if len(rows):
        order, top = brute_force(queries, matrix[rows], min(k, len(rows)))
        block_ids = np.array([block["block_id"] for block in table])[rows]
        ids[:, : order.shape[1]] = block_ids[order]
        scores[:, : order.shape[1]] = top
    return ids, scores


# ---------------------------------------------------------------------------------------------------------------------
# Filters on a Flat index: exact
# ---------------------------------------------------------------------------------------------------------------------

FILTERS = {
    "one value": ({"topic": "food"}, lambda block: block["topic"] == "food"),
    "any of values": ({"topic": ["food", "islands"]}, lambda block: block["topic"] in ("food", "islands")),
    "two columns": (
        {"topic": "islands", "year": [1900, 1903, 1906, 1930]},
        lambda block: block["topic"] == "islands" and block["year"] in (1900, 1903, 1906, 1930),
    ),
    "callable on a column": ({"year": lambda year: year % 4 == 1}, lambda block: block["year"] % 4 == 1),
    "callable on a block": (
        lambda block: "island" in block["text"].lower(),
        lambda block: "island" in block["text"].lower(),
    ),
    "block ids": ({"block_id": list(range(0, 200, 7))}, lambda block: block["block_id"] % 7 == 0),
}


@pytest.mark.parametrize("name", list(FILTERS))
def test_a_filter_on_a_flat_index_gives_the_exact_top_k_of_the_matching_blocks(retriever, embedder, tokenizer, name):
    condition, keep = FILTERS[name]
    queries = embed_questions(embedder, tokenizer, QUESTION_TEXTS).numpy()
    out = retriever.search(QUESTION_TEXTS, k=6, filter=condition)
    ids, scores = brute_force_among(retriever, queries, 6, keep)
    np.testing.assert_array_equal(out.block_ids.numpy(), ids)
    np.testing.assert_allclose(out.scores.numpy(), scores, rtol=1e-5, atol=1e-5)
    assert all(keep(block) for row in out.blocks for block in row if block["block_id"] >= 0)
    # Not merely the unfiltered results cut down: the filter reaches past the unfiltered top k.
    unfiltered = set(retriever.search(QUESTION_TEXTS, k=6).block_ids.reshape(-1).tolist())
    assert set(ids.reshape(-1).tolist()) - unfiltered


def test_fewer_matching_blocks_than_k_leave_the_rest_empty_without_a_warning(retriever, caplog):
    with caplog.at_level(logging.WARNING, logger="realm_hf"):
        out = retriever.search(QUESTION_TEXTS[0], k=10, filter={"doc_id": "doc-000"})
        none = retriever.search(QUESTION_TEXTS[0], k=3, filter={"topic": "sport"})
    found = out.block_ids[0][out.block_ids[0] >= 0]
    assert 0 < len(found) < 10 and {block["doc_id"] for block in out.blocks[0][: len(found)]} == {"doc-000"}
    assert (out.block_ids[0][len(found) :] == -1).all() and torch.isinf(out.scores[0][len(found) :]).all()
    assert (none.block_ids == -1).all()
    assert "fewer than" not in caplog.text


def test_filters_name_what_is_wrong(retriever):
    with pytest.raises(ValueError, match=r"no column 'topc'.*'topic'.*Did you mean 'topic'"):
        retriever.search(QUESTION_TEXTS[0], k=2, filter={"topc": "food"})
    with pytest.raises(ValueError, match="cannot read the column 'embeddings'"):
        retriever.search(QUESTION_TEXTS[0], k=2, filter={"embeddings": 0.0})
    # No casting between numbers and text: "1901" never matches 1901.
    with pytest.raises(ValueError, match="'year' gives str values, but the column holds int64"):
        retriever.search(QUESTION_TEXTS[0], k=2, filter={"year": "1901"})
    with pytest.raises(TypeError, match="a dict of conditions"):
        retriever.search(QUESTION_TEXTS[0], k=2, filter="topic == food")


# ---------------------------------------------------------------------------------------------------------------------
# Other indexes, hybrid retrieval, sharded corpora
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vectors():
    return structured_vectors(400, 16, seed=3), structured_vectors(5, 16, seed=4)


def by_parity(index, vectors):
    corpus, _ = vectors
    texts = [f"block {i}" for i in range(len(corpus))]
    parity = ["even" if i % 2 == 0 else "odd" for i in range(len(corpus))]
    return RealmRetriever.from_embeddings(corpus, texts, index=index, metadata={"parity": parity})


def test_an_index_that_cannot_restrict_its_search_scores_every_matching_block(vectors):
    # FAISS's flat PQ search takes no id selector: the matching blocks are scored from their stored vectors, exactly.
    retriever = by_parity("PQ4x4", vectors)
    _, queries = vectors
    out = retriever.search(queries, k=5, filter={"parity": "odd"})
    ids, scores = brute_force_among(retriever, queries, 5, lambda block: block["parity"] == "odd")
    np.testing.assert_array_equal(out.block_ids.numpy(), ids)
    np.testing.assert_allclose(out.scores.numpy(), scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("index, params", [("IVF8,Flat", {"nprobe": 8}), ("HNSW16", {"efSearch": 400})])
def test_approximate_indexes_keep_to_the_filter(vectors, index, params):
    retriever = by_parity(index, vectors)
    _, queries = vectors
    out = retriever.search(queries, k=5, filter={"parity": "odd"}, **params)
    assert all(block["parity"] == "odd" for row in out.blocks for block in row)
    # Searching wide enough (every IVF list; an HNSW beam over the whole corpus), the top k is the exact one.
    ids, _ = brute_force_among(retriever, queries, 5, lambda block: block["parity"] == "odd")
    np.testing.assert_array_equal(out.block_ids.numpy(), ids)


def test_hybrid_search_keeps_bm25_candidates_to_the_filter(retriever, embedder, tokenizer):
    hybrid = RealmRetriever.from_store(retriever.store, tokenizer).use_bm25(sparse_k=8)
    hybrid.question_embedder = embedder
    out = hybrid.search(QUESTION_TEXTS, k=4, filter={"topic": "machines"})
    assert all(block["topic"] == "machines" for row in out.blocks for block in row if block["block_id"] >= 0)
    unfiltered = hybrid.search(QUESTION_TEXTS, k=4)
    assert any(block["topic"] != "machines" for row in unfiltered.blocks for block in row)
    # Texts given as the query are the texts of the hybrid search.
    queries = embed_questions(embedder, tokenizer, QUESTION_TEXTS)
    assert torch.equal(unfiltered.block_ids, hybrid.search(queries, k=4, questions=QUESTION_TEXTS).block_ids)


def test_a_sharded_corpus_refuses_filters(retriever):
    sharded = ShardedRealmRetriever.from_retriever(retriever, num_shards=2)
    with pytest.raises(ValueError, match=r"A sharded corpus cannot filter.*to_retriever"):
        sharded.search(QUESTION_TEXTS, k=3, filter={"topic": "food"})
