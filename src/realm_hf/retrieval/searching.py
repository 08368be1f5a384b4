"""Searching a retriever: question checks, one FAISS call and the block lookups under its lock, PQ/SQ re-scoring."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from transformers.utils import ModelOutput

from ..logging_utils import get_logger
from ..text_inputs import check_positive_int
from .corpus import as_id_array, pad_token_ids
from .encoding import tokenize_block_texts
from .index import get_search_param, is_exact, normalize_search_params

if TYPE_CHECKING:
    from .retriever import RealmRetriever

logger = get_logger(__name__)


@dataclass
class RealmSearchOutput(ModelOutput):
    """
    Output of [`RealmRetriever.search`].

    Args:
        block_ids (`torch.LongTensor` of shape `(batch_size, k)`):
            Corpus ids of the retrieved blocks, best first. `-1` where an approximate index found fewer than `k`
            blocks (raise `nprobe`/`efSearch`; the logged warning names the cause).
        scores (`torch.FloatTensor` of shape `(batch_size, k)`):
            Inner products question · block, descending (`-inf` for missing results). For compressed indexes
            (PQ, SQ) the candidates are re-scored with the stored float32 block embeddings, so the scores are
            always exact inner products, the numbers the model's own einsum reproduces.
        blocks (`list[list[dict]]`):
            For each question, the `k` blocks as dicts with `block_id`, `title`, `text`, `score` and the corpus's
            metadata columns (e.g. `doc_id`).
        block_embeddings (`torch.FloatTensor` of shape `(batch_size, k, dim)`, *optional*):
            The stored embeddings of the retrieved blocks (zeros for `-1`), from the same state of the corpus as
            `block_ids`, when asked for with `return_embeddings=True` (what the model re-scores them with).
    """

    block_ids: torch.LongTensor | None = None
    scores: torch.FloatTensor | None = None
    blocks: list[list[dict]] | None = None
    block_embeddings: torch.FloatTensor | None = None


def search(
    retriever: RealmRetriever,
    question_embeddings,
    k: int,
    return_blocks: bool,
    rerank_factor: int,
    search_params,
    return_embeddings: bool = False,
) -> RealmSearchOutput:
    """[`RealmRetriever.search`]."""
    queries = as_query_matrix(question_embeddings)
    check_finite_queries(queries)
    k = check_positive_int(k, "k")
    params = normalize_search_params(search_params)
    # One lock for the whole call: an update or index swap never lands between the FAISS search and the lookups, so
    # ids, scores, blocks and stored embeddings all come from one state of the corpus and index.
    with retriever._lock:
        check_query_shape(retriever, queries, k)
        exact = is_exact(retriever.index)
        fetch = k if exact else min(retriever.num_blocks, k * max(1, int(rerank_factor)))
        scores, ids = retriever._index.search(queries, fetch, params)
        return finish_search(retriever, queries, scores, ids, k, exact, return_blocks, return_embeddings)


def as_query_matrix(question_embeddings) -> np.ndarray:
    """Question embeddings as a contiguous `(batch_size, dim)` float32 CPU array (one vector becomes a batch of one)."""
    if isinstance(question_embeddings, torch.Tensor):
        question_embeddings = question_embeddings.detach().to("cpu", torch.float32).numpy()
    queries = np.ascontiguousarray(np.asarray(question_embeddings, dtype=np.float32))
    if queries.ndim == 1:
        queries = queries[None]
    if queries.ndim != 2:
        raise ValueError(f"question_embeddings must have shape (batch_size, dim); got {queries.shape}.")
    return queries


def check_finite_queries(queries: np.ndarray) -> None:
    """Refuse NaN/inf question embeddings: FAISS would answer them with no block at all (ids -1)."""
    bad = ~np.isfinite(queries).all(axis=1)
    if bad.any():
        raise ValueError(
            f"{int(bad.sum())} of {len(queries)} question embeddings contain NaN or inf (rows "
            f"{np.flatnonzero(bad)[:10].tolist()}): the question embedder's weights have diverged (NaN/inf after "
            "training: lower the learning rate, resume from an earlier checkpoint) or its activations overflowed in "
            "fp16 (run it in fp32 or bf16)."
        )


def check_query_shape(retriever: RealmRetriever, queries: np.ndarray, k: int) -> None:
    """Refuse question embeddings of another dimension and a `k` above the corpus size (the caller holds the lock)."""
    if queries.shape[1] != retriever.embedding_dim:
        raise ValueError(
            f"Question embeddings have dimension {queries.shape[1]}, but this corpus was built with an embedder "
            f"of projection size {retriever.embedding_dim} (retriever_proj_size={retriever.embedding_dim}). Use the "
            "embedder that built the corpus, or re-embed it with `retriever.embed_corpus(embedder)`."
        )
    if k > retriever.num_blocks:
        raise ValueError(
            f"k={k} is larger than the number of blocks in the corpus ({retriever.num_blocks}): ask for at most "
            f"{retriever.num_blocks}."
        )


def finish_search(
    retriever: RealmRetriever, queries, scores, ids, k, exact, return_blocks, return_embeddings=False
) -> RealmSearchOutput:
    """
    Re-score compressed-index candidates, mark missing results and look the blocks (and, if asked, their stored
    embeddings) up. The caller holds the lock.
    """
    ids = ids.astype(np.int64, copy=False)
    if not exact:
        # Compressed codes give approximate scores: re-score with the stored float32 vectors.
        scores = rescore(retriever, queries, ids)
        scores[ids < 0] = -np.inf
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        ids = np.take_along_axis(ids, order, axis=1)
        scores = np.take_along_axis(scores, order, axis=1)
    missing = ids < 0
    if missing.any():
        scores = np.where(missing, -np.inf, scores)
        warn_missing_results(retriever, k, int(missing.any(axis=1).sum()))
    scores = np.ascontiguousarray(scores, dtype=np.float32)
    blocks = None
    if return_blocks:
        blocks = retriever._corpus.blocks(ids)
        for row_blocks, row_scores in zip(blocks, scores.tolist()):
            for block, score in zip(row_blocks, row_scores):
                block["score"] = score
    embeddings = None
    if return_embeddings:
        embeddings = torch.from_numpy(retriever._corpus.embeddings(ids, retriever.embedding_dim))
    return RealmSearchOutput(
        block_ids=torch.from_numpy(ids), scores=torch.from_numpy(scores), blocks=blocks, block_embeddings=embeddings
    )


# Candidate vectors re-scored per step: bounds the `[questions, candidates, dim]` float32 buffer (16 MB at 128-d)
# however many questions and candidates one search has.
RERANK_ROWS = 32_768


def rescore(retriever: RealmRetriever, queries: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """
    Exact inner products of `queries` `[batch, dim]` with the stored embeddings of their candidates `ids`
    `[batch, n]`, read from the corpus (memory-mapped: the OS pages the vectors in, the index keeps only codes) a few
    questions at a time.
    """
    scores = np.empty(ids.shape, dtype=np.float32)
    step = max(1, RERANK_ROWS // max(1, ids.shape[1]))
    for start in range(0, len(ids), step):
        part = slice(start, start + step)
        vectors = retriever._corpus.embeddings(ids[part], retriever.embedding_dim)
        scores[part] = np.einsum("bd,bkd->bk", queries[part], vectors)
    return scores


def warn_missing_results(retriever: RealmRetriever, k: int, num_questions: int) -> None:
    """Say why an index returned fewer than `k` blocks; the nprobe/efSearch hint only where those are the cause."""
    tunable = [name for name in ("nprobe", "efSearch") if get_search_param(retriever.index, name) is not None]
    if tunable:
        cause = "The search visited too few candidates: raise " + " or ".join(f"`{name}`" for name in tunable) + "."
    else:
        # Exhaustive indexes score every stored vector: only non-finite stored vectors (refused since they were
        # written, but possible in an index saved by an older version or corrupted) drop results.
        cause = (
            "This index scores every stored vector, so its stored vectors must be NaN/inf or corrupt: rebuild it "
            "(`retriever.embed_corpus(embedder)`) with an embedder whose outputs are finite."
        )
    logger.warning(
        "The %s index returned fewer than k=%d blocks for %d question(s); missing results have block id -1. %s",
        retriever.index_type,
        k,
        num_questions,
        cause,
    )


def block_token_ids(retriever: RealmRetriever, block_ids) -> tuple[torch.Tensor, torch.LongTensor]:
    """[`RealmRetriever.get_block_token_ids`]."""
    ids_array = as_id_array(block_ids)
    corpus = retriever._corpus  # one snapshot for both lookups (changes replace the corpus object, never edit it)
    if corpus.has_token_ids:
        ids, lengths, missing = corpus.token_ids(ids_array)
    else:
        ids, lengths, missing = None, None, np.ones(ids_array.size, dtype=bool)
    if missing.any():
        if retriever.tokenizer is None:
            raise ValueError("This corpus stores no token ids and the retriever has no tokenizer: set one.")
        texts = corpus.texts(ids_array.reshape(-1)[missing])
        fresh, fresh_lengths = pad_token_ids(tokenize_block_texts(retriever.tokenizer, texts))
        if ids is None:
            ids, lengths = fresh, fresh_lengths
        else:
            width = max(ids.shape[1], fresh.shape[1])
            ids = np.pad(ids, ((0, 0), (0, width - ids.shape[1])), constant_values=-1)
            ids[np.flatnonzero(missing), : fresh.shape[1]] = fresh
            lengths[missing] = fresh_lengths
    shape = tuple(ids_array.shape)
    return torch.from_numpy(ids).view(*shape, ids.shape[1]), torch.from_numpy(lengths).view(shape)
