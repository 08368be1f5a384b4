"""Generating and writing cards: the model card of a REALM model and the dataset card of a shared corpus."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

import yaml

from ..constants import MANIFEST_NAME, RETRIEVER_SUBFOLDER
from ..file_utils import atomic_write_text
from .handwritten import AUTO_END, AUTO_START, ParsedCard, merge_metadata, parse_card
from .metadata import DEFAULT_TAGS, as_list, model_index_entry, normalize_eval_results, size_category, unique
from .sections import (
    DESCRIPTION,
    DESCRIPTION_ONE_REPO,
    corpus_info,
    corpus_section,
    evaluation_section,
    model_details,
    training_section,
    usage_section,
    versions_section,
)

#: Model id used in the usage snippet when none is known; replace it with a repo id or local path.
USAGE_MODEL_PLACEHOLDER = "your-username/realm-model"
DEFAULT_EXAMPLE_QUESTION = "What is a compiler?"
_TEMPLATE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "templates")


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
    previous = parse_card(existing_readme) if existing_readme else None
    model_id = model_id or USAGE_MODEL_PLACEHOLDER
    model_name = model_name or model_id.rstrip("/").split("/")[-1] or "realm-model"
    datasets = as_list(datasets)
    results = normalize_eval_results(eval_results, eval_dataset, datasets)

    metadata: dict[str, Any] = {"library_name": "realm-hf", "pipeline_tag": "question-answering"}
    if license:
        metadata["license"] = license
    if language:
        metadata["language"] = as_list(language)
    metadata["tags"] = unique(DEFAULT_TAGS + list(tags or []))
    if datasets:
        metadata["datasets"] = datasets
    if base_model:
        metadata["base_model"] = base_model if isinstance(base_model, str) else list(base_model)
    if results:
        metadata["model-index"] = [{"name": model_name, "results": [model_index_entry(r) for r in results]}]

    reference = getattr(getattr(model, "config", None), "retriever_repo_id", None)
    has_corpus = retriever is not None or bool(retriever_manifest)
    sections = {
        "model_name": model_name,
        "description": description or (DESCRIPTION + (DESCRIPTION_ONE_REPO if has_corpus else "")),
        "model_details": model_details(model),
        "corpus": corpus_section(retriever, corpus_source, retriever_manifest, reference),
        "usage": usage_section(model_id, example_question),
        "training": training_section(training_args),
        "evaluation": evaluation_section(results),
        "versions": versions_section(),
    }
    if previous is not None:
        # Keep earlier training/evaluation details when this save has none (e.g. re-saving after evaluation).
        if training_args is None and previous.sections.get("Training"):
            sections["training"] = previous.sections["Training"]
        if not results and previous.sections.get("Evaluation"):
            sections["evaluation"] = previous.sections["Evaluation"]
    return render("model_card.md", metadata, sections, previous)


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
    previous = parse_card(existing_readme) if existing_readme else None
    repo_id = repo_id or "your-username/realm-corpus"
    metadata: dict[str, Any] = {}
    if license:
        metadata["license"] = license
    metadata["tags"] = unique(["realm", "retrieval", "faiss", "knowledge-corpus"] + list(tags or []))
    info = corpus_info(retriever, manifest)
    if info.get("num_blocks") is not None:
        metadata["size_categories"] = [size_category(info["num_blocks"])]
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
        "corpus": corpus_section(retriever, source, manifest, prefix=f"{subfolder}/" if subfolder else ""),
        "usage": usage,
        "versions": versions_section(),
    }
    return render("corpus_card.md", metadata, sections, previous)


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


def extract_code_blocks(text: str, language: str = "python") -> list[str]:
    """The fenced code blocks of `language` in a card (used to test that the usage snippet runs)."""
    return re.findall(rf"```{re.escape(language)}\n(.*?)```", text, re.DOTALL)


def render(template_name: str, metadata: dict, sections: dict, previous: ParsedCard | None) -> str:
    merged, hashes = merge_metadata(metadata, previous)
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
