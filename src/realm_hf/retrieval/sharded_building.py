"""
Building a sharded retriever: splitting a retriever's rows into shards, splitting and embedding documents on each
process, and merging every shard back into one retriever.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import datasets
import numpy as np
import torch

from . import building
from .chunking import split_documents
from .collectives import ShardGroup
from .corpus import BlockCorpus
from .encoding import embed_blocks, fingerprint_module
from .index import BlockIndex
from .retriever import RealmRetriever

if TYPE_CHECKING:
    from .sharding import ShardedRealmRetriever


def row_bounds(num_rows: int, num_parts: int) -> list[int]:
    """Contiguous split of `num_rows` rows into `num_parts` parts: part `i` is rows `bounds[i]:bounds[i + 1]`."""
    return [num_rows * i // num_parts for i in range(num_parts + 1)]


def shard_of(retriever: RealmRetriever, start: int, end: int, train_size: int | None = None) -> RealmRetriever:
    """A [`RealmRetriever`] over rows `start:end` of `retriever` (same block ids), indexed with its index type."""
    with retriever._lock:
        corpus = retriever._corpus
    rows = corpus.dataset.select(range(start, end))
    embeddings = np.ascontiguousarray(corpus.embedding_rows(slice(start, end)), dtype=np.float32)
    index = BlockIndex.from_matrix(retriever.index_type, embeddings, corpus.row_ids[start:end], train_size)
    return RealmRetriever(
        BlockCorpus(rows),
        index,
        tokenizer=retriever.tokenizer,
        max_block_length=retriever.max_block_length,
        embedder_fingerprint=retriever.embedder_fingerprint,
    )


def split_retriever(cls, retriever: RealmRetriever, group, num_shards: int | None, train_size: int | None):
    """[`ShardedRealmRetriever.from_retriever`]."""
    group = group if isinstance(group, ShardGroup) else ShardGroup(group)
    num_shards = group.world_size if num_shards is None else int(num_shards)
    if num_shards < 1 or num_shards % group.world_size:
        raise ValueError(
            f"num_shards={num_shards} cannot be split evenly over {group.world_size} processes: use a multiple "
            f"of {group.world_size}."
        )
    per_process = num_shards // group.world_size
    bounds = row_bounds(retriever.num_blocks, num_shards)
    first = group.rank * per_process

    def build():
        return [shard_of(retriever, bounds[i], bounds[i + 1], train_size) for i in range(first, first + per_process)]

    return cls(group.run("Splitting the retriever into shards", build), group=group)


def build_from_documents(
    cls,
    documents,
    embedder: torch.nn.Module,
    tokenizer,
    max_block_length: int,
    index: str,
    batch_size: int,
    device,
    dtype,
    show_progress: bool,
    train_size: int | None,
    group,
):
    """[`ShardedRealmRetriever.from_documents`]."""
    group = group if isinstance(group, ShardGroup) else ShardGroup(group)
    if isinstance(documents, dict):  # columns
        num_documents = len(next(iter(documents.values()), []))
    else:
        documents = documents if hasattr(documents, "__getitem__") else list(documents)
        num_documents = len(documents)
    bounds = row_bounds(num_documents, group.world_size)
    lo, hi = bounds[group.rank], bounds[group.rank + 1]

    def split():
        if isinstance(documents, dict):
            share = {name: list(values[lo:hi]) for name, values in documents.items()}
        elif hasattr(documents, "select"):
            share = documents.select(range(lo, hi))
        else:
            share = documents[lo:hi]
        return split_documents(share, tokenizer, max_block_length, first_doc_id=lo)

    columns = group.run("Splitting the documents into blocks", split)
    counts = group.all_gather(len(columns["text"]))
    if 0 in counts:
        raise ValueError(
            f"Process {counts.index(0)} got no block to index ({num_documents} documents over {group.world_size} "
            "processes): give every process documents with text, or use fewer processes."
        )
    offset = sum(counts[: group.rank])
    columns = {"block_id": np.arange(offset, offset + counts[group.rank], dtype=np.int64), **columns}

    def embed_and_index():
        embeddings = embed_blocks(
            embedder,
            tokenizer,
            columns["title"],
            columns["text"],
            max_length=max_block_length,
            batch_size=batch_size,
            device=device,
            dtype=dtype,
            show_progress=show_progress and group.rank == 0,
        ).numpy()
        return building.build(
            RealmRetriever,
            columns,
            embeddings,
            tokenizer=tokenizer,
            index=index,
            max_block_length=max_block_length,
            embedder_fingerprint=fingerprint_module(embedder),
            train_size=train_size,
        )

    return cls([group.run("Embedding and indexing the blocks", embed_and_index)], group=group)


def merge_shards(sharded: ShardedRealmRetriever, index: str | None, train_size: int | None) -> RealmRetriever:
    """[`ShardedRealmRetriever.to_retriever`]."""
    if len(sharded.shards) != sharded.num_shards:
        raise ValueError(
            f"This process holds {len(sharded.shards)} of {sharded.num_shards} shards: merge on one process that holds "
            "them all (load the sharded save without a process group)."
        )
    corpus = BlockCorpus(datasets.concatenate_datasets([shard.corpus for shard in sharded.shards]))
    embeddings = np.concatenate([shard._corpus.embedding_rows(slice(0, shard.num_blocks)) for shard in sharded.shards])
    block_index = BlockIndex.from_matrix(index or sharded.index_type, embeddings, corpus.row_ids, train_size)
    first = sharded.shards[0]
    return RealmRetriever(
        corpus,
        block_index,
        tokenizer=first.tokenizer,
        max_block_length=first.max_block_length,
        embedder_fingerprint=first.embedder_fingerprint,
    )
