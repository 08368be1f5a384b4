"""[`Retriever`]: what a REALM model asks of its knowledge corpus, the contract every retriever satisfies."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from .searching import RealmSearchOutput


class Retriever(Protocol):
    """
    The knowledge corpus of a REALM model: [`RealmRetriever`] (one process) and [`ShardedRealmRetriever`] (a corpus
    split across processes) both satisfy it, and the models, the pipeline and the re-index callback use nothing else,
    so they never ask which kind they hold.

    A search returns everything the model reads about the retrieved blocks (ids, scores, blocks, stored embeddings,
    the reader's token ids) from one state of the corpus and index: nothing is looked up afterwards.
    """

    tokenizer: Any
    """The BERT WordPiece tokenizer the blocks were split with (`None` when unknown)."""
    max_block_length: int | None
    """Maximum wordpieces per block as the embedder saw it (`None`: the tokenizer's limit)."""
    collective: bool
    """Whether `search` and `save_pretrained` are collective calls that every process makes (a sharded corpus)."""

    @property
    def embedding_dim(self) -> int: ...

    @property
    def num_blocks(self) -> int: ...

    @property
    def index_type(self) -> str: ...

    @property
    def embedder_fingerprint(self) -> str | None: ...

    @property
    def is_main_process(self) -> bool:
        """Whether this process writes the files every process shares."""
        ...

    def __len__(self) -> int: ...

    def search(
        self,
        question_embeddings,
        k: int = 5,
        return_blocks: bool = True,
        rerank_factor: int = 1,
        return_embeddings: bool = False,
        return_token_ids: bool = False,
        questions: Sequence[str] | None = None,
        **search_params,
    ) -> RealmSearchOutput:
        """The top `k` blocks; `questions` (the texts) add BM25 candidates where the retriever holds a BM25 index."""
        ...

    def is_stale(self, embedder: torch.nn.Module) -> bool | None: ...

    def check_embedder(self, embedder: torch.nn.Module) -> None: ...

    def refresh_index_state(
        self,
        embedder: torch.nn.Module,
        batch_size: int = 64,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        show_progress: bool = False,
        train_size: int | None = None,
        group=None,
    ) -> Any:
        """A re-embedded index state built off the live one (see [`RealmRetriever.refresh_index_state`])."""
        ...

    def swap_index_state(self, state) -> None: ...

    def export_index_state(self) -> Any: ...

    def saved_index_state(self, path: str | os.PathLike) -> Any: ...

    def save_pretrained(
        self, save_directory: str | os.PathLike, corpus_format: str = "arrow", max_shard_size: str | int = "500MB"
    ) -> None: ...
