"""
The saved retriever directory: saving it (corpus, index, BM25 index, tokenizer and manifest, written as one staged save;
a memory-mapped index following its new file) and loading it back checked (corpus, index, BM25 index and tokenizer
against the manifest and each other). The manifest and its checks: `retrieval/manifest.py`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re

import datasets
import numpy as np
import pyarrow as pa

from ..constants import (
    CORPUS_DIR,
    INDEX_NAME,
    MANIFEST_NAME,
    RETRIEVER_ENTRIES,
    SPARSE_INDEX_DIR,
    TOKENIZER_DIR,
)
from ..io.consistent_reads import consistent_read, recover_moved_aside
from ..io.paths import check_relative_name, resolve_inside
from ..logging_utils import get_logger
from ..progress import datasets_bars_follow_switches
from .bm25 import BM25BlockIndex
from .corpus import BlockCorpus, caching_outside, check_corpus_columns
from .index import BlockIndex
from .manifest import (
    build_manifest,
    check_state_file,
    check_tokenizer_config,
    read_manifest,
    tokenizer_error,
    verify_retriever_files,
    write_manifest,
)
from .store import REBUILD_HINT, BlockStore

logger = get_logger(__name__)


def parse_size(size: str | int) -> int:
    """
    A size in bytes from an `int` or a string such as `"500MB"`, `"1.5GB"` or `"64MiB"` (decimal and binary units, as
    `max_shard_size` takes them in transformers and datasets).

    Raises:
        `ValueError`: The string is not a number with an optional unit.
    """
    if isinstance(size, int):
        return size
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B)?\s*", str(size), flags=re.IGNORECASE)
    if not match:
        raise ValueError(f"Cannot parse size {size!r}; use e.g. 500MB or an int number of bytes.")
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
    units.update({"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40})
    return int(float(match.group(1)) * units[(match.group(2) or "").upper()])


def _save_parquet_shards(corpus: datasets.Dataset, corpus_dir: str, max_shard_size) -> None:
    os.makedirs(corpus_dir)
    fraction = len(corpus) / max(1, corpus.data.num_rows)
    nbytes = int(corpus.data.nbytes * fraction)
    num_shards = max(1, math.ceil(nbytes / parse_size(max_shard_size)))
    for i in range(num_shards):
        shard = corpus.shard(num_shards, i, contiguous=True)
        shard.to_parquet(os.path.join(corpus_dir, f"data-{i:05d}-of-{num_shards:05d}.parquet"))


def resolve_pretrained_path(path_or_repo_id: str, revision, subfolder, repo_type, cache_dir, token) -> str:
    """
    The local folder of a retriever given as a directory or a Hub repo id (with its `subfolder`): a directory as it is
    (after completing a directory swap killed half-way), a repo id downloaded through `huggingface_hub`'s cache (the
    `repo_type` given, else a model repo, then a dataset repo).

    Raises:
        `OSError`: The directory or subfolder does not exist, the path is a file, or the repo cannot be downloaded.
    """
    recover_moved_aside(path_or_repo_id)  # a directory swap (e.g. `realm-hf index --overwrite`) killed half-way
    if os.path.isdir(path_or_repo_id):
        path = os.path.join(path_or_repo_id, subfolder) if subfolder else path_or_repo_id
        if not os.path.isdir(path):
            raise OSError(f"{path} does not exist.")
        return path
    if os.path.exists(path_or_repo_id):
        raise OSError(f"{path_or_repo_id} is a file, not a retriever directory.")
    if path_or_repo_id.startswith((".", "/", "~")) or path_or_repo_id.count("/") > 1:
        # Looks like a local path, not an `owner/name` repo id: do not try the Hub.
        raise OSError(f"Retriever directory {path_or_repo_id} not found.")
    from huggingface_hub import snapshot_download

    allow_patterns = [f"{subfolder}/*"] if subfolder else None
    errors = []
    for kind in [repo_type] if repo_type else ["model", "dataset"]:
        try:
            local = snapshot_download(
                path_or_repo_id,
                revision=revision,
                repo_type=kind,
                allow_patterns=allow_patterns,
                cache_dir=cache_dir,
                token=token,
            )
            return os.path.join(local, subfolder) if subfolder else local
        except Exception as err:  # noqa: BLE001 - reported together below
            errors.append(f"{kind} repo: {type(err).__name__}: {err}")
    offline = (
        " (HF_HUB_OFFLINE is set: only repos already in the local cache can load)"
        if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
        else ""
    )
    raise OSError(
        f"{path_or_repo_id!r} is not a local directory and could not be downloaded from the Hub{offline}: "
        + "; ".join(errors)
    )


def _load_corpus(corpus_dir: str, manifest: dict, mmap: bool) -> datasets.Dataset:
    if not os.path.isdir(corpus_dir):
        raise OSError(f"Corpus folder {corpus_dir} not found. {REBUILD_HINT}")
    parquet = sorted(f for f in os.listdir(corpus_dir) if f.endswith(".parquet"))
    state_path = os.path.join(corpus_dir, "state.json")
    if os.path.isfile(state_path):
        check_state_file(corpus_dir, state_path)
    try:
        if os.path.isfile(state_path):
            # load_from_disk memory-maps the Arrow files unless keep_in_memory=True.
            corpus = datasets.load_from_disk(corpus_dir, keep_in_memory=not mmap)
            # `map`/`filter` on the loaded corpus must not write datasets' cache files into the saved folder.
            corpus = caching_outside(corpus, corpus_dir) if mmap else corpus
        elif parquet:
            corpus = datasets.Dataset.from_parquet(
                [os.path.join(corpus_dir, f) for f in parquet], keep_in_memory=not mmap
            )
        else:
            raise OSError(
                f"{corpus_dir} holds neither a saved Dataset (state.json) nor Parquet shards. {REBUILD_HINT}"
            )
    except (FileNotFoundError, ValueError, pa.ArrowInvalid) as err:
        raise OSError(f"Could not read the corpus in {corpus_dir}: {err}. {REBUILD_HINT}") from None
    if isinstance(corpus, datasets.DatasetDict):
        raise OSError(f"{corpus_dir} holds a DatasetDict; a retriever corpus is a single Dataset.")
    check_corpus_columns(corpus)
    return corpus


def try_load_tokenizer(path: str):
    """
    The tokenizer saved in `path` (`AutoTokenizer`, else a plain BERT tokenizer), or `None` with a warning when none
    loads or the one that loads has no vocabulary ([`~realm_hf.text.tokenizer_calls.check_vocabulary`]): for sources
    whose tokenizer is optional (a legacy checkpoint, a retriever built without one).
    """
    from transformers import AutoTokenizer, BertTokenizer

    from ..text.tokenizer_calls import check_vocabulary  # with transformers, imported when a tokenizer is loaded

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as err:  # noqa: BLE001 - fall back to a plain BERT tokenizer below
        try:
            tokenizer = BertTokenizer.from_pretrained(path)
        except Exception:  # noqa: BLE001
            logger.warning("Could not load a tokenizer from %s (%s); the retriever has none.", path, err)
            return None
    # A folder without the vocabulary loads a tokenizer of special tokens only: no tokenizer is better than that one.
    try:
        check_vocabulary(tokenizer, path)
    except OSError as err:
        logger.warning("%s The retriever has no tokenizer.", err)
        return None
    return tokenizer


def _load_tokenizer(path: str, manifest: dict):
    """
    The retriever's tokenizer, or `None` when the manifest says it was saved without one. A tokenizer that is
    missing or cannot be loaded is an error, never a fallback: a tokenizer without its vocabulary silently maps every
    word to [UNK].
    """
    manifest_path = os.path.join(path, MANIFEST_NAME)
    tokenizer_dir = manifest.get("tokenizer_dir", TOKENIZER_DIR)
    if tokenizer_dir is None:
        return None
    directory = resolve_inside(path, tokenizer_dir, "the field 'tokenizer_dir'", manifest_path)
    if not os.path.isdir(directory):
        if "tokenizer_dir" not in manifest:
            return None  # an early manifest that did not say: no tokenizer was saved
        raise tokenizer_error(directory, f"the folder is missing ({manifest_path} names it)")
    present = [name for name in _VOCABULARY_FILES if os.path.isfile(os.path.join(directory, name))]
    if not present:
        raise tokenizer_error(
            directory, f"it has no vocabulary file ({' or '.join(_VOCABULARY_FILES[:2])}: deleted or never copied)"
        )
    check_tokenizer_config(directory)
    from transformers import AutoTokenizer, BertTokenizerFast

    try:
        tokenizer = AutoTokenizer.from_pretrained(directory)
    except Exception as err:  # noqa: BLE001 - a legacy config naming an unregistered class: try plain BERT below
        try:
            tokenizer = BertTokenizerFast.from_pretrained(directory)
        except Exception:  # noqa: BLE001 - report the first, more telling error
            raise tokenizer_error(
                directory, f"{', '.join(present)} is corrupt ({type(err).__name__}: {err})"
            ) from None
    expected = manifest.get("tokenizer_vocab_size")
    special = set(getattr(tokenizer, "all_special_tokens", []))
    if (expected is not None and len(tokenizer) != expected) or len(tokenizer) <= len(special):
        raise tokenizer_error(
            directory,
            f"it loads with {len(tokenizer)} tokens"
            + (f" but was saved with {expected}" if expected is not None else ", only its special tokens")
            + f" ({', '.join(present)} is incomplete or corrupt)",
        )
    return tokenizer


def _can_map_index(manifest: dict) -> bool:
    # FAISS maps an IVF index's lists read-only, and row labels are rewritten in those lists: read it into RAM.
    return manifest.get("index_labels", "block_id") != "row" or "IVF" not in str(manifest.get("index_type", ""))


def check_corpus_format(corpus_format: str) -> None:
    if corpus_format not in ("arrow", "parquet"):
        raise ValueError(f"corpus_format must be 'arrow' or 'parquet', got {corpus_format!r}.")


def write_store(
    store: BlockStore,
    directory: str,
    tokenizer=None,
    max_block_length: int | None = None,
    corpus_format: str = "arrow",
    max_shard_size="500MB",
    model_files: dict | None = None,
) -> dict:
    """
    Write `store`'s corpus and index (and BM25 index, if it has one), `tokenizer` and the manifest into `directory`, a new or empty folder (the
    staging folder of a save). The manifest records the size and sha256 of every file and, given `model_files` (see
    [`record_model_files`]), the weights saved with it. Returns the manifest.
    """
    check_corpus_format(corpus_format)
    os.makedirs(directory, exist_ok=True)
    corpus_dir = os.path.join(directory, CORPUS_DIR)
    if corpus_format == "arrow":
        with datasets_bars_follow_switches():  # "Saving the dataset": silent when realm-hf's bars are
            store.corpus.dataset.save_to_disk(corpus_dir, max_shard_size=max_shard_size)
    else:
        _save_parquet_shards(store.corpus.dataset, corpus_dir, max_shard_size)
    index_path = os.path.join(directory, INDEX_NAME)
    index_labels = store.index.save(index_path, store.corpus.rows)
    if tokenizer is not None:
        tokenizer.save_pretrained(os.path.join(directory, TOKENIZER_DIR))
    if store.sparse is not None:
        # The BM25 index of a hybrid store (`retrieval/bm25.py`): its files go under the same manifest and checksums.
        store.sparse.save(os.path.join(directory, SPARSE_INDEX_DIR))
    manifest = build_manifest(store, tokenizer, max_block_length)
    return write_manifest(directory, manifest, corpus_format, index_labels, tokenizer, model_files)


def record_num_blocks(config, model_dir: str, num_blocks: int) -> None:
    """
    Set `config.num_block_records` (and the one in `model_dir/config.json`, written just before the retriever) to
    `num_blocks`, the block count of the corpus saved with the model, taken under the retriever's lock with it:
    documents added while the model saves then change neither, and config and corpus agree.
    """
    config.num_block_records = int(num_blocks)
    path = os.path.join(model_dir, "config.json")
    with open(path, encoding="utf-8") as f:
        saved = json.load(f)
    if saved.get("num_block_records") != int(num_blocks):
        saved["num_block_records"] = int(num_blocks)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(saved, f, indent=2, sort_keys=True)
            f.write("\n")


def saved_store(store: BlockStore, directory: str) -> BlockStore:
    """
    `store` after it was saved into `directory`: a memory-mapped index follows the new file (the save may have
    replaced the one it mapped); row labels (format 2) map back to block ids through the corpus.
    """
    if store.index.source is None:
        return store
    with open(os.path.join(directory, MANIFEST_NAME), encoding="utf-8") as f:
        index_labels = json.load(f).get("index_labels", "block_id")
    row_ids = store.corpus.row_ids if index_labels == "row" else None
    index = store.index.following_file(os.path.join(directory, INDEX_NAME), row_ids)
    return dataclasses.replace(store, index=index)


def stage_retriever_entries(save, staging: str) -> None:
    """Which entries of a retriever directory a staged `save` replaces (what it wrote) and removes (the rest)."""
    written = set(os.listdir(staging))
    save.replace = [name for name in RETRIEVER_ENTRIES if name in written]
    save.remove = [name for name in RETRIEVER_ENTRIES if name not in written]


def load_retriever_parts(
    path: str,
    expected_dim: int | None = None,
    expected_num_blocks: int | None = None,
    mmap: bool = True,
    verify_checksums: bool = True,
) -> tuple[dict, BlockStore, object]:
    """
    Read and check a saved retriever directory: the manifest against the model's expectations, every file against
    the sizes and sha256 checksums the manifest recorded (checksums with `verify_checksums`), the index and the corpus
    against the manifest and each other. Returns `(manifest, store, tokenizer)`. Read as one save (a save into it, or
    into the model directory holding it, is completed or waited for: see
    [`realm_hf.io.consistent_reads.consistent_read`]).
    """
    with consistent_read(path):
        return _load_retriever_parts(path, expected_dim, expected_num_blocks, mmap, verify_checksums)


def _load_retriever_parts(
    path: str, expected_dim: int | None, expected_num_blocks: int | None, mmap: bool, verify_checksums: bool
) -> tuple[dict, BlockStore, object]:
    manifest = read_manifest(path)
    dim = int(manifest["embedding_dim"])
    num_blocks = int(manifest["num_blocks"])
    if expected_dim is not None and int(expected_dim) != dim:
        raise ValueError(
            f"The corpus in {path} holds {dim}-d embeddings (built with an embedder of projection size {dim}), but "
            f"the model expects {expected_dim}-d embeddings (config.retriever_proj_size). Use the corpus built "
            "for this model, or re-embed it with `realm_hf.retrieval.embed_corpus(retriever, embedder)`."
        )
    if expected_num_blocks is not None and int(expected_num_blocks) != num_blocks:
        raise ValueError(
            f"The corpus in {path} has {num_blocks} blocks but {expected_num_blocks} were expected "
            "(e.g. config.num_block_records). Use the corpus that belongs to this model."
        )
    verify_retriever_files(path, manifest, verify_checksums)
    manifest_path = os.path.join(path, MANIFEST_NAME)
    index_path = resolve_inside(path, manifest.get("index_file", INDEX_NAME), "the field 'index_file'", manifest_path)
    expected_size = manifest.get("index_file_size")
    if expected_size is not None and os.path.isfile(index_path) and os.path.getsize(index_path) != expected_size:
        raise ValueError(
            f"{index_path} has {os.path.getsize(index_path)} bytes but the manifest recorded {expected_size}: the "
            f"file is truncated or from another corpus. {REBUILD_HINT}"
        )
    corpus_dir = resolve_inside(path, manifest.get("corpus_dir", CORPUS_DIR), "the field 'corpus_dir'", manifest_path)
    dataset = _load_corpus(corpus_dir, manifest, mmap)
    if len(dataset) != num_blocks:
        raise ValueError(
            f"The corpus in {path} has {len(dataset)} blocks but the manifest says {num_blocks}. {REBUILD_HINT}"
        )
    corpus = BlockCorpus(dataset)
    index = BlockIndex.load(
        index_path,
        manifest.get("index_type", "Flat"),
        manifest.get("index_labels", "block_id"),
        corpus.row_ids,
        dim,
        mmap=mmap and _can_map_index(manifest),
        how_to_fix=REBUILD_HINT,
    )
    store = BlockStore(
        corpus,
        index,
        next_block_id=manifest.get("next_block_id") or 0,
        embedder_fingerprint=manifest.get("embedder_fingerprint"),
        sparse=_load_sparse_index(path, manifest, corpus),
    )
    return manifest, store, _load_tokenizer(path, manifest)


def _load_sparse_index(path: str, manifest: dict, corpus: BlockCorpus):
    """
    The BM25 index the manifest names (`sparse_index`; its files were checked with the others), or `None`. Without
    `bm25s` installed, a warning says the retriever searches its dense index alone.
    """
    entry = manifest.get("sparse_index")
    if entry is None:
        return None
    parts = check_relative_name(entry.get("dir") if isinstance(entry, dict) else None, "sparse_index", MANIFEST_NAME)
    try:
        sparse = BM25BlockIndex.load(os.path.join(path, *parts))
    except ImportError as error:
        logger.warning("%s The retriever in %s is loaded without its BM25 index (dense search only).", error, path)
        return None
    if not np.array_equal(sparse.block_ids, corpus.row_ids):
        raise ValueError(
            f"The BM25 index in {path} covers other blocks than the corpus: save the hybrid retriever again."
        )
    return sparse


# Files that hold a tokenizer's vocabulary (transformers 5 writes tokenizer.json; older saves vocab.txt).
_VOCABULARY_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model")
