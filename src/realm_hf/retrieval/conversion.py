"""
Converting a legacy REALM checkpoint's retriever (pickled `block_records.npy` + `block_emb`) into a pickle-free one,
streamed: at google/realm-orqa-nq-openqa's 13,353,718 blocks, no step holds all the texts or a second copy of the
6.8 GB embedding matrix (bench/convert.py measures it).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from datasets.arrow_writer import ArrowWriter
from datasets.utils.py_utils import asdict

from ..constants import CORPUS_DIR, INDEX_NAME, LEGACY_BLOCK_RECORDS, RETRIEVER_ENTRIES, TOKENIZER_DIR
from ..io.staged_saves import staged_save
from ..progress import progress_bar
from .encoding import fingerprint_module
from .index import BlockIndex
from .legacy import (
    RECORD_CHUNK_ROWS,
    LegacyBlockEmb,
    UnsupportedRecordsLayout,
    check_pickle_opt_in,
    iter_loaded_record_chunks,
    iter_record_chunks,
    records_count,
)
from .manifest import manifest_fields, write_manifest
from .retriever import RealmRetriever
from .serialization import parse_size, try_load_tokenizer

logger = logging.getLogger(__name__)

# The columns of a converted legacy corpus: block id = doc id = legacy row, no titles (legacy blocks had none).
LEGACY_COLUMNS = ("block_id", "doc_id", "title", "text", "embeddings")


def convert_legacy_checkpoint(
    legacy_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    allow_pickle: bool = False,
    index: str = "Flat",
    tokenizer=None,
    embedder: torch.nn.Module | None = None,
    corpus_format: str = "arrow",
) -> RealmRetriever:
    """
    Convert the retriever part of a legacy REALM checkpoint (`block_records.npy` + the `block_emb` buffer) into a
    pickle-free retriever saved in `output_dir` (exactly there: a model checkpoint looks for it in its
    `retriever/` subfolder), streamed by [`write_legacy_retriever`]. See [`RealmRetriever.from_legacy`] for
    `allow_pickle`.

    Returns:
        The converted [`RealmRetriever`], loaded from `output_dir` (its corpus memory-mapped).
    """
    write_legacy_retriever(
        legacy_dir,
        output_dir,
        allow_pickle=allow_pickle,
        index=index,
        tokenizer=tokenizer,
        embedder_fingerprint=fingerprint_module(embedder) if embedder is not None else None,
        corpus_format=corpus_format,
    )
    return RealmRetriever.from_pretrained(output_dir)


def write_legacy_retriever(
    legacy_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    allow_pickle: bool = False,
    index: str = "Flat",
    tokenizer=None,
    embedder_fingerprint: str | None = None,
    corpus_format: str = "arrow",
    max_shard_size="500MB",
    train_size: int | None = None,
    chunk_rows: int = RECORD_CHUNK_ROWS,
) -> None:
    """
    Write the retriever directory of a legacy `RealmForOpenQA` checkpoint into `output_dir` (all at once or not at
    all, like [`RealmRetriever.save_pretrained`], whose layout it writes), streaming: the block texts are read from
    the pickle `chunk_rows` at a time without unpickling it ([`legacy.iter_record_chunks`]; a file laid out
    otherwise is read with `np.load`), the `block_emb` rows from the memory-mapped weights, and each chunk is written
    to the Arrow (or Parquet) corpus shards at once. The index is written from the same chunks by
    [`BlockIndex.write_streamed`] (a `Flat` one straight into its file, with no in-memory FAISS copy).

    The result is what `RealmRetriever.from_legacy(legacy_dir, ...).save_pretrained(output_dir)` writes: block id =
    doc id = legacy row, empty titles, the exact legacy vectors (`tests/retrieval/test_conversion.py`).

    Args:
        legacy_dir (`str`): The legacy checkpoint directory (`block_records.npy`, `pytorch_model.bin`, tokenizer).
        output_dir (`str`): Where to write the retriever (`corpus/`, `index.faiss`, `tokenizer/`, manifest).
        allow_pickle (`bool`): The opt-in for the pickled `block_records.npy` (see [`pickle_allowed`]).
        index (`str`, defaults to `"Flat"`): FAISS factory string.
        tokenizer (*optional*): The tokenizer saved with the corpus (default: loaded from `legacy_dir`).
        embedder_fingerprint (`str`, *optional*): Recorded in the manifest (which embedder made `block_emb`).
        corpus_format (`str`, defaults to `"arrow"`): `"arrow"` (datasets' `save_to_disk` layout) or `"parquet"`.
        max_shard_size (`str` or `int`, defaults to `"500MB"`): Size at which a corpus shard is closed.
        train_size (`int`, *optional*): Training sample of an index that needs training (see `build_index`).
        chunk_rows (`int`): Blocks read and written at a time.
    """
    if corpus_format not in ("arrow", "parquet"):
        raise ValueError(f"corpus_format must be 'arrow' or 'parquet', got {corpus_format!r}.")
    legacy_dir = os.fspath(legacy_dir)
    records_path = os.path.join(legacy_dir, LEGACY_BLOCK_RECORDS)
    if not os.path.isfile(records_path):
        raise OSError(f"{legacy_dir} has no {LEGACY_BLOCK_RECORDS}: not a legacy RealmForOpenQA checkpoint directory.")
    check_pickle_opt_in(records_path, allow_pickle)
    block_emb = LegacyBlockEmb(legacy_dir)
    num_blocks, dim = block_emb.shape
    count = records_count(records_path)
    if count != num_blocks:
        raise ValueError(f"{LEGACY_BLOCK_RECORDS} has ({count},) records but block_emb has {num_blocks} rows.")
    if num_blocks == 0:
        raise ValueError("The corpus is empty: a retriever needs at least one block.")
    if tokenizer is None:
        tokenizer = try_load_tokenizer(legacy_dir)
    with staged_save(output_dir) as save:
        _write_corpus(
            os.path.join(save.staging, CORPUS_DIR),
            records_path,
            block_emb.chunks,
            num_blocks,
            dim,
            corpus_format,
            parse_size(max_shard_size),
            chunk_rows,
        )
        index_path = os.path.join(save.staging, INDEX_NAME)
        index_type, index_labels = _write_index(index_path, index, block_emb, num_blocks, dim, train_size, chunk_rows)
        if tokenizer is not None:
            tokenizer.save_pretrained(os.path.join(save.staging, TOKENIZER_DIR))
        manifest = manifest_fields(
            index_type=index_type,
            embedding_dim=dim,
            num_blocks=num_blocks,
            next_block_id=num_blocks,
            # Unknown for legacy blocks: re-embedding then truncates at the tokenizer's limit, like the legacy model.
            max_block_length=None,
            embedder_fingerprint=embedder_fingerprint,
            columns=list(LEGACY_COLUMNS),
        )
        write_manifest(save.staging, manifest, corpus_format, index_labels, tokenizer)
        written = set(os.listdir(save.staging))
        save.replace = [name for name in RETRIEVER_ENTRIES if name in written]
        save.remove = [name for name in RETRIEVER_ENTRIES if name not in written]


# -- The corpus -------------------------------------------------------------------------------------------------------


def legacy_features(dim: int) -> datasets.Features:
    """The features of a converted legacy corpus (what `RealmRetriever.from_legacy` builds)."""
    schema = pa.schema(
        [
            ("block_id", pa.int64()),
            ("doc_id", pa.int64()),
            ("title", pa.string()),
            ("text", pa.string()),
            ("embeddings", pa.list_(pa.float32(), dim)),
        ]
    )
    return datasets.Features.from_arrow_schema(schema)


class _ShardWriter:
    """Corpus shards written one after the other, each closed past `max_bytes`; named `data-i-of-N` at the end."""

    def __init__(self, corpus_dir: str, features: datasets.Features, corpus_format: str, max_bytes: int):
        os.makedirs(corpus_dir)
        self.dir, self.features, self.format, self.max_bytes = corpus_dir, features, corpus_format, max_bytes
        self.paths, self.writer, self.size = [], None, 0

    def write(self, table: pa.Table) -> None:
        if self.writer is None:
            path = os.path.join(self.dir, f".shard-{len(self.paths):05d}.{self.format}")
            self.paths.append(path)
            if self.format == "arrow":
                # datasets' own writer: the files `save_to_disk` writes and `load_from_disk` memory-maps.
                self.writer = ArrowWriter(features=self.features, path=path)
            else:
                self.writer = pq.ParquetWriter(path, self.features.arrow_schema)
            self.size = 0
        self.writer.write_table(table)
        self.size += table.nbytes
        if self.size >= self.max_bytes:
            self._close()

    def _close(self) -> None:
        if self.format == "arrow":
            self.writer.finalize()
        self.writer.close()
        self.writer = None

    def finish(self) -> None:
        if self.writer is not None:
            self._close()
        names = [f"data-{i:05d}-of-{len(self.paths):05d}.{self.format}" for i in range(len(self.paths))]
        for path, name in zip(self.paths, names):
            os.replace(path, os.path.join(self.dir, name))
        if self.format == "arrow":
            _write_dataset_json(self.dir, self.features, names)


def _write_dataset_json(corpus_dir: str, features: datasets.Features, names: list[str]) -> None:
    # `state.json` and `dataset_info.json` as `Dataset.save_to_disk` writes them, so `load_from_disk` reads the folder.
    state = {
        "_data_files": [{"filename": name} for name in names],
        "_fingerprint": uuid.uuid4().hex[:16],
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": None,
    }
    with open(os.path.join(corpus_dir, datasets.config.DATASET_STATE_JSON_FILENAME), "w", encoding="utf-8") as f:
        json.dump(state, f, indent=2, sort_keys=True)
    info = asdict(datasets.DatasetInfo(features=features))
    with open(os.path.join(corpus_dir, datasets.config.DATASET_INFO_FILENAME), "w", encoding="utf-8") as f:
        json.dump({key: info[key] for key in sorted(info)}, f, indent=2)


def _write_corpus(corpus_dir, records_path, emb_chunks, num_blocks, dim, corpus_format, max_bytes, chunk_rows) -> None:
    features = legacy_features(dim)
    try:
        _write_corpus_from(
            corpus_dir,
            iter_record_chunks(records_path, chunk_rows),
            emb_chunks,
            num_blocks,
            features,
            corpus_format,
            max_bytes,
            chunk_rows,
        )
    except UnsupportedRecordsLayout as err:
        logger.warning(
            "%s cannot be streamed (%s): reading it with np.load, which holds all its texts in memory.",
            records_path,
            err,
        )
        shutil.rmtree(corpus_dir, ignore_errors=True)
        _write_corpus_from(
            corpus_dir,
            iter_loaded_record_chunks(records_path, chunk_rows),
            emb_chunks,
            num_blocks,
            features,
            corpus_format,
            max_bytes,
            chunk_rows,
        )


def _write_corpus_from(corpus_dir, texts, emb_chunks, num_blocks, features, corpus_format, max_bytes, chunk_rows):
    writer = _ShardWriter(corpus_dir, features, corpus_format, max_bytes)
    start, dim = 0, features["embeddings"].length
    bar = progress_bar(total=num_blocks, unit=" blocks", desc="Converting the corpus")
    with bar:
        for text, emb in zip(texts, emb_chunks(chunk_rows)):
            n = len(text)
            if len(emb) != n:
                raise ValueError(f"{LEGACY_BLOCK_RECORDS} and block_emb disagree on the number of blocks.")
            ids = pa.array(np.arange(start, start + n, dtype=np.int64))
            vectors = pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), dim)
            writer.write(
                pa.Table.from_arrays([ids, ids, _empty_strings(n), text, vectors], names=list(LEGACY_COLUMNS))
            )
            start += n
            bar.update(n)
    if start != num_blocks:
        raise ValueError(f"{LEGACY_BLOCK_RECORDS} has {start} texts but block_emb has {num_blocks} rows.")
    writer.finish()


def _empty_strings(n: int) -> pa.Array:
    return pa.StringArray.from_buffers(n, pa.py_buffer(np.zeros(n + 1, dtype=np.int32)), pa.py_buffer(b""))


# -- The index --------------------------------------------------------------------------------------------------------


def _write_index(path, factory, block_emb, num_blocks, dim, train_size, chunk_rows) -> tuple[str, str]:
    """Write the index over the legacy rows (labels = rows = block ids). Returns (index type, manifest `index_labels`)."""

    def chunks():
        start = 0
        for emb in block_emb.chunks(chunk_rows):
            yield emb, np.arange(start, start + len(emb), dtype=np.int64)
            start += len(emb)

    # As `BlockIndex.from_matrix` samples (same random training sample), reading the rows from the file.
    rng = np.random.default_rng(0)

    def sample(size: int) -> np.ndarray:
        return block_emb.take(np.sort(rng.choice(num_blocks, size=size, replace=False)))

    return BlockIndex.write_streamed(
        path, factory, dim, chunks, num_blocks, train_sample=sample, train_size=train_size
    )
