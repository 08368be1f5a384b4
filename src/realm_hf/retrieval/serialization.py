"""
The saved retriever directory: saving and loading it (corpus, index, BM25 index, tokenizer and manifest, written as
one staged save and read back checked), and the checks: its manifest, paths that stay inside it, the files (sizes,
sha256) a save records, the tokenizer's config, and the model weights saved with it.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import re

import datasets
import faiss
import numpy as np
import pyarrow as pa

from ..constants import (
    CORPUS_DIR,
    FORMAT_VERSION,
    INDEX_NAME,
    LEGACY_BLOCK_RECORDS,
    MANIFEST_NAME,
    RETRIEVER_ENTRIES,
    SHARDED_MANIFEST_NAME,
    SPARSE_INDEX_DIR,
    TOKENIZER_DIR,
)
from ..io.auto_map import tokenizer_auto_map
from ..io.checksums import file_sha256
from ..io.consistent_reads import consistent_read, recover_moved_aside, save_in_progress
from ..io.paths import check_inside, check_relative_name, resolve_inside
from ..logging_utils import get_logger
from ..progress import datasets_bars_follow_switches
from ..version import __version__
from .bm25 import BM25BlockIndex
from .corpus import BlockCorpus, caching_outside, check_corpus_columns
from .index import BlockIndex
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
        _check_state_file(corpus_dir, state_path)
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
        raise _tokenizer_error(directory, f"the folder is missing ({manifest_path} names it)")
    present = [name for name in _VOCABULARY_FILES if os.path.isfile(os.path.join(directory, name))]
    if not present:
        raise _tokenizer_error(
            directory, f"it has no vocabulary file ({' or '.join(_VOCABULARY_FILES[:2])}: deleted or never copied)"
        )
    _check_tokenizer_config(directory)
    from transformers import AutoTokenizer, BertTokenizerFast

    try:
        tokenizer = AutoTokenizer.from_pretrained(directory)
    except Exception as err:  # noqa: BLE001 - a legacy config naming an unregistered class: try plain BERT below
        try:
            tokenizer = BertTokenizerFast.from_pretrained(directory)
        except Exception:  # noqa: BLE001 - report the first, more telling error
            raise _tokenizer_error(
                directory, f"{', '.join(present)} is corrupt ({type(err).__name__}: {err})"
            ) from None
    expected = manifest.get("tokenizer_vocab_size")
    special = set(getattr(tokenizer, "all_special_tokens", []))
    if (expected is not None and len(tokenizer) != expected) or len(tokenizer) <= len(special):
        raise _tokenizer_error(
            directory,
            f"it loads with {len(tokenizer)} tokens"
            + (f" but was saved with {expected}" if expected is not None else ", only its special tokens")
            + f" ({', '.join(present)} is incomplete or corrupt)",
        )
    return tokenizer


def _can_map_index(manifest: dict) -> bool:
    # FAISS maps an IVF index's lists read-only, and row labels are rewritten in those lists: read it into RAM.
    return manifest.get("index_labels", "block_id") != "row" or "IVF" not in str(manifest.get("index_type", ""))


def build_manifest(store: BlockStore, tokenizer=None, max_block_length: int | None = None) -> dict:
    """The manifest of a retriever's `store` as a save writes it (without the file entries and sizes)."""
    manifest = manifest_fields(
        index_type=store.index_type,
        embedding_dim=store.dim,
        num_blocks=len(store),
        next_block_id=store.next_block_id,
        max_block_length=max_block_length,
        embedder_fingerprint=store.embedder_fingerprint,
        columns=store.corpus.dataset.column_names,
    )
    if store.sparse is not None:
        manifest["sparse_index"] = {"dir": SPARSE_INDEX_DIR, "library": "bm25s"}
    return manifest


def manifest_fields(
    index_type: str,
    embedding_dim: int,
    num_blocks: int,
    next_block_id: int,
    max_block_length: int | None,
    embedder_fingerprint: str | None,
    columns: list[str],
) -> dict:
    """A retriever manifest's description of the corpus and index (without the file entries and sizes)."""
    return {
        "format_version": FORMAT_VERSION,
        "library": "realm-hf",
        "realm_hf_version": __version__,
        "faiss_version": getattr(faiss, "__version__", "unknown"),
        "index_type": index_type,
        "metric": "inner_product",
        "embedding_dim": embedding_dim,
        "num_blocks": num_blocks,
        "next_block_id": next_block_id,
        "max_block_length": max_block_length,
        "embedder_fingerprint": embedder_fingerprint,
        "columns": list(columns),
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def write_manifest(
    directory: str, manifest: dict, corpus_format: str, index_labels: str, tokenizer, model_files: dict | None = None
) -> dict:
    """
    Complete `manifest` with the layout of `directory` (corpus, index, tokenizer) and the size and sha256 of every
    file in it, and write it there: the last file of a retriever directory.
    """
    index_path = os.path.join(directory, INDEX_NAME)
    manifest = dict(manifest)
    manifest.update(
        corpus_format=corpus_format,
        corpus_dir=CORPUS_DIR,
        index_file=INDEX_NAME,
        index_file_size=os.path.getsize(index_path),
        index_labels=index_labels,
        tokenizer_dir=TOKENIZER_DIR if tokenizer is not None else None,
        tokenizer_vocab_size=len(tokenizer) if tokenizer is not None else None,
        files=_record_files(directory),
    )
    if model_files:
        manifest["model_files"] = model_files
    with open(os.path.join(directory, MANIFEST_NAME), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")
    return manifest


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
        # The BM25 index of a hybrid store (`retrieval/sparse.py`): its files go under the same manifest and checksums.
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
    row_ids = store.block_ids if index_labels == "row" else None
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
    manifest = _read_manifest(path)
    dim = int(manifest["embedding_dim"])
    num_blocks = int(manifest["num_blocks"])
    if expected_dim is not None and int(expected_dim) != dim:
        raise ValueError(
            f"The corpus in {path} holds {dim}-d embeddings (built with an embedder of projection size {dim}), but "
            f"the model expects {expected_dim}-d embeddings (config.retriever_proj_size). Use the corpus built "
            "for this model, or re-embed it with `retriever.embed_corpus(embedder)`."
        )
    if expected_num_blocks is not None and int(expected_num_blocks) != num_blocks:
        raise ValueError(
            f"The corpus in {path} has {num_blocks} blocks but {expected_num_blocks} were expected "
            "(e.g. config.num_block_records). Use the corpus that belongs to this model."
        )
    _verify_retriever_files(path, manifest, verify_checksums)
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


# The manifest fields that name files or folders of the retriever directory.
_PATH_FIELDS = ("corpus_dir", "index_file", "tokenizer_dir")
# Files that hold a tokenizer's vocabulary (transformers 5 writes tokenizer.json; older saves vocab.txt).
_VOCABULARY_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model")
# Weight files of a model directory whose checksums a retriever saved with its model records ("model_files").
_WEIGHTS_FILE = re.compile(r"(?:model|pytorch_model)(?:\.[\w-]+)?(?:-\d{5}-of-\d{5})?\.(?:safetensors|bin)")
_SHARD_SUFFIX = re.compile(r"-\d{5}-of-\d{5}")
_WEIGHTS_INDEX = re.compile(r"(model|pytorch_model)\.(safetensors|bin)\.index(?:\.([\w-]+))?\.json")


def _read_manifest(path: str) -> dict:
    """The manifest of the retriever directory `path`, refused with what to do when it is missing or malformed."""
    manifest_path = os.path.join(path, MANIFEST_NAME)
    if not os.path.isfile(manifest_path):
        legacy = os.path.isfile(os.path.join(path, LEGACY_BLOCK_RECORDS))
        hint = (
            " It looks like a legacy REALM checkpoint: convert it with `convert_legacy_checkpoint(dir, output_dir, "
            "allow_pickle=True)` (or `realm-hf convert`)."
            if legacy
            else f" {REBUILD_HINT}"
        )
        if os.path.isfile(os.path.join(path, SHARDED_MANIFEST_NAME)):
            hint = (
                " It is a sharded retriever save: load it with `ShardedRealmRetriever.from_pretrained` (on one "
                "process it holds every shard; `.to_retriever()` merges them into one RealmRetriever)."
            )
        _refuse_during_save(path, manifest_path, "is missing")
        raise OSError(f"{path} has no {MANIFEST_NAME}: it is not a realm-hf retriever directory.{hint}")
    check_inside(path, manifest_path, MANIFEST_NAME, manifest_path)
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(
            f"{manifest_path} is not valid JSON ({err}): the save was corrupted. {REBUILD_HINT}"
        ) from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{manifest_path} is not a retriever manifest (a JSON object expected). {REBUILD_HINT}")
    missing = [k for k in ("format_version", "embedding_dim", "num_blocks", "index_type") if k not in manifest]
    if missing:
        raise ValueError(f"{manifest_path} lacks {missing}: not a realm-hf retriever manifest. {REBUILD_HINT}")
    for key in ("format_version", "embedding_dim", "num_blocks"):
        value = manifest[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{manifest_path}: `{key}` must be an integer, got {value!r}. {REBUILD_HINT}")
    if int(manifest["format_version"]) > FORMAT_VERSION:
        raise ValueError(
            f"{manifest_path} has format version {manifest['format_version']}, newer than this realm-hf supports "
            f"({FORMAT_VERSION}): upgrade realm-hf (`pip install -U realm-hf`)."
        )
    if manifest.get("metric", "inner_product") != "inner_product":
        raise ValueError(f"{manifest_path}: unsupported metric {manifest['metric']!r} (REALM uses inner product).")
    # Every path the manifest gives must name something inside this directory (no absolute paths, `..` or links
    # leading out): a downloaded repo must never make realm-hf read another corpus or any other file.
    for field in _PATH_FIELDS:
        value = manifest.get(field)
        if value is not None or (field != "tokenizer_dir" and field in manifest):
            resolve_inside(path, value, f"the field {field!r}", manifest_path)
    return manifest


def _refuse_during_save(directory: str, path: str, what: str) -> None:
    """
    Before calling a file damaged: when a save into `directory` is in progress (or was interrupted), say so instead
    (the file is being swapped in, not lost). realm-hf's own loads wait for saves, so this is another reader's case.
    """
    if save_in_progress(directory):
        raise OSError(
            f"{path} {what}: a save into {directory} is in progress (or was interrupted), so its files are being "
            "replaced. Load it again once the save has finished (realm-hf loads wait for a save in progress and "
            "complete an interrupted one)."
        )


def _record_files(directory: str) -> dict:
    """`{relative path: {"size", "sha256"}}` of every file under `directory` but the manifest."""
    files = {}
    for folder, _dirs, names in os.walk(directory):
        for name in names:
            full = os.path.join(folder, name)
            relative = os.path.relpath(full, directory).replace(os.sep, "/")
            if relative != MANIFEST_NAME:
                files[relative] = {"size": os.path.getsize(full), "sha256": file_sha256(full)}
    return dict(sorted(files.items()))


def check_recorded_files(directory: str, files, verify_checksums: bool, source: str, what: str) -> None:
    """
    Check the files a manifest lists (`{relative path: {"size", "sha256"}}`) against `directory`: each must exist
    inside it with its size (always, it is free) and its sha256 (with `verify_checksums`).
    """
    if not isinstance(files, dict):
        raise ValueError(f"{source}: {what} must map file names to sizes and checksums. {REBUILD_HINT}")
    for relative, expected in files.items():
        full = resolve_inside(directory, relative, f"the file {relative!r} in {what}", source, recursive=False)
        if not isinstance(expected, dict) or not isinstance(expected.get("size"), int):
            raise ValueError(f"{source}: the entry of {relative!r} in {what} is malformed. {REBUILD_HINT}")
        if not os.path.isfile(full):
            _refuse_during_save(directory, full, "is missing")
            raise OSError(
                f"{full} is missing, but {source} lists it: the directory is incomplete (a file was deleted or not "
                "copied). Restore the file from the original save, or save the model or retriever again."
            )
        size = os.path.getsize(full)
        if size != expected["size"]:
            _refuse_during_save(directory, full, f"has {size} bytes, not the {expected['size']} {source} recorded")
            raise ValueError(
                f"{full} has {size} bytes but {source} recorded {expected['size']}: the file is truncated, changed or "
                "comes from another save. Restore it from the original save, or save the model or retriever again."
            )
        if verify_checksums and expected.get("sha256") is not None and file_sha256(full) != expected["sha256"]:
            raise ValueError(
                f"{full} is corrupt: its sha256 differs from the one {source} recorded when it was saved (the file "
                "was changed in place or comes from another save). Restore it from the original save, or save the "
                "model or retriever again. (`verify_checksums=False` skips this check, for trusted local files.)"
            )


def _verify_retriever_files(path: str, manifest: dict, verify_checksums: bool) -> None:
    manifest_path = os.path.join(path, MANIFEST_NAME)
    files = manifest.get("files")
    if files is None:
        logger.debug("%s records no file checksums (saved by an older realm-hf): files not verified.", manifest_path)
        return
    check_recorded_files(path, files, verify_checksums, manifest_path, "'files'")
    # A data file dropped into the corpus folder would be read with the others: only the saved ones belong there.
    corpus_dir = os.path.join(
        path, *check_relative_name(manifest.get("corpus_dir", CORPUS_DIR), "corpus_dir", manifest_path)
    )
    if os.path.isdir(corpus_dir):
        prefix = os.path.relpath(corpus_dir, path).replace(os.sep, "/") + "/"
        extra = sorted(
            name
            for name in os.listdir(corpus_dir)
            if name.endswith((".arrow", ".parquet")) and prefix + name not in files
        )
        if extra:
            raise ValueError(
                f"{corpus_dir} holds {extra}, which {manifest_path} does not list: they are not part of this save. "
                "Remove them, or save the retriever again."
            )


def _check_state_file(corpus_dir: str, state_path: str) -> None:
    # `datasets.load_from_disk` opens the data files state.json names: they must be files of this folder.
    try:
        with open(state_path, encoding="utf-8") as f:
            data_files = json.load(f).get("_data_files", [])
        names = [entry["filename"] for entry in data_files]
    except (ValueError, AttributeError, KeyError, TypeError) as err:
        raise ValueError(f"{state_path} is not a valid datasets state file ({err}).") from None
    for name in names:
        resolve_inside(corpus_dir, name, "a data file", state_path, recursive=False)


def _tokenizer_error(directory: str, reason: str) -> OSError:
    return OSError(
        f"The retriever's tokenizer in {directory} cannot be loaded: {reason}. It is the tokenizer the corpus was "
        "split with, and the model tokenizes questions and blocks with it: restore the folder from the original "
        f"save, or save that tokenizer there again (`tokenizer.save_pretrained({directory!r})`)."
    )


def _check_tokenizer_config(directory: str) -> None:
    config_path = os.path.join(directory, "tokenizer_config.json")
    if not os.path.isfile(config_path):
        return
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    except (ValueError, UnicodeDecodeError) as err:
        raise _tokenizer_error(directory, f"tokenizer_config.json is corrupt ({err})") from None
    if not isinstance(config, dict):
        raise _tokenizer_error(directory, "tokenizer_config.json is not a JSON object")
    # transformers opens the files `fast_tokenizer_files` names relative to the folder; code from `auto_map` would
    # run: neither may come with a corpus. realm-hf's own `auto_map` (written by every RealmTokenizer save) names
    # classes that `import realm_hf` has registered, so transformers uses those and runs nothing from the folder.
    for name in config.get("fast_tokenizer_files") or []:
        resolve_inside(directory, name, "a 'fast_tokenizer_files' entry", config_path, recursive=False)
    if config.get("auto_map") and config["auto_map"] != tokenizer_auto_map():
        raise _tokenizer_error(directory, "tokenizer_config.json asks for custom code (auto_map), which is not run")


def record_model_files(model_dir: str) -> dict:
    """`{name: {"size", "sha256"}}` of the weight files in `model_dir`, for a manifest's `model_files`."""
    return {
        name: {
            "size": os.path.getsize(os.path.join(model_dir, name)),
            "sha256": file_sha256(os.path.join(model_dir, name)),
        }
        for name in sorted(os.listdir(model_dir))
        if _WEIGHTS_FILE.fullmatch(name) and os.path.isfile(os.path.join(model_dir, name))
    }


def stale_weight_files(target: str, written: set[str]) -> list[str]:
    """
    The weight files of an earlier save in `target` that a save writing `written` supersedes: shards and shard
    indexes of the same weights (same format and variant) that the new save does not write, as transformers' own
    `save_pretrained` removes stale shards. Nothing else is ever listed.
    """
    families = {_SHARD_SUFFIX.sub("", name) for name in written if _WEIGHTS_FILE.fullmatch(name)}
    stale = []
    for name in sorted(os.listdir(target)) if os.path.isdir(target) else []:
        if name in written or not os.path.isfile(os.path.join(target, name)):
            continue
        index = _WEIGHTS_INDEX.fullmatch(name)
        if index:
            family = f"{index[1]}{'.' + index[3] if index[3] else ''}.{index[2]}"
        elif _WEIGHTS_FILE.fullmatch(name):
            family = _SHARD_SUFFIX.sub("", name)
        else:
            continue
        if family in families:
            stale.append(name)
    return stale


def rebind_model_files(retriever_dir: str, staging_retriever_dir: str, model_files: dict) -> bool:
    """
    For a model saved without its retriever into a directory that keeps one: if that retriever was saved with the
    earlier weights (its manifest lists `model_files`), write its manifest, now naming the new weights, into
    `staging_retriever_dir`. Returns whether it did (the caller then swaps that manifest in).
    """
    manifest_path = os.path.join(retriever_dir, MANIFEST_NAME)
    if not os.path.isfile(manifest_path):
        return False
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return False  # reported when the retriever is loaded
    if not isinstance(manifest, dict) or not manifest.get("model_files"):
        return False
    manifest["model_files"] = model_files
    os.makedirs(staging_retriever_dir, exist_ok=True)
    with open(os.path.join(staging_retriever_dir, MANIFEST_NAME), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")
    return True


def check_model_files(retriever_dir: str, model_dir: str, verify_checksums: bool = True) -> None:
    """
    Check that the weights in `model_dir` are the ones saved together with the retriever in `retriever_dir` (its
    manifest's `model_files`, written by `RealmForOpenQA.save_pretrained`), so that weights and index from two
    different saves are never used together. A retriever saved on its own (attached with
    `RealmRetriever.save_pretrained`, `realm-hf index --attach-to`) records no model files and passes.
    """
    with consistent_read(retriever_dir):
        manifest = _read_manifest(retriever_dir)
    files = manifest.get("model_files")
    if not files:
        return
    source = os.path.join(retriever_dir, MANIFEST_NAME)
    try:
        check_recorded_files(model_dir, files, verify_checksums, source, "'model_files'")
    except (OSError, ValueError) as err:
        raise ValueError(
            f"The weights in {model_dir} and the retriever in {retriever_dir} come from different saves: {err} "
            "Save the model again with `model.save_pretrained(...)` (it writes weights and retriever together), or "
            "load the weights alone (`load_retriever=False`) and attach a corpus explicitly (`retriever=...`)."
        ) from None
