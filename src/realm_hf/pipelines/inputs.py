"""Inputs of the REALM question-answering pipeline: a question string or dict, its context, a streamed dataset."""

from __future__ import annotations

import torch


def _to_example(item) -> dict:
    if isinstance(item, str):
        return {"question": item, "context": None}
    if isinstance(item, dict):
        unknown = set(item) - {"question", "context"}
        if "question" not in item or unknown:
            raise ValueError(
                f"A question dict needs a `question` key and may have a `context` key; got keys {sorted(item)}."
            )
        return {"question": item["question"], "context": item.get("context")}
    raise ValueError(
        f"A question must be a string or a dict with `question` (and `context`), got {type(item).__name__}."
    )


def _check_context(context) -> None:
    if context is not None and (not isinstance(context, str) or not context.strip()):
        raise ValueError(f"Empty context {context!r}: give some text to answer from, or no context to retrieve.")


def _is_dataset(inputs) -> bool:
    return isinstance(inputs, torch.utils.data.Dataset)
