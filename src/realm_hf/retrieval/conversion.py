"""Converting a legacy REALM checkpoint's retriever (pickled `block_records.npy` + `block_emb`) into a pickle-free one."""

from __future__ import annotations

import os

import torch

from .retriever import RealmRetriever


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
    retriever = RealmRetriever.from_legacy(
        legacy_dir, tokenizer=tokenizer, allow_pickle=allow_pickle, index=index, embedder=embedder
    )
    retriever.save_pretrained(output_dir, corpus_format=corpus_format)
    return retriever
