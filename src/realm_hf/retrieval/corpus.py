"""The block table: a `datasets.Dataset` of blocks and their embeddings, with lookup by stable block id."""

from __future__ import annotations

import atexit
import mmap
import os
import shutil
import tempfile
import threading
import uuid
import weakref
from collections.abc import Mapping
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from ..logging_utils import get_logger

logger = get_logger(__name__)

# Arrow string arrays have 32-bit offsets (2 GB per array): build big text columns in row chunks.
_ARROW_CHUNK_ROWS = 1 << 20
# The wordpiece ids of each block's text as the reader reads it (`encoding.tokenize_block_texts`): training matches
# answers in the searcher beam against them instead of tokenizing every (question, block) pair. Optional: corpora
# saved without it tokenize the beam's texts on demand.
TOKEN_IDS_COLUMN = "text_token_ids"


# Rows per Arrow `take` when reading stored embeddings. Arrow's memory pool (mimalloc) keeps what a take allocated
# resident after it is freed: one take for a whole re-ranked search (1,000 questions x 500 candidates x 128 floats,
# 256 MB, copied twice) left ~0.5 GB of anonymous memory behind, next to a ~0.7 GB IVF-PQ index at 13M blocks.
# Pieces of this many rows (8 MB at 128-d) bound it.
GATHER_ROWS = 16_384


def token_ids_array(ids: list[list[int]], vocab_size: int | None = None) -> pa.ChunkedArray:
    """
    The `text_token_ids` column from per-block id lists: `list<uint16>` when the vocabulary fits in 16 bits (BERT's
    30,522 wordpieces: half the bytes of int32 at 13M x 288 ids), `list<int32>` otherwise.
    """
    small = vocab_size is not None and vocab_size <= np.iinfo(np.uint16).max + 1
    dtype = np.uint16 if small else np.int32
    chunks = []
    for start in range(0, len(ids), _ARROW_CHUNK_ROWS):
        part = ids[start : start + _ARROW_CHUNK_ROWS]
        offsets = np.zeros(len(part) + 1, dtype=np.int32)
        np.cumsum([len(row) for row in part], out=offsets[1:])
        values = np.fromiter((t for row in part for t in row), dtype=np.int64, count=int(offsets[-1]))
        if len(values) and (values.min() < 0 or values.max() > np.iinfo(dtype).max):
            raise ValueError(f"Token ids out of range for {np.dtype(dtype).name}: the vocabulary size is wrong.")
        chunks.append(pa.ListArray.from_arrays(pa.array(offsets), pa.array(values.astype(dtype))))
    return pa.chunked_array(chunks, type=pa.list_(pa.from_numpy_dtype(dtype)))


def pad_token_ids(rows: list) -> tuple[np.ndarray, np.ndarray]:
    """Id lists (or arrays) as one `[n, longest]` int32 array padded with -1 (never a token id), and their lengths."""
    lengths = np.fromiter((len(row) for row in rows), dtype=np.int64, count=len(rows))
    padded = np.full((len(rows), int(lengths.max()) if len(rows) else 0), -1, dtype=np.int32)
    if lengths.sum():
        padded[np.arange(padded.shape[1]) < lengths[:, None]] = np.concatenate([np.asarray(r) for r in rows if len(r)])
    return padded, lengths


def _arrow_column(name: str, values, arrow_type=None) -> pa.ChunkedArray:
    try:
        if isinstance(values, np.ndarray) and values.dtype != object:
            return pa.chunked_array([pa.array(values, type=arrow_type)])
        chunks = [
            pa.array(values[i : i + _ARROW_CHUNK_ROWS], type=arrow_type)
            for i in range(0, len(values), _ARROW_CHUNK_ROWS)
        ]
        return (
            pa.chunked_array(chunks, type=arrow_type) if chunks else pa.chunked_array([], type=arrow_type or pa.null())
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise ValueError(f"Column {name!r} has values of mixed or unsupported types: {err}") from None


def _embedding_column(embeddings: np.ndarray) -> pa.ChunkedArray:
    # FixedSizeList over the flat float32 buffer: zero-copy from numpy (also from a memory-mapped legacy matrix).
    dim = embeddings.shape[1]
    chunks = []
    for i in range(0, len(embeddings), _ARROW_CHUNK_ROWS):
        part = np.ascontiguousarray(embeddings[i : i + _ARROW_CHUNK_ROWS], dtype=np.float32)
        chunks.append(pa.FixedSizeListArray.from_arrays(pa.array(part.reshape(-1)), dim))
    return pa.chunked_array(chunks)


# -- Memory-mapped scratch files ---------------------------------------------------------------------------------------
# A corpus built in this process (from documents, embeddings or legacy blocks; added blocks; re-embedded columns) is
# written once to an Arrow file in a per-process scratch directory and memory-mapped from there, like a corpus loaded
# with `load_from_disk`: the OS pages it in and out, and the process keeps no second copy in RAM. datasets' cache is
# not involved (datasets keeps an in-memory Dataset's `map` results in memory, and `datasets.disable_caching()` only
# moves cache files), so this works the same with caching on or off. The file is mapped through a Python `mmap` that
# every Arrow buffer read from it references, so it is deleted exactly when the last array using it is freed (by any
# Dataset: the retriever's, one a reader holds, or one derived with `select`/`concatenate_datasets`); the directory
# goes at interpreter exit. Set `TMPDIR` to put it on a disk with room for the corpus.

_SCRATCH = {"dir": None}
_SCRATCH_LOCK = threading.Lock()


def _scratch_dir() -> str:
    with _SCRATCH_LOCK:
        if _SCRATCH["dir"] is None or not os.path.isdir(_SCRATCH["dir"]):
            _SCRATCH["dir"] = tempfile.mkdtemp(prefix="realm-hf-corpus-")
            atexit.register(shutil.rmtree, _SCRATCH["dir"], ignore_errors=True)
        return _SCRATCH["dir"]


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:  # already gone, or still mapped on a platform that refuses (the directory goes at exit)
        pass


def memory_mapped(table: pa.Table, features: datasets.Features | None = None) -> datasets.Dataset:
    """
    `table` written to a scratch Arrow file and read back memory-mapped, as a `datasets.Dataset` with `features`
    (default: inferred from the Arrow types). See the comment above for where the file lives and when it goes.
    """
    features = features if features is not None else datasets.Features.from_arrow_schema(table.schema)
    schema = features.arrow_schema
    table = table.cast(schema) if table.schema != schema else table
    path = os.path.join(_scratch_dir(), f"corpus-{uuid.uuid4().hex}.arrow")
    try:
        # An Arrow IPC stream: the format of `Dataset.from_file` and `save_to_disk`.
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
            writer.write_table(table, max_chunksize=_ARROW_CHUNK_ROWS)
        with open(path, "rb") as f:
            mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as err:
        _remove_quietly(path)
        raise OSError(
            f"Could not write the corpus ({table.nbytes} bytes) to its memory-mapped scratch file {path}: {err}. Set "
            "the TMPDIR environment variable to a directory on a disk with room for it."
        ) from None
    weakref.finalize(mapping, _remove_quietly, path)
    # Zero-copy: every buffer of the table is a slice of `mapping`, which lives as long as the last of them.
    mapped = pa.ipc.open_stream(pa.BufferReader(pa.py_buffer(mapping))).read_all()
    # `MemoryMappedTable` records the path: `cache_files`, pickling and `save_to_disk` treat it as a file-backed table.
    return datasets.Dataset(
        datasets.table.MemoryMappedTable(mapped, path), info=datasets.DatasetInfo(features=features)
    )


def caching_outside(dataset: datasets.Dataset, directory: str) -> datasets.Dataset:
    """
    `dataset`, loaded with `load_from_disk` from `directory` (a saved corpus), seen through links to its Arrow files
    in the scratch directory, so that datasets' `map`/`filter` write their `cache-*.arrow` files there, not into the
    saved folder: datasets caches next to a dataset's first file, which left the folder dirty (the next load refused
    the files the manifest does not list) or failed on a read-only folder (a Hub cache, a shared mount). The data stays
    memory-mapped from the saved files; the links go with the scratch directory at exit. Where links cannot be made,
    `dataset` is returned as it is.
    """
    from datasets.table import ConcatenationTable, MemoryMappedTable

    directory = os.path.realpath(directory)

    def relinked(table):
        if isinstance(table, MemoryMappedTable) and os.path.dirname(os.path.realpath(table.path)) == directory:
            link = os.path.join(_scratch_dir(), f"saved-{uuid.uuid4().hex}-{os.path.basename(table.path)}")
            os.symlink(os.path.realpath(table.path), link)
            return MemoryMappedTable(table.table, link, table.replays)
        if isinstance(table, ConcatenationTable):
            return ConcatenationTable(table.table, [[relinked(block) for block in row] for row in table.blocks])
        return table

    try:
        data = relinked(dataset._data)
    except (OSError, NotImplementedError) as err:  # no symbolic links here (e.g. Windows without the privilege)
        logger.debug("Corpus files not linked outside %s (%s): datasets' cache files go there.", directory, err)
        return dataset
    return datasets.Dataset(
        data, info=dataset.info, split=dataset.split, indices_table=dataset._indices, fingerprint=dataset._fingerprint
    )


def make_corpus(
    columns: Mapping[str, Any],
    embeddings: np.ndarray,
    features: datasets.Features | None = None,
    in_memory: bool = False,
):
    """
    A `datasets.Dataset` from python/numpy columns and an `[n, dim]` embedding matrix: memory-mapped from a scratch
    file ([`memory_mapped`]), or an in-memory Arrow table with `in_memory=True`.
    """
    types = {
        "block_id": pa.int64(),
        "title": pa.string(),
        "text": pa.string(),
        "char_start": pa.int64(),
        "char_end": pa.int64(),
    }
    arrays = {}
    for name, values in columns.items():
        if isinstance(values, pa.ChunkedArray):  # e.g. `token_ids_array`: already typed
            arrays[name] = values
            continue
        arrays[name] = _arrow_column(name, values, types.get(name))
    arrays["embeddings"] = _embedding_column(embeddings)
    table = pa.table(arrays)
    if features is not None:
        table = _conform_table(table, features)
    if not in_memory:
        return memory_mapped(table, features)
    if features is not None:
        return datasets.Dataset(datasets.table.InMemoryTable(table), info=datasets.DatasetInfo(features=features))
    return datasets.Dataset(datasets.table.InMemoryTable(table))


def _conform_table(table: pa.Table, features: datasets.Features) -> pa.Table:
    """Reorder/cast `table` to `features`' schema: missing metadata columns become nulls, extra ones are dropped."""
    schema = features.arrow_schema
    extra = [name for name in table.column_names if name not in schema.names]
    if extra:
        logger.warning("Dropping document fields %s that the existing corpus does not have.", extra)
    arrays = []
    for field in schema:
        if field.name in table.column_names:
            column = table.column(field.name)
            try:
                arrays.append(column.cast(field.type) if column.type != field.type else column)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
                raise ValueError(
                    f"Column {field.name!r} of the new documents ({column.type}) does not match the corpus ({field.type}): {err}"
                ) from None
        else:
            arrays.append(pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def check_corpus_columns(corpus: datasets.Dataset) -> None:
    """
    Refuse a `datasets.Dataset` that cannot be a retriever corpus: a missing `block_id`, `title`, `text` or
    `embeddings` column, texts or titles that are not strings, or `doc_id`s that are neither integers nor strings.

    Raises:
        `ValueError`: What is wrong and how to rebuild the corpus.
    """
    missing = [c for c in ("block_id", "title", "text", "embeddings") if c not in corpus.column_names]
    if missing:
        raise ValueError(
            f"The corpus dataset lacks column(s) {missing} (has {corpus.column_names}). A retriever corpus needs "
            "`block_id`, `title`, `text` and `embeddings`."
        )
    # A damaged or hand-made corpus fails here, where it is loaded, not when a search returns a number as a text.
    for column, allowed in (("text", _STRING_TYPES), ("title", (*_STRING_TYPES, "null"))):
        dtype = getattr(corpus.features[column], "dtype", type(corpus.features[column]).__name__)
        if dtype not in allowed:
            raise ValueError(
                f"The corpus's `{column}` column holds {dtype}, not strings: it is damaged or was not built as a "
                "retriever corpus. Rebuild it from the documents (`RealmRetriever.from_documents`, `realm-hf index`)."
            )
    if "doc_id" in corpus.column_names and _doc_id_kind(corpus.features["doc_id"]) is None:
        raise ValueError(
            f"The corpus's `doc_id` column holds {getattr(corpus.features['doc_id'], 'dtype', 'lists')}: doc_ids are "
            "integers or strings (one type per corpus). Rebuild the corpus with such ids."
        )


_STRING_TYPES = ("string", "large_string")


def _embedding_length(corpus: datasets.Dataset) -> int | None:
    """
    The length of every row's embedding: the schema's, or, when the schema does not fix it (a corpus from Parquet
    or `map`), read from the rows (list lengths only), which must all agree.
    """
    length = getattr(corpus.features["embeddings"], "length", None)
    if length not in (None, -1):
        return int(length)
    if len(corpus) == 0:
        return None
    column = corpus.with_format("arrow", columns=["embeddings"])[:]["embeddings"]
    lengths = pc.list_value_length(column)
    low, high = pc.min_max(lengths).values()
    if low.as_py() != high.as_py() or low.as_py() is None:
        raise ValueError(
            f"The corpus's embeddings have lengths from {low.as_py()} to {high.as_py()}: every block needs one "
            "vector of the index's dimension. The corpus is damaged: re-embed it (`realm_hf.retrieval.embed_corpus(retriever, embedder)`) "
            "or rebuild it from the documents."
        )
    return int(low.as_py())


def _doc_id_kind(feature) -> type | None:
    """`int` or `str`: the type of a corpus's doc_ids by its `doc_id` feature (`None`: neither)."""
    dtype = getattr(feature, "dtype", None)
    if dtype in _STRING_TYPES:
        return str
    if isinstance(dtype, str) and dtype.startswith(("int", "uint")):
        return int
    return None


def check_doc_id(doc_id, what: str) -> int | str:
    """
    `doc_id` as an `int` or `str` (numpy integers become `int`), else a `ValueError` starting with `what`: a doc_id
    names a document in `remove_documents`, so it must be hashable and compare as the user wrote it.
    """
    if isinstance(doc_id, str):
        return doc_id
    if isinstance(doc_id, (int, np.integer)) and not isinstance(doc_id, bool):
        return int(doc_id)
    raise ValueError(
        f"{what} is {doc_id!r} ({type(doc_id).__name__}): a doc_id is an integer or a string. Give each document "
        "one id of one type (or none, to number the documents by position)."
    )


def _describe_kind(kind: type) -> str:
    return "integers" if kind is int else "strings"


def as_id_array(block_ids) -> np.ndarray:
    """Block ids (tensor, array or list) as an int64 numpy array."""
    if isinstance(block_ids, torch.Tensor):
        return block_ids.detach().cpu().numpy().astype(np.int64)
    return np.asarray(block_ids, dtype=np.int64)


def unflatten(flat: list, ids: np.ndarray) -> list:
    """`flat`, one item per id of `ids` in row-major order, shaped as `ids`: a list, or a list of rows for 2-d ids."""
    if ids.ndim == 1:
        return flat
    k = ids.shape[1]
    return [flat[i * k : (i + 1) * k] for i in range(ids.shape[0])]


class BlockCorpus:
    """
    The blocks of a retriever: a `datasets.Dataset` (one row per block, `block_id`, `title`, `text`, metadata and
    `embeddings`) and the bookkeeping that finds a block's row from its id. Never modified in place: changes build a
    new `BlockCorpus`, so a reader holding the old one keeps a consistent view. Blocks added to a memory-mapped table
    (and re-embedded columns) are memory-mapped too; a table held in memory stays in memory.

    Args:
        dataset (`datasets.Dataset`): The block table; its `block_id`s must be unique.
    """

    def __init__(self, dataset: datasets.Dataset):
        check_corpus_columns(dataset)
        self.dataset = dataset
        ids = dataset.with_format("numpy", columns=["block_id"])[:]["block_id"].astype(np.int64)
        if len(ids) > 1 and not np.all(ids[1:] > ids[:-1]):
            # Corpora we build are sorted by block_id; shared ones may not be: keep an argsort to map ids to rows.
            order = np.argsort(ids, kind="stable")
            sorted_ids = ids[order]
            if np.any(sorted_ids[1:] == sorted_ids[:-1]):
                dup = sorted_ids[1:][sorted_ids[1:] == sorted_ids[:-1]][:5].tolist()
                raise ValueError(f"Duplicate block ids in the corpus: {dup}. Block ids must be unique.")
            self.sorted_ids, self._sorted_rows = sorted_ids, order
        else:
            self.sorted_ids, self._sorted_rows = ids, None
        self.row_ids = ids
        # Table rows behind the dataset's rows (a `select`ed dataset keeps an indices mapping), for `_gather`.
        indices = getattr(dataset, "_indices", None)
        self._table_rows = indices.column(0).to_numpy().astype(np.int64) if indices is not None else None
        self._emb_view = dataset.with_format("numpy", columns=["embeddings"])
        # Block dicts (search results, provenance) carry the metadata, not the vectors or the reader's token ids.
        self._meta_columns = [c for c in dataset.column_names if c not in ("embeddings", TOKEN_IDS_COLUMN)]
        self._meta_view = dataset.select_columns(self._meta_columns)
        self.has_token_ids = TOKEN_IDS_COLUMN in dataset.column_names
        self._dim = _embedding_length(dataset)

    def __len__(self) -> int:
        return len(self.dataset)

    @property
    def dim(self) -> int | None:
        """Dimension of the stored embeddings (`None` for an empty corpus whose schema does not fix it)."""
        return self._dim

    @property
    def max_block_id(self) -> int:
        return int(self.sorted_ids[-1])

    def rows(self, block_ids: np.ndarray) -> np.ndarray:
        """Corpus rows of `block_ids` (any shape); -1 stays -1; unknown ids raise `KeyError`."""
        flat = np.asarray(block_ids, dtype=np.int64).reshape(-1)
        pos = np.searchsorted(self.sorted_ids, flat)
        pos = np.minimum(pos, len(self.sorted_ids) - 1)
        found = self.sorted_ids[pos] == flat
        unknown = ~found & (flat != -1)
        if unknown.any():
            raise KeyError(f"Block ids not in the corpus: {flat[unknown][:10].tolist()}")
        rows = self._sorted_rows[pos] if self._sorted_rows is not None else pos
        return np.where(found, rows, -1).reshape(np.shape(block_ids))

    def _gather(self, column: str, rows: np.ndarray) -> pa.Array:
        """
        One column at corpus `rows` (in that order) with Arrow's vectorised `take`: the searcher beam looks up
        thousands of rows per question, and `Dataset.__getitem__` gathers and formats them one row at a time.
        """
        if self._table_rows is not None:
            rows = self._table_rows[rows]
        return self.dataset.data.column(column).take(pa.array(rows, type=pa.int64())).combine_chunks()

    def embeddings(self, block_ids, dim: int) -> np.ndarray:
        """Stored embeddings of `block_ids`, shape `block_ids.shape + (dim,)`; zeros for id -1."""
        ids = as_id_array(block_ids)
        rows = self.rows(ids).reshape(-1)
        out = np.zeros((len(rows), dim), dtype=np.float32)
        valid = np.flatnonzero(rows >= 0)
        for start in range(0, len(valid), GATHER_ROWS):
            part = valid[start : start + GATHER_ROWS]
            values = self._gather("embeddings", rows[part]).flatten().to_numpy(zero_copy_only=False)
            out[part] = values.reshape(-1, dim)
        return out.reshape(*ids.shape, dim)

    def embedding_rows(self, rows) -> np.ndarray:
        """Stored embeddings of corpus rows (a slice or sorted row numbers)."""
        return self._emb_view[rows]["embeddings"]

    def blocks(self, block_ids) -> list:
        """Blocks as dicts (`list[list[dict]]` for 2-D ids, `list[dict]` for 1-D); id -1 gives an empty block."""
        ids = as_id_array(block_ids)
        if ids.ndim not in (1, 2):
            raise ValueError(f"block_ids must be 1-D or 2-D, got shape {ids.shape}.")
        rows = self.rows(ids).reshape(-1)
        valid = rows >= 0
        fetched = {c: self._gather(c, rows[valid]).to_pylist() if valid.any() else [] for c in self._meta_columns}
        empty = {c: None for c in self._meta_columns}
        empty.update(block_id=-1, title="", text="")
        flat, j = [], 0
        for is_valid in valid:
            if is_valid:
                flat.append({c: fetched[c][j] for c in self._meta_columns})
                j += 1
            else:
                flat.append(dict(empty))
        return unflatten(flat, ids)

    def texts(self, block_ids) -> list:
        """Texts of `block_ids` (`list[list[str]]` for 2-D ids, `list[str]` for 1-D); id -1 gives `""`."""
        ids = as_id_array(block_ids)
        rows = self.rows(ids).reshape(-1)
        valid = rows >= 0
        texts = self._gather("text", rows[valid]).to_pylist() if valid.any() else []
        it = iter(texts)
        return unflatten([next(it) if v else "" for v in valid], ids)

    def token_ids(self, block_ids) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """
        The stored `text_token_ids` of `block_ids` (flattened), for the corpora that have the column: `(ids, lengths,
        missing)` with `ids` an `[n, longest]` int32 array padded with -1, and `missing` marking the rows stored
        without ids (null), which the caller tokenizes. Id -1 gives an empty row.
        """
        if not self.has_token_ids:
            raise ValueError(f"This corpus has no `{TOKEN_IDS_COLUMN}` column.")
        rows = self.rows(as_id_array(block_ids)).reshape(-1)
        valid = rows >= 0
        lengths = np.zeros(len(rows), dtype=np.int64)
        missing = np.zeros(len(rows), dtype=bool)
        if not valid.any():
            return np.full((len(rows), 0), -1, dtype=np.int32), lengths, missing
        # Arrow all the way: one gather, then the flat values and offsets, never a Python list per block.
        array = self._gather(TOKEN_IDS_COLUMN, rows[valid])
        offsets = np.asarray(array.offsets, dtype=np.int64)
        values = np.asarray(array.flatten(), dtype=np.int32)
        lengths[valid] = np.diff(offsets)
        missing[valid] = np.asarray(array.is_null(), dtype=bool)
        lengths[missing] = 0
        ids = np.full((len(rows), int(lengths.max()) if len(rows) else 0), -1, dtype=np.int32)
        ids[np.arange(ids.shape[1]) < lengths[:, None]] = values
        return ids, lengths, missing

    def titles_and_texts(self, start: int, stop: int) -> dict[str, list]:
        """`{"title": [...], "text": [...]}` of corpus rows `start:stop`."""
        return self._meta_view.select_columns(["title", "text"])[start:stop]

    def iter_embeddings(self, chunk_size: int = 262144):
        """`build_index` chunks over the stored embeddings: `(embeddings, block_ids)` in row order."""

        def gen():
            for start in range(0, len(self), chunk_size):
                stop = min(start + chunk_size, len(self))
                yield self.embedding_rows(slice(start, stop)), self.row_ids[start:stop]

        return gen

    def next_doc_id(self, fallback: int) -> int:
        """A `doc_id` for new documents: one past the largest integer `doc_id`, else `fallback`."""
        if "doc_id" not in self.dataset.column_names:
            return 0
        if getattr(self.dataset.features["doc_id"], "dtype", "").startswith("int"):
            values = self.dataset.with_format("numpy", columns=["doc_id"])[:]["doc_id"]
            return int(values.max()) + 1 if len(values) else 0
        return fallback

    @property
    def in_memory(self) -> bool:
        """Whether the table is held in memory (no Arrow file behind it), e.g. loaded with `mmap=False`."""
        return not self.dataset.cache_files

    def _new_table(self, table: pa.Table, features: datasets.Features | None = None) -> datasets.Dataset:
        """`table` as a Dataset stored like this corpus: memory-mapped, or in memory for an in-memory corpus."""
        if self.in_memory:
            return datasets.Dataset(datasets.table.InMemoryTable(table), info=datasets.DatasetInfo(features=features))
        return memory_mapped(table, features)

    def with_embeddings(self, embeddings: np.ndarray) -> datasets.Dataset:
        """This table with its `embeddings` column replaced by `embeddings` (`[len(self), dim]`, row order)."""
        # One new table (not the old one with a column concatenated): a horizontal concatenation would keep listing
        # the replaced embeddings' file among `cache_files`, after the data in it is gone.
        rows = self.dataset.remove_columns(["embeddings"]).with_format("arrow")[:]
        table = rows.append_column("embeddings", _embedding_column(embeddings))
        features = datasets.Features({**self.dataset.features, "embeddings": self.dataset.features["embeddings"]})
        if getattr(features["embeddings"], "length", None) != embeddings.shape[1]:
            features = None  # re-embedded at another dimension: infer the new embedding feature
        return self._new_table(table, features)

    @property
    def doc_id_kind(self) -> type | None:
        """`int` or `str`: the type of this corpus's doc_ids (`None` when it has no `doc_id` column)."""
        if "doc_id" not in self.dataset.column_names:
            return None
        return _doc_id_kind(self.dataset.features["doc_id"])

    def check_doc_ids(self, doc_ids, what: str = "New documents") -> None:
        """
        Refuse doc_ids of another type than this corpus's: one type per corpus, so that `remove_documents(3)` never
        also removes a document `"3"` (and `"3"` is never stored as 3, or 3 as `"3"`).
        """
        kind = self.doc_id_kind
        if kind is None:
            return
        for doc_id in doc_ids:
            if doc_id is None:
                continue
            check_doc_id(doc_id, f"{what}' doc_id")
            if not isinstance(doc_id, kind) or isinstance(doc_id, bool):
                converted = f"int({doc_id!r})" if kind is int else f"str({doc_id!r})"
                raise ValueError(
                    f"{what}: doc_id {doc_id!r} is a {type(doc_id).__name__}, but this corpus's doc_ids are "
                    f"{_describe_kind(kind)}: one type per corpus (else {doc_id!r} and {converted} would name two "
                    f"documents). Give it as {converted}"
                    + (" (documents without a doc_id are numbered with integers)." if kind is str else ".")
                )

    def appended(self, columns: dict, embeddings: np.ndarray) -> datasets.Dataset:
        """This table with new blocks (`columns` with `block_id`, and their embeddings) appended, in its schema."""
        if "doc_id" in columns and "doc_id" in self.dataset.column_names:
            self.check_doc_ids(columns["doc_id"])  # never cast: "3" stored as 3 would be a second document 3
        new = make_corpus(columns, embeddings, features=self.dataset.features, in_memory=self.in_memory)
        return datasets.concatenate_datasets([self.dataset, new])

    def doc_mask(self, doc_ids) -> np.ndarray:
        """Boolean row mask of the blocks of documents `doc_ids` (one id or several); unknown ids are logged."""
        if "doc_id" not in self.dataset.column_names:
            raise ValueError("This corpus has no `doc_id` column: remove blocks with `block_ids=` instead.")
        doc_ids = [doc_ids] if isinstance(doc_ids, (str, int, np.integer)) else list(doc_ids)
        doc_ids = [check_doc_id(d, f"doc_ids[{i}]") for i, d in enumerate(doc_ids)]
        self.check_doc_ids(doc_ids, "remove_documents")
        corpus_doc_ids = self.dataset.with_format("numpy", columns=["doc_id"])[:]["doc_id"].tolist()
        wanted = set(doc_ids)
        hit = np.fromiter((d in wanted for d in corpus_doc_ids), dtype=bool, count=len(corpus_doc_ids))
        not_found = sorted(wanted - {d for d, h in zip(corpus_doc_ids, hit) if h}, key=str)
        if not_found:
            logger.warning("Documents not in the corpus (nothing removed for them): %s", not_found[:10])
        return hit
