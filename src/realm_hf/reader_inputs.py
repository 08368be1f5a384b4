"""Reader inputs: pair each question with its retrieved blocks and locate gold answer spans in them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .tokenization_realm import tokenizer_call


@dataclass
class RealmReaderInputs:
    """
    Tokenized `[CLS] question [SEP] block [SEP]` pairs for a batch of questions, each with `k` retrieved blocks.

    Args:
        input_ids, attention_mask, token_type_ids (`torch.LongTensor` of shape `(batch_size, k, seq_len)`):
            The reader's inputs.
        block_mask (`torch.BoolTensor` of shape `(batch_size, k, seq_len)`):
            True on the block's own wordpieces (the only tokens an answer span may cover).
        offset_mapping (`torch.LongTensor` of shape `(batch_size, k, seq_len, 2)`, *optional*):
            Character offsets of each token in its segment (only when the tokenizer is a fast tokenizer).
        has_answers (`torch.BoolTensor` of shape `(batch_size, k)`, *optional*):
            Whether a gold answer occurs in the block.
        start_positions, end_positions (`torch.LongTensor` of shape `(batch_size, k, max_answers)`, *optional*):
            Token positions of every gold answer occurrence in the block, padded with -1.
    """

    input_ids: torch.LongTensor
    attention_mask: torch.LongTensor
    token_type_ids: torch.LongTensor
    block_mask: torch.BoolTensor
    offset_mapping: torch.LongTensor | None = None
    has_answers: torch.BoolTensor | None = None
    start_positions: torch.LongTensor | None = None
    end_positions: torch.LongTensor | None = None

    def to(self, device) -> RealmReaderInputs:
        """Move every tensor to `device`."""
        moved = {
            name: (value.to(device) if isinstance(value, torch.Tensor) else value)
            for name, value in self.__dict__.items()
        }
        return RealmReaderInputs(**moved)


def normalize_answer_ids(answer_ids, batch_size: int) -> list[list[list[int]]] | None:
    """
    Bring `answer_ids` to the batched form `[question][answer][token]`.

    The legacy `RealmForOpenQA` took the answers of its single question as `[answer][token]`; that form is still
    accepted when `batch_size == 1`.
    """
    if answer_ids is None:
        return None
    if isinstance(answer_ids, torch.Tensor):
        answer_ids = answer_ids.tolist()
    answer_ids = list(answer_ids)
    if batch_size == 1 and answer_ids and answer_ids[0] and isinstance(answer_ids[0][0], int):
        answer_ids = [answer_ids]
    if len(answer_ids) != batch_size:
        raise ValueError(
            f"`answer_ids` has answers for {len(answer_ids)} questions but the batch has {batch_size}: pass one list "
            "of answers (each a list of token ids) per question."
        )
    # -1 padding (as in the legacy docs) never matches a token; drop it so answers stay exact token sequences.
    return [
        [[t for t in answer if t >= 0] for answer in answers if any(t >= 0 for t in answer)] for answers in answer_ids
    ]


def tokenize_answers(tokenizer, answers: Sequence[Sequence[str]]) -> list[list[list[int]]]:
    """Tokenize gold answer strings (`[question][answer]`) into wordpiece ids without special tokens."""
    return [
        [ids for ids in tokenizer_call(tokenizer, list(golds), add_special_tokens=False)["input_ids"] if ids]
        if golds
        else []
        for golds in answers
    ]


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


def build_reader_inputs(
    tokenizer,
    questions: Sequence[str],
    block_texts: Sequence[Sequence[str]],
    answer_ids: list[list[list[int]]] | None = None,
    max_length: int | None = None,
    return_offsets_mapping: bool = False,
) -> RealmReaderInputs:
    """
    Tokenize every (question, block) pair of a batch in one call and, when answers are given, mark where they occur.

    Pairs are built exactly as the legacy `RealmRetriever` built them (`tokenizer(question, block, truncation=True,
    max_length=reader_seq_len)`), so a legacy reader sees the same inputs; all `batch_size * k` pairs are padded to
    one length.

    Args:
        tokenizer: A BERT WordPiece tokenizer.
        questions (`list[str]`): One question per batch element.
        block_texts (`list[list[str]]`): The `k` retrieved block texts of each question.
        answer_ids (`list[list[list[int]]]`, *optional*): Gold answers of each question as wordpiece ids.
        max_length (`int`, *optional*): Truncation length of a pair (`config.reader_seq_len`).
        return_offsets_mapping (`bool`): Also return character offsets (fast tokenizers only).

    Returns:
        [`RealmReaderInputs`]
    """
    if len(questions) != len(block_texts):
        raise ValueError(f"Got {len(questions)} questions but block lists for {len(block_texts)}.")
    batch_size = len(questions)
    k = len(block_texts[0]) if batch_size else 0
    if any(len(blocks) != k for blocks in block_texts):
        raise ValueError("Every question must come with the same number of retrieved blocks.")
    text = [question for question in questions for _ in range(k)]
    text_pair = [block for blocks in block_texts for block in blocks]
    encoded = tokenizer_call(
        tokenizer,
        text,
        text_pair,
        padding=True,
        truncation=True,
        max_length=max_length,
        return_special_tokens_mask=True,
        return_token_type_ids=True,
        return_offsets_mapping=return_offsets_mapping,
    )
    input_ids = torch.tensor(encoded["input_ids"], dtype=torch.long)
    token_type_ids = torch.tensor(encoded["token_type_ids"], dtype=torch.long)
    special = torch.tensor(encoded["special_tokens_mask"], dtype=torch.bool)
    block_mask = ~special & token_type_ids.bool()
    seq_len = input_ids.shape[-1]

    def grid(tensor):
        return tensor.view(batch_size, k, seq_len, *tensor.shape[2:])

    outputs = RealmReaderInputs(
        input_ids=grid(input_ids),
        attention_mask=grid(torch.tensor(encoded["attention_mask"], dtype=torch.long)),
        token_type_ids=grid(token_type_ids),
        block_mask=grid(block_mask),
        offset_mapping=grid(torch.tensor(encoded["offset_mapping"], dtype=torch.long))
        if return_offsets_mapping
        else None,
    )
    if answer_ids is None:
        return outputs

    has_answers, all_starts, all_ends = [], [], []
    for row, ids in enumerate(encoded["input_ids"]):
        starts, ends = find_answer_spans(list(ids), answer_ids[row // k], tokenizer.sep_token_id)
        has_answers.append(bool(starts))
        all_starts.append(starts)
        all_ends.append(ends)
    max_answers = max(1, max(len(s) for s in all_starts))
    pad = [-1] * max_answers
    outputs.has_answers = torch.tensor(has_answers, dtype=torch.bool).view(batch_size, k)
    outputs.start_positions = torch.tensor([(s + pad)[:max_answers] for s in all_starts]).view(
        batch_size, k, max_answers
    )
    outputs.end_positions = torch.tensor([(e + pad)[:max_answers] for e in all_ends]).view(batch_size, k, max_answers)
    return outputs
