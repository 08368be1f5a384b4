"""
Searching a sharded retriever: the questions of every process gathered, each process's shards searched, the top `k`
merged exactly, and the retrieved blocks' data sent from the processes that hold them; lookups of retrieved blocks.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..logging_utils import get_logger
from ..text_inputs import check_positive_int
from . import searching
from .collectives import ShardedCollectiveError, describe
from .corpus import _unflatten, as_id_array, pad_token_ids
from .encoding import tokenize_block_texts
from .index import normalize_search_params
from .searching import RealmSearchOutput

if TYPE_CHECKING:
    from .sharding import ShardedRealmRetriever

logger = get_logger(__name__)


def sharded_search(
    retriever: ShardedRealmRetriever,
    question_embeddings,
    k: int,
    return_blocks: bool,
    rerank_factor: int,
    search_params: dict,
    return_embeddings: bool,
) -> RealmSearchOutput:
    """[`ShardedRealmRetriever.search`]: a collective call (every process of the retriever's group calls it)."""
    group = retriever.group
    try:
        request = {
            "queries": searching.as_query_matrix(question_embeddings),
            "k": check_positive_int(k, "k"),
            "rerank_factor": max(1, int(rerank_factor)),
            "params": normalize_search_params(search_params),
            "blocks": bool(return_blocks),
            "embeddings": bool(return_embeddings),
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
    # The shards' locks for the whole call: a refresh swapped in meanwhile waits, so ids, scores, blocks and stored
    # embeddings come from one state of each shard (as a single retriever's search guarantees).
    with contextlib.ExitStack() as locks:
        for shard in retriever.shards:
            locks.enter_context(shard._lock)
        candidates = group.run(
            "Searching the local shards",
            local_candidates,
            retriever,
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
        requests_out = block_requests(retriever, ids, sources, mine["blocks"], mine["embeddings"])
        requests_in = group.exchange(requests_out)
        replies = group.run("Looking up retrieved blocks", answer_requests, retriever, requests_in)
        received = group.exchange(replies)
    return assemble(retriever, ids, scores, received, mine["blocks"], mine["embeddings"])


def check_requests(retriever: ShardedRealmRetriever, requests: list[dict]) -> tuple[np.ndarray, np.ndarray]:
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


def local_candidates(retriever: ShardedRealmRetriever, queries: np.ndarray, k: int, rerank_factor: int, params: dict):
    """The top `k` of this process's shards for every gathered question: `(scores, block ids, global shard index)`."""
    parts = []
    for j, shard in enumerate(retriever.shards):
        kk = min(k, shard.num_blocks)
        if len(queries):
            out = searching.search(shard, queries, kk, False, rerank_factor, params)
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


def block_requests(retriever: ShardedRealmRetriever, ids, sources, want_blocks: bool, want_embeddings: bool) -> list:
    """For each process, the positions (in this process's `(batch, k)` results) and ids of the blocks it holds."""
    flat_ids, flat_sources = ids.reshape(-1), sources.reshape(-1)
    owners = np.where(flat_ids >= 0, retriever._shard_owner[np.maximum(flat_sources, 0)], -1)
    requests = []
    for process in range(retriever.group.world_size):
        positions = np.flatnonzero(owners == process)
        requests.append(
            {
                "positions": positions,
                "ids": flat_ids[positions],
                "sources": flat_sources[positions],
                "blocks": want_blocks,
                "embeddings": want_embeddings,
            }
        )
    return requests


def answer_requests(retriever: ShardedRealmRetriever, requests: list[dict]) -> list:
    """The data of the requested blocks, for each process that asked."""
    return [block_data(retriever, request) for request in requests]


def block_data(retriever: ShardedRealmRetriever, request: dict) -> list:
    """The blocks (dicts, reader token ids) and stored embeddings of a request, per local shard, with positions."""
    parts = []
    for j, shard in enumerate(retriever.shards):
        selected = request["sources"] == retriever.first_shard + j
        if not selected.any():
            continue
        part_ids = request["ids"][selected]
        part = {"positions": request["positions"][selected]}
        if request["blocks"]:
            part["blocks"] = shard.get_blocks(part_ids)
            if shard._corpus.has_token_ids:
                tokens, lengths = shard.get_block_token_ids(part_ids)
                part["tokens"], part["lengths"] = tokens.numpy(), lengths.numpy()
        if request["embeddings"]:
            part["embeddings"] = shard.get_block_embeddings(part_ids).numpy()
        parts.append(part)
    return parts


def assemble(retriever: ShardedRealmRetriever, ids, scores, received, want_blocks, want_embeddings):
    """This process's search output from the merged ids and scores and the block data the other processes sent."""
    size, dim = ids.size, retriever.embedding_dim
    parts = [part for sent in received for part in sent]
    blocks = embeddings = tokens = None
    if want_blocks:
        empty = retriever.shards[0].get_blocks(np.array([-1]))[0]
        blocks = [None] * size
        for part in parts:
            for position, block in zip(part["positions"], part["blocks"]):
                blocks[position] = block
        blocks = [dict(empty) if block is None else block for block in blocks]
        for block, score in zip(blocks, scores.reshape(-1).tolist()):
            block["score"] = score
        if parts and all("tokens" in part for part in parts):
            width = max(part["tokens"].shape[1] for part in parts)
            padded, lengths = np.full((size, width), -1, dtype=np.int32), np.zeros(size, dtype=np.int64)
            for part in parts:
                padded[part["positions"], : part["tokens"].shape[1]] = part["tokens"]
                lengths[part["positions"]] = part["lengths"]
            tokens = (padded, lengths)
    if want_embeddings:
        embeddings = np.zeros((size, dim), dtype=np.float32)
        for part in parts:
            embeddings[part["positions"]] = part["embeddings"]
    missing = ids < 0
    if missing.any():
        searching.warn_missing_results(retriever.shards[0], ids.shape[1], int(missing.any(axis=1).sum()))
    retriever._remember(ids, blocks, embeddings, tokens)
    return RealmSearchOutput(
        block_ids=torch.from_numpy(ids),
        scores=torch.from_numpy(scores),
        blocks=_unflatten(blocks, ids) if blocks is not None else None,
        block_embeddings=torch.from_numpy(embeddings.reshape(*ids.shape, dim)) if embeddings is not None else None,
    )


# ---------------------------------------------------------------------------------------------------------------------
# Lookups of retrieved blocks (not collective)
# ---------------------------------------------------------------------------------------------------------------------


def lookup(retriever: ShardedRealmRetriever, block_ids, what: str):
    """
    `what` (`"blocks"`, `"texts"`, `"embeddings"` or `"tokens"`) of `block_ids`, flat in row order: from the last
    search of this thread when `block_ids` are its ids, else from this process's shards (ids held elsewhere are
    refused with what to do). Returns `(ids, flat values)`.
    """
    ids = as_id_array(block_ids)
    cached = retriever._last_search()
    if cached is not None and cached["ids"].shape == ids.shape and np.array_equal(cached["ids"], ids):
        if what == "texts" and cached["blocks"] is not None:
            return ids, [block["text"] for block in cached["blocks"]]
        if what == "tokens" and cached["tokens"] is None and cached["blocks"] is not None:
            # Corpora stored without token ids: tokenized here, as a single retriever does.
            texts = [block["text"] for block in cached["blocks"]]
            return ids, pad_token_ids(tokenize_block_texts(retriever.tokenizer, texts))
        if what == "blocks" and cached["blocks"] is not None:
            # The blocks as the corpus holds them: the search's `score` is not part of a block.
            return ids, [{key: value for key, value in block.items() if key != "score"} for block in cached["blocks"]]
        if cached.get(what) is not None:
            return ids, cached[what]
    return ids, _local_lookup(retriever, ids.reshape(-1), what)


def _local_lookup(retriever: ShardedRealmRetriever, flat: np.ndarray, what: str):
    owner = np.full(len(flat), -1, dtype=np.int64)
    for j, shard in enumerate(retriever.shards):
        sorted_ids = shard._corpus.sorted_ids
        position = np.minimum(np.searchsorted(sorted_ids, flat), len(sorted_ids) - 1)
        owner[(sorted_ids[position] == flat) & (owner < 0)] = j
    unknown = (owner < 0) & (flat >= 0)
    if unknown.any():
        raise ValueError(
            f"Block ids {flat[unknown][:10].tolist()} are not held by this process (process {retriever.group.rank} "
            f"holds shards {retriever.first_shard}..{retriever.first_shard + len(retriever.shards) - 1} of "
            f"{retriever.num_shards}). A sharded retriever sends the data of other processes' blocks with the search "
            "that found them: use the search output (`blocks`, `block_embeddings` with `return_embeddings=True`), or "
            "look up the ids of this thread's last search."
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
