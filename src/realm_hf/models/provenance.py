"""
The provenance schema of REALM answers, shared by every entry point: [`RealmForOpenQA.answer`], the
question-answering pipeline (with and without `context`) and `realm-hf ask --json`. See docs/provenance.md.

An answer is a dict with `answer`, `score` (the span's probability), `logit` (REALM's raw score), `start`, `end` and
`block`, the block dict [`block_provenance`] builds: `block_id`, `doc_id`, `title`, `text`, `retrieval_score` and
the corpus's other columns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

#: Keys every block dict has, in this order; the corpus's other columns follow.
PROVENANCE_KEYS = ("block_id", "doc_id", "title", "text", "retrieval_score")
# Never part of provenance: the stored vector, and the retrieval score under its retriever-side name (`score` is the
# answer's probability in every answer dict: one name, one meaning).
_DROPPED = ("embeddings", "score")


def block_provenance(block: Mapping[str, Any], retrieval_score: float | None = None) -> dict[str, Any]:
    r"""
    The provenance dict of one block: the one place that decides what every entry point reports about a block.

    Args:
        block (`Mapping`):
            A retrieved block as [`RealmRetriever.search`] or [`RealmForOpenQAOutput.retrieved_blocks`] give it
            (`block_id`, `title`, `text`, `score` and the corpus's other columns), or `{"text": context}` for a
            passage given by the caller (no corpus block: `block_id`, `doc_id` and `title` are `None`).
        retrieval_score (`float`, *optional*):
            The question · block inner product; defaults to the block's `score`, else 0 (a given context enters the
            reader with relevance 0).

    Returns:
        `dict` with `block_id`, `doc_id`, `title`, `text`, `retrieval_score` (`float`), then the corpus's other
        columns (e.g. `char_start`/`char_end`, the block's span in its document, and the documents' metadata; a
        corpus column named `score` is dropped, as that name is the answer's probability).
    """
    if retrieval_score is None:
        retrieval_score = block.get("score")
    block_id = block.get("block_id")
    record = {
        "block_id": None if block_id is None else int(block_id),
        "doc_id": block.get("doc_id"),
        "title": block.get("title"),
        "text": block.get("text"),
        "retrieval_score": 0.0 if retrieval_score is None else float(retrieval_score),
    }
    for key, value in block.items():
        if key not in record and key not in _DROPPED:
            record[key] = value
    return record


def answer_record(
    answer: str,
    score: float,
    logit: float | None,
    start: int | None,
    end: int | None,
    block: dict[str, Any] | None,
) -> dict[str, Any]:
    r"""
    One answer in the shared schema (key order included).

    Args:
        answer (`str`): The span, cut from `block["text"]`.
        score (`float`): The span's probability under the reader (see [`span_log_probs`]).
        logit (`float`, *optional*): REALM's raw score, span logit + retrieval score of its block.
        start, end (`int`, *optional*): Character offsets of the answer in `block["text"]` (`None` with a slow
            tokenizer, which keeps no offsets).
        block (`dict`, *optional*): From [`block_provenance`]; `None` only for "no answer".
    """
    return {"answer": answer, "score": float(score), "logit": logit, "start": start, "end": end, "block": block}


def no_answer_record(best_score: float = 0.0) -> dict[str, Any]:
    r"""
    "No answer" in the shared schema: `answer` `""`, `logit`, `start`, `end` and `block` `None`, and `score` the
    probability of the best span, which a threshold declined (0 when the reader found no span at all).

    Args:
        best_score (`float`, *optional*, defaults to 0.0): The best span's probability.
    """
    return answer_record("", score=best_score, logit=None, start=None, end=None, block=None)


def span_log_probs(logits: torch.Tensor) -> torch.Tensor:
    r"""
    Log-probabilities of the spans of one question: log-softmax of REALM's span logits (retrieval score included) over
    every span of every read block, i.e. log p(span, block | question) restricted to the retrieved blocks.

    Args:
        logits (`torch.FloatTensor` of shape `(num_blocks, num_candidates)` or flat): One question's reader logits.

    Returns:
        `torch.FloatTensor` of the same shape as `logits`; `-inf` where a span lies outside its block (masked with a
        huge negative logit: not an answer, no probability mass).
    """
    flat = logits.detach().float().reshape(-1)
    valid = flat > torch.finfo(flat.dtype).min / 2
    log_probs = torch.full_like(flat, float("-inf"))
    if bool(valid.any()):
        # masked_select / masked_scatter: the values of boolean indexing, without its index tensors (ten times the
        # time for one question's ~16,000 spans).
        log_probs = log_probs.masked_scatter(valid, torch.log_softmax(flat.masked_select(valid), dim=-1))
    return log_probs.view(logits.shape)


__all__ = ["PROVENANCE_KEYS", "answer_record", "block_provenance", "no_answer_record", "span_log_probs"]
