"""The Markdown sections of the cards: model details, corpus facts, usage, training settings, evaluation, versions."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from typing import Any

from ..constants import RETRIEVER_SUBFOLDER
from .card_metadata import metric_name
from .card_tasks import OPEN_QA, CardTask, detail_rows, usage_text

TRAINING_KEYS = (
    "learning_rate",
    "num_train_epochs",
    "max_steps",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "warmup_steps",
    "warmup_ratio",
    "weight_decay",
    "lr_scheduler_type",
    "optim",
    "max_grad_norm",
    "seed",
    "bf16",
    "fp16",
)


def corpus_info(retriever=None, manifest: Mapping | None = None) -> dict:
    """
    Facts about a corpus and its index for cards: `num_blocks`, `index_type`, `metric`, `dim`, `corpus_format`,
    `index_size_bytes`, `fingerprint` (of the embedder that built the index), `source` (those that are known).

    Args:
        retriever ([`RealmRetriever`], *optional*): Read through its `manifest()` and attributes.
        manifest (`dict`, *optional*): A saved `retriever_manifest.json` (has file sizes and the corpus format, which
            an in-memory retriever does not know); its values win.
    """
    info: dict[str, Any] = {}
    if retriever is not None:
        live = getattr(retriever, "manifest", None)
        live = live() if callable(live) else live
        info.update(live if isinstance(live, Mapping) else {})
    info.update(manifest or {})
    if not info and retriever is None:
        return {}
    aliases = {
        "num_blocks": ("num_blocks",),
        "index_type": ("index_type",),
        "metric": ("metric",),
        "dim": ("embedding_dim", "dim"),
        "corpus_format": ("corpus_format",),
        "index_size_bytes": ("index_file_size", "index_size_bytes"),
        "fingerprint": ("embedder_fingerprint", "fingerprint"),
        "source": ("source", "corpus_source"),
    }
    facts: dict[str, Any] = {}
    for key, names in aliases.items():
        for name in names:
            value = info.get(name)
            if value is None and retriever is not None:
                value = getattr(retriever, name, None)
                value = None if callable(value) else value
            if value is not None and not isinstance(value, (dict, list)):
                facts[key] = value
                break
    if facts.get("num_blocks") is None and retriever is not None:
        try:
            facts["num_blocks"] = len(retriever)
        except TypeError:
            pass
    return facts


DESCRIPTION = OPEN_QA.description
DESCRIPTION_ONE_REPO = (
    " The corpus and its index are part of this repository (`retriever/`), so the model answers questions right "
    "after loading."
)


def model_details(model, task: CardTask = OPEN_QA) -> str:
    if model is None:
        return "_No model details recorded._"
    rows = detail_rows(model, task)
    try:
        rows.append(("Parameters", f"{model.num_parameters():,}"))
    except Exception:  # noqa: BLE001 - a card must not fail on a detail
        pass
    return table(("Property", "Value"), rows)


def corpus_section(
    retriever,
    source: str | None = None,
    manifest: Mapping | None = None,
    reference=None,
    prefix: str = f"{RETRIEVER_SUBFOLDER}/",
) -> str:
    info = corpus_info(retriever, manifest)
    if not info:
        if reference:
            return (
                f"The corpus and its FAISS index live in the repo `{reference}` (see `retriever_repo_id` in "
                "`config.json`); `RealmForOpenQA.from_pretrained` fetches them."
            )
        return (
            "_No corpus was saved with this model._ Attach one with `model.set_retriever(RealmRetriever"
            ".from_documents(...))` or reference a corpus repo with `realm_hf.hub.repositories.set_retriever_reference`."
        )
    if source:
        info["source"] = source
    labels = [
        ("num_blocks", "Blocks", lambda v: f"{int(v):,}"),
        ("source", "Source", str),
        ("index_type", "FAISS index", lambda v: f"`{v}`"),
        ("metric", "Metric", lambda v: str(v).replace("_", " ")),
        ("dim", "Embedding dimension", str),
        ("corpus_format", "Corpus format", lambda v: {"parquet": "Parquet shards", "arrow": "Arrow"}.get(v, str(v))),
        ("index_size_bytes", "Index file size", human_bytes),
        ("fingerprint", "Embedder fingerprint", lambda v: f"`{v}`"),
    ]
    rows = [(label, fmt(info[key])) for key, label, fmt in labels if info.get(key) is not None]
    return (
        table(("Property", "Value"), rows)
        + f"\n\nThe blocks (title, text, embedding) are stored under `{prefix}corpus/`, the FAISS index in "
        f"`{prefix}index.faiss`; `{prefix}retriever_manifest.json` records the index type, dimension, number of "
        "blocks and the fingerprint of the embedder that built the index, all checked on load so that an index never "
        "serves a different corpus or model."
    )


def usage_section(model_id: str, question: str, task: CardTask = OPEN_QA) -> str:
    return usage_text(task, model_id, question)


def training_section(
    training_args, setup: Mapping[str, Any] | None = None, results: Mapping[str, Any] | None = None
) -> str:
    """
    The training settings: `setup` (the recipe: masking, null document, ... as `{label: value}`), the
    `TrainingArguments` (or a dict) actually used, and `results` (e.g. the final training loss, `{label: value}`).
    """
    parts = []
    if setup:
        parts.append(table(("Recipe", "Value"), [(key, format_value(value)) for key, value in setup.items()]))
    arguments = _arguments_table(training_args) if training_args is not None else None
    if arguments:
        parts.append(arguments)
    if results:
        parts.append(table(("Result", "Value"), [(key, format_value(value)) for key, value in results.items()]))
    return "\n\n".join(parts) if parts else "_No training settings were recorded with this save._"


def _arguments_table(training_args) -> str | None:
    if hasattr(training_args, "to_dict"):
        values = training_args.to_dict()
        values = {key: values[key] for key in TRAINING_KEYS if values.get(key) not in (None, "", -1)}
        if values.get("max_steps", 0) > 0:
            values.pop("num_train_epochs", None)  # Trainer ignores it when max_steps is set
    elif isinstance(training_args, Mapping):
        values = dict(training_args)
    else:
        raise TypeError(f"`training_args` must be a TrainingArguments or a dict, got {type(training_args).__name__}.")
    rows = [(key, format_value(value)) for key, value in values.items() if not isinstance(value, (dict, list))]
    return table(("Setting", "Value"), rows) if rows else None


def evaluation_section(results: list[dict], task: CardTask = OPEN_QA) -> str:
    if not results:
        return "_No evaluation results were recorded with this save._"
    rows = []
    for result in results:
        dataset = result["dataset"] or {"name": "(not named)"}
        for metric, value in result["metrics"].items():
            rows.append(
                (dataset.get("name", ""), dataset.get("split", ""), metric_name(metric, task), format_value(value))
            )
    text = table(("Dataset", "Split", "Metric", "Value"), rows) + "\n\n" + task.evaluation_note
    if any(result["dataset"] is None for result in results):
        text += (
            " Results on a set that was not named are not in the `model-index` metadata: name it (`eval_dataset=` of "
            "`write_model_card`, or `dataset_tags=`/`dataset=` of the Trainer's `create_model_card`) to publish them."
        )
    return text


def versions_section() -> str:
    packages = [
        ("realm-hf", "realm-hf"),
        ("transformers", "transformers"),
        ("torch", "torch"),
        ("datasets", "datasets"),
        ("faiss", ("faiss-cpu", "faiss-gpu-cu12", "faiss-gpu", "faiss")),
        ("huggingface-hub", "huggingface-hub"),
    ]
    lines = []
    for label, dists in packages:
        version = dist_version(dists)
        if version is not None:
            lines.append(f"- {label} {version}")
    return "\n".join(lines)


def table(header: tuple[str, ...], rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |")
    return "\n".join(lines)


def format_value(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e-3 and value != 0 else f"{value:.4f}".rstrip("0").rstrip(".")
    return str(value)


def human_bytes(size) -> str:
    size = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(size)


def dist_version(names) -> str | None:
    for name in (names,) if isinstance(names, str) else names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None
