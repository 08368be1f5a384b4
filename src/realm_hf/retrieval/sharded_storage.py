"""
The shards of a sharded retriever, made and kept: a retriever's rows split into shards, documents split and embedded
on each process, shards merged back into one retriever; saved as N shard folders (each a retriever directory) and one
manifest with their block ranges and the sha256 of every file, written by all processes as one staged save, read back
checked. The retriever that holds them and its search: [`ShardedRealmRetriever`].
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re

import datasets
import numpy as np
import torch

from ..constants import FORMAT_VERSION, MANIFEST_NAME, RETRIEVER_ENTRIES, SHARD_FOLDER_FORMAT, SHARDED_MANIFEST_NAME
from ..io.checksums import file_sha256
from ..io.paths import resolve_inside
from ..io.staged_saves import recover_interrupted_save, staged_save
from . import building
from .building import BuildOptions
from .chunking import split_documents
from .collectives import ShardedCollectiveError, ShardGroup, describe, row_bounds
from .corpus import BlockCorpus
from .encoding import embed_blocks, fingerprint_module
from .index import BlockIndex
from .manifest import check_recorded_files
from .retriever import RealmRetriever
from .store import BlockStore

SHARDED_FORMAT = "realm-hf-sharded-retriever"
SHARDED_FORMAT_VERSION = 1

# Shard folders of any save (any shard count), so that a save with fewer shards removes the earlier ones.
_SHARD_FOLDER = re.compile(r"shard-\d{5}-of-\d{5}")


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
    block_index = BlockIndex.from_corpus(index or first.store.index_type, corpus, train_size)
    store = BlockStore(corpus, block_index, embedder_fingerprint=first.store.embedder_fingerprint)
    return RealmRetriever.from_store(store, first.tokenizer, first.max_block_length)


def shard_folder(index: int, count: int) -> str:
    return SHARD_FOLDER_FORMAT.format(index=index, count=count)


def save_sharded(retriever, save_directory, corpus_format: str, max_shard_size) -> None:
    """[`ShardedRealmRetriever.save_pretrained`]: every process writes its shards; process 0 stages and commits."""
    group = retriever.group
    target = os.path.abspath(os.fspath(save_directory))
    try:
        with contextlib.ExitStack() as stack:
            save = None

            def open_staging():
                nonlocal save
                if group.rank == 0:
                    save = stack.enter_context(staged_save(target))
                    return save.staging
                return None

            staging = group.broadcast(group.run("Preparing the sharded save", open_staging))

            def write_shards():
                if not os.path.isdir(staging):
                    raise OSError(
                        f"{staging} (created by process 0) is not visible here: save into a folder every process can "
                        "reach (a shared filesystem)."
                    )
                for j, shard in enumerate(retriever.shards):
                    folder = os.path.join(staging, shard_folder(retriever.first_shard + j, retriever.num_shards))
                    shard.write(folder, corpus_format, max_shard_size)

            group.run("Writing the shards", write_shards)

            def write_manifest():
                if group.rank == 0:
                    save.replace, save.remove = install_manifest(retriever, staging, target)

            group.run("Writing the sharded manifest", write_manifest)
        commit_error = None
    except Exception as err:
        if group.world_size == 1 or not _failed_in_commit(err):
            raise
        # Process 0 alone can fail here, swapping the staged save into place: tell the others.
        group.broadcast(describe(err))
        raise
    status = group.broadcast(commit_error)
    if status is not None:
        raise OSError(f"Process 0 could not install the sharded save into {target}: {status}")


def _failed_in_commit(error: Exception) -> bool:
    # Collective steps raise ShardedCollectiveError on every process; anything else came from process 0's commit.
    return not isinstance(error, ShardedCollectiveError)


def install_manifest(retriever, staging: str, target: str) -> tuple[list[str], list[str]]:
    """Write the sharded manifest into `staging` (process 0); returns the save's `(replace, remove)` entries."""
    folders = [shard_folder(i, retriever.num_shards) for i in range(retriever.num_shards)]
    shards, files, first_row = [], {}, 0
    for folder, info in zip(folders, retriever.layout):
        shard_manifest = os.path.join(staging, folder, MANIFEST_NAME)
        if not os.path.isfile(shard_manifest):
            raise OSError(
                f"{shard_manifest} was not written: the processes do not share {target}. Save into a folder every "
                "process can reach (a shared filesystem)."
            )
        with open(shard_manifest, encoding="utf-8") as f:
            recorded = json.load(f)
        files[f"{folder}/{MANIFEST_NAME}"] = {
            "size": os.path.getsize(shard_manifest),
            "sha256": file_sha256(shard_manifest),
        }
        files.update({f"{folder}/{name}": entry for name, entry in recorded["files"].items()})
        shards.append(
            {
                "directory": folder,
                "num_blocks": info["num_blocks"],
                "first_row": first_row,
                "block_id_range": list(info["id_range"]),
                "index_type": info["index_type"],
            }
        )
        first_row += info["num_blocks"]
    manifest = {
        "format": SHARDED_FORMAT,
        "format_version": SHARDED_FORMAT_VERSION,
        "retriever_format_version": FORMAT_VERSION,
        "library": "realm-hf",
        "num_shards": retriever.num_shards,
        "num_blocks": retriever.num_blocks,
        "embedding_dim": retriever.embedding_dim,
        "index_type": retriever.index_type,
        "embedder_fingerprint": retriever.embedder_fingerprint,
        "saved_by_processes": retriever.group.world_size,
        "shards": shards,
        "files": dict(sorted(files.items())),
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    with open(os.path.join(staging, SHARDED_MANIFEST_NAME), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")
    # Shard folders of an earlier save with more shards, and a single retriever saved here before: the directory
    # then holds exactly this save.
    old = [name for name in os.listdir(target) if _SHARD_FOLDER.fullmatch(name) and name not in folders]
    old += [name for name in RETRIEVER_ENTRIES if os.path.lexists(os.path.join(target, name))]
    return [*folders, SHARDED_MANIFEST_NAME], old


def read_sharded_manifest(path: str) -> dict:
    """The manifest of a sharded save, refused with what to do when it is missing or malformed."""
    manifest_path = os.path.join(path, SHARDED_MANIFEST_NAME)
    if not os.path.isfile(manifest_path):
        if os.path.isfile(os.path.join(path, MANIFEST_NAME)):
            raise OSError(
                f"{path} is a single retriever directory, not a sharded save: load it with "
                "`RealmRetriever.from_pretrained`, and split it across processes with "
                "`ShardedRealmRetriever.from_retriever(retriever)`."
            )
        raise OSError(
            f"{path} has no {SHARDED_MANIFEST_NAME}: it is not a sharded retriever save (write one with "
            "`ShardedRealmRetriever.save_pretrained`)."
        )
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{manifest_path} is not valid JSON ({err}): the save is corrupt; save it again.") from None
    if not isinstance(manifest, dict) or manifest.get("format") != SHARDED_FORMAT:
        raise ValueError(f"{manifest_path} is not a sharded retriever manifest; save the retriever again.")
    if int(manifest.get("format_version", 0)) > SHARDED_FORMAT_VERSION:
        raise ValueError(f"{manifest_path} was written by a newer realm-hf: upgrade (`pip install -U realm-hf`).")
    shards = manifest.get("shards")
    if not isinstance(shards, list) or len(shards) != manifest.get("num_shards") or not shards:
        raise ValueError(f"{manifest_path}: `shards` does not list `num_shards` shards; save the retriever again.")
    if sum(int(shard["num_blocks"]) for shard in shards) != manifest.get("num_blocks"):
        raise ValueError(f"{manifest_path}: the shards' block counts do not add up to `num_blocks`; save it again.")
    for shard in shards:
        resolve_inside(path, shard.get("directory"), "a shard's 'directory'", manifest_path)
    return manifest


def load_shards(
    path, group: ShardGroup, embedder, expected_dim, mmap: bool, verify_checksums: bool
) -> list[RealmRetriever]:
    """The shards this process holds of the sharded save in `path`, checked (a collective call)."""
    path = os.fspath(path)

    def plan():
        if not os.path.isdir(path):
            raise OSError(f"Sharded retriever directory {path} not found (sharded saves load from local folders).")
        recover_interrupted_save(path)
        manifest = read_sharded_manifest(path)
        count = manifest["num_shards"]
        if count % group.world_size:
            raise ValueError(
                f"{path} holds {count} shards, which cannot be split evenly over {group.world_size} processes: load "
                f"it on {count} processes (one shard each), on a number of processes that divides {count}, or on one "
                "process (all shards). To change the number of shards, load it on one process, merge it "
                "(`sharded.to_retriever()`) and split it again (`ShardedRealmRetriever.from_retriever`)."
            )
        dim = int(manifest["embedding_dim"])
        if expected_dim is not None and int(expected_dim) != dim:
            raise ValueError(
                f"The sharded corpus in {path} holds {dim}-d embeddings, but {expected_dim}-d were expected "
                "(config.retriever_proj_size): use the corpus built for this model."
            )
        return manifest

    manifest = group.run(f"Loading the sharded retriever {path}", plan)
    per_process = manifest["num_shards"] // group.world_size
    mine = manifest["shards"][group.rank * per_process : (group.rank + 1) * per_process]

    def load():
        manifest_path = os.path.join(path, SHARDED_MANIFEST_NAME)
        shards = []
        for shard in mine:
            prefix = shard["directory"] + "/"
            files = {name: entry for name, entry in manifest["files"].items() if name.startswith(prefix)}
            if f"{prefix}{MANIFEST_NAME}" not in files:
                raise ValueError(f"{manifest_path} records no manifest for {shard['directory']}: save it again.")
            # Every file of the shard checked against the sharded manifest (sha256 with `verify_checksums`), so the
            # shard's own manifest, and through it the shard, is the one this save wrote.
            check_recorded_files(path, files, verify_checksums, manifest_path, "'files'")
            loaded = RealmRetriever.from_pretrained(
                os.path.join(path, shard["directory"]), embedder=embedder, mmap=mmap, verify_checksums=False
            )
            if loaded.num_blocks != int(shard["num_blocks"]):
                raise ValueError(
                    f"{shard['directory']} holds {loaded.num_blocks} blocks but {manifest_path} records "
                    f"{shard['num_blocks']}: the folder comes from another save; save the retriever again."
                )
            shards.append(loaded)
        return shards

    return group.run(f"Loading the shards of {path}", load)
