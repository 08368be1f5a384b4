"""Answers of the REALM question-answering pipeline: the best distinct spans across the blocks read for a question."""

from __future__ import annotations

import re

import torch

from ..provenance import answer_record, span_log_probs


def _normalize_text(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().casefold()


def _align_to_words(text: str, start: int, end: int) -> tuple[int, int]:
    """Widen the characters `[start, end)` of `text` to whole words (a wordpiece span may start or end in one)."""
    # Words as BERT's pre-tokenizer cuts them: runs of letters and digits; spaces and punctuation end a word.
    while start > 0 and text[start - 1].isalnum() and text[start].isalnum():
        start -= 1
    while end < len(text) and text[end].isalnum() and text[end - 1].isalnum():
        end += 1
    return start, end


def _best_spans(result: dict, top_k: int, max_answer_len: int, tokenizer, align_to_words: bool = False) -> list[dict]:
    """
    The `top_k` best spans across the read blocks of one question, with distinct texts, best first; widened to whole
    words with `align_to_words` (which needs character offsets: a fast tokenizer).
    """
    logits = result["logits"]  # [num_blocks, num_candidates]
    starts, ends = result["starts"], result["ends"]
    num_candidates = logits.shape[-1]
    flat = logits.reshape(-1)
    # Spans outside a block carry a huge negative mask; they are not answers and take no probability mass.
    log_probs = span_log_probs(flat)
    valid = log_probs > float("-inf")
    if not bool(valid.any()):
        return []
    widths = (ends - starts + 1).repeat(logits.shape[0])
    eligible = valid & (widths <= max_answer_len)
    order = torch.argsort(torch.where(eligible, flat, torch.full_like(flat, float("-inf"))), descending=True)
    answers, seen = [], set()
    for index in order.tolist():
        if not bool(eligible[index]) or len(answers) >= top_k:
            break
        row, candidate = divmod(index, num_candidates)
        start, end = int(starts[candidate]), int(ends[candidate])
        if result["offsets"] is not None:
            char_start = int(result["offsets"][row, start, 0])
            char_end = int(result["offsets"][row, end, 1])
            if align_to_words:
                char_start, char_end = _align_to_words(result["texts"][row], char_start, char_end)
            text = result["texts"][row][char_start:char_end]
        else:  # slow tokenizer: no offsets, decode the wordpieces
            char_start = char_end = None
            text = tokenizer.decode(result["input_ids"][row, start : end + 1])
        key = _normalize_text(text)
        if not key or key in seen:
            continue
        seen.add(key)
        answers.append(
            answer_record(
                text,
                score=float(log_probs[index].exp()),
                logit=float(flat[index]),
                start=char_start,
                end=char_end,
                block=dict(result["blocks"][row]),
            )
        )
    return answers
