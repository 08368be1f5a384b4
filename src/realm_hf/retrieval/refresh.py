"""
Refresh and staleness of a retriever's index. REALM re-embeds its corpus while the document embedder trains: whether
an embedder's weights are those that filled the index ([`is_stale`], [`check_embedder`]), re-embedding the blocks
([`embed_corpus`]), and the index states built off the live retriever, safe in a background thread
([`refresh_index_state`], [`saved_index_state`]), that the retriever's `swap_index_state` installs under its lock.

Functions over the public surface of a retriever ([`Retriever`]): a [`RealmRetriever`] through its `store`,
`tokenizer`, `max_block_length`, `swap_index_state` and `export_index_state`; a [`ShardedRealmRetriever`] shard by
shard, each process refreshing the shards it holds (its `shards`, each a [`RealmRetriever`]).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ..logging_utils import get_logger, warn
from .building import embed_rows
from .collectives import gather_rows, row_bounds
from .encoding import embedder_dim, fingerprint_module
from .store import BlockStore

logger = get_logger(__name__)


@dataclass
class ShardedIndexState:
    """The refreshed index states of the shards one process holds, in shard order (each a [`BlockStore`])."""

    shard_states: list[BlockStore]


def local_retrievers(retriever) -> list:
    """The [`RealmRetriever`]s whose blocks this process holds: a sharded retriever's `shards`, else `retriever`."""
    return list(retriever.shards) if retriever.collective else [retriever]


# ---------------------------------------------------------------------------------------------------------------------
# Staleness
# ---------------------------------------------------------------------------------------------------------------------


def is_stale(retriever, embedder: torch.nn.Module) -> bool | None:
    """
    Whether `embedder`'s weights differ from those that embedded the corpus (for a sharded retriever, any of this
    process's shards); `None` when a corpus recorded no embedder fingerprint.
    """
    recorded = [part.store.embedder_fingerprint for part in local_retrievers(retriever)]
    if None in recorded:
        return None
    fingerprint = fingerprint_module(embedder)
    return any(fingerprint != value for value in recorded)


def check_embedder(retriever, embedder: torch.nn.Module) -> None:
    """
    Refuse an embedder of another dimension than the corpus's; warn if its weights differ from those of the embedder
    that filled the index (a stale index: retrieval works, but the scores are not this embedder's).
    """
    first = local_retrievers(retriever)[0]
    dim = embedder_dim(embedder)
    if dim is not None and dim != first.embedding_dim:
        raise ValueError(
            f"The embedder projects to {dim} dimensions (config.retriever_proj_size) but this corpus was built "
            f"with an embedder of dimension {first.embedding_dim}. Re-embed the corpus with this embedder "
            "(`realm_hf.retrieval.embed_corpus(retriever, embedder)`) or use the matching model."
        )
    stale = is_stale(first, embedder)
    if stale:
        warn(
            f"The corpus index is stale: it was embedded by an embedder with fingerprint "
            f"{first.store.embedder_fingerprint}, but the given embedder's weights have fingerprint "
            f"{fingerprint_module(embedder)}. Retrieval still works, but scores no longer match what this "
            "embedder would produce; re-embed with `realm_hf.retrieval.embed_corpus(retriever, embedder)` and save again.",
            stacklevel=2,
        )
    elif stale is None:
        logger.info("No embedder fingerprint recorded for this corpus: cannot tell whether the index is stale.")


# ---------------------------------------------------------------------------------------------------------------------
# Re-embedding and index states
# ---------------------------------------------------------------------------------------------------------------------


def embed_corpus(
    retriever,
    embedder: torch.nn.Module,
    batch_size: int = 64,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    show_progress: bool | None = None,
    start: int | None = None,
    end: int | None = None,
    update_index: bool | None = None,
    chunk_size: int = 100_000,
    train_size: int | None = None,
) -> torch.FloatTensor | None:
    """
    Re-embed a retriever's blocks with `embedder` (e.g. after training it: REALM refreshes its index during
    pre-training), as [`embed_blocks`] does, with the corpus's titles, texts and `max_block_length`.

    Args:
        retriever ([`RealmRetriever`] or [`ShardedRealmRetriever`]): The retriever. A sharded one re-embeds the
            shards of this process and swaps their new indexes in (call it on every process); it returns `None` and
            takes no `start`, `end`, `update_index` or `chunk_size`.
        embedder (`torch.nn.Module`): The (document) embedder.
        batch_size, device, dtype: See [`embed_blocks`].
        show_progress (`bool`, *optional*): Draw a progress bar (by default for a [`RealmRetriever`] only).
        start (`int`, *optional*), end (`int`, *optional*): Embed only corpus rows `start:end` (e.g. one process's
            share in distributed re-indexing).
        update_index (`bool`, *optional*): Replace the stored embeddings and rebuild the index with the new ones (and
            record the embedder's fingerprint). Defaults to `True` when the whole corpus is embedded (`start`/`end`
            not given), `False` otherwise; to swap in a refresh built elsewhere use `retriever.store.with_embeddings`
            and `retriever.swap_index_state`.
        chunk_size (`int`): Rows tokenized at a time (bounds memory on large corpora).
        train_size (`int`, *optional*): Training sample size when the index is rebuilt.

    Returns:
        `torch.FloatTensor` of shape `(end - start, dim)`: the new embeddings of those rows, in row order.
    """
    if retriever.collective:
        if (start, end, update_index) != (None, None, None) or chunk_size != 100_000:
            raise ValueError(
                "A sharded retriever re-embeds every block of this process's shards: start, end, update_index and "
                "chunk_size do not apply."
            )
        state = refresh_index_state(retriever, embedder, batch_size, device, dtype, bool(show_progress), train_size)
        retriever.swap_index_state(state)
        return None
    if retriever.tokenizer is None:
        raise ValueError("This retriever has no tokenizer: set `retriever.tokenizer` before re-embedding.")
    if update_index is None:
        update_index = start is None and end is None
    # One snapshot of the blocks for the whole call: documents added or removed meanwhile must not shift the rows
    # between chunks, or between embedding them and building the index (the swap then refuses the stale state).
    store = retriever.store
    start = 0 if start is None else int(start)
    end = len(store) if end is None else int(end)
    if update_index and (start, end) != (0, len(store)):
        raise ValueError("update_index=True needs the whole corpus embedded (no start/end).")
    embeddings = embed_rows(
        store,
        embedder,
        retriever.tokenizer,
        retriever.max_block_length,
        start,
        end,
        batch_size,
        device,
        dtype,
        True if show_progress is None else show_progress,
        chunk_size,
    )
    if update_index:
        retriever.swap_index_state(store.with_embeddings(embeddings, fingerprint_module(embedder), train_size))
    return embeddings


def refresh_index_state(
    retriever,
    embedder: torch.nn.Module,
    batch_size: int = 64,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    show_progress: bool = False,
    train_size: int | None = None,
    group=None,
) -> BlockStore | ShardedIndexState:
    """
    Re-embed a retriever's blocks with `embedder` and build the new store, without touching the live one (safe in a
    background thread); install it with `retriever.swap_index_state`.

    For a [`RealmRetriever`] given a gloo `group` of `torch.distributed` whose every process holds this corpus, each
    process embeds a contiguous share of the rows and the shares are gathered (a collective call over `group`);
    otherwise this process embeds every row. A [`ShardedRealmRetriever`] refreshes the shards of this process, each on
    its own (no process needs another's embeddings, `group` is not used), into a [`ShardedIndexState`].
    """
    if retriever.collective:
        fingerprint = fingerprint_module(embedder)
        states = []
        for shard in retriever.shards:
            if shard.tokenizer is None:
                raise ValueError("This retriever has no tokenizer: set `retriever.tokenizer` before re-embedding.")
            store = shard.store
            embeddings = embed_rows(
                store,
                embedder,
                shard.tokenizer,
                shard.max_block_length,
                0,
                len(store),
                batch_size,
                device,
                dtype,
                show_progress,
            )
            states.append(store.with_embeddings(embeddings, fingerprint, train_size))
        return ShardedIndexState(states)
    store = retriever.store  # the blocks this refresh embeds; the swap refuses it if they changed meanwhile
    rank, world_size = (0, 1) if group is None else (group.rank(), group.size())
    bounds = row_bounds(len(store), world_size)
    embeddings = embed_rows(
        store,
        embedder,
        retriever.tokenizer,
        retriever.max_block_length,
        bounds[rank],
        bounds[rank + 1],
        batch_size,
        device,
        dtype,
        show_progress and rank == 0,
    )
    if world_size > 1:
        embeddings = gather_rows(embeddings, bounds, group)
    return store.with_embeddings(embeddings, fingerprint_module(embedder), train_size)


def saved_index_state(retriever, path: str | os.PathLike) -> BlockStore | ShardedIndexState:
    """
    The index state saved in `path` (a retriever directory, or a sharded one for a [`ShardedRealmRetriever`]: a
    collective call), to swap into `retriever`: how a training checkpoint is resumed.
    """
    if retriever.collective:
        return type(retriever).from_pretrained(path, group=retriever.group).export_index_state()
    return type(retriever).from_pretrained(path).export_index_state()
