"""
[`ShardedRealmRetriever`]: a corpus larger than one machine, split across the processes of `torch.distributed`
(`accelerate launch`), each holding 1/N of the blocks and of the index; searches merge every shard's top `k` exactly.

The retriever: its shards and where they are, its search (the collective algorithm is `retrieval/sharded_search.py`'s),
lookups of local blocks, moves and index states per shard. Building, saving and loading the shards:
`retrieval/sharded_storage.py`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Self

import numpy as np
import torch

from .building import BuildOptions
from .collectives import ShardGroup
from .contract import RealmSearchOutput
from .corpus import as_id_array, unflatten
from .refresh import ShardedIndexState
from .retriever import RealmRetriever
from .sharded_search import ShardLayout, sharded_search
from .sharded_storage import load_shards, merge_shards, save_sharded, shard_from_documents, split_retriever


class ShardedRealmRetriever:
    r"""
    A REALM knowledge corpus split across processes: each process of a `torch.distributed` group (the processes of
    `accelerate launch`) holds a contiguous share of the blocks, their stored embeddings and an index over them (its
    *shards*, plain [`RealmRetriever`]s keeping the corpus's global block ids), and a search returns exactly what one
    retriever over the whole corpus would return for an exact index.

    [`~ShardedRealmRetriever.search`] is a **collective call**: every process calls it at the same point, each with
    its own questions (any number, also none: a `(0, dim)` tensor). The questions of all processes are gathered,
    each process searches its shards for all of them, the candidates are gathered and merged (score descending, ties
    broken by the smaller block id), and each retrieved block's text, token ids and stored embedding are sent by the
    process that holds it to the process that asked. [`RealmForOpenQA`] calls it once per forward pass, so under
    DDP/Accelerate (every process runs the same number of steps) training and evaluation keep the rule; do not call
    it from one process alone (e.g. inside `if accelerator.is_main_process:`), which would wait forever.

    With one process (no process group initialised), it holds every shard and needs no collective at all.

    Build one with [`~ShardedRealmRetriever.from_documents`] (each process splits and embeds only its share of the
    documents) or [`~ShardedRealmRetriever.from_retriever`] (a retriever's rows split, no re-embedding); save and
    load it with [`~ShardedRealmRetriever.save_pretrained`] / [`~ShardedRealmRetriever.from_pretrained`] (N shard
    folders and one manifest). [`RealmReindexCallback`] refreshes each process's shards locally (`realm_hf.retrieval.refresh`). See docs/sharding.md.

    Args:
        shards (`Sequence[RealmRetriever]`): The shards this process holds, in corpus order.
        group (`torch.distributed.ProcessGroup`, *optional*): A gloo group of the processes; by default a gloo group
            over every process of the default group (created once), or none for a single process.

    Example (under `accelerate launch`):

    ```python
    >>> from accelerate import Accelerator
    >>> from realm_hf import RealmForOpenQA, ShardedRealmRetriever

    >>> accelerator = Accelerator()  # initialises torch.distributed
    >>> model = RealmForOpenQA.from_pretrained("path/to/model", load_retriever=False)
    >>> sharded = ShardedRealmRetriever.from_pretrained("path/to/sharded-corpus")  # this process's shard
    >>> model.set_retriever(sharded)
    ```"""

    def __init__(self, shards: Sequence[RealmRetriever], group=None):
        self.shards = list(shards)
        self.group = group if isinstance(group, ShardGroup) else ShardGroup(group)
        self.group.run("Building the sharded retriever", self._check_local_shards)
        self._layout = ShardLayout.gathered(self.group, [self._describe(shard) for shard in self.shards])

    def _check_local_shards(self) -> None:
        if not self.shards:
            raise ValueError("This process holds no shard: give every process at least one RealmRetriever.")
        if not all(isinstance(shard, RealmRetriever) for shard in self.shards):
            raise TypeError("The shards of a ShardedRealmRetriever must be RealmRetriever instances.")

    @staticmethod
    def _describe(shard: RealmRetriever) -> dict:
        ids = shard.store.corpus.sorted_ids
        return {
            "num_blocks": shard.num_blocks,
            "dim": shard.embedding_dim,
            "index_type": shard.store.index_type,
            "id_range": (int(ids[0]), int(ids[-1])),
        }

    # -----------------------------------------------------------------------------------------------------------------
    # What the model reads
    # -----------------------------------------------------------------------------------------------------------------

    collective = True  # every process calls `search` and `save_pretrained` (see [`Retriever.collective`])

    @property
    def is_main_process(self) -> bool:
        """Whether this process writes the files all processes share (process 0 of the group)."""
        return self.group.rank == 0

    @property
    def layout(self) -> list[dict]:
        """Every shard of every process, in corpus order: `num_blocks`, `dim`, `index_type`, `id_range`."""
        return [dict(info) for info in self._layout.shards]

    @property
    def first_shard(self) -> int:
        """The index of this process's first shard among all shards."""
        return self._layout.first_local

    @property
    def num_blocks(self) -> int:
        """Number of blocks of the whole corpus (all shards)."""
        return self._layout.num_blocks

    def __len__(self) -> int:
        return self.num_blocks

    @property
    def num_shards(self) -> int:
        """Number of shards over all processes."""
        return len(self._layout.shards)

    @property
    def shard_sizes(self) -> list[int]:
        """Blocks of each shard, in corpus order."""
        return [info["num_blocks"] for info in self._layout.shards]

    @property
    def embedding_dim(self) -> int:
        return self.shards[0].embedding_dim

    @property
    def tokenizer(self):
        """The blocks' tokenizer (the same in every shard)."""
        return self.shards[0].tokenizer

    @property
    def max_block_length(self) -> int | None:
        return self.shards[0].max_block_length

    @property
    def question_embedder(self):
        """The embedder of question texts given to `search` (the shards', see [`Retriever.question_embedder`])."""
        return self.shards[0].question_embedder

    @question_embedder.setter
    def question_embedder(self, embedder) -> None:
        for shard in self.shards:
            shard.question_embedder = embedder

    @property
    def index_type(self) -> str:
        """The FAISS factory string of the shards' indexes."""
        return self.shards[0].store.index_type

    @property
    def embedder_fingerprint(self) -> str | None:
        """[`fingerprint_module`] of the embedder that filled the shards (`None`: unknown)."""
        return self.shards[0].store.embedder_fingerprint

    @property
    def local_block_ids(self) -> np.ndarray:
        """The block ids this process holds, in corpus order."""
        return np.concatenate([shard.store.block_ids for shard in self.shards])

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_blocks={self.num_blocks}, num_shards={self.num_shards}, "
            f"process={self.group.rank}/{self.group.world_size}, local_shards={len(self.shards)}, "
            f"embedding_dim={self.embedding_dim}, index_type={self.index_type!r})"
        )

    # -----------------------------------------------------------------------------------------------------------------
    # Search (collective) and lookups of local blocks, named as a store's (`BlockStore.blocks`, ...)
    # -----------------------------------------------------------------------------------------------------------------

    def search(
        self,
        queries,
        k: int = 5,
        return_blocks: bool = True,
        rerank_factor: int = 1,
        return_embeddings: bool = False,
        return_token_ids: bool = False,
        questions: Sequence[str] | None = None,
        filter=None,
        **search_params,
    ) -> RealmSearchOutput:
        """
        Top-`k` blocks of the whole corpus for this process's questions (texts, embedded with `question_embedder`, or
        embeddings); a **collective call** (see the class docstring). Arguments and output as [`Retriever.search`]
        (`questions` is accepted and unused: the shards hold dense indexes only, no BM25 index; a `filter` is refused
        on every process); `k`, `rerank_factor` and the search parameters must be the same on every process. Each shard returns its own top `k` (re-ranked from its stored vectors for
        compressed indexes), so for exact indexes (Flat, IVF-Flat probing every list) the result is the single
        retriever's; for approximate ones each shard's index is searched with the same parameters.
        """
        return sharded_search(
            self.group,
            self._layout,
            # One snapshot of each shard for the whole call (see `sharded_search`).
            [shard.store for shard in self.shards],
            self.tokenizer,
            queries,
            k,
            return_blocks,
            rerank_factor,
            search_params,
            return_embeddings,
            return_token_ids,
            self.question_embedder,
            filter,
        )

    def embeddings(self, block_ids) -> torch.FloatTensor:
        """Stored embeddings of blocks this process holds; see [`BlockStore.embeddings`]."""
        ids, values = local_lookup(self, block_ids, "embeddings")
        return torch.from_numpy(np.ascontiguousarray(values).reshape(*ids.shape, self.embedding_dim))

    def blocks(self, block_ids) -> list:
        """Blocks (dicts) this process holds; see [`BlockStore.blocks`]."""
        ids, values = local_lookup(self, block_ids, "blocks")
        return unflatten([dict(block) for block in values], ids)

    def texts(self, block_ids) -> list:
        """Texts of blocks this process holds; see [`BlockStore.texts`]."""
        ids, values = local_lookup(self, block_ids, "texts")
        return unflatten(list(values), ids)

    def token_ids(self, block_ids) -> tuple[torch.Tensor, torch.LongTensor]:
        """Reader token ids of blocks this process holds; see [`BlockStore.token_ids`]."""
        ids, (tokens, lengths) = local_lookup(self, block_ids, "tokens")
        shape = tuple(ids.shape)
        return torch.from_numpy(tokens).view(*shape, tokens.shape[1]), torch.from_numpy(lengths).view(shape)

    # -----------------------------------------------------------------------------------------------------------------
    # Index states (each process its own shards; refreshing them: `realm_hf.retrieval.refresh`) and placement
    # -----------------------------------------------------------------------------------------------------------------

    def swap_index_state(self, state: ShardedIndexState) -> None:
        """Install refreshed index states (one per local shard), each atomically under its shard's lock."""
        if not isinstance(state, ShardedIndexState) or len(state.shard_states) != len(self.shards):
            raise ValueError(
                f"A sharded retriever swaps in a ShardedIndexState with one state per local shard ({len(self.shards)})."
            )
        for shard, shard_state in zip(self.shards, state.shard_states):
            shard.swap_index_state(shard_state)

    def export_index_state(self) -> ShardedIndexState:
        """The local shards' current embeddings and indexes (e.g. to restore them into another sharded retriever)."""
        return ShardedIndexState([shard.export_index_state() for shard in self.shards])

    def to_gpu(self, device: int = 0) -> Self:
        """Move this process's shard indexes to GPU `device` (e.g. its local rank); see [`RealmRetriever.to_gpu`]."""
        for shard in self.shards:
            shard.to_gpu(device)
        return self

    def to_retriever(self, index: str | None = None, train_size: int | None = None) -> RealmRetriever:
        """
        One [`RealmRetriever`] over every shard (this process must hold them all: one process, e.g. after
        [`~ShardedRealmRetriever.from_pretrained`] without a process group), indexed from the stored embeddings with
        `index` (default: the shards' index type). Not a collective.
        """
        if len(self.shards) != self.num_shards:
            raise ValueError(
                f"This process holds {len(self.shards)} of {self.num_shards} shards: merge on one process that holds "
                "them all (load the sharded save without a process group)."
            )
        merged = merge_shards(self.shards, index, train_size)
        merged.question_embedder = self.question_embedder
        return merged

    # -----------------------------------------------------------------------------------------------------------------
    # Building, saving, loading (collective)
    # -----------------------------------------------------------------------------------------------------------------

    @classmethod
    def from_retriever(
        cls, retriever: RealmRetriever, group=None, num_shards: int | None = None, train_size: int | None = None
    ) -> Self:
        """
        Split a retriever that every process holds (e.g. loaded from one save) into contiguous shards of its rows,
        each indexed from its stored embeddings with the retriever's index type; a collective call. Each process keeps
        `num_shards / world_size` shards (default one) and drops nothing else: free the full retriever afterwards.
        """
        group = group if isinstance(group, ShardGroup) else ShardGroup(group)
        sharded = cls(split_retriever(retriever, group, num_shards, train_size), group=group)
        sharded.question_embedder = retriever.question_embedder
        return sharded

    @classmethod
    def from_documents(cls, documents, embedder: torch.nn.Module, tokenizer, group=None, **options) -> Self:
        """
        [`RealmRetriever.from_documents`] split across processes; a collective call. Every process is given the same
        documents (a sequence or a `datasets.Dataset`), splits and embeds only its contiguous share of them, and
        numbers its blocks after those of the processes before it: block ids, doc ids and texts are those the
        single-process build gives, embeddings too up to float rounding (other batches), and each process indexes its
        own blocks. `options` are those of [`RealmRetriever.from_documents`] ([`BuildOptions`]).
        """
        group = group if isinstance(group, ShardGroup) else ShardGroup(group)
        shard = shard_from_documents(documents, embedder, tokenizer, BuildOptions(**options), group)
        sharded = cls([shard], group=group)
        sharded.question_embedder = embedder
        return sharded

    def save_pretrained(
        self, save_directory: str | os.PathLike, corpus_format: str = "arrow", max_shard_size: str | int = "500MB"
    ) -> None:
        """
        Save every shard into `save_directory/shard-XXXXX-of-YYYYY/` (each a retriever directory of its own) and one
        `sharded_retriever_manifest.json` naming them with their block ranges and the sha256 of every file; a
        collective call, all or nothing (staged, then swapped in by process 0). `save_directory` must be a folder all
        processes can reach (a shared filesystem). Arguments as [`RealmRetriever.save_pretrained`].
        """
        save_sharded(self, save_directory, corpus_format, max_shard_size)

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        group=None,
        embedder: torch.nn.Module | None = None,
        expected_dim: int | None = None,
        mmap: bool = True,
        verify_checksums: bool = True,
    ) -> Self:
        """
        Load a sharded save; a collective call. With N shards on W processes (W dividing N) each process loads its
        N/W shards; one process (no process group) loads them all. The manifest, every shard's files (sizes and
        sha256) and the block ranges are checked; any other number of processes is refused with what to do.
        Arguments as [`RealmRetriever.from_pretrained`] (local folders only).
        """
        group = group if isinstance(group, ShardGroup) else ShardGroup(group)
        return cls(load_shards(path, group, embedder, expected_dim, mmap, verify_checksums), group=group)


# ---------------------------------------------------------------------------------------------------------------------
# Lookups of local blocks (not collective)
# ---------------------------------------------------------------------------------------------------------------------


def local_lookup(retriever, block_ids, what: str):
    """
    `what` (`"blocks"`, `"texts"`, `"embeddings"` or `"tokens"`) of `block_ids` from this process's shards, flat in
    row order (ids held by other processes are refused with what to do). Returns `(ids, flat values)`.
    """
    ids = as_id_array(block_ids)
    return ids, _local_values(retriever, ids.reshape(-1), what)


def _local_values(retriever, flat: np.ndarray, what: str):
    owner = np.full(len(flat), -1, dtype=np.int64)
    for j, shard in enumerate(retriever.shards):
        sorted_ids = shard.store.corpus.sorted_ids
        position = np.minimum(np.searchsorted(sorted_ids, flat), len(sorted_ids) - 1)
        owner[(sorted_ids[position] == flat) & (owner < 0)] = j
    unknown = (owner < 0) & (flat >= 0)
    if unknown.any():
        raise ValueError(
            f"Block ids {flat[unknown][:10].tolist()} are not held by this process (process {retriever.group.rank} "
            f"holds shards {retriever.first_shard}..{retriever.first_shard + len(retriever.shards) - 1} of "
            f"{retriever.num_shards}). A sharded retriever sends the data of other processes' blocks with the search "
            "that found them: use the search output (`blocks`, `block_embeddings` with `return_embeddings=True`, "
            "`block_token_ids` with `return_token_ids=True`)."
        )
    selections = [(shard, np.flatnonzero(owner == j)) for j, shard in enumerate(retriever.shards)]
    selections = [(shard, rows) for shard, rows in selections if rows.size]
    if what == "embeddings":
        out = np.zeros((len(flat), retriever.embedding_dim), dtype=np.float32)
        for shard, rows in selections:
            out[rows] = shard.store.embeddings(flat[rows]).numpy()
        return out
    if what == "tokens":
        found = [(rows, shard.store.token_ids(flat[rows], shard.tokenizer)) for shard, rows in selections]
        width = max([tokens.shape[1] for _, (tokens, _) in found], default=0)
        padded, lengths = np.full((len(flat), width), -1, dtype=np.int32), np.zeros(len(flat), dtype=np.int64)
        for rows, (tokens, row_lengths) in found:
            padded[rows, : tokens.shape[1]] = tokens.numpy()
            lengths[rows] = row_lengths.numpy()
        return padded, lengths
    getter = "blocks" if what == "blocks" else "texts"
    empty = getattr(retriever.shards[0].store, getter)(np.array([-1]))[0]
    out = [None] * len(flat)
    for shard, rows in selections:
        for row, value in zip(rows, getattr(shard.store, getter)(flat[rows])):
            out[row] = value
    for row in np.flatnonzero(flat < 0):
        out[row] = empty if what == "texts" else dict(empty)
    return out
