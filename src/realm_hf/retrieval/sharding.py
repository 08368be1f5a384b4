"""
[`ShardedRealmRetriever`]: a corpus larger than one machine, split across the processes of `torch.distributed`
(`accelerate launch`), each holding 1/N of the blocks and of the index; searches merge every shard's top `k` exactly.

The retriever and its search, one concept: a search gathers the questions of every process, searches each process's
shards, merges the top `k` exactly and sends the retrieved blocks' data from the processes that hold them
([`sharded_search`]); lookups of local blocks. Building, saving and loading the shards: `retrieval/sharded_storage.py`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

import numpy as np
import torch

from ..logging_utils import get_logger
from . import contract
from .building import BuildOptions
from .collectives import ShardedCollectiveError, ShardGroup, describe
from .contract import RealmSearchOutput
from .corpus import as_id_array, unflatten
from .encoding import fingerprint_module
from .faiss_ops import normalize_search_params
from .retriever import RealmRetriever
from .sharded_storage import load_shards, merge_shards, save_sharded, shard_from_documents, split_retriever
from .store import BlockStore


@dataclass
class ShardedIndexState:
    """The refreshed index states of the shards one process holds, in shard order (each a [`BlockStore`])."""

    shard_states: list[BlockStore]


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
    folders and one manifest). [`RealmReindexCallback`] refreshes each process's shards locally. See docs/sharding.md.

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
        described = self.group.all_gather([self._describe(shard) for shard in self.shards])
        self._layout = [info for process in described for info in process]
        # The process that holds each shard (shards are numbered in process order).
        self.shard_owner = np.repeat(np.arange(len(described)), [len(process) for process in described])
        self.first_shard = sum(len(process) for process in described[: self.group.rank])
        self._check_layout()

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
            "index_type": shard.index_type,
            "id_range": (int(ids[0]), int(ids[-1])),
        }

    def _check_layout(self) -> None:
        # Every process sees the same layout, so every process raises the same error.
        dims = sorted({info["dim"] for info in self._layout})
        if len(dims) > 1:
            raise ValueError(
                f"The shards hold embeddings of different dimensions {dims}: embed them with one embedder."
            )
        ranges = sorted(info["id_range"] for info in self._layout)
        overlapping = [(a, b) for a, b in zip(ranges, ranges[1:]) if b[0] <= a[1]]
        if overlapping:
            raise ValueError(
                f"The shards' block id ranges overlap ({overlapping[0][0]} and {overlapping[0][1]}): each shard must "
                "hold a contiguous range of the corpus's block ids (build them with `from_documents` or "
                "`from_retriever`)."
            )

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
        return [dict(info) for info in self._layout]

    @property
    def num_blocks(self) -> int:
        """Number of blocks of the whole corpus (all shards)."""
        return sum(info["num_blocks"] for info in self._layout)

    def __len__(self) -> int:
        return self.num_blocks

    @property
    def num_shards(self) -> int:
        """Number of shards over all processes."""
        return len(self._layout)

    @property
    def shard_sizes(self) -> list[int]:
        """Blocks of each shard, in corpus order."""
        return [info["num_blocks"] for info in self._layout]

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
    def index_type(self) -> str:
        return self.shards[0].index_type

    @property
    def embedder_fingerprint(self) -> str | None:
        return self.shards[0].embedder_fingerprint

    @property
    def local_block_ids(self) -> np.ndarray:
        """The block ids this process holds, in corpus order."""
        return np.concatenate([shard.block_ids for shard in self.shards])

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_blocks={self.num_blocks}, num_shards={self.num_shards}, "
            f"process={self.group.rank}/{self.group.world_size}, local_shards={len(self.shards)}, "
            f"embedding_dim={self.embedding_dim}, index_type={self.index_type!r})"
        )

    # -----------------------------------------------------------------------------------------------------------------
    # Search (collective) and lookups of retrieved blocks (local)
    # -----------------------------------------------------------------------------------------------------------------

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
        """
        Top-`k` blocks of the whole corpus for this process's questions; a **collective call** (see the class
        docstring). Arguments and output as [`RealmRetriever.search`] (`questions` is accepted and unused: the
        shards hold dense indexes only, no BM25 index); `k`, `rerank_factor` and the search parameters
        must be the same on every process. Each shard returns its own top `k` (re-ranked from its stored vectors for
        compressed indexes), so for exact indexes (Flat, IVF-Flat probing every list) the result is the single
        retriever's; for approximate ones each shard's index is searched with the same parameters.
        """
        return sharded_search(
            self,
            question_embeddings,
            k,
            return_blocks,
            rerank_factor,
            search_params,
            return_embeddings,
            return_token_ids,
        )

    def get_block_embeddings(self, block_ids) -> torch.FloatTensor:
        """Stored embeddings of blocks this process holds; see [`RealmRetriever.get_block_embeddings`]."""
        ids, values = local_lookup(self, block_ids, "embeddings")
        return torch.from_numpy(np.ascontiguousarray(values).reshape(*ids.shape, self.embedding_dim))

    def get_blocks(self, block_ids) -> list:
        """Blocks (dicts) this process holds; see [`RealmRetriever.get_blocks`]."""
        ids, values = local_lookup(self, block_ids, "blocks")
        return unflatten([dict(block) for block in values], ids)

    def get_block_texts(self, block_ids) -> list:
        """Texts of blocks this process holds; see [`RealmRetriever.get_block_texts`]."""
        ids, values = local_lookup(self, block_ids, "texts")
        return unflatten(list(values), ids)

    def get_block_token_ids(self, block_ids) -> tuple[torch.Tensor, torch.LongTensor]:
        """Reader token ids of blocks this process holds; see [`RealmRetriever.get_block_token_ids`]."""
        ids, (tokens, lengths) = local_lookup(self, block_ids, "tokens")
        shape = tuple(ids.shape)
        return torch.from_numpy(tokens).view(*shape, tokens.shape[1]), torch.from_numpy(lengths).view(shape)

    # -----------------------------------------------------------------------------------------------------------------
    # Refreshing (each process its own shards; no embeddings gathered)
    # -----------------------------------------------------------------------------------------------------------------

    def refresh_index_state(
        self,
        embedder: torch.nn.Module,
        batch_size: int = 64,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        show_progress: bool = False,
        train_size: int | None = None,
        group=None,
    ) -> ShardedIndexState:
        """
        Re-embed the blocks of this process's shards with `embedder` and build their new indexes, without touching
        the live ones (safe in a background thread); install with [`~ShardedRealmRetriever.swap_index_state`]. Not a
        collective: each process refreshes what it holds (`group` is not used: no process needs another's
        embeddings).
        """
        fingerprint = fingerprint_module(embedder)
        states = []
        for shard in self.shards:
            embeddings = shard.embed_corpus(
                embedder, batch_size, device, dtype, show_progress, update_index=False, train_size=train_size
            )
            states.append(shard.build_index_state(embeddings, fingerprint, train_size))
        return ShardedIndexState(states)

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

    def saved_index_state(self, path: str | os.PathLike) -> ShardedIndexState:
        """The index states of this process's shards saved in sharded directory `path` (a collective call)."""
        return type(self).from_pretrained(path, group=self.group).export_index_state()

    def embed_corpus(self, embedder: torch.nn.Module, **kwargs) -> None:
        """Re-embed this process's shards with `embedder` and swap their new indexes in (call it on every process)."""
        self.swap_index_state(self.refresh_index_state(embedder, **kwargs))

    def is_stale(self, embedder: torch.nn.Module) -> bool | None:
        """Whether `embedder`'s weights differ from those that embedded this process's shards (`None`: unknown)."""
        stale = [shard.is_stale(embedder) for shard in self.shards]
        return None if None in stale else any(stale)

    def check_embedder(self, embedder: torch.nn.Module) -> None:
        """Refuse an embedder of another dimension; warn if its weights differ from the shards' embedder."""
        self.shards[0].check_embedder(embedder)

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
        return merge_shards(self.shards, index, train_size)

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
        return cls(split_retriever(retriever, group, num_shards, train_size), group=group)

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
        return cls([shard_from_documents(documents, embedder, tokenizer, BuildOptions(**options), group)], group=group)

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


logger = get_logger(__name__)


def sharded_search(
    retriever,
    question_embeddings,
    k: int,
    return_blocks: bool,
    rerank_factor: int,
    search_params: dict,
    return_embeddings: bool,
    return_token_ids: bool = False,
) -> RealmSearchOutput:
    """[`ShardedRealmRetriever.search`]: a collective call (every process of the retriever's group calls it)."""
    group = retriever.group
    try:
        request = {
            "queries": contract.as_query_matrix(question_embeddings),
            "k": contract.check_k(k),
            "rerank_factor": max(1, int(rerank_factor)),
            "params": normalize_search_params(search_params),
            "blocks": bool(return_blocks),
            "embeddings": bool(return_embeddings),
            "tokens": bool(return_token_ids),
        }
        error = None
    except Exception as err:
        if group.world_size == 1:
            raise
        request, error = None, describe(err)
    requests = group.all_gather((request, error))
    group_errors = [(rank, message) for rank, (_, message) in enumerate(requests) if message is not None]
    if group_errors:
        details = "; ".join(f"process {rank}: {message}" for rank, message in group_errors)
        raise ShardedCollectiveError(f"A sharded search was refused. {details}")
    requests = [request for request, _ in requests]
    queries, offsets = check_requests(retriever, requests)
    mine = requests[group.rank]
    k = mine["k"]
    # One snapshot of each shard for the whole call: a refresh swapped in meanwhile installs a new store and leaves
    # this one as it is, so ids, scores, blocks, embeddings and token ids come from one state of each shard.
    stores = [shard.store for shard in retriever.shards]
    candidates = group.run(
        "Searching the local shards",
        local_candidates,
        retriever,
        stores,
        queries,
        k,
        mine["rerank_factor"],
        mine["params"],
    )
    # Each process merges its own questions' candidates from every process ...
    rows_of = [slice(offsets[d], offsets[d + 1]) for d in range(group.world_size)]
    received = group.exchange([tuple(part[rows] for part in candidates) for rows in rows_of])
    scores, ids, sources = top_k(*(np.concatenate(parts, axis=1) for parts in zip(*received)), k)
    # ... asks the processes holding the winners for their data, and answers the others' requests.
    requests_out = block_requests(retriever, ids, sources, mine)
    requests_in = group.exchange(requests_out)
    replies = group.run("Looking up retrieved blocks", answer_requests, retriever, stores, requests_in)
    received = group.exchange(replies)
    return assemble(retriever, stores[0], ids, scores, received, mine)


def check_requests(retriever, requests: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """
    Refuse requests the processes disagree on, or that a single retriever would refuse; every process sees every
    request, so every process raises the same error. Returns the gathered questions and each process's first row.
    """
    settings = [(r["k"], r["rerank_factor"], sorted(r["params"].items())) for r in requests]
    if any(setting != settings[0] for setting in settings):
        raise ValueError(
            "Every process must search a sharded retriever with the same k, rerank_factor and search parameters; got "
            + ", ".join(
                f"process {rank}: k={s[0]}, rerank_factor={s[1]}, {dict(s[2])}" for rank, s in enumerate(settings)
            )
            + "."
        )
    k = requests[0]["k"]
    dims = {r["queries"].shape[1] for r in requests}
    if dims != {retriever.embedding_dim}:
        raise ValueError(
            f"Question embeddings have dimension {sorted(dims)}, but this corpus was built with an embedder of "
            f"projection size {retriever.embedding_dim}. Use the embedder that built the corpus."
        )
    if k > retriever.num_blocks:
        raise ValueError(
            f"k={k} is larger than the number of blocks in the corpus ({retriever.num_blocks}): ask for at most "
            f"{retriever.num_blocks}."
        )
    queries = np.concatenate([r["queries"] for r in requests])
    contract.check_finite_queries(queries)
    offsets = np.cumsum([0] + [len(r["queries"]) for r in requests])
    return queries, offsets


def local_candidates(retriever, stores, queries: np.ndarray, k: int, rerank_factor: int, params: dict):
    """The top `k` of this process's shards for every gathered question: `(scores, block ids, global shard index)`."""
    parts = []
    for j, store in enumerate(stores):
        kk = min(k, len(store))
        if len(queries):
            out = store.search(queries, kk, rerank_factor, params, return_blocks=False)
            scores, ids = out.scores.numpy(), out.block_ids.numpy()
        else:
            scores, ids = np.empty((0, kk), np.float32), np.empty((0, kk), np.int64)
        parts.append((scores, ids, np.full(ids.shape, retriever.first_shard + j, dtype=np.int64)))
    return top_k(*(np.concatenate(column, axis=1) for column in zip(*parts)), k)


def top_k(scores: np.ndarray, ids: np.ndarray, sources: np.ndarray, k: int):
    """
    The best `k` candidates of each row by score, ties broken by the smaller block id (missing results, id -1 with
    score -inf, last), padded with missing results to `k` columns.
    """
    order = np.lexsort((ids, -scores.astype(np.float64)), axis=-1)[:, :k]
    scores, ids, sources = (np.take_along_axis(a, order, axis=1) for a in (scores, ids, sources))
    missing = k - scores.shape[1]
    if missing > 0:
        pad = ((0, 0), (0, missing))
        scores = np.pad(scores, pad, constant_values=-np.inf)
        ids, sources = np.pad(ids, pad, constant_values=-1), np.pad(sources, pad, constant_values=-1)
    return np.ascontiguousarray(scores, dtype=np.float32), ids.astype(np.int64), sources


def block_requests(retriever, ids, sources, wanted: dict) -> list:
    """For each process, the positions (in this process's `(batch, k)` results) and ids of the blocks it holds."""
    flat_ids, flat_sources = ids.reshape(-1), sources.reshape(-1)
    owners = np.where(flat_ids >= 0, retriever.shard_owner[np.maximum(flat_sources, 0)], -1)
    requests = []
    for process in range(retriever.group.world_size):
        positions = np.flatnonzero(owners == process)
        requests.append(
            {
                "positions": positions,
                "ids": flat_ids[positions],
                "sources": flat_sources[positions],
                **{what: wanted[what] for what in ("blocks", "embeddings", "tokens")},
            }
        )
    return requests


def answer_requests(retriever, stores, requests: list[dict]) -> list:
    """The data of the requested blocks, for each process that asked."""
    return [block_data(retriever, stores, request) for request in requests]


def block_data(retriever, stores, request: dict) -> list:
    """The blocks, reader token ids and stored embeddings of a request, per local shard, with positions."""
    parts = []
    for j, store in enumerate(stores):
        selected = request["sources"] == retriever.first_shard + j
        if not selected.any():
            continue
        part_ids = request["ids"][selected]
        part = {"positions": request["positions"][selected]}
        if request["blocks"]:
            part["blocks"] = store.corpus.blocks(part_ids)
        if request["tokens"]:
            tokens, lengths = store.token_ids(part_ids, retriever.tokenizer)
            part["tokens"], part["lengths"] = tokens.numpy(), lengths.numpy()
        if request["embeddings"]:
            part["embeddings"] = store.corpus.embeddings(part_ids, store.dim)
        parts.append(part)
    return parts


def assemble(retriever, store, ids, scores, received, wanted: dict) -> RealmSearchOutput:
    """This process's search output from the merged ids and scores and the block data the other processes sent."""
    size, dim = ids.size, retriever.embedding_dim
    parts = [part for sent in received for part in sent]
    blocks = embeddings = tokens = lengths = None
    if wanted["blocks"]:
        empty = store.corpus.blocks(np.array([-1]))[0]
        blocks = [None] * size
        for part in parts:
            for position, block in zip(part["positions"], part["blocks"]):
                blocks[position] = block
        blocks = [dict(empty) if block is None else block for block in blocks]
        for block, score in zip(blocks, scores.reshape(-1).tolist()):
            block["score"] = score
    if wanted["tokens"]:
        width = max([part["tokens"].shape[1] for part in parts], default=0)
        tokens, lengths = np.full((size, width), -1, dtype=np.int32), np.zeros(size, dtype=np.int64)
        for part in parts:
            tokens[part["positions"], : part["tokens"].shape[1]] = part["tokens"]
            lengths[part["positions"]] = part["lengths"]
        tokens = torch.from_numpy(tokens).view(*ids.shape, width)
        lengths = torch.from_numpy(lengths).view(ids.shape)
    if wanted["embeddings"]:
        embeddings = np.zeros((size, dim), dtype=np.float32)
        for part in parts:
            embeddings[part["positions"]] = part["embeddings"]
        embeddings = torch.from_numpy(embeddings.reshape(*ids.shape, dim))
    missing = ids < 0
    if missing.any():
        store.warn_missing_results(ids.shape[1], int(missing.any(axis=1).sum()))
    return RealmSearchOutput(
        block_ids=torch.from_numpy(ids),
        scores=torch.from_numpy(scores),
        blocks=unflatten(blocks, ids) if blocks is not None else None,
        block_embeddings=embeddings,
        block_token_ids=tokens,
        block_token_lengths=lengths,
    )


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
            out[rows] = shard.get_block_embeddings(flat[rows]).numpy()
        return out
    if what == "tokens":
        found = [(rows, shard.get_block_token_ids(flat[rows])) for shard, rows in selections]
        width = max([tokens.shape[1] for _, (tokens, _) in found], default=0)
        padded, lengths = np.full((len(flat), width), -1, dtype=np.int32), np.zeros(len(flat), dtype=np.int64)
        for rows, (tokens, row_lengths) in found:
            padded[rows, : tokens.shape[1]] = tokens.numpy()
            lengths[rows] = row_lengths.numpy()
        return padded, lengths
    getter = "get_blocks" if what == "blocks" else "get_block_texts"
    empty = getattr(retriever.shards[0], getter)(np.array([-1]))[0]
    out = [None] * len(flat)
    for shard, rows in selections:
        for row, value in zip(rows, getattr(shard, getter)(flat[rows])):
            out[row] = value
    for row in np.flatnonzero(flat < 0):
        out[row] = empty if what == "texts" else dict(empty)
    return out
