"""
The manifest of a saved retriever directory and the checks it makes possible: what a save records (the corpus and
index it describes, the size and sha256 of every file, the weights saved with it), reading it back refused with what to
do when it is missing, malformed or names a path leading out, the files checked against it, the tokenizer folder's
config, and the weights of a model directory checked against the retriever saved with them. Saving and loading the
directory: `retrieval/serialization.py`.
"""

from __future__ import annotations

import datetime
import fnmatch
import json
import os
import re

import faiss

from ..constants import (
    CORPUS_DIR,
    DATASETS_CACHE_FILES,
    FORMAT_VERSION,
    INDEX_NAME,
    LEGACY_BLOCK_RECORDS,
    MANIFEST_NAME,
    SHARDED_MANIFEST_NAME,
    SPARSE_INDEX_DIR,
    TOKENIZER_DIR,
)
from ..io.auto_map import tokenizer_auto_map
from ..io.checksums import file_sha256
from ..io.consistent_reads import consistent_read, save_in_progress
from ..io.paths import check_inside, check_relative_name, resolve_inside
from ..logging_utils import get_logger
from ..version import __version__
from .store import REBUILD_HINT, BlockStore

logger = get_logger(__name__)


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
        files=record_files(directory),
    )
    if model_files:
        manifest["model_files"] = model_files
    with open(os.path.join(directory, MANIFEST_NAME), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")
    return manifest


# The manifest fields that name files or folders of the retriever directory.
_PATH_FIELDS = ("corpus_dir", "index_file", "tokenizer_dir")
# Weight files of a model directory whose checksums a retriever saved with its model records ("model_files").
_WEIGHTS_FILE = re.compile(r"(?:model|pytorch_model)(?:\.[\w-]+)?(?:-\d{5}-of-\d{5})?\.(?:safetensors|bin)")
_SHARD_SUFFIX = re.compile(r"-\d{5}-of-\d{5}")
_WEIGHTS_INDEX = re.compile(r"(model|pytorch_model)\.(safetensors|bin)\.index(?:\.([\w-]+))?\.json")


def read_manifest(path: str) -> dict:
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


def record_files(directory: str) -> dict:
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


def verify_retriever_files(path: str, manifest: dict, verify_checksums: bool) -> None:
    """
    Check the files of the retriever directory `path` against its `manifest` (sizes, and sha256 with
    `verify_checksums`; see [`check_recorded_files`]), and refuse data files in its corpus folder that the manifest
    does not list. The cache files `datasets` writes there when the corpus, opened with `load_from_disk`, is mapped or
    filtered (`cache-*.arrow`) are left alone: a load reads only the data files of the saved `state.json`, which the
    manifest checks. A manifest of an older save, without a file list, is not verified.
    """
    manifest_path = os.path.join(path, MANIFEST_NAME)
    files = manifest.get("files")
    if files is None:
        # Only format-1 saves predate the file list; without it no file is checked (a BM25 index or corpus of
        # another save would load), so a manifest that should have one and has none is refused.
        if manifest.get("format_version", 1) >= 2 or "sparse_index" in manifest or "model_files" in manifest:
            raise ValueError(
                f"{manifest_path} has no `files` list (the size and sha256 of every file of the save), which every "
                f"save of format {manifest.get('format_version')} records: it was edited or damaged, and the files "
                f"cannot be checked. {REBUILD_HINT}"
            )
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
            if name.endswith((".arrow", ".parquet"))
            and prefix + name not in files
            and not fnmatch.fnmatchcase(name, DATASETS_CACHE_FILES)
        )
        if extra:
            raise ValueError(
                f"{corpus_dir} holds {extra}, which {manifest_path} does not list: they are not part of this save. "
                "Remove them, or save the retriever again."
            )


def check_state_file(corpus_dir: str, state_path: str) -> None:
    """Refuse a datasets `state.json` whose data files are not files of `corpus_dir` (read before loading it)."""
    # `datasets.load_from_disk` opens the data files state.json names: they must be files of this folder.
    try:
        with open(state_path, encoding="utf-8") as f:
            data_files = json.load(f).get("_data_files", [])
        names = [entry["filename"] for entry in data_files]
    except (ValueError, AttributeError, KeyError, TypeError) as err:
        raise ValueError(f"{state_path} is not a valid datasets state file ({err}).") from None
    for name in names:
        resolve_inside(corpus_dir, name, "a data file", state_path, recursive=False)


def tokenizer_error(directory: str, reason: str) -> OSError:
    """The error of a retriever tokenizer folder that cannot be loaded for `reason`, saying how to restore it."""
    return OSError(
        f"The retriever's tokenizer in {directory} cannot be loaded: {reason}. It is the tokenizer the corpus was "
        "split with, and the model tokenizes questions and blocks with it: restore the folder from the original "
        f"save, or save that tokenizer there again (`tokenizer.save_pretrained({directory!r})`)."
    )


def check_tokenizer_config(directory: str) -> None:
    """
    Refuse a tokenizer folder whose `tokenizer_config.json` is damaged, names files outside the folder
    (`fast_tokenizer_files`) or asks for code of its own (`auto_map` other than realm-hf's).
    """
    config_path = os.path.join(directory, "tokenizer_config.json")
    if not os.path.isfile(config_path):
        return
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    except (ValueError, UnicodeDecodeError) as err:
        raise tokenizer_error(directory, f"tokenizer_config.json is corrupt ({err})") from None
    if not isinstance(config, dict):
        raise tokenizer_error(directory, "tokenizer_config.json is not a JSON object")
    # transformers opens the files `fast_tokenizer_files` names relative to the folder; code from `auto_map` would
    # run: neither may come with a corpus. realm-hf's own `auto_map` (written by every RealmTokenizer save) names
    # classes that `import realm_hf` has registered, so transformers uses those and runs nothing from the folder.
    for name in config.get("fast_tokenizer_files") or []:
        resolve_inside(directory, name, "a 'fast_tokenizer_files' entry", config_path, recursive=False)
    if config.get("auto_map") and config["auto_map"] != tokenizer_auto_map():
        raise tokenizer_error(directory, "tokenizer_config.json asks for custom code (auto_map), which is not run")


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
        manifest = read_manifest(retriever_dir)
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
