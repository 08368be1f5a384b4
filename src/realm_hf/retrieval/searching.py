"""Searching a retriever: question checks, one FAISS call and the block lookups under its lock, PQ/SQ re-scoring."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from transformers.utils import ModelOutput

from .index import is_exact, normalize_search_params

if TYPE_CHECKING:
    from .retriever import RealmRetriever

logger = logging.getLogger(__name__)


@dataclass
class RealmSearchOutput(ModelOutput):
    """
    Output of [`RealmRetriever.search`].

    Args:
        block_ids (`torch.LongTensor` of shape `(batch_size, k)`):
            Corpus ids of the retrieved blocks, best first. `-1` where an approximate index found fewer than `k`
            blocks (raise `nprobe`/`efSearch`).
        scores (`torch.FloatTensor` of shape `(batch_size, k)`):
            Inner products question · block, descending (`-inf` for missing results). For compressed indexes
            (PQ, SQ) the candidates are re-scored with the stored float32 block embeddings, so the scores are
            always exact inner products, the numbers the model's own einsum reproduces.
        blocks (`list[list[dict]]`):
            For each question, the `k` blocks as dicts with `block_id`, `title`, `text`, `score` and the corpus's
            metadata columns (e.g. `doc_id`).
    """

    block_ids: torch.LongTensor | None = None
    scores: torch.FloatTensor | None = None
    blocks: list[list[dict]] | None = None


def search(
    retriever: RealmRetriever, question_embeddings, k: int, return_blocks: bool, rerank_factor: int, search_params
) -> RealmSearchOutput:
    """[`RealmRetriever.search`]."""
    if isinstance(question_embeddings, torch.Tensor):
        question_embeddings = question_embeddings.detach().to("cpu", torch.float32).numpy()
    queries = np.ascontiguousarray(np.asarray(question_embeddings, dtype=np.float32))
    if queries.ndim == 1:
        queries = queries[None]
    if queries.ndim != 2:
        raise ValueError(f"question_embeddings must have shape (batch_size, dim); got {queries.shape}.")
    if queries.shape[1] != retriever.embedding_dim:
        raise ValueError(
            f"Question embeddings have dimension {queries.shape[1]}, but this corpus was built with an embedder "
            f"of projection size {retriever.embedding_dim} (retriever_proj_size={retriever.embedding_dim}). Use the "
            "embedder that built the corpus, or re-embed it with `retriever.embed_corpus(embedder)`."
        )
    k = int(k)
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}.")
    if k > retriever.num_blocks:
        raise ValueError(
            f"k={k} is larger than the number of blocks in the corpus ({retriever.num_blocks}): ask for at most "
            f"{retriever.num_blocks}."
        )
    params = normalize_search_params(search_params)
    # One lock for the whole call: an update or index swap never lands between the FAISS search and the lookups.
    with retriever._lock:
        exact = is_exact(retriever.index)
        fetch = k if exact else min(retriever.num_blocks, k * max(1, int(rerank_factor)))
        scores, ids = retriever._index.search(queries, fetch, params)
        return finish_search(retriever, queries, scores, ids, k, exact, return_blocks)


def finish_search(retriever: RealmRetriever, queries, scores, ids, k, exact, return_blocks) -> RealmSearchOutput:
    """Re-score compressed-index candidates, mark missing results and look the blocks up (the caller holds the lock)."""
    ids = ids.astype(np.int64, copy=False)
    if not exact:
        # Compressed codes give approximate scores: re-score with the stored float32 vectors.
        scores = np.einsum("bd,bkd->bk", queries, retriever._corpus.embeddings(ids, retriever.embedding_dim))
        scores[ids < 0] = -np.inf
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        ids = np.take_along_axis(ids, order, axis=1)
        scores = np.take_along_axis(scores, order, axis=1)
    missing = ids < 0
    if missing.any():
        scores = np.where(missing, -np.inf, scores)
        logger.warning(
            "The %s index returned fewer than k=%d blocks for %d question(s); missing results have block id -1. "
            "Raise `nprobe` (IVF) or `efSearch` (HNSW).",
            retriever.index_type,
            k,
            int(missing.any(axis=1).sum()),
        )
    scores = np.ascontiguousarray(scores, dtype=np.float32)
    blocks = None
    if return_blocks:
        blocks = retriever._corpus.blocks(ids)
        for row_blocks, row_scores in zip(blocks, scores.tolist()):
            for block, score in zip(row_blocks, row_scores):
                block["score"] = score
    return RealmSearchOutput(block_ids=torch.from_numpy(ids), scores=torch.from_numpy(scores), blocks=blocks)
