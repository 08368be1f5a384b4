"""
Card metadata: `huggingface_hub`'s `ModelCardData` / `DatasetCardData` filled with what is known, and evaluation
results as `EvalResult` entries (which the library writes as `model-index`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from huggingface_hub import DatasetCardData, EvalResult, ModelCardData

from .card_tasks import OPEN_QA, CardTask

DEFAULT_TAGS = list(OPEN_QA.tags)
CORPUS_TAGS = ["realm", "retrieval", "faiss", "knowledge-corpus"]
# Keys of evaluation dicts (e.g. from `Trainer.evaluate` or `compute_qa_metrics`) that are not quality metrics.
NON_METRIC_KEYS = {"total", "epoch", "loss", "runtime", "samples_per_second", "steps_per_second", "step"}
QA_TASK = OPEN_QA.eval_task


def normalize_eval_results(eval_results, eval_dataset, datasets, task: CardTask = OPEN_QA) -> list[dict]:
    """
    Evaluation results as `[{"dataset": {...} or None, "metrics": {name: float}}]`: `eval_` prefixes dropped, counts,
    runtimes and losses skipped (the loss is kept for a task whose result it is: pre-training, ICT). A flat dict is
    described by `eval_dataset`, else by the first training dataset; with neither, its dataset is `None` (unknown:
    shown in the card's table, left out of `model-index`).
    """
    skipped = NON_METRIC_KEYS - {"loss"} if task.loss_name else NON_METRIC_KEYS
    if not eval_results:
        return []
    if isinstance(eval_results, Mapping):
        dataset = dict(eval_dataset) if eval_dataset else None
        if dataset is None and datasets:
            dataset = {"name": datasets[0], "type": datasets[0]}
        eval_results = [{"dataset": dataset, "metrics": eval_results}]
    results = []
    for entry in eval_results:
        if "metrics" not in entry:
            raise ValueError("Each evaluation result needs `metrics` (and `dataset`: name, type, split).")
        dataset = dict(entry["dataset"]) if entry.get("dataset") else None
        if dataset is not None:
            if not dataset.get("name") and not dataset.get("type"):
                raise ValueError(
                    f"An evaluation dataset needs a `name` or a `type` (a Hub dataset id), got {dataset}."
                )
            dataset.setdefault("name", dataset.get("type"))
            dataset.setdefault("type", slug(dataset["name"]))
        metrics = {}
        for key, value in entry["metrics"].items():
            key = key[len("eval_") :] if key.startswith("eval_") else key
            if key in skipped or key.endswith("_count") or isinstance(value, bool):
                continue
            if isinstance(value, (int, float)):
                metrics[key] = float(value)
        if metrics:
            results.append({"dataset": dataset, "metrics": metrics})
    return results


def eval_result_entries(results: list[dict], task: CardTask = OPEN_QA) -> list[EvalResult]:
    """One `EvalResult` per metric of each result whose dataset is known (the Hub needs its type and name)."""
    entries = []
    for result in results:
        dataset = result["dataset"]
        if dataset is None:
            continue
        for metric, value in result["metrics"].items():
            entries.append(
                EvalResult(
                    task_type=task.eval_task["type"],
                    task_name=task.eval_task["name"],
                    dataset_type=str(dataset["type"]),
                    dataset_name=str(dataset["name"]),
                    dataset_config=dataset.get("config"),
                    dataset_split=dataset.get("split"),
                    dataset_revision=dataset.get("revision"),
                    metric_type=metric,
                    metric_value=round(value, 4),
                    metric_name=metric_name(metric, task),
                )
            )
    return entries


def model_card_data(
    *,
    model_name: str,
    results: list[dict],
    license: str | None = None,
    language=None,
    tags=None,
    datasets=None,
    base_model=None,
    task: CardTask = OPEN_QA,
) -> ModelCardData:
    """The metadata of a REALM model card; `license`, `datasets`, `language`, `base_model` only when given."""
    entries = eval_result_entries(results, task)
    return ModelCardData(
        library_name="realm-hf",
        pipeline_tag=task.pipeline_tag,
        license=license or None,
        language=as_list(language) or None,
        tags=unique(list(task.tags) + list(tags or [])),
        datasets=as_list(datasets) or None,
        base_model=(base_model if isinstance(base_model, str) else list(base_model)) if base_model else None,
        model_name=model_name if entries else None,
        eval_results=entries or None,
    )


def corpus_card_data(
    *, license: str | None = None, tags=None, num_blocks: int | None = None, data_files: str | None = None
) -> DatasetCardData:
    """The metadata of a corpus (dataset) card; `data_files` (Parquet shards) lets the Hub's viewer show the blocks."""
    configs = None
    if data_files:
        configs = [{"config_name": "default", "data_files": [{"split": "train", "path": data_files}]}]
    return DatasetCardData(
        license=license or None,
        tags=unique(CORPUS_TAGS + list(tags or [])),
        size_categories=[size_category(num_blocks)] if num_blocks is not None else None,
        configs=configs,
    )


def metric_name(metric: str, task: CardTask = OPEN_QA) -> str:
    names = {"exact_match": "Exact Match", "f1": "F1", "loss": task.loss_name or "Loss"}
    if metric in names:
        return names[metric]
    match = re.fullmatch(r"(answer_)?recall@(\d+)", metric)
    if match:
        return ("Answer recall" if match.group(1) else "Recall") + f"@{match.group(2)}"
    return metric.replace("_", " ").capitalize()


def size_category(n: int) -> str:
    for limit, label in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M")):
        if n < limit:
            return label
    return "1M<n<10M" if n < 10_000_000 else "10M<n<100M"


def as_list(value) -> list:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def unique(items: list) -> list:
    return list(dict.fromkeys(items))


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-") or "custom"
