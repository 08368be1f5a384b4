"""
Searching a sharded retriever: the questions of every process gathered, each process's shards searched, the top `k`
merged exactly, and the retrieved blocks' data sent from the processes that hold them; lookups of local blocks.
"""

from __future__ import annotations

import numpy as np
import torch

from ..logging_utils import get_logger
from . import searching
from .collectives import ShardedCollectiveError, describe
from .corpus import _unflatten, as_id_array
from .index import normalize_search_params
from .searching import RealmSearchOutput

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
            "queries": searching.as_query_matrix(question_embeddings),
            "k": searching.check_k(k),
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
    searching.check_finite_queries(queries)
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
        blocks=_unflatten(blocks, ids) if blocks is not None else None,
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
