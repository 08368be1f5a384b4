"""Inputs of the REALM question-answering pipeline: a question string or dict, its context, a streamed dataset."""

from __future__ import annotations

from collections.abc import Iterator

import datasets
import torch


def _is_dataset(inputs) -> bool:
    return isinstance(inputs, torch.utils.data.Dataset)


def is_hf_dataset(inputs) -> bool:
    """Whether `inputs` is a `datasets` dataset (or dataset dict), which the pipeline reads by its columns."""
    return isinstance(
        inputs, (datasets.Dataset, datasets.IterableDataset, datasets.DatasetDict, datasets.IterableDatasetDict)
    )


class _QuestionRows(torch.utils.data.Dataset):
    """The `question` (and `context`) columns of a `datasets.Dataset`, row by row, as the pipeline streams them."""

    def __init__(self, dataset: datasets.Dataset):
        self.has_context = "context" in dataset.column_names
        # Only the columns read: the others (answers, ids, ...) are never decoded.
        self.rows = dataset.select_columns(["question", "context"] if self.has_context else ["question"])

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        row = self.rows[index]
        return {"question": row["question"], "context": row["context"] if self.has_context else None}


def _iterable_questions(dataset: datasets.IterableDataset) -> Iterator[dict]:
    for row in dataset:
        if "question" not in row:
            raise ValueError(_missing_question_column(sorted(row)))
        yield {"question": row["question"], "context": row.get("context")}


def _missing_question_column(columns) -> str:
    return (
        f"The dataset has no `question` column (columns: {list(columns)}). Rename the column that holds the questions "
        "with `dataset.rename_column(name, 'question')`, or pass `transformers.pipelines.pt_utils.KeyDataset(dataset, "
        "name)`."
    )


def dataset_questions(dataset):
    """
    A `datasets.Dataset` (or `IterableDataset`) as the pipeline streams it: its `question` column and, when it has
    one, its `context` column; the other columns are ignored. A `DatasetDict` is refused: pick a split.
    """
    if isinstance(dataset, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        raise ValueError(
            f"Got a dataset dict with splits {list(dataset)}; pass one split, e.g. `qa(dataset['test'])`."
        )
    columns = dataset.column_names
    if columns is not None and "question" not in columns:
        raise ValueError(_missing_question_column(columns))
    if isinstance(dataset, datasets.Dataset):
        return _QuestionRows(dataset)
    return _iterable_questions(dataset)  # a generator: the pipeline streams it
