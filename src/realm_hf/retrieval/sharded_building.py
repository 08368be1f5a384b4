"""
Building a sharded retriever: splitting a retriever's rows into shards, splitting and embedding documents on each
process, and merging every shard back into one retriever.
"""

from __future__ import annotations

import datasets
import numpy as np
import torch

from . import building
from .building import BuildOptions
from .chunking import split_documents
from .collectives import ShardGroup, row_bounds
from .corpus import BlockCorpus
from .encoding import embed_blocks, fingerprint_module
from .index import BlockIndex
from .retriever import RealmRetriever
from .store import BlockStore


def shard_of(retriever: RealmRetriever, start: int, end: int, train_size: int | None = None) -> RealmRetriever:
    """A [`RealmRetriever`] over rows `start:end` of `retriever` (same block ids), indexed with its index type."""
    store = retriever.store.rows(start, end, train_size=train_size)
    return RealmRetriever.from_store(store, retriever.tokenizer, retriever.max_block_length)


def split_retriever(
    retriever: RealmRetriever, group: ShardGroup, num_shards: int | None, train_size: int | None
) -> list[RealmRetriever]:
    """The shards this process keeps of `retriever` split into `num_shards` contiguous shards (a collective call)."""
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

    return group.run("Splitting the retriever into shards", build)


def shard_from_documents(documents, embedder: torch.nn.Module, tokenizer, options: BuildOptions, group: ShardGroup):
    """
    This process's shard of `documents` (the same on every process): its contiguous share split, numbered after the
    blocks of the processes before it, embedded and indexed (a collective call).
    """
    if isinstance(documents, dict):  # columns
        num_documents = len(next(iter(documents.values()), []))
    else:
        documents = documents if hasattr(documents, "__getitem__") else list(documents)
        num_documents = len(documents)
    bounds = row_bounds(num_documents, group.world_size)
    lo, hi = bounds[group.rank], bounds[group.rank + 1]

    def split():
        share = building.documents_share(documents, lo, hi)
        return split_documents(share, tokenizer, options.max_block_length, first_doc_id=lo)

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
            max_length=options.max_block_length,
            show_progress=options.show_progress and group.rank == 0,
            **options.embed_kwargs(),
        ).numpy()
        store = building.build_store(
            columns,
            embeddings,
            tokenizer=tokenizer,
            index=options.index,
            embedder_fingerprint=fingerprint_module(embedder),
            train_size=options.train_size,
        )
        shard = RealmRetriever.from_store(store, tokenizer, options.max_block_length)
        return shard.to_gpu() if options.use_gpu else shard

    return group.run("Embedding and indexing the blocks", embed_and_index)


def merge_shards(shards: list[RealmRetriever], index: str | None, train_size: int | None) -> RealmRetriever:
    """One retriever over every shard, indexed from the stored embeddings with `index` (default: the shards' type)."""
    corpus = BlockCorpus(datasets.concatenate_datasets([shard.corpus for shard in shards]))
    first = shards[0]
    block_index = BlockIndex.from_corpus(index or first.index_type, corpus, train_size)
    store = BlockStore(corpus, block_index, embedder_fingerprint=first.embedder_fingerprint)
    return RealmRetriever.from_store(store, first.tokenizer, first.max_block_length)
