"""Reader inputs: pair each question with its retrieved blocks and locate gold answer spans in them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..logging_utils import warn
from ..text.answer_spans import find_answer_spans, find_answers_in_token_ids
from ..text.tokenizer_calls import tokenizer_call


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


def truncated_pair_lengths(
    question_lengths: torch.Tensor, block_lengths: torch.Tensor, max_length: int, num_special_tokens: int = 3
) -> tuple[torch.Tensor, torch.Tensor]:
    """
    The wordpieces of question and block that a `(question, block)` pair keeps under `truncation=True` (longest
    first) at `max_length`, as 🤗 Tokenizers truncates a pair (right side): when both are too long they share the
    budget (the second gets the odd one), else the longer is cut to what the shorter leaves. Broadcasts.

    Args:
        question_lengths, block_lengths (`torch.LongTensor`): Wordpieces of each segment, special tokens excluded.
        max_length (`int`): The pair's length limit (`config.reader_seq_len`).
        num_special_tokens (`int`, defaults to 3): `[CLS]`, `[SEP]`, `[SEP]`.

    Returns:
        `(question_kept, block_kept)`, broadcast to a common shape.
    """
    q, b = torch.broadcast_tensors(question_lengths.long(), block_lengths.long())
    budget = max_length - num_special_tokens
    shorter = torch.minimum(q, b)
    # Only the longer one is cut, to what the shorter one leaves; if that is not enough, both get half.
    longer_kept = torch.where(shorter > budget, shorter, torch.clamp(budget - shorter, min=0).maximum(shorter))
    both = shorter + longer_kept > budget
    shorter_kept = torch.where(both, torch.full_like(q, budget // 2), shorter)
    longer_kept = torch.where(both, torch.full_like(q, budget // 2 + budget % 2), longer_kept)
    swap = q > b  # 🤗 Tokenizers orders by length; on a tie the question is the "shorter" (first) one
    q_kept = torch.where(swap, longer_kept, shorter_kept)
    b_kept = torch.where(swap, shorter_kept, longer_kept)
    fits = q + b <= budget
    return torch.where(fits, q, q_kept), torch.where(fits, b, b_kept)


def build_reader_inputs(
    tokenizer,
    questions: Sequence[str],
    block_texts: Sequence[Sequence[str]],
    answer_ids: list[list[list[int]]] | None = None,
    max_length: int | None = None,
    return_offsets_mapping: bool = False,
    pad_to_length: int | None = None,
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
        pad_to_length (`int`, *optional*): Pad to this length instead of the longest pair (at least that long), with
            the tokenizer's padding values: the length the pairs of a larger beam would have been padded to.

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
    if pad_to_length is not None:
        encoded = _pad_encoding(tokenizer, encoded, pad_to_length)
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


def build_beam_reader_inputs(
    tokenizer,
    questions: Sequence[str],
    search,
    answer_ids: list[list[list[int]]] | None,
    max_length: int | None,
    reader_beam_size: int,
    return_offsets_mapping: bool = False,
) -> RealmReaderInputs:
    """
    Reader inputs for the first `reader_beam_size` of the `k` blocks retrieved per question, and whether each of the
    `k` blocks holds an answer: what [`build_reader_inputs`] gives for all `k` pairs (its `[:, :reader_beam_size]`
    rows, padded to the same length; `has_answers` for all `k`), without tokenizing the `k - reader_beam_size` pairs
    that are never read.

    The blocks' wordpiece ids come from the search (`return_token_ids=True`: stored when the corpus was built).
    An answer counts where [`find_answer_spans`] would find it in the pair: inside the part of the block the pair keeps
    after truncation ([`truncated_pair_lengths`]), before any `[SEP]`. The pairs that are read are checked against
    the stored ids (layout, truncation, the ids themselves, the answers found); if they disagree (e.g. the tokenizer
    changed since the corpus was built) every pair is tokenized, with a warning. So are the inputs this shortcut does
    not cover: `k <= reader_beam_size`, non-🤗-Tokenizers tokenizers, left truncation or padding, a pair template other
    than `[CLS] A [SEP] B [SEP]`, `[SEP]` in a question or answer, and searches without token ids.

    Args:
        tokenizer: The retriever's BERT WordPiece tokenizer.
        questions (`list[str]`): One question per batch element.
        search ([`RealmSearchOutput`]): The retrieved blocks (`block_ids` of shape `(batch_size, k)`, best first, and
            their `blocks`) and, for the shortcut, their `block_token_ids` / `block_token_lengths`.
        answer_ids (`list[list[list[int]]]`, *optional*): Gold answers of each question as wordpiece ids.
        max_length (`int`, *optional*): Truncation length of a pair (`config.reader_seq_len`).
        reader_beam_size (`int`): Blocks read per question.
        return_offsets_mapping (`bool`): Also return character offsets (fast tokenizers only).

    Returns:
        [`RealmReaderInputs`] with `reader_beam_size` rows per question, and `has_answers` of shape `(batch_size, k)`.
    """
    batch_size, k = search.block_ids.shape
    read = min(reader_beam_size, k)
    block_texts = [[block["text"] for block in row] for row in search.blocks]

    def every_pair():
        return build_reader_inputs(tokenizer, questions, block_texts, answer_ids, max_length, return_offsets_mapping)

    sep = getattr(tokenizer, "sep_token_id", None)
    if search.block_token_ids is None or not _token_ids_shortcut_applies(tokenizer, k, read, max_length, answer_ids):
        return every_pair()
    question_ids = tokenizer_call(tokenizer, list(questions), add_special_tokens=False, verbose=False)["input_ids"]
    if any(sep in ids for ids in question_ids):
        return every_pair()
    tokens, lengths = search.block_token_ids, search.block_token_lengths
    tokens, lengths = tokens.to(torch.long), lengths.to(torch.long)
    question_lengths = torch.tensor([len(ids) for ids in question_ids], dtype=torch.long).unsqueeze(-1)
    num_special = tokenizer.num_special_tokens_to_add(pair=True)
    question_kept, block_kept = truncated_pair_lengths(question_lengths, lengths, max_length, num_special)
    # The length all k pairs would have been padded to: the reader's span candidates depend on it.
    seq_len = int((question_kept + block_kept).max()) + num_special
    inputs = build_reader_inputs(
        tokenizer,
        questions,
        [row[:read] for row in block_texts],
        answer_ids,
        max_length,
        return_offsets_mapping,
        pad_to_length=seq_len,
    )
    consistent = _pairs_match_token_ids(
        tokenizer, inputs, question_ids, tokens[:, :read], question_kept[:, :read], block_kept[:, :read]
    )
    has_answers = None
    if consistent and answer_ids is not None:
        # find_answer_spans searches the block's kept ids up to the next [SEP] (one written in the text included).
        width = tokens.shape[-1]
        positions = torch.arange(width).expand_as(tokens)
        first_sep = torch.where(tokens == sep, positions, width).amin(-1) if width else torch.zeros_like(lengths)
        searchable = torch.minimum(block_kept, first_sep)
        has_answers = torch.stack(
            [find_answers_in_token_ids(tokens[b], searchable[b], answer_ids[b]) for b in range(batch_size)]
        )
        consistent = torch.equal(has_answers[:, :read], inputs.has_answers)
    if not consistent:
        warn(
            "The token ids stored with the corpus do not match what the tokenizer makes of the retrieved blocks "
            "(was the tokenizer changed after the corpus was built?): tokenizing every question/block pair of the "
            "searcher beam instead, which is slow. Rebuild the corpus with this tokenizer.",
            stacklevel=3,
        )
        return every_pair()
    if has_answers is not None:
        inputs.has_answers = has_answers
    return inputs


def _token_ids_shortcut_applies(tokenizer, k, read, max_length, answer_ids) -> bool:
    if read >= k or max_length is None:
        return False
    if not getattr(tokenizer, "is_fast", False) or tokenizer.cls_token_id is None or tokenizer.sep_token_id is None:
        return False
    if (
        getattr(tokenizer, "truncation_side", "right") != "right"
        or getattr(tokenizer, "padding_side", "right") != "right"
    ):
        return False
    if tokenizer.num_special_tokens_to_add(pair=True) != 3:
        return False
    sep = tokenizer.sep_token_id
    # An answer holding [SEP] could match across the block's end in the pair: only the pairs tell.
    return not any(sep in answer for answers in answer_ids or [] for answer in answers)


def _pairs_match_token_ids(tokenizer, inputs, question_ids, tokens, question_kept, block_kept) -> bool:
    """Every read pair is `[CLS] question[:q] [SEP] stored block ids[:n] [SEP]` padding, with `(q, n)` as computed."""
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    batch_size, read = block_kept.shape
    for b in range(batch_size):
        question = list(question_ids[b])
        for j in range(read):
            q, n = int(question_kept[b, j]), int(block_kept[b, j])
            expected = [cls] + question[:q] + [sep] + tokens[b, j, :n].tolist() + [sep]
            if inputs.input_ids[b, j, : len(expected)].tolist() != expected:
                return False
            if int(inputs.attention_mask[b, j].sum()) != len(expected):
                return False
    return True


def _pad_encoding(tokenizer, encoded, length: int) -> dict:
    """Right-pad every row of a batch encoding to `length` with the values the tokenizer's own padding writes."""
    current = len(encoded["input_ids"][0]) if encoded["input_ids"] else 0
    if length < current:
        raise ValueError(f"Cannot pad pairs of {current} wordpieces to {length}.")
    fill = {
        "input_ids": tokenizer.pad_token_id,
        "token_type_ids": tokenizer.pad_token_type_id,
        "attention_mask": 0,
        "special_tokens_mask": 1,
        "offset_mapping": (0, 0),
    }
    extra = length - current
    return {key: [list(row) + [fill[key]] * extra for row in rows] for key, rows in encoded.items() if key in fill}


def positive_block_order(has_answers: torch.Tensor, reader_beam_size: int) -> torch.LongTensor | None:
    """
    For `config.reader_beam_positive`: a reordering of each question's searcher beam (`(batch_size, k)` indices into
    it) that swaps the best-ranked block holding an answer into the reader beam's last place, for the questions whose
    first `reader_beam_size` blocks hold none and a later block does; other questions keep their order. `None` when no
    question needs it.

    Args:
        has_answers (`torch.BoolTensor` of shape `(batch_size, k)`): Whether each block of the beam holds an answer.
        reader_beam_size (`int`): Blocks the reader reads per question.
    """
    has = has_answers.bool()
    batch_size, k = has.shape
    if reader_beam_size < 1 or reader_beam_size >= k:
        return None
    needs = ~has[:, :reader_beam_size].any(-1) & has[:, reader_beam_size:].any(-1)
    if not bool(needs.any()):
        return None
    # argmax over a 0/1 row returns its first 1: the best-ranked block holding an answer.
    first = reader_beam_size + has[:, reader_beam_size:].to(torch.int8).argmax(-1)
    order = torch.arange(k, device=has.device).expand(batch_size, k).clone()
    rows = needs.nonzero().squeeze(-1)
    order[rows, reader_beam_size - 1] = first[rows]
    order[rows, first[rows]] = reader_beam_size - 1
    return order


def drop_unfilled_blocks(search, questions: Sequence[str]):
    """
    `search` without the trailing places that no question's search filled (block id `-1`: a metadata filter or an
    approximate index found fewer than `k` blocks), so the reader never reads an empty block that none of the batch
    needs. Places left empty for some questions only stay, with id `-1`, for the caller to mask. A question with no
    block at all is refused with a `ValueError`: there is nothing to read its answer from.
    """
    filled = (search.block_ids >= 0).sum(dim=1)
    empty = [i for i, count in enumerate(filled.tolist()) if count == 0]
    if empty:
        shown = ", ".join(f"{questions[i]!r}" for i in empty[:3]) + (" ..." if len(empty) > 3 else "")
        raise ValueError(
            f"The search found no block for {len(empty)} question(s) ({shown}): the filter lets no block through, or "
            "the approximate index reached none of those it lets through. Loosen the filter, or raise the index's "
            "`nprobe` / `efSearch`."
        )
    width = int(filled.max())
    if width == search.block_ids.shape[1]:
        return search
    return search.reordered(torch.arange(width).expand(search.block_ids.shape[0], width))
