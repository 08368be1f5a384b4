"""
The answers of one [`RealmForOpenQA`] forward pass: each question's best span (wordpiece ids, text, character
offsets) and its block, with every retrieved block and its retrieval score, as a [`RealmForOpenQAOutput`].
"""

from __future__ import annotations

import torch

from .modeling_outputs import RealmForOpenQAOutput, RealmReaderOutput
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
