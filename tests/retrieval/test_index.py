"""Approximate FAISS indexes (`realm_hf.retrieval.index`): recall against exact search, per-call search parameters,
and re-ranking by exact inner products read from the corpus in bounded pieces."""

import faiss
import numpy as np
import pytest
import torch

from realm_hf.retrieval import faiss_ops
from realm_hf.retrieval.retriever import RealmRetriever
from tests.support.retrieval import PROJ, brute_force, structured_vectors


@pytest.mark.parametrize(
    "factory,params,floor",
    [
        ("HNSW32", {"efSearch": 64}, 0.95),
        ("IVF32,Flat", {"nprobe": 8}, 0.9),
        ("IVF32,SQ8", {"nprobe": 8}, 0.9),
        # 4-bit PQ codes are coarse: re-ranking 4k candidates by exact inner product is what makes them usable.
        ("IVF32,PQ16x4", {"nprobe": 8, "rerank_factor": 4}, 0.6),
    ],
)
def test_approximate_index_recall(factory, params, floor):
    vectors = structured_vectors(6000, PROJ, seed=1)
    queries = structured_vectors(200, PROJ, seed=2)
    texts = [f"block {i}" for i in range(len(vectors))]
    exact = RealmRetriever.from_embeddings(vectors, texts)
    approx = RealmRetriever.from_embeddings(vectors, texts, index=factory)
    truth = exact.search(queries, k=5, return_blocks=False).block_ids.numpy()
    found = approx.search(queries, k=5, return_blocks=False, **params).block_ids.numpy()
    recall = np.mean([len(set(t) & set(f)) / 5 for t, f in zip(truth, found)])
    assert recall >= floor, f"{factory} recall@5 {recall:.3f}"
    if "rerank_factor" in params:
        plain = approx.search(queries, k=5, return_blocks=False, nprobe=params["nprobe"]).block_ids.numpy()
        assert np.mean([len(set(t) & set(f)) / 5 for t, f in zip(truth, plain)]) < recall
    # Parameters apply to one call only.
    name = next(iter(params))
    default = faiss_ops.get_search_param(approx.store.index.index, name)
    assert default != params[name]
    approx.search(queries[:2], k=5, **params)
    assert faiss_ops.get_search_param(approx.store.index.index, name) == default
    # Scores are exact inner products (compressed codes are re-scored with the stored vectors).
    out = approx.search(queries[:3], k=5, **params)
    rescored = torch.einsum("bd,bkd->bk", torch.from_numpy(queries[:3]), approx.store.embeddings(out.block_ids))
    torch.testing.assert_close(out.scores, rescored, atol=1e-4, rtol=1e-5)


def test_ivf_pq_rerank_is_exact_top_k_and_reads_vectors_in_pieces(monkeypatch):
    # The 1 GB paper-scale setup (bench/search.py): IVF-PQ codes with block ids in the lists (no IDMap), candidates
    # re-scored from the corpus's memory-mapped embeddings. Probing every list and re-scoring every block is exact.
    from realm_hf.retrieval import corpus as corpus_module

    vectors = structured_vectors(3000, PROJ, seed=1)
    queries = structured_vectors(40, PROJ, seed=2)
    texts = [f"block {i}" for i in range(len(vectors))]
    approx = RealmRetriever.from_embeddings(vectors, texts, index="IVF16,PQ8", block_ids=np.arange(3000) * 2 + 5)
    # Ids in the lists: 8 bytes, not 16.
    assert type(faiss.downcast_index(approx.store.index.index)).__name__ == "IndexIVFPQ"
    assert approx.store.corpus.dataset.cache_files  # the stored vectors are a memory-mapped file, not anonymous memory
    gathered = []
    gather = corpus_module.BlockCorpus._gather

    def spy(self, column, rows):
        if column == "embeddings":
            gathered.append(len(rows))
        return gather(self, column, rows)

    monkeypatch.setattr(corpus_module.BlockCorpus, "_gather", spy)
    out = approx.search(queries, k=5, return_blocks=False, nprobe=16, rerank_factor=len(vectors))
    order, scores = brute_force(queries, vectors, 5)
    assert out.block_ids.tolist() == (order * 2 + 5).tolist()
    np.testing.assert_allclose(out.scores.numpy(), scores, rtol=1e-5, atol=1e-4)
    # 40 x 3000 candidates are read a bounded number of rows at a time (Arrow's pool keeps what one take allocated).
    assert sum(gathered) == 40 * 3000 and max(gathered) <= corpus_module.GATHER_ROWS < 40 * 3000
