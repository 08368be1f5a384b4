"""
The answers of one [`RealmForOpenQA`] forward pass: each question's best span (wordpiece ids, text, character
offsets) and its block, with every retrieved block and its retrieval score, as a [`RealmForOpenQAOutput`]; and the
best distinct spans of one question across its read blocks (`_best_spans`: the pipeline's and `answer(top_k=...)`'s).
"""

from __future__ import annotations

import re

import torch

from .modeling_outputs import RealmForOpenQAOutput, RealmReaderOutput
from .provenance import answer_record, span_log_probs
from .reader_inputs import RealmReaderInputs


def check_finite_reader_logits(reader_logits: torch.Tensor) -> None:
    """
    Refuse NaN span logits when answering: every span would tie at NaN, and the answer would be an empty span with
    score 0, which reads like "no answer" instead of a broken model.
    """
    if torch.isnan(reader_logits).any():
        raise ValueError(
            "The reader's span scores are NaN: its weights hold NaN (training diverged: lower the learning rate or "
            "resume from an earlier checkpoint; or the checkpoint is damaged: load it again) or its activations "
            "overflowed in fp16 (answer in fp32 or bf16). No answer can be chosen."
        )


def collect_answers(
    reader_output: RealmReaderOutput, reader_inputs: RealmReaderInputs, block_ids, relevance_score, search, tokenizer
) -> RealmForOpenQAOutput:
    """
    The [`RealmForOpenQAOutput`] of a forward pass from the reader's output over `reader_inputs`, the retrieved
    `block_ids`, their `relevance_score` and the `search` that found them. Answer texts are cut from the block texts
    by character offsets (fast tokenizers), else decoded with `tokenizer`.
    """
    batch = torch.arange(block_ids.shape[0], device=reader_output.block_idx.device)
    num_read = reader_output.reader_logits.shape[1]
    answer_scores = reader_output.reader_logits[batch, reader_output.block_idx, reader_output.candidate]
    answer_ids, answer_texts, char_spans = [], [], []
    blocks = search.blocks
    for b in range(block_ids.shape[0]):
        row = int(reader_output.block_idx[b])
        start, end = int(reader_output.start_pos[b]), int(reader_output.end_pos[b])
        answer_ids.append(reader_inputs.input_ids[b, row, start : end + 1])
        if reader_inputs.offset_mapping is not None:
            char_start = int(reader_inputs.offset_mapping[b, row, start, 0])
            char_end = int(reader_inputs.offset_mapping[b, row, end, 1])
            char_spans.append((char_start, char_end))
            answer_texts.append(blocks[b][row]["text"][char_start:char_end])
        else:
            char_spans.append(None)
            answer_texts.append(tokenizer.decode(answer_ids[-1]))
    answer_block_ids = block_ids.to(batch.device)[batch, reader_output.block_idx]
    retrieved_blocks = [
        [dict(block, score=float(score)) for block, score in zip(row_blocks, row_scores)]
        for row_blocks, row_scores in zip(blocks, relevance_score.detach().cpu().tolist())
    ]
    return RealmForOpenQAOutput(
        loss=reader_output.loss,
        reader_output=reader_output,
        predicted_answer_ids=answer_ids[0] if len(answer_ids) == 1 else answer_ids,
        predicted_answers=answer_texts,
        answer_scores=answer_scores,
        answer_block_ids=answer_block_ids,
        answer_char_spans=char_spans,
        retrieved_block_ids=block_ids,
        retrieved_scores=relevance_score,
        retrieved_blocks=retrieved_blocks,
        # The read pairs, so callers (the pipeline's top-k answers) need not tokenize them a second time.
        reader_input_ids=reader_inputs.input_ids[:, :num_read],
        reader_offset_mapping=reader_inputs.offset_mapping[:, :num_read]
        if reader_inputs.offset_mapping is not None
        else None,
    )


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
