"""The block table: a `datasets.Dataset` of blocks and their embeddings, built from columns and checked."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import datasets
import numpy as np
import pyarrow as pa

logger = logging.getLogger(__name__)

# Arrow string arrays have 32-bit offsets (2 GB per array): build big text columns in row chunks.
_ARROW_CHUNK_ROWS = 1 << 20


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


def _make_corpus(columns: Mapping[str, Any], embeddings: np.ndarray, features: datasets.Features | None = None):
    """A `datasets.Dataset` from python/numpy columns and an `[n, dim]` embedding matrix (in memory, Arrow-backed)."""
    types = {
        "block_id": pa.int64(),
        "title": pa.string(),
        "text": pa.string(),
        "char_start": pa.int64(),
        "char_end": pa.int64(),
    }
    arrays = {}
    for name, values in columns.items():
        arrays[name] = _arrow_column(name, values, types.get(name))
    arrays["embeddings"] = _embedding_column(embeddings)
    table = pa.table(arrays)
    if features is not None:
        table = _conform_table(table, features)
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


def _check_corpus_columns(corpus: datasets.Dataset) -> None:
    missing = [c for c in ("block_id", "title", "text", "embeddings") if c not in corpus.column_names]
    if missing:
        raise ValueError(
            f"The corpus dataset lacks column(s) {missing} (has {corpus.column_names}). A retriever corpus needs "
            "`block_id`, `title`, `text` and `embeddings`."
        )
