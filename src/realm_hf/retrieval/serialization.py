"""Saving and loading a retriever directory: manifest, staged corpus/index/tokenizer save, checked load."""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import re
import shutil
import tempfile

import datasets
import faiss
import numpy as np
import pyarrow as pa

from ..constants import CORPUS_DIR, FORMAT_VERSION, INDEX_NAME, LEGACY_BLOCK_RECORDS, MANIFEST_NAME, TOKENIZER_DIR
from ..file_utils import swap_into_place
from .corpus import BlockCorpus, _check_corpus_columns
from .index import BlockIndex, can_relabel, read_index_checked, relabel_in_place, relabeled_for_writing

logger = logging.getLogger(__name__)

_REBUILD_HINT = (
    "Rebuild the retriever with `RealmRetriever.from_documents(...)` (or `realm-hf index`) and save it again with "
    "`save_pretrained`, or convert a legacy checkpoint with `convert_legacy_checkpoint`."
)


def _realm_hf_version() -> str:
    try:
        from .. import __version__

        return __version__
    except ImportError:  # pragma: no cover - partially initialised package
        return "unknown"


def _parse_size(size: str | int) -> int:
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
    num_shards = max(1, math.ceil(nbytes / _parse_size(max_shard_size)))
    for i in range(num_shards):
        shard = corpus.shard(num_shards, i, contiguous=True)
        shard.to_parquet(os.path.join(corpus_dir, f"data-{i:05d}-of-{num_shards:05d}.parquet"))


def _resolve_pretrained_path(path_or_repo_id: str, revision, subfolder, repo_type, cache_dir, token) -> str:
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


def _read_manifest(path: str) -> dict:
    manifest_path = os.path.join(path, MANIFEST_NAME)
    if not os.path.isfile(manifest_path):
        legacy = os.path.isfile(os.path.join(path, LEGACY_BLOCK_RECORDS))
        hint = (
            " It looks like a legacy REALM checkpoint: convert it with `convert_legacy_checkpoint(dir, output_dir, "
            "allow_pickle=True)` (or `realm-hf convert`)."
            if legacy
            else f" {_REBUILD_HINT}"
        )
        raise OSError(f"{path} has no {MANIFEST_NAME}: it is not a realm-hf retriever directory.{hint}")
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(
            f"{manifest_path} is not valid JSON ({err}): the save was corrupted. {_REBUILD_HINT}"
        ) from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{manifest_path} is not a retriever manifest (a JSON object expected). {_REBUILD_HINT}")
    missing = [k for k in ("format_version", "embedding_dim", "num_blocks", "index_type") if k not in manifest]
    if missing:
        raise ValueError(f"{manifest_path} lacks {missing}: not a realm-hf retriever manifest. {_REBUILD_HINT}")
    for key in ("format_version", "embedding_dim", "num_blocks"):
        value = manifest[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{manifest_path}: `{key}` must be an integer, got {value!r}. {_REBUILD_HINT}")
    if int(manifest["format_version"]) > FORMAT_VERSION:
        raise ValueError(
            f"{manifest_path} has format version {manifest['format_version']}, newer than this realm-hf supports "
            f"({FORMAT_VERSION}): upgrade realm-hf (`pip install -U realm-hf`)."
        )
    if manifest.get("metric", "inner_product") != "inner_product":
        raise ValueError(f"{manifest_path}: unsupported metric {manifest['metric']!r} (REALM uses inner product).")
    return manifest


def _load_corpus(corpus_dir: str, manifest: dict, mmap: bool) -> datasets.Dataset:
    if not os.path.isdir(corpus_dir):
        raise OSError(f"Corpus folder {corpus_dir} not found. {_REBUILD_HINT}")
    parquet = sorted(f for f in os.listdir(corpus_dir) if f.endswith(".parquet"))
    try:
        if os.path.isfile(os.path.join(corpus_dir, "state.json")):
            # load_from_disk memory-maps the Arrow files unless keep_in_memory=True.
            corpus = datasets.load_from_disk(corpus_dir, keep_in_memory=not mmap)
        elif parquet:
            corpus = datasets.Dataset.from_parquet(
                [os.path.join(corpus_dir, f) for f in parquet], keep_in_memory=not mmap
            )
        else:
            raise OSError(
                f"{corpus_dir} holds neither a saved Dataset (state.json) nor Parquet shards. {_REBUILD_HINT}"
            )
    except (FileNotFoundError, ValueError, pa.ArrowInvalid) as err:
        raise OSError(f"Could not read the corpus in {corpus_dir}: {err}. {_REBUILD_HINT}") from None
    if isinstance(corpus, datasets.DatasetDict):
        raise OSError(f"{corpus_dir} holds a DatasetDict; a retriever corpus is a single Dataset.")
    _check_corpus_columns(corpus)
    return corpus


def _try_load_tokenizer(path: str):
    from transformers import AutoTokenizer, BertTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as err:  # noqa: BLE001 - fall back to a plain BERT tokenizer below
        try:
            return BertTokenizer.from_pretrained(path)
        except Exception:  # noqa: BLE001
            logger.warning("Could not load a tokenizer from %s (%s); the retriever has none.", path, err)
            return None


def _load_tokenizer(path: str, manifest: dict):
    tokenizer_dir = manifest.get("tokenizer_dir", TOKENIZER_DIR)
    if tokenizer_dir is None or not os.path.isdir(os.path.join(path, tokenizer_dir)):
        return None
    return _try_load_tokenizer(os.path.join(path, tokenizer_dir))


def _write_index(retriever, path: str) -> str:
    """
    Write the retriever's index to `path` with labels = rows of the saved corpus, so that datasets' own FAISS API
    (`load_from_disk` + `load_faiss_index` + `get_nearest_examples`) finds the right rows. Returns the manifest's
    `index_labels`: `"row"`, or `"block_id"` for an index type that cannot be relabelled (written as it is).
    """
    index = retriever._index.cpu_index()
    if not can_relabel(index):
        logger.warning(
            "The %s index cannot be relabelled with corpus rows: %s keeps block ids as labels (`index_labels: "
            "block_id` in the manifest), so datasets' `get_nearest_examples` would not return the right rows from it.",
            type(index).__name__,
            os.path.basename(path),
        )
        faiss.write_index(index, path)
        return "block_id"
    faiss.write_index(relabeled_for_writing(index, retriever._corpus.rows), path)
    return "row"


def _can_map_index(manifest: dict) -> bool:
    # FAISS maps an IVF index's lists read-only, and row labels are rewritten in those lists: read it into RAM.
    return manifest.get("index_labels", "block_id") != "row" or "IVF" not in str(manifest.get("index_type", ""))


def _restore_block_ids(index, corpus: BlockCorpus, manifest: dict, index_path: str) -> np.ndarray | None:
    """
    Map a loaded index's labels back to block ids when the save wrote corpus rows (`index_labels: row`; saves before
    format 2 wrote block ids). Returns the block id of each row (what a re-read of the file needs), else `None`.
    """
    labels = manifest.get("index_labels", "block_id")
    if labels == "block_id":
        return None
    if labels != "row":
        raise ValueError(f"{index_path}: unknown index_labels {labels!r} in the manifest. {_REBUILD_HINT}")
    block_ids = corpus.row_ids

    def to_block_ids(rows: np.ndarray) -> np.ndarray:
        if rows.size and (rows.min() < 0 or rows.max() >= len(block_ids)):
            raise ValueError(
                f"{index_path} has labels outside the corpus rows 0..{len(block_ids) - 1}: the index belongs to "
                f"another corpus. {_REBUILD_HINT}"
            )
        return block_ids[rows]

    if not can_relabel(index):
        raise ValueError(
            f"{index_path} is a {type(index).__name__} index, but the manifest says its labels are corpus rows, "
            f"which only IDMap and IVF indexes are saved with. {_REBUILD_HINT}"
        )
    relabel_in_place(index, to_block_ids)
    return block_ids


def build_manifest(retriever) -> dict:
    """The manifest of `retriever` as `save_pretrained` writes it (without the file entries and sizes)."""
    return {
        "format_version": FORMAT_VERSION,
        "library": "realm-hf",
        "realm_hf_version": _realm_hf_version(),
        "faiss_version": getattr(faiss, "__version__", "unknown"),
        "index_type": retriever.index_type,
        "metric": "inner_product",
        "embedding_dim": retriever.embedding_dim,
        "num_blocks": retriever.num_blocks,
        "next_block_id": retriever.next_block_id,
        "max_block_length": retriever.max_block_length,
        "embedder_fingerprint": retriever.embedder_fingerprint,
        "columns": retriever.corpus.column_names,
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def save_retriever(retriever, save_directory: str, corpus_format: str, max_shard_size) -> None:
    """
    Write `retriever`'s corpus, index, tokenizer and manifest into a temporary sibling of their final place, then
    swap each entry in (the manifest last); see [`RealmRetriever.save_pretrained`]. The caller holds its lock.
    """
    if corpus_format not in ("arrow", "parquet"):
        raise ValueError(f"corpus_format must be 'arrow' or 'parquet', got {corpus_format!r}.")
    os.makedirs(save_directory, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".tmp-retriever-", dir=save_directory)
    try:
        corpus_dir = os.path.join(staging, CORPUS_DIR)
        if corpus_format == "arrow":
            retriever.corpus.save_to_disk(corpus_dir, max_shard_size=max_shard_size)
        else:
            _save_parquet_shards(retriever.corpus, corpus_dir, max_shard_size)
        index_path = os.path.join(staging, INDEX_NAME)
        index_labels = _write_index(retriever, index_path)
        if retriever.tokenizer is not None:
            retriever.tokenizer.save_pretrained(os.path.join(staging, TOKENIZER_DIR))
        manifest = build_manifest(retriever)
        manifest.update(
            corpus_format=corpus_format,
            corpus_dir=CORPUS_DIR,
            index_file=INDEX_NAME,
            index_file_size=os.path.getsize(index_path),
            index_labels=index_labels,
            tokenizer_dir=TOKENIZER_DIR if retriever.tokenizer is not None else None,
        )
        with open(os.path.join(staging, MANIFEST_NAME), "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=2, sort_keys=True)
            f.write("\n")
        swap_into_place(staging, save_directory, [CORPUS_DIR, INDEX_NAME, TOKENIZER_DIR, MANIFEST_NAME])
        if retriever._index.source is not None:
            # The mmapped index's file may just have been replaced by an identical copy: track the new one.
            labels = retriever._corpus.row_ids if index_labels == "row" else None
            retriever._index.track_file(os.path.join(save_directory, INDEX_NAME), labels)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def load_retriever_parts(
    path: str, expected_dim: int | None = None, expected_num_blocks: int | None = None, mmap: bool = True
) -> tuple[dict, BlockCorpus, BlockIndex, object]:
    """
    Read and check a saved retriever directory: the manifest against the model's expectations, the index and the
    corpus against the manifest and each other. Returns `(manifest, corpus, index, tokenizer)`.
    """
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

    index_path = os.path.join(path, manifest.get("index_file", INDEX_NAME))
    expected_size = manifest.get("index_file_size")
    if expected_size is not None and os.path.isfile(index_path) and os.path.getsize(index_path) != expected_size:
        raise ValueError(
            f"{index_path} has {os.path.getsize(index_path)} bytes but the manifest recorded {expected_size}: the "
            f"file is truncated or from another corpus. {_REBUILD_HINT}"
        )
    index, mmapped = read_index_checked(index_path, mmap=mmap and _can_map_index(manifest), how_to_fix=_REBUILD_HINT)
    if index.d != dim:
        raise ValueError(
            f"{index_path} is a {index.d}-d index but the manifest says {dim}: the index belongs to another corpus "
            f"or embedder. {_REBUILD_HINT}"
        )
    if index.ntotal != num_blocks:
        raise ValueError(
            f"{index_path} holds {index.ntotal} vectors but the manifest says {num_blocks} blocks. {_REBUILD_HINT}"
        )
    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise ValueError(f"{index_path} is not an inner-product index (metric {index.metric_type}). {_REBUILD_HINT}")

    dataset = _load_corpus(os.path.join(path, manifest.get("corpus_dir", CORPUS_DIR)), manifest, mmap)
    if len(dataset) != num_blocks:
        raise ValueError(
            f"The corpus in {path} has {len(dataset)} blocks but the manifest says {num_blocks}. {_REBUILD_HINT}"
        )
    corpus = BlockCorpus(dataset)
    file_labels = _restore_block_ids(index, corpus, manifest, index_path)
    if hasattr(index, "id_map"):
        index_ids = faiss.vector_to_array(index.id_map)
        if not np.array_equal(np.sort(index_ids), corpus.sorted_ids):
            raise ValueError(f"The ids in {index_path} do not match the corpus's block ids. {_REBUILD_HINT}")
    block_index = BlockIndex(
        index, manifest.get("index_type", "Flat"), source=index_path if mmapped else None, source_labels=file_labels
    )
    return manifest, corpus, block_index, _load_tokenizer(path, manifest)
