"""
The search of a corpus split across processes ([`ShardedRealmRetriever.search`]), a collective call: the questions of
every process gathered, each process's shard stores searched for all of them, the top `k` merged exactly (score
descending, ties broken by the smaller block id), and the retrieved blocks' data (blocks, embeddings, token ids) sent
by the processes that hold them. It reads a [`ShardLayout`] (where every shard is) and this process's shard stores;
the retriever that holds them is `retrieval/sharding.py`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from . import contract
from .collectives import ShardedCollectiveError, ShardGroup, describe
from .contract import RealmSearchOutput
from .corpus import unflatten
from .faiss_ops import normalize_search_params
from .store import BlockStore


@dataclass(frozen=True)
class ShardLayout:
    """
    Where the shards of a sharded corpus are, the same on every process: each shard in corpus order (`num_blocks`,
    `dim`, `index_type`, `id_range`), the process holding it, and the first shard of this process.

    Args:
        shards (`list[dict]`): Every shard of every process, in corpus order.
        owner (`np.ndarray`): The process that holds each shard.
        first_local (`int`): The index of this process's first shard.
    """

    shards: list[dict]
    owner: np.ndarray
    first_local: int

    @classmethod
    def gathered(cls, group: ShardGroup, local: list[dict]) -> ShardLayout:
        """
        The layout of the shards every process describes (`local`: this process's, in order); a collective call.
        Shards of different dimensions or overlapping block id ranges are refused (on every process alike).
        """
        described = group.all_gather(local)
        layout = cls(
            shards=[info for process in described for info in process],
            # Shards are numbered in process order.
            owner=np.repeat(np.arange(len(described)), [len(process) for process in described]),
            first_local=sum(len(process) for process in described[: group.rank]),
        )
        layout.check()
        return layout

    @property
    def num_blocks(self) -> int:
        return sum(info["num_blocks"] for info in self.shards)

    def check(self) -> None:
        """Refuse shards of different dimensions, or whose block id ranges overlap."""
        dims = sorted({info["dim"] for info in self.shards})
        if len(dims) > 1:
            raise ValueError(
                f"The shards hold embeddings of different dimensions {dims}: embed them with one embedder."
            )
        ranges = sorted(info["id_range"] for info in self.shards)
        overlapping = [(a, b) for a, b in zip(ranges, ranges[1:]) if b[0] <= a[1]]
        if overlapping:
            raise ValueError(
                f"The shards' block id ranges overlap ({overlapping[0][0]} and {overlapping[0][1]}): each shard must "
                "hold a contiguous range of the corpus's block ids (build them with `from_documents` or "
                "`from_retriever`)."
            )


def sharded_search(
    group: ShardGroup,
    layout: ShardLayout,
    stores: list[BlockStore],
    tokenizer,
    queries,
    k: int,
    return_blocks: bool,
    rerank_factor: int,
    search_params: dict,
    return_embeddings: bool,
    return_token_ids: bool = False,
    question_embedder=None,
    filter=None,
) -> RealmSearchOutput:
    """
    This process's top `k` blocks of the whole corpus for its `queries` (question texts, embedded with
    `question_embedder`, or embeddings): a collective call that every process of `group` makes. `stores` are this
    process's shards, one snapshot of each for the whole call (a refresh swapped in meanwhile installs new stores and
    leaves these as they are), so ids, scores, blocks, embeddings and token ids come from one state of each shard;
    `tokenizer` tokenizes questions, and blocks stored without token ids. A `filter` is refused (on every process).
    """
    try:
        if filter is not None:
            raise ValueError(
                "A sharded corpus cannot filter a search: merge it into one retriever (`.to_retriever()`) to search "
                "with a filter, or keep the blocks you want from the results."
            )
        request = {
            "queries": contract.search_queries(queries, question_embedder, tokenizer)[0],
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
    queries, offsets = check_requests(requests, stores[0].dim, layout.num_blocks)
    mine = requests[group.rank]
    k = mine["k"]
    candidates = group.run(
        "Searching the local shards",
        local_candidates,
        layout,
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
    requests_out = block_requests(layout, group.world_size, ids, sources, mine)
    requests_in = group.exchange(requests_out)
    replies = group.run("Looking up retrieved blocks", answer_requests, layout, stores, tokenizer, requests_in)
    received = group.exchange(replies)
    return assemble(stores[0], ids, scores, received, mine)


def check_requests(requests: list[dict], dim: int, num_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """
    Refuse requests the processes disagree on, or that a single retriever over `num_blocks` blocks of dimension `dim`
    would refuse; every process sees every request, so every process raises the same error. Returns the gathered
    questions and each process's first row.
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
    if dims != {dim}:
        raise ValueError(
            f"Question embeddings have dimension {sorted(dims)}, but this corpus was built with an embedder of "
            f"projection size {dim}. Use the embedder that built the corpus."
        )
    if k > num_blocks:
        raise ValueError(
            f"k={k} is larger than the number of blocks in the corpus ({num_blocks}): ask for at most {num_blocks}."
        )
    queries = np.concatenate([r["queries"] for r in requests])
    contract.check_finite_queries(queries)
    offsets = np.cumsum([0] + [len(r["queries"]) for r in requests])
    return queries, offsets


def local_candidates(layout: ShardLayout, stores, queries: np.ndarray, k: int, rerank_factor: int, params: dict):
    """The top `k` of this process's shards for every gathered question: `(scores, block ids, global shard index)`."""
    parts = []
    for j, store in enumerate(stores):
        kk = min(k, len(store))
        if len(queries):
            out = store.top_blocks(queries, kk, rerank_factor, params, return_blocks=False)
            scores, ids = out.scores.numpy(), out.block_ids.numpy()
        else:
            scores, ids = np.empty((0, kk), np.float32), np.empty((0, kk), np.int64)
        parts.append((scores, ids, np.full(ids.shape, layout.first_local + j, dtype=np.int64)))
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


def block_requests(layout: ShardLayout, world_size: int, ids, sources, wanted: dict) -> list:
    """For each process, the positions (in this process's `(batch, k)` results) and ids of the blocks it holds."""
    flat_ids, flat_sources = ids.reshape(-1), sources.reshape(-1)
    owners = np.where(flat_ids >= 0, layout.owner[np.maximum(flat_sources, 0)], -1)
    requests = []
    for process in range(world_size):
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


def answer_requests(layout: ShardLayout, stores, tokenizer, requests: list[dict]) -> list:
    """The data of the requested blocks, for each process that asked."""
    return [block_data(layout, stores, tokenizer, request) for request in requests]


def block_data(layout: ShardLayout, stores, tokenizer, request: dict) -> list:
    """The blocks, reader token ids and stored embeddings of a request, per local shard, with positions."""
    parts = []
    for j, store in enumerate(stores):
        selected = request["sources"] == layout.first_local + j
        if not selected.any():
            continue
        part_ids = request["ids"][selected]
        part = {"positions": request["positions"][selected]}
        if request["blocks"]:
            part["blocks"] = store.corpus.blocks(part_ids)
        if request["tokens"]:
            tokens, lengths = store.token_ids(part_ids, tokenizer)
            part["tokens"], part["lengths"] = tokens.numpy(), lengths.numpy()
        if request["embeddings"]:
            part["embeddings"] = store.corpus.embeddings(part_ids, store.dim)
        parts.append(part)
    return parts


def assemble(store: BlockStore, ids, scores, received, wanted: dict) -> RealmSearchOutput:
    """This process's search output from the merged ids and scores and the block data the other processes sent."""
    size, dim = ids.size, store.dim
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
