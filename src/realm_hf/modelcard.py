"""
Model cards (README.md) for REALM models and corpus cards for shared corpora.

Cards are rendered from the templates in `realm_hf/templates/` (the model card template is documented as
`model_cards/README_TEMPLATE.md` in the repository). A card has YAML metadata (library, pipeline tag, tags, datasets,
base model, license, `model-index` with evaluation results) and a generated block between
`<!-- realm-hf:auto-start ... -->` and `<!-- realm-hf:auto-end -->`.

Regenerating a card keeps what people wrote: text outside the generated block stays where it is, and metadata keys
that were added or edited by hand win over generated ones. The start marker records a short hash of each generated
metadata value, which is how an edited value is told from a stale generated one. Information that a later save does
not provide (evaluation results, training settings) is carried over from the previous card rather than dropped.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import re
from collections.abc import Mapping
from typing import Any

import yaml

from .constants import MANIFEST_NAME, RETRIEVER_SUBFOLDER
from .file_utils import atomic_write_text

logger = logging.getLogger(__name__)

AUTO_START = "<!-- realm-hf:auto-start"
AUTO_END = "<!-- realm-hf:auto-end -->"
#: Model id used in the usage snippet when none is known; replace it with a repo id or local path.
USAGE_MODEL_PLACEHOLDER = "your-username/realm-model"
DEFAULT_TAGS = ["realm", "retrieval-augmented", "open-domain-qa", "question-answering", "faiss"]
DEFAULT_EXAMPLE_QUESTION = "What is a compiler?"
_TEMPLATE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")
_AUTO_START_RE = re.compile(r"<!-- realm-hf:auto-start(?P<payload>.*?)-->", re.DOTALL)
# Keys of evaluation dicts (e.g. from `Trainer.evaluate` or `compute_qa_metrics`) that are not quality metrics.
_NON_METRIC_KEYS = {"total", "epoch", "loss", "runtime", "samples_per_second", "steps_per_second", "step"}
_TRAINING_KEYS = (
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


# --------------------------------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------------------------------


def generate_model_card(
    model=None,
    retriever=None,
    eval_results: Mapping[str, float] | list[dict] | None = None,
    training_args: Any = None,
    base_model: str | list[str] | None = None,
    datasets: str | list[str] | None = None,
    existing_readme: str | None = None,
    *,
    model_id: str | None = None,
    model_name: str | None = None,
    license: str | None = "apache-2.0",
    language: str | list[str] | None = None,
    tags: list[str] | None = None,
    example_question: str = DEFAULT_EXAMPLE_QUESTION,
    eval_dataset: Mapping[str, str] | None = None,
    corpus_source: str | None = None,
    description: str | None = None,
    retriever_manifest: Mapping | None = None,
) -> str:
    r"""
    Render the model card (README.md text) of a REALM model.

    Args:
        model ([`RealmForOpenQA`], *optional*): The model (architecture details come from its config).
        retriever ([`RealmRetriever`], *optional*): Its corpus + index; defaults to `model.retriever`.
        eval_results (`dict` or `list[dict]`, *optional*): Evaluation results. Either a flat dict of metrics
            (`{"exact_match": 40.4, "f1": 46.1, "recall@5": 61.0}`, as `compute_qa_metrics`/`recall_at_k` return;
            an `eval_` prefix is dropped, counts and runtimes are skipped), described by `eval_dataset`; or a list of
            `{"dataset": {"name", "type", "split"}, "metrics": {...}}`, one per evaluation set.
        training_args (`TrainingArguments` or `dict`, *optional*): Training settings to list.
        base_model (`str` or `list[str]`, *optional*): The checkpoint(s) it was fine-tuned from.
        datasets (`str` or `list[str]`, *optional*): Training dataset ids.
        existing_readme (`str`, *optional*): The current README: its hand-written text and metadata are kept.
        model_id (`str`, *optional*): Repo id or path in the usage snippet (default: a placeholder,
            `USAGE_MODEL_PLACEHOLDER`).
        model_name (`str`, *optional*): Title and `model-index` name (default: last part of `model_id`).
        license (`str`, *optional*, defaults to `"apache-2.0"`): License id.
        language (`str` or `list[str]`, *optional*): Language code(s).
        tags (`list[str]`, *optional*): Tags added to the default ones.
        example_question (`str`, *optional*): Question used in the usage snippet.
        eval_dataset (`dict`, *optional*): `name`, `type` (and `split`, `config`) of the set a flat `eval_results`
            dict was computed on (default: the first of `datasets`).
        corpus_source (`str`, *optional*): Where the corpus text comes from (overrides the manifest's `source`).
        description (`str`, *optional*): Replaces the generic description paragraph.
        retriever_manifest (`dict`, *optional*): The saved `retriever_manifest.json` (adds file sizes and format);
            [`write_model_card`] reads it from the directory.

    Returns:
        `str`: The README.md text.
    """
    if retriever is None and model is not None:
        retriever = getattr(model, "retriever", None)
    previous = _parse_card(existing_readme) if existing_readme else None
    model_id = model_id or USAGE_MODEL_PLACEHOLDER
    model_name = model_name or model_id.rstrip("/").split("/")[-1] or "realm-model"
    datasets = _as_list(datasets)
    results = _normalize_eval_results(eval_results, eval_dataset, datasets)

    metadata: dict[str, Any] = {"library_name": "realm-hf", "pipeline_tag": "question-answering"}
    if license:
        metadata["license"] = license
    if language:
        metadata["language"] = _as_list(language)
    metadata["tags"] = _unique(DEFAULT_TAGS + list(tags or []))
    if datasets:
        metadata["datasets"] = datasets
    if base_model:
        metadata["base_model"] = base_model if isinstance(base_model, str) else list(base_model)
    if results:
        metadata["model-index"] = [{"name": model_name, "results": [_model_index_entry(r) for r in results]}]

    reference = getattr(getattr(model, "config", None), "retriever_repo_id", None)
    has_corpus = retriever is not None or bool(retriever_manifest)
    sections = {
        "model_name": model_name,
        "description": description or (_DESCRIPTION + (_DESCRIPTION_ONE_REPO if has_corpus else "")),
        "model_details": _model_details(model),
        "corpus": _corpus_section(retriever, corpus_source, retriever_manifest, reference),
        "usage": _usage_section(model_id, example_question),
        "training": _training_section(training_args),
        "evaluation": _evaluation_section(results),
        "versions": _versions_section(),
    }
    if previous is not None:
        # Keep earlier training/evaluation details when this save has none (e.g. re-saving after evaluation).
        if training_args is None and previous.sections.get("Training"):
            sections["training"] = previous.sections["Training"]
        if not results and previous.sections.get("Evaluation"):
            sections["evaluation"] = previous.sections["Evaluation"]
    return _render("model_card.md", metadata, sections, previous)


def write_model_card(save_directory: str | os.PathLike, model=None, retriever=None, **kwargs) -> str:
    r"""
    Write `README.md` in `save_directory` (atomically), keeping the hand-written parts of the README already there.

    Meant to be called at the end of `RealmForOpenQA.save_pretrained`:
    `realm_hf.modelcard.write_model_card(save_directory, model=self, retriever=self.retriever)`.

    Args:
        save_directory (`str` or `os.PathLike`): The model directory.
        model, retriever, kwargs: As in [`generate_model_card`]; `existing_readme` defaults to the directory's README.

    Returns:
        `str`: The README path.
    """
    path = os.path.join(save_directory, "README.md")
    if kwargs.get("existing_readme") is None and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            kwargs["existing_readme"] = f.read()
    manifest_file = os.path.join(save_directory, RETRIEVER_SUBFOLDER, MANIFEST_NAME)
    if retriever is not None and kwargs.get("retriever_manifest") is None and os.path.isfile(manifest_file):
        with open(manifest_file, encoding="utf-8") as f:
            kwargs["retriever_manifest"] = json.load(f)
    atomic_write_text(path, generate_model_card(model=model, retriever=retriever, **kwargs))
    return path


def generate_corpus_card(
    retriever,
    repo_id: str | None = None,
    subfolder: str | None = None,
    existing_readme: str | None = None,
    *,
    name: str | None = None,
    license: str | None = None,
    source: str | None = None,
    tags: list[str] | None = None,
    manifest: Mapping | None = None,
) -> str:
    r"""
    Render the dataset card of a corpus + index pushed with [`~realm_hf.hub.push_corpus_to_hub`].

    Args:
        retriever ([`RealmRetriever`]): The corpus.
        repo_id (`str`, *optional*): Its repo id (for the usage snippet).
        subfolder (`str`, *optional*): Folder of the retriever in the repo.
        existing_readme (`str`, *optional*): The current README, whose hand-written parts are kept.
        name (`str`, *optional*): Title (default: last part of `repo_id`).
        license (`str`, *optional*): License id of the corpus text.
        source (`str`, *optional*): Where the text comes from (overrides the manifest's `source`).
        tags (`list[str]`, *optional*): Tags added to the default ones.
        manifest (`dict`, *optional*): The saved `retriever_manifest.json`.
    """
    previous = _parse_card(existing_readme) if existing_readme else None
    repo_id = repo_id or "your-username/realm-corpus"
    metadata: dict[str, Any] = {}
    if license:
        metadata["license"] = license
    metadata["tags"] = _unique(["realm", "retrieval", "faiss", "knowledge-corpus"] + list(tags or []))
    info = corpus_info(retriever, manifest)
    if info.get("num_blocks") is not None:
        metadata["size_categories"] = [_size_category(info["num_blocks"])]
    subfolder = (subfolder or "").strip("/")
    if (manifest or {}).get("corpus_format", "parquet") == "parquet":
        # Lets the Hub's dataset viewer show the blocks.
        shards = f"{subfolder}/corpus/*.parquet" if subfolder else "corpus/*.parquet"
        metadata["configs"] = [{"config_name": "default", "data_files": [{"split": "train", "path": shards}]}]
    usage = (
        "Use it as the knowledge corpus of a REALM model (saved in the model's `config.json`, followed by "
        "`RealmForOpenQA.from_pretrained`):\n\n"
        "```python\n"
        "from realm_hf import RealmForOpenQA\n"
        "from realm_hf.hub import set_retriever_reference\n\n"
        'model = RealmForOpenQA.from_pretrained("path/or/repo-of-a-realm-model")\n'
        f'set_retriever_reference(model.config, "{repo_id}"'
        + (f', subfolder="{subfolder}"' if subfolder else "")
        + ")\n"
        'model.save_pretrained("realm-model-with-this-corpus", save_retriever=False)\n'
        "```\n\n"
        "or load it directly:\n\n"
        "```python\n"
        "from realm_hf.hub import download_retriever\n"
        "from realm_hf.retrieval_realm import RealmRetriever\n\n"
        f'retriever = RealmRetriever.from_pretrained(download_retriever("{repo_id}", subfolder="{subfolder}", '
        'repo_type="dataset"))\n'
        "```"
    )
    sections = {
        "name": name or repo_id.rstrip("/").split("/")[-1],
        "corpus": _corpus_section(retriever, source, manifest, prefix=f"{subfolder}/" if subfolder else ""),
        "usage": usage,
        "versions": _versions_section(),
    }
    return _render("corpus_card.md", metadata, sections, previous)


def write_corpus_card(save_directory: str | os.PathLike, retriever, **kwargs) -> str:
    """Write the corpus card as `README.md` in `save_directory` (atomically); see [`generate_corpus_card`]."""
    path = os.path.join(save_directory, "README.md")
    if kwargs.get("existing_readme") is None and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            kwargs["existing_readme"] = f.read()
    manifest_file = os.path.join(save_directory, kwargs.get("subfolder") or "", MANIFEST_NAME)
    if kwargs.get("manifest") is None and os.path.isfile(manifest_file):
        with open(manifest_file, encoding="utf-8") as f:
            kwargs["manifest"] = json.load(f)
    atomic_write_text(path, generate_corpus_card(retriever, **kwargs))
    return path


def parse_card_metadata(text: str) -> dict:
    """The YAML metadata of a card (`{}` when it has none)."""
    return _split_front_matter(text)[0]


def extract_code_blocks(text: str, language: str = "python") -> list[str]:
    """The fenced code blocks of `language` in a card (used to test that the usage snippet runs)."""
    return re.findall(rf"```{re.escape(language)}\n(.*?)```", text, re.DOTALL)


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


# --------------------------------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------------------------------

_DESCRIPTION = (
    "A [REALM](https://arxiv.org/abs/2002.08909) (Retrieval-Augmented Language Model, Guu et al. 2020) open-domain "
    "question-answering model for [realm-hf](https://pypi.org/project/realm-hf/). A question is embedded by the "
    "question embedder, the most relevant text blocks are found by maximum inner-product search in a FAISS index over "
    "the knowledge corpus, and the reader extracts the answer span from the retrieved blocks. The answer's score is "
    "the span logit plus the retrieval score of its block, and every answer comes with the block it was read from."
)
_DESCRIPTION_ONE_REPO = (
    " The corpus and its index are part of this repository (`retriever/`), so the model answers questions right "
    "after loading."
)


def _model_details(model) -> str:
    if model is None:
        return "_No model details recorded._"
    config = model.config
    rows = [
        ("Architecture", type(model).__name__),
        (
            "Encoder",
            f"BERT, {config.num_hidden_layers} layers, hidden size {config.hidden_size}, "
            f"{config.num_attention_heads} attention heads",
        ),
        ("Retrieval embedding size", config.retriever_proj_size),
        ("Blocks read per question", config.reader_beam_size),
        ("Longest answer (wordpieces)", config.max_span_width),
        ("Reader input length", config.reader_seq_len),
        ("Vocabulary size", config.vocab_size),
    ]
    try:
        rows.append(("Parameters", f"{model.num_parameters():,}"))
    except Exception:  # noqa: BLE001 - a card must not fail on a detail
        pass
    return _table(("Property", "Value"), rows)


def _corpus_section(
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
            ".from_documents(...))` or reference a corpus repo with `realm_hf.hub.set_retriever_reference`."
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
        ("index_size_bytes", "Index file size", _human_bytes),
        ("fingerprint", "Embedder fingerprint", lambda v: f"`{v}`"),
    ]
    rows = [(label, fmt(info[key])) for key, label, fmt in labels if info.get(key) is not None]
    return (
        _table(("Property", "Value"), rows)
        + f"\n\nThe blocks (title, text, embedding) are stored under `{prefix}corpus/`, the FAISS index in "
        f"`{prefix}index.faiss`; `{prefix}retriever_manifest.json` records the index type, dimension, number of "
        "blocks and the fingerprint of the embedder that built the index, all checked on load so that an index never "
        "serves a different corpus or model."
    )


def _usage_section(model_id: str, question: str) -> str:
    return (
        "Install with `pip install realm-hf`, then:\n\n"
        "```python\n"
        "import realm_hf\n\n"
        f'qa = realm_hf.pipeline("question-answering", model={json.dumps(model_id)})\n'
        f"answer = qa({json.dumps(question)})\n"
        'print(answer["answer"], answer["score"], answer["block"]["title"])\n\n'
        "# Several answers, each with the block it was read from:\n"
        f"for candidate in qa({json.dumps(question)}, top_k=3):\n"
        '    print(candidate["answer"], candidate["block"]["id"])\n'
        "```\n\n"
        '`transformers.pipeline("realm-question-answering", model=...)` works too once `realm_hf` is imported; '
        "`RealmForOpenQA.from_pretrained(...)` gives the model with its corpus and index."
    )


def _training_section(training_args) -> str:
    if training_args is None:
        return "_No training settings were recorded with this save._"
    if hasattr(training_args, "to_dict"):
        values = training_args.to_dict()
        values = {key: values[key] for key in _TRAINING_KEYS if values.get(key) not in (None, "", -1)}
        if values.get("max_steps", 0) > 0:
            values.pop("num_train_epochs", None)  # Trainer ignores it when max_steps is set
    elif isinstance(training_args, Mapping):
        values = dict(training_args)
    else:
        raise TypeError(f"`training_args` must be a TrainingArguments or a dict, got {type(training_args).__name__}.")
    rows = [(key, _format_value(value)) for key, value in values.items() if not isinstance(value, (dict, list))]
    return _table(("Setting", "Value"), rows) if rows else "_No training settings were recorded with this save._"


def _evaluation_section(results: list[dict]) -> str:
    if not results:
        return "_No evaluation results were recorded with this save._"
    rows = []
    for result in results:
        dataset = result["dataset"]
        for metric, value in result["metrics"].items():
            rows.append(
                (dataset.get("name", ""), dataset.get("split", ""), _metric_name(metric), _format_value(value))
            )
    return (
        _table(("Dataset", "Split", "Metric", "Value"), rows)
        + "\n\nExact match and F1 use the SQuAD answer normalisation; recall@k is the share of questions with a gold "
        "block (or answer) among the top k retrieved blocks."
    )


def _versions_section() -> str:
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
        version = _dist_version(dists)
        if version is not None:
            lines.append(f"- {label} {version}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------------------
# Evaluation results
# --------------------------------------------------------------------------------------------------------------------


def _normalize_eval_results(eval_results, eval_dataset, datasets) -> list[dict]:
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
        dataset.setdefault("type", _slug(dataset["name"]))
        metrics = {}
        for key, value in entry["metrics"].items():
            key = key[len("eval_") :] if key.startswith("eval_") else key
            if key in _NON_METRIC_KEYS or key.endswith("_count") or isinstance(value, bool):
                continue
            if isinstance(value, (int, float)):
                metrics[key] = float(value)
        if metrics:
            results.append({"dataset": dataset, "metrics": metrics})
    return results


def _model_index_entry(result: dict) -> dict:
    return {
        "task": {"type": "question-answering", "name": "Open-domain question answering"},
        "dataset": {k: v for k, v in result["dataset"].items() if v is not None},
        "metrics": [
            {"type": metric, "value": round(value, 4), "name": _metric_name(metric)}
            for metric, value in result["metrics"].items()
        ],
    }


def _metric_name(metric: str) -> str:
    names = {"exact_match": "Exact Match", "f1": "F1"}
    if metric in names:
        return names[metric]
    match = re.fullmatch(r"(answer_)?recall@(\d+)", metric)
    if match:
        return ("Answer recall" if match.group(1) else "Recall") + f"@{match.group(2)}"
    return metric.replace("_", " ").capitalize()


# --------------------------------------------------------------------------------------------------------------------
# Rendering and merging
# --------------------------------------------------------------------------------------------------------------------


class _ParsedCard:
    def __init__(self, metadata: dict, before: str, after: str, generated_hashes: dict, sections: dict):
        self.metadata = metadata
        self.before = before
        self.after = after
        self.generated_hashes = generated_hashes
        self.sections = sections


def _split_front_matter(text: str) -> tuple[dict, str]:
    match = re.match(r"\A---\s*\n(.*?)\n---\s*(?:\n|\Z)", text, re.DOTALL)
    if not match:
        return {}, text
    try:
        metadata = yaml.safe_load(match.group(1)) or {}
    except yaml.YAMLError:
        logger.warning("The existing README's YAML metadata does not parse; it is replaced by generated metadata.")
        metadata = {}
    if not isinstance(metadata, dict):
        metadata = {}
    return metadata, text[match.end() :]


def _parse_card(text: str) -> _ParsedCard:
    metadata, body = _split_front_matter(text)
    start = _AUTO_START_RE.search(body)
    end = body.find(AUTO_END, start.end()) if start else -1
    if not start or end < 0:
        # A hand-written README: all of it is kept, the generated block goes after it.
        return _ParsedCard(metadata, body.strip("\n"), "", {}, {})
    try:
        hashes = json.loads(start.group("payload").strip() or "{}")
    except json.JSONDecodeError:
        hashes = {}
    block = body[start.end() : end]
    return _ParsedCard(
        metadata,
        body[: start.start()].strip("\n"),
        body[end + len(AUTO_END) :].strip("\n"),
        hashes if isinstance(hashes, dict) else {},
        _sections(block),
    )


def _sections(block: str) -> dict[str, str]:
    sections = {}
    parts = re.split(r"^## (.+)$", block, flags=re.MULTILINE)
    for title, content in zip(parts[1::2], parts[2::2]):
        sections[title.strip()] = content.strip("\n")
    return sections


def _hash(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _merge_metadata(generated: dict, previous: _ParsedCard | None) -> tuple[dict, dict]:
    """Generated metadata merged with the previous card's: hand-added or hand-edited keys win."""
    if previous is None:
        return dict(generated), {key: _hash(value) for key, value in generated.items()}
    merged, hashes = {}, {}
    old, recorded = previous.metadata, previous.generated_hashes
    for key, value in generated.items():
        if key in old and recorded.get(key) != _hash(old[key]):
            if old[key] != value:
                logger.info("Model card: keeping the hand-edited `%s` metadata over the generated value.", key)
            merged[key] = old[key]  # edited or added by hand: the user's value wins
        elif key in recorded and key not in old:
            continue  # generated before, deleted by hand since: stay deleted
        else:
            merged[key] = value
            hashes[key] = _hash(value)
    for key, value in old.items():
        if key in merged:
            continue
        if key in recorded and recorded[key] == _hash(value):
            # Generated last time, not generated now (e.g. no evaluation in this save): keep, still as generated.
            merged[key] = value
            hashes[key] = recorded[key]
        else:
            merged[key] = value  # added or edited by hand
    return merged, hashes


def _render(template_name: str, metadata: dict, sections: dict, previous: _ParsedCard | None) -> str:
    merged, hashes = _merge_metadata(metadata, previous)
    with open(os.path.join(_TEMPLATE_DIR, template_name), encoding="utf-8") as f:
        template = f.read()
    values = dict(sections)
    values["metadata"] = yaml.safe_dump(merged, sort_keys=False, allow_unicode=True, width=1000).strip()
    values["generated"] = json.dumps(hashes, sort_keys=True)
    text = re.sub(
        r"\{\{ (\w+) \}\}", lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), template
    )
    if previous is None:
        return text
    # Put the hand-written text back around the generated block.
    front, body = text.split("\n---\n", 1)
    start = body.index(AUTO_START)
    end = body.index(AUTO_END) + len(AUTO_END)
    parts = [front + "\n---\n"]
    if previous.before:
        parts.append("\n" + previous.before + "\n\n")
    else:
        parts.append(body[:start])
    parts.append(body[start:end] + "\n")
    if previous.after:
        parts.append("\n" + previous.after + "\n")
    return "".join(parts)


# --------------------------------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------------------------------


def _table(header: tuple[str, ...], rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |")
    return "\n".join(lines)


def _format_value(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e-3 and value != 0 else f"{value:.4f}".rstrip("0").rstrip(".")
    return str(value)


def _human_bytes(size) -> str:
    size = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(size)


def _size_category(n: int) -> str:
    for limit, label in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M")):
        if n < limit:
            return label
    return "1M<n<10M" if n < 10_000_000 else "10M<n<100M"


def _dist_version(names) -> str | None:
    for name in (names,) if isinstance(names, str) else names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _as_list(value) -> list:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _unique(items: list) -> list:
    return list(dict.fromkeys(items))


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-") or "custom"


__all__ = [
    "AUTO_END",
    "AUTO_START",
    "USAGE_MODEL_PLACEHOLDER",
    "corpus_info",
    "extract_code_blocks",
    "generate_corpus_card",
    "generate_model_card",
    "parse_card_metadata",
    "write_corpus_card",
    "write_model_card",
]
