"""
Metadata filters of a search (`retriever.search(..., filter=...)`): which blocks of a corpus a filter lets through, as
a mask over the corpus rows. A filter is a dict `{column: condition}` over the corpus's columns (`block_id`, `title`,
`text`, `doc_id` and any metadata column), every condition met, or a callable over a block's dict.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .corpus import TOKEN_IDS_COLUMN, BlockCorpus

# Columns a filter never reads: the stored vectors and the reader's token ids.
UNFILTERABLE_COLUMNS = ("embeddings", TOKEN_IDS_COLUMN)
# Rows handed to a callable filter per read.
ROWS_PER_READ = 4096

FILTER_FORMS = (
    "`filter` takes a dict of conditions on the corpus's columns ({'topic': 'science'}, {'year': [1999, 2000]}, "
    "{'year': lambda year: year > 1990}) or a callable over a block's dict (lambda block: block['year'] > 1990)"
)


def filterable_columns(corpus: BlockCorpus) -> list[str]:
    """The columns a filter can name: every corpus column but the embeddings and token ids."""
    return [name for name in corpus.dataset.column_names if name not in UNFILTERABLE_COLUMNS]


def row_mask(corpus: BlockCorpus, filter) -> np.ndarray | None:
    """
    The rows of `corpus` that `filter` lets through, a boolean array in corpus row order (`None`: no filter).

    Args:
        corpus ([`BlockCorpus`]): The blocks.
        filter (`dict` or `callable`, *optional*): `{column: condition}`, every condition met: a value (rows equal to
            it; `None` matches missing values), a list, tuple or set of values (rows equal to one of them), or a
            callable over the column's value (rows for which it returns true). Or a callable over a block's dict
            (`block_id`, `title`, `text` and the metadata columns), called once per block.

    Raises:
        `ValueError` for a column the corpus lacks (naming the columns it has) or a value of another type than the
        column's; `TypeError` for a filter of another form.
    """
    if filter is None:
        return None
    if isinstance(filter, Mapping):
        mask = np.ones(len(corpus), dtype=bool)
        for column, condition in filter.items():
            mask &= _column_mask(corpus, column, condition)
        return mask
    if callable(filter):
        return _callable_mask(corpus, filter)
    raise TypeError(f"{FILTER_FORMS}; got {type(filter).__name__}.")


def _check_column(corpus: BlockCorpus, column) -> None:
    columns = filterable_columns(corpus)
    if column in columns:
        return
    if column in UNFILTERABLE_COLUMNS:
        raise ValueError(f"A filter cannot read the column {column!r}: filter on one of {columns}.")
    close = difflib.get_close_matches(str(column), columns, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(
        f"The corpus has no column {column!r} to filter on: its columns are {columns}.{hint} Add metadata as fields "
        "of the documents (`from_documents([{'text': ..., 'topic': ...}])`)."
    )


def _column_mask(corpus: BlockCorpus, column: str, condition) -> np.ndarray:
    _check_column(corpus, column)
    values = corpus.dataset.with_format("arrow", columns=[column])[:][column]
    if callable(condition):
        return np.fromiter((bool(condition(value)) for value in values.to_pylist()), dtype=bool, count=len(values))
    if condition is None:
        return _as_mask(pc.is_null(values))
    if pa.types.is_nested(values.type):
        raise ValueError(
            f"The column {column!r} holds {values.type} values, which a filter value cannot equal: give a callable "
            f"({{{column!r}: lambda value: ...}})."
        )
    wanted = list(condition) if isinstance(condition, (list, tuple, set, frozenset)) else [condition]
    try:
        # Typed as the column, so that 3 never matches "3" (no casting between numbers and text).
        wanted = pa.array(wanted, type=values.type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        kinds = sorted({type(value).__name__ for value in wanted})
        raise ValueError(
            f"The filter on {column!r} gives {', '.join(kinds)} values, but the column holds {values.type}: give "
            "values of the column's type (or a callable)."
        ) from None
    return _as_mask(pc.is_in(values, value_set=wanted))


def _callable_mask(corpus: BlockCorpus, condition: Callable[[dict], bool]) -> np.ndarray:
    columns = filterable_columns(corpus)
    rows = corpus.dataset.select_columns(columns).with_format(None)
    mask = np.zeros(len(corpus), dtype=bool)
    for start in range(0, len(rows), ROWS_PER_READ):
        batch = rows[start : start + ROWS_PER_READ]
        for offset, values in enumerate(zip(*(batch[name] for name in columns))):
            mask[start + offset] = bool(condition(dict(zip(columns, values))))
    return mask


def _as_mask(result) -> np.ndarray:
    """A pyarrow boolean result as a numpy mask, nulls (missing values) as false."""
    return np.asarray(pc.fill_null(result, False).to_numpy(), dtype=bool)
