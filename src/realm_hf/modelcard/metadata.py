"""Card metadata: the default tags, evaluation results normalised into `model-index` entries, small value helpers."""

from __future__ import annotations

import re
from collections.abc import Mapping

DEFAULT_TAGS = ["realm", "retrieval-augmented", "open-domain-qa", "question-answering", "faiss"]
# Keys of evaluation dicts (e.g. from `Trainer.evaluate` or `compute_qa_metrics`) that are not quality metrics.
NON_METRIC_KEYS = {"total", "epoch", "loss", "runtime", "samples_per_second", "steps_per_second", "step"}


def normalize_eval_results(eval_results, eval_dataset, datasets) -> list[dict]:
    if not eval_results:
        return []
    if isinstance(eval_results, Mapping):
        dataset = dict(eval_dataset) if eval_dataset else None
        if dataset is None:
            dataset = {"name": datasets[0], "type": datasets[0]} if datasets else {"name": "evaluation set"}
        eval_results = [{"dataset": dataset, "metrics": eval_results}]
    results = []
    for entry in eval_results:
        if "metrics" not in entry:
            raise ValueError("Each evaluation result needs `metrics` (and `dataset`: name, type, split).")
        dataset = dict(entry.get("dataset") or {"name": "evaluation set"})
        dataset.setdefault("name", dataset.get("type", "evaluation set"))
        dataset.setdefault("type", slug(dataset["name"]))
        metrics = {}
        for key, value in entry["metrics"].items():
            key = key[len("eval_") :] if key.startswith("eval_") else key
            if key in NON_METRIC_KEYS or key.endswith("_count") or isinstance(value, bool):
                continue
            if isinstance(value, (int, float)):
                metrics[key] = float(value)
        if metrics:
            results.append({"dataset": dataset, "metrics": metrics})
    return results


def model_index_entry(result: dict) -> dict:
    return {
        "task": {"type": "question-answering", "name": "Open-domain question answering"},
        "dataset": {k: v for k, v in result["dataset"].items() if v is not None},
        "metrics": [
            {"type": metric, "value": round(value, 4), "name": metric_name(metric)}
            for metric, value in result["metrics"].items()
        ],
    }


def metric_name(metric: str) -> str:
    names = {"exact_match": "Exact Match", "f1": "F1"}
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
