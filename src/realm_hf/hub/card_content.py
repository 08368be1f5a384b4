"""
What the cards say: for each kind of REALM model (Open-QA, pre-training, the ICT warm start) its pipeline tag, tags,
description, details, usage and the name of its loss; the card metadata (`huggingface_hub`'s `ModelCardData` /
`DatasetCardData` filled with what is known, evaluation results as `EvalResult` entries, which the library writes as
`model-index`); and the Markdown sections (model details, corpus facts, usage, training settings, evaluation,
versions). Writing a card from them: `hub/cards.py`.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from huggingface_hub import DatasetCardData, EvalResult, ModelCardData

from ..constants import RETRIEVER_SUBFOLDER


@dataclass(frozen=True)
class CardTask:
    r"""
    The task-dependent parts of a REALM model card.

    Args:
        name (`str`): `"open-qa"`, `"pretraining"` or `"ict"`; a model class names its own in `model_card_task`.
        pipeline_tag (`str`): The Hub task of the model.
        tags (`tuple[str, ...]`): Tags every card of the task has.
        eval_task (`dict`): `type` and `name` of the task in `model-index` entries.
        description (`str`): What the model is (the card's first paragraph).
        evaluation_note (`str`): What the evaluation metrics mean (after the card's results table).
        uses (`str`): What the model is for and what it is not for (the card's "Uses").
        limitations (`str`): What limits its answers or outputs (the card's "Bias, Risks, and Limitations").
        loss_name (`str`, *optional*): The name of the evaluation loss (`eval_loss`, the quality measure of a
            pre-training run) among the card's results; `None`: the loss is not a result of the task.
    """

    name: str
    pipeline_tag: str
    tags: tuple[str, ...]
    eval_task: dict
    description: str
    evaluation_note: str
    uses: str
    limitations: str
    loss_name: str | None = None


OPEN_QA = CardTask(
    name="open-qa",
    pipeline_tag="question-answering",
    tags=("realm", "retrieval-augmented", "open-domain-qa", "question-answering", "faiss"),
    eval_task={"type": "question-answering", "name": "Open-domain question answering"},
    description=(
        "A [REALM](https://arxiv.org/abs/2002.08909) (Retrieval-Augmented Language Model, Guu et al. 2020) "
        "open-domain question-answering model for [realm-hf](https://pypi.org/project/realm-hf/). A question is "
        "embedded by the question embedder, the most relevant text blocks are found by maximum inner-product search in "
        "a FAISS index over the knowledge corpus, and the reader extracts the answer span from the retrieved blocks. "
        "The answer's score is the span logit plus the retrieval score of its block, and every answer comes with the "
        "block it was read from."
    ),
    evaluation_note=(
        "Exact match and F1 use the SQuAD answer normalisation; recall@k is the share of questions with a gold "
        "block (or answer) among the top k retrieved blocks."
    ),
    uses=(
        "Answering questions in plain language from the knowledge corpus saved with it, each answer with the block "
        "it was read from (title, `doc_id`, text), so that a person can check it. The corpus can be changed without "
        "retraining (`retriever.add_documents`, `remove_documents`, or another corpus embedded by its document "
        "embedder); fine-tuning on question-answer pairs adapts it to a domain (`RealmOpenQATrainer`, "
        "`realm-hf train`). Out of scope: questions whose answer is not a span of some block (yes/no, arithmetic, "
        "summaries), and decisions taken on an answer without reading its source."
    ),
    limitations=(
        "Every answer is a span of a retrieved block: the model knows what its corpus says, as of when it was "
        "indexed, and repeats its errors and biases. A question the corpus does not answer still gets the best span "
        "found, with a low probability (`score`): filter answers by it where a wrong answer costs more than none. "
        "Quality is measured only on the sets under Evaluation; questions of another domain or phrasing may fare "
        "worse. The corpus text keeps its own licence and attribution (Knowledge corpus)."
    ),
)
PRETRAINING = CardTask(
    name="pretraining",
    pipeline_tag="fill-mask",
    tags=("realm", "retrieval-augmented", "masked-language-modeling", "pretraining", "faiss"),
    eval_task={"type": "fill-mask", "name": "Retrieval-augmented masked language modelling"},
    description=(
        "A [REALM](https://arxiv.org/abs/2002.08909) (Retrieval-Augmented Language Model, Guu et al. 2020) "
        "pre-training model for [realm-hf](https://pypi.org/project/realm-hf/): a retrieval-augmented masked language "
        "model with a learned retriever. Each masked input is embedded by the query embedder, blocks of the knowledge "
        "corpus are retrieved by maximum inner-product search in a FAISS index and re-scored by the document embedder, "
        "and the knowledge-augmented encoder predicts the masked tokens from the input joined with each block; the "
        "masked-LM loss is marginalised over the candidates by their retrieval probability, so its gradient trains "
        "both embedders. The first candidate is always the *null document* (no block, relevance 0), and the block an "
        "input was cut from, when the data names it, is never retrieved for it (no trivial retrieval). Its embedders and encoder are the "
        "starting point of REALM's open-domain QA fine-tuning."
    ),
    evaluation_note=(
        "The masked-LM loss is the evaluation loss of pre-training: the negative log-probability of the masked "
        "tokens, marginalised over the retrieved candidates (null document included)."
    ),
    uses="The start of REALM's open-QA fine-tuning (`export_components`) or of more pre-training; it does not answer.",
    limitations="It knows what its pre-training corpus and steps taught it, and repeats that corpus's biases.",
    loss_name="Masked-LM loss",
)
ICT = CardTask(
    name="ict",
    pipeline_tag="feature-extraction",
    tags=("realm", "retrieval", "inverse-cloze-task", "dense-retrieval"),
    eval_task={"type": "feature-extraction", "name": "Inverse Cloze Task retrieval"},
    description=(
        "The Inverse Cloze Task (ICT; Lee et al. 2019, ORQA) warm start of a [REALM](https://arxiv.org/abs/2002.08909) "
        "retriever, for [realm-hf](https://pypi.org/project/realm-hf/): a query embedder and a document embedder "
        "(BERT with a projection to the retrieval embedding) trained so that a sentence retrieves the block it was "
        "taken from against the other blocks of its batch (in-batch softmax over query-document inner products). "
        "REALM pre-training starts its embedders here, since a random retriever gets no useful gradient from the "
        "masked-LM loss."
    ),
    evaluation_note=(
        "The ICT loss is the cross-entropy of each sentence against the blocks of its batch, its own block the target."
    ),
    uses="The warm start of REALM pre-training's embedders (`load_ict_embedders`); not a general sentence embedder.",
    limitations="It learned to find a sentence's own block in its corpus; other text and real questions fare worse.",
    loss_name="ICT loss (in-batch cross-entropy)",
)
TASKS = {task.name: task for task in (OPEN_QA, PRETRAINING, ICT)}


def card_task(model=None, task: str | None = None) -> CardTask:
    """
    The card task named by `task`, else by the model's class (`model_card_task`, e.g. `"pretraining"` for
    [`RealmForPreTraining`]), else Open-QA.

    Raises:
        `ValueError`: for an unknown task name.
    """
    name = task or getattr(model, "model_card_task", None) or OPEN_QA.name
    if name not in TASKS:
        raise ValueError(f"Unknown model card task {name!r}: use one of {', '.join(sorted(TASKS))}.")
    return TASKS[name]


def detail_rows(model, task: CardTask) -> list[tuple[str, object]]:
    """The rows of the card's "Model details" table for `model` (its config's facts that matter for `task`)."""
    config = model.config
    rows = [
        ("Architecture", type(model).__name__),
        (
            "Encoder",
            f"BERT, {config.num_hidden_layers} layers, hidden size {config.hidden_size}, "
            f"{config.num_attention_heads} attention heads",
        ),
        ("Retrieval embedding size", config.retriever_proj_size),
    ]
    if task is OPEN_QA:
        rows += [
            ("Blocks read per question", config.reader_beam_size),
            ("Longest answer (wordpieces)", config.max_span_width),
            ("Reader input length", config.reader_seq_len),
        ]
    else:
        shared = getattr(config, "share_query_document_embedder", None)
        rows.append(("Query and document embedders", "shared" if shared or shared is None else "separate"))
    if task is PRETRAINING:
        rows += [
            ("Candidates per input (null document included)", getattr(model, "num_candidates", None)),
            ("Block length (wordpieces)", getattr(model, "max_block_length", None)),
            ("Input + block length (wordpieces)", getattr(model, "max_joint_length", None)),
        ]
    rows.append(("Vocabulary size", config.vocab_size))
    return [(label, value) for label, value in rows if value is not None]


def usage_text(task: CardTask, model_id: str, question: str) -> str:
    """The card's usage section: how to load and use a model of `task` saved as `model_id`."""
    quoted = json.dumps(model_id)
    if task is PRETRAINING:
        return (
            "Install with `pip install realm-hf`, then:\n\n"
            "```python\n"
            "from realm_hf import RealmForPreTraining\n\n"
            "# The weights, and the corpus and index saved with them (retriever/), from a repo id or a local copy.\n"
            f"model = RealmForPreTraining.from_pretrained({quoted})\n"
            "# Go on pre-training with realm_hf.training.recipes.pretraining_trainer, or take the embedders and the\n"
            "# encoder on to open-domain QA fine-tuning (the legacy checkpoint layout):\n"
            'model.export_components("components")\n'
            "```"
        )
    if task is ICT:
        return (
            "Install with `pip install realm-hf`, then start REALM pre-training from these embedders:\n\n"
            "```python\n"
            "from realm_hf import RealmForPreTraining\n"
            "from realm_hf.training import RealmForInverseClozeTask\n\n"
            f"ict = RealmForInverseClozeTask.from_pretrained({quoted})\n"
            "model = RealmForPreTraining(ict.config)  # or init_from_bert(RealmForPreTraining, bert_dir)\n"
            "model.load_ict_embedders(ict)\n"
            "```\n\n"
            "`ict.embedder` (the document embedder) builds the first index: "
            "`RealmRetriever.from_documents(documents, ict.embedder, tokenizer)`."
        )
    return (
        "Install with `pip install realm-hf`, then:\n\n"
        "```python\n"
        "import realm_hf\n\n"
        f'qa = realm_hf.pipeline("question-answering", model={quoted})\n'
        f"answer = qa({json.dumps(question)})\n"
        'print(answer["answer"], answer["score"], answer["block"]["title"])\n\n'
        "# Several answers, each with the block it was read from:\n"
        f"for candidate in qa({json.dumps(question)}, top_k=3):\n"
        '    print(candidate["answer"], candidate["block"]["block_id"])\n'
        "```\n\n"
        '`transformers.pipeline("realm-question-answering", model=...)` works too once `realm_hf` is imported; '
        "`RealmForOpenQA.from_pretrained(...)` gives the model with its corpus and index."
    )


CORPUS_TAGS = ["realm", "retrieval", "faiss", "knowledge-corpus"]
# Keys of evaluation dicts (e.g. from `Trainer.evaluate` or `compute_qa_metrics`) that are not quality metrics.
NON_METRIC_KEYS = {"total", "epoch", "loss", "runtime", "samples_per_second", "steps_per_second", "step"}


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
        retriever ([`RealmRetriever`], *optional*): Read through its attributes and those of its `store`.
        manifest (`dict`, *optional*): A saved `retriever_manifest.json` (has file sizes and the corpus format, which
            an in-memory retriever does not know); its values win.
    """
    info: dict[str, Any] = {}
    if retriever is not None:
        info["metric"] = "inner_product"  # every REALM index: maximum inner product, what a save's manifest says
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
    # A retriever's own facts, then its store's (`index_type`, `embedder_fingerprint`; a sharded one has no store).
    sources = [source for source in (retriever, getattr(retriever, "store", None)) if source is not None]
    facts: dict[str, Any] = {}
    for key, names in aliases.items():
        for name in names:
            value = info.get(name)
            for source in sources:
                if value is None:
                    value = getattr(source, name, None)
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
