"""Saving and loading a retriever directory: manifest, staged corpus/index/tokenizer save, checked load."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil

import datasets
import pyarrow as pa

from ..constants import FORMAT_VERSION, LEGACY_BLOCK_RECORDS, MANIFEST_NAME, TOKENIZER_DIR
from .corpus import _check_corpus_columns

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


def _swap_into_place(staging: str, target: str, names: list[str]) -> None:
    """
    Move `staging/<name>` to `target/<name>` for each name (the manifest last), replacing what is there. Old
    entries are first moved aside inside `staging` (deleted with it afterwards); on any failure the moves are undone,
    so the target keeps its previous complete content.
    """
    done: list[tuple[str, str | None]] = []  # (target path, where its old version was moved, or None)
    try:
        for name in names:
            new = os.path.join(staging, name)
            dest = os.path.join(target, name)
            old_aside = None
            if os.path.lexists(dest):
                old_aside = os.path.join(staging, f".old-{name}")
                os.replace(dest, old_aside)
            done.append((dest, old_aside))
            if os.path.lexists(new):
                os.replace(new, dest)
    except BaseException:
        for dest, old_aside in reversed(done):
            if os.path.lexists(dest):
                if os.path.isdir(dest) and not os.path.islink(dest):
                    shutil.rmtree(dest, ignore_errors=True)
                else:
                    os.remove(dest)
            if old_aside is not None:
                os.replace(old_aside, dest)
        raise


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
