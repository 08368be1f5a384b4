"""
The inputs of REALM pre-training: each masked input joined with each of its candidate blocks at the wordpiece-id level
(`join_inputs_and_blocks`), blocks tokenized exactly as the retriever embeds them (`encode_blocks`), the blocks each
input was cut from (never retrieved for it), and the ids of candidates that are not corpus blocks. The model that
reads them: `models/modeling_pretraining.py`.
"""

from __future__ import annotations

import torch

from ..retrieval.encoding import tokenize_blocks

# Block ids in `retrieved_block_ids` that are not corpus blocks.
NULL_BLOCK_ID = -1
PADDING_BLOCK_ID = -2


def join_inputs_and_blocks(
    input_ids: torch.LongTensor,
    block_token_ids: list[list[list[int]]],
    sep_token_id: int,
    pad_token_id: int = 0,
    max_length: int = 512,
    attention_mask: torch.Tensor | None = None,
    labels: torch.LongTensor | None = None,
    mlm_mask: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    r"""
    Join each masked input with each of its candidate blocks at the wordpiece-id level, without a tokenizer:
    `[CLS] x [SEP] z [SEP]`, where `[CLS] x [SEP]` is the input exactly as the collator produced it and `z` the
    block's wordpieces (e.g. `title [SEP] text`), truncated so that the pair fits in `max_length`.

    Because `x` comes first, every masked position keeps the same index in every candidate, so one `labels` row serves
    all candidates (as [`RealmKnowledgeAugEncoder`] expects).

    Args:
        input_ids (`torch.LongTensor` of shape `(batch_size, input_length)`):
            The (masked) inputs, with their special tokens (`[CLS] x [SEP]`).
        block_token_ids (`list[list[list[int]]]`):
            For each input, the wordpiece ids of each candidate (no `[CLS]`, no final `[SEP]`); an empty list is the
            null document (`[CLS] x [SEP] [SEP]`).
        sep_token_id (`int`): Id of `[SEP]`, appended after each block.
        pad_token_id (`int`, *optional*, defaults to 0): Padding id.
        max_length (`int`, *optional*, defaults to 512): Longest joint sequence.
        attention_mask (`torch.Tensor` of shape `(batch_size, input_length)`, *optional*):
            Which input positions are real tokens (left or right padding both work); all of them if omitted.
        labels (`torch.LongTensor` of shape `(batch_size, input_length)`, *optional*):
            Masked-LM targets, -100 where there is nothing to predict.
        mlm_mask (`torch.Tensor` of shape `(batch_size, input_length)`, *optional*):
            Positions that count in the loss (defaults to `labels != -100`).

    Returns:
        `dict` with `input_ids`, `attention_mask`, `token_type_ids` of shape `(batch_size, num_candidates, length)`,
        where `length` is the longest joint sequence of the batch, `labels` and `mlm_mask` of shape
        `(batch_size, length)`, and `input_positions` (`list[list[int]]`: for each input, the positions of its tokens
        in the original `input_ids`, in joint order), for mapping predictions back.
    """
    batch_size = input_ids.shape[0]
    if len(block_token_ids) != batch_size:
        raise ValueError(f"Got blocks for {len(block_token_ids)} inputs but {batch_size} inputs.")
    num_candidates = len(block_token_ids[0])
    if any(len(blocks) != num_candidates for blocks in block_token_ids):
        raise ValueError("Every input needs the same number of candidate blocks.")
    keep = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)

    rows, types, joint_labels, joint_mlm, positions = [], [], [], [], []
    for b in range(batch_size):
        where = keep[b].nonzero().squeeze(-1)
        x = input_ids[b, where].tolist()
        if len(x) + 1 > max_length:
            raise ValueError(
                f"Input {b} has {len(x)} wordpieces: no room for a block within max_length={max_length}. Shorten the "
                "inputs or raise the joint length."
            )
        positions.append(where.tolist())
        if labels is not None:
            example_labels = labels[b, where]
            counted = example_labels != -100
            if mlm_mask is not None:
                counted = counted & mlm_mask[b, where].bool()
            joint_labels.append(example_labels.tolist())
            joint_mlm.append(counted.long().tolist())
        room = max_length - len(x) - 1
        for block in block_token_ids[b]:
            z = list(block[:room])
            rows.append(x + z + [sep_token_id])
            types.append([0] * len(x) + [1] * (len(z) + 1))

    length = max(len(row) for row in rows)
    ids = torch.full((len(rows), length), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    token_types = torch.zeros((len(rows), length), dtype=torch.long)
    for i, (row, row_types) in enumerate(zip(rows, types)):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
        token_types[i, : len(row)] = torch.tensor(row_types, dtype=torch.long)
    device = input_ids.device
    out = {
        "input_ids": ids.view(batch_size, num_candidates, length).to(device),
        "attention_mask": mask.view(batch_size, num_candidates, length).to(device),
        "token_type_ids": token_types.view(batch_size, num_candidates, length).to(device),
        "input_positions": positions,
    }
    if labels is not None:
        out_labels = torch.full((batch_size, length), -100, dtype=torch.long)
        out_mlm = torch.zeros((batch_size, length), dtype=torch.long)
        for b in range(batch_size):
            out_labels[b, : len(joint_labels[b])] = torch.tensor(joint_labels[b], dtype=torch.long)
            out_mlm[b, : len(joint_mlm[b])] = torch.tensor(joint_mlm[b], dtype=torch.long)
        out["labels"] = out_labels.to(device)
        out["mlm_mask"] = out_mlm.to(device)
    return out


def encode_blocks(tokenizer, titles: list[str | None], texts: list[str], max_length: int) -> dict[str, torch.Tensor]:
    r"""
    Tokenize blocks exactly as the retriever embeds them ([`~realm_hf.retrieval.encoding.embed_blocks`]):
    `tokenizer(title, text, truncation=True, max_length=max_length)`, i.e. `[CLS] title [SEP] text [SEP]` (an empty
    title gives `[CLS] [SEP] text [SEP]`). Re-scoring must see the same inputs as indexing, or the fresh scores and
    the index disagree for reasons other than training.

    Returns:
        `dict` with `input_ids`, `attention_mask`, `token_type_ids` of shape `(num_blocks, longest)`.
    """
    encoded = tokenize_blocks(tokenizer, titles, texts, max_length=max_length, padding=True, return_tensors="pt")
    return {key: encoded[key] for key in ("input_ids", "attention_mask", "token_type_ids")}


def source_block_sets(source_block_ids, batch_size: int) -> list[set[int]]:
    """
    For each of `batch_size` inputs, the set of corpus block ids it was cut from (`source_block_ids`: a tensor of shape
    `(batch_size,)` or `(batch_size, num_sources)`, or a list of ids or of lists of ids; negative ids and `None` are
    ignored), which its retrieval must skip. Empty sets when `source_block_ids` is `None`.
    """
    if source_block_ids is None:
        return [set() for _ in range(batch_size)]
    if isinstance(source_block_ids, torch.Tensor):
        source_block_ids = source_block_ids.reshape(batch_size, -1).tolist()
    rows = []
    for row in source_block_ids:
        row = row if isinstance(row, (list, tuple)) else [row]
        rows.append({int(i) for i in row if i is not None and int(i) >= 0})
    if len(rows) != batch_size:
        raise ValueError(f"Got source block ids for {len(rows)} inputs but the batch has {batch_size}.")
    return rows
