"""Legacy REALM checkpoints: reading `block_records.npy` and the `block_emb` buffer, and converting them."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..constants import LEGACY_BLOCK_EMB_KEY
from .corpus import _ARROW_CHUNK_ROWS

if TYPE_CHECKING:
    from .retriever import RealmRetriever


def load_legacy_block_emb(legacy_dir: str) -> torch.Tensor | None:
    """
    The legacy `block_emb` buffer of a `RealmForOpenQA` checkpoint, read without loading the other weights into RAM:
    from `model.safetensors` if present, else from `pytorch_model.bin` with `torch.load(weights_only=True, mmap=True)`
    (no arbitrary unpickling, and the 6.8 GB matrix stays memory-mapped).
    """
    safetensors_file = os.path.join(legacy_dir, "model.safetensors")
    if os.path.isfile(safetensors_file):
        from safetensors import safe_open

        with safe_open(safetensors_file, framework="pt") as f:
            if LEGACY_BLOCK_EMB_KEY in f.keys():
                return f.get_tensor(LEGACY_BLOCK_EMB_KEY)
    bin_file = os.path.join(legacy_dir, "pytorch_model.bin")
    if os.path.isfile(bin_file):
        state_dict = torch.load(bin_file, map_location="cpu", weights_only=True, mmap=True)
        return state_dict.get(LEGACY_BLOCK_EMB_KEY)
    return None


def _decode_legacy_records(records: np.ndarray) -> list[str]:
    texts = []
    for start in range(0, len(records), _ARROW_CHUNK_ROWS):
        chunk = records[start : start + _ARROW_CHUNK_ROWS]
        texts.extend(r.decode("utf-8") if isinstance(r, bytes) else str(r) for r in chunk)
        # Drop the decoded bytes as we go: the 13M-record legacy array is 12.6 GB.
        records[start : start + _ARROW_CHUNK_ROWS] = None
    return texts


def convert_legacy_checkpoint(
    legacy_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    allow_pickle: bool = False,
    index: str = "Flat",
    tokenizer=None,
    embedder: torch.nn.Module | None = None,
    corpus_format: str = "arrow",
) -> RealmRetriever:
    """
    Convert the retriever part of a legacy REALM checkpoint (`block_records.npy` + the `block_emb` buffer) into a
    pickle-free retriever saved in `output_dir` (exactly there: a model checkpoint looks for it in its
    `retriever/` subfolder). See [`RealmRetriever.from_legacy`] for `allow_pickle`.

    Returns:
        The converted [`RealmRetriever`].
    """
    from .retriever import RealmRetriever  # the retriever module builds on this one

    retriever = RealmRetriever.from_legacy(
        legacy_dir, tokenizer=tokenizer, allow_pickle=allow_pickle, index=index, embedder=embedder
    )
    retriever.save_pretrained(output_dir, corpus_format=corpus_format)
    return retriever
