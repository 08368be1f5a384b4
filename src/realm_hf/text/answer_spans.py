"""
Where gold answers occur in wordpiece ids: the token positions of every occurrence in the block segment of a
`[CLS] question [SEP] block [SEP]` pair ([`find_answer_spans`], as the legacy retriever searched), and whether any
occurs in each of many blocks' ids at once ([`find_answers_in_token_ids`], the same test vectorised).
"""

from __future__ import annotations

import torch


def find_answer_spans(input_ids: list[int], answers: list[list[int]], sep_token_id: int) -> tuple[list, list]:
    """
    Token positions `(starts, ends)` of every occurrence of every answer (wordpiece ids) in the block segment of a
    `[CLS] question [SEP] block [SEP]` pair, between the first and second `[SEP]`, as the legacy retriever searched.
    """
    first_sep = input_ids.index(sep_token_id)
    try:
        second_sep = first_sep + 1 + input_ids[first_sep + 1 :].index(sep_token_id)
    except ValueError:  # the block was truncated away entirely
        second_sep = first_sep + 1
    starts, ends = [], []
    for answer in answers:
        answer = list(answer)
        width = len(answer)
        first = answer[0]
        for idx in range(first_sep + 1, second_sep):
            if input_ids[idx] == first and input_ids[idx : idx + width] == answer:
                starts.append(idx)
                ends.append(idx + width - 1)
    return starts, ends


def find_answers_in_token_ids(
    block_ids: torch.Tensor, lengths: torch.Tensor, answers: list[list[int]]
) -> torch.Tensor:
    """
    Whether any answer (wordpiece ids) occurs as a contiguous run inside the first `lengths` ids of each block:
    `find_answer_spans`' test without the pairs, vectorised over the blocks.

    Args:
        block_ids (`torch.Tensor` of shape `(n, width)`): Block ids, padded with -1 (which no answer id equals).
        lengths (`torch.LongTensor` of shape `(n,)`): Ids of each row an answer may cover.
        answers (`list[list[int]]`): The question's gold answers (non-empty, non-negative ids).

    Returns:
        `torch.BoolTensor` of shape `(n,)`.
    """
    n, width = block_ids.shape
    ids = block_ids.masked_fill(torch.arange(width, device=block_ids.device) >= lengths.unsqueeze(-1), -1)
    found = torch.zeros(n, dtype=torch.bool, device=block_ids.device)
    for answer in answers:
        size = len(answer)
        if size == 0 or size > width:
            continue
        # Starts where every answer token matches at its offset: one comparison of shifted columns per token.
        hits = ids[:, : width - size + 1] == answer[0]
        for offset in range(1, size):
            hits &= ids[:, offset : width - size + 1 + offset] == answer[offset]
        found |= hits.any(-1)
    return found


__all__ = ["find_answer_spans", "find_answers_in_token_ids"]
