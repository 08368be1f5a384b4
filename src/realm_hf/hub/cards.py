"""
Generating and writing cards: the model card of a REALM model and the dataset card of a shared corpus, keeping what
people wrote in a card (its parts around the generated block and the metadata they added or edited). What the cards
say: `hub/card_content.py`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from typing import Any

import yaml
from huggingface_hub import CardData, DatasetCard, ModelCard, RepoCard
from huggingface_hub.repocard import REGEX_YAML_BLOCK

from ..constants import MANIFEST_NAME, RETRIEVER_SUBFOLDER
from ..io.atomic import atomic_write_text
from ..logging_utils import get_logger
from .card_content import (
    DESCRIPTION_ONE_REPO,
    ICT,
    OPEN_QA,
    as_list,
    card_task,
    corpus_card_data,
    corpus_info,
    corpus_section,
    evaluation_section,
    model_card_data,
    model_details,
    normalize_eval_results,
    training_section,
    usage_section,
    versions_section,
)

logger = get_logger(__name__)

#: Model id used in the usage snippet when none is known; replace it with a repo id or local path.
USAGE_MODEL_PLACEHOLDER = "your-username/realm-model"
DEFAULT_EXAMPLE_QUESTION = "What is a compiler?"
DESCRIPTION_CORPUS_SAVED = (
    " The corpus it retrieves from and its index are part of this repository (`retriever/`): "
    "`from_pretrained` of the repo id (or of a local copy) attaches them."
)
ICT_CORPUS = (
    "_No corpus is saved with an ICT model:_ the Inverse Cloze Task trains on text blocks, each batch's other blocks "
    "being the negatives. Its document embedder (`embedder`) builds the first index of REALM pre-training."
)
UNTRAINED_READER = (
    "**Its reader was never trained** (`config.reader_trained` is `false`, as after `init_from_bert`): the span head "
    "is randomly initialised, so the answers are arbitrary spans of the retrieved blocks and loading or answering "
    "warns. Fine-tune it on question-answer pairs (`RealmOpenQATrainer`, `realm-hf train`) before use."
)
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
    license: str | None = None,
    language: str | list[str] | None = None,
    tags: list[str] | None = None,
    example_question: str = DEFAULT_EXAMPLE_QUESTION,
    eval_dataset: Mapping[str, str] | None = None,
    corpus_source: str | None = None,
    description: str | None = None,
    retriever_manifest: Mapping | None = None,
    task: str | None = None,
    training_setup: Mapping[str, Any] | None = None,
    training_results: Mapping[str, Any] | None = None,
    uses: str | None = None,
    limitations: str | None = None,
) -> str:
    r"""
    Render the model card (README.md text) of a REALM model.

    Args:
        model ([`RealmForOpenQA`], [`RealmForPreTraining`] or [`RealmForInverseClozeTask`], *optional*): The model
            (architecture details come from its config, the task the card describes from its class).
        retriever ([`RealmRetriever`], *optional*): Its corpus + index; defaults to `model.retriever`.
        eval_results (`dict` or `list[dict]`, *optional*): Evaluation results. Either a flat dict of metrics
            (`{"exact_match": 40.4, "f1": 46.1, "recall@5": 61.0}`, as `compute_qa_metrics`/`recall_at_k` return;
            an `eval_` prefix is dropped, counts and runtimes are skipped), described by `eval_dataset`; or a list of
            `{"dataset": {"name", "type", "split"}, "metrics": {...}}`, one per evaluation set. Results whose dataset
            is known become `EvalResult` entries (`model-index`); the others are listed in the card's table only.
        training_args (`TrainingArguments` or `dict`, *optional*): Training settings to list.
        base_model (`str` or `list[str]`, *optional*): The checkpoint(s) it was fine-tuned from.
        datasets (`str` or `list[str]`, *optional*): Training dataset ids.
        existing_readme (`str`, *optional*): The current README: its hand-written text and metadata are kept.
        model_id (`str`, *optional*): Repo id or path in the usage snippet (default: a placeholder,
            `USAGE_MODEL_PLACEHOLDER`).
        model_name (`str`, *optional*): Title and `model-index` name (default: last part of `model_id`).
        license (`str`, *optional*): License id (a Hub license identifier); none is written unless given.
        language (`str` or `list[str]`, *optional*): Language code(s).
        tags (`list[str]`, *optional*): Tags added to the default ones.
        example_question (`str`, *optional*): Question used in the usage snippet.
        eval_dataset (`dict`, *optional*): `name`, `type` (and `split`, `config`) of the set a flat `eval_results`
            dict was computed on (default: the first of `datasets`).
        corpus_source (`str`, *optional*): Where the corpus text comes from (overrides the manifest's `source`).
        description (`str`, *optional*): Replaces the generic description paragraph.
        retriever_manifest (`dict`, *optional*): The saved `retriever_manifest.json` (adds file sizes and format);
            [`write_model_card`] reads it from the directory.
        task (`str`, *optional*): What the model is: `"open-qa"`, `"pretraining"` (REALM pre-training) or `"ict"`
            (the Inverse Cloze Task warm start); default: the model's `model_card_task`, else `"open-qa"`. Sets the
            pipeline tag, default tags, description, details, usage snippet and the names of the results.
        training_setup (`dict`, *optional*): The recipe, `{label: value}` (e.g. the masking), listed with the
            training settings.
        training_results (`dict`, *optional*): Training results, `{label: value}` (e.g. the final training loss).
        uses (`str`, *optional*): What the model is for and not for (the "Uses" section); default: the task's.
        limitations (`str`, *optional*): What limits it (the "Bias, Risks, and Limitations" section); default: the
            task's.

    Returns:
        `str`: The README.md text (a `huggingface_hub.ModelCard` rendered to text).
    """
    kind = card_task(model, task)
    if retriever is None and model is not None:
        retriever = getattr(model, "retriever", None)
    previous = parse_card(existing_readme) if existing_readme else None
    model_id = model_id or USAGE_MODEL_PLACEHOLDER
    model_name = model_name or model_id.rstrip("/").split("/")[-1] or "realm-model"
    datasets = as_list(datasets)
    results = normalize_eval_results(eval_results, eval_dataset, datasets, kind)

    config = getattr(model, "config", None)
    if base_model is None:
        # What `init_from_bert` recorded (a Hub id), so a model started from BERT names its base.
        base_model = getattr(config, "base_model", None)
    if previous is not None and previous.inherited_tags:
        tags = list(tags or []) + previous.inherited_tags
    data = model_card_data(
        model_name=model_name,
        results=results,
        license=license,
        language=language,
        tags=tags,
        datasets=datasets,
        base_model=base_model,
        task=kind,
    )

    reference = getattr(getattr(model, "config", None), "retriever_repo_id", None)
    has_corpus = retriever is not None or bool(retriever_manifest)
    if description is None:
        description = kind.description
        if has_corpus:
            description += DESCRIPTION_ONE_REPO if kind is OPEN_QA else DESCRIPTION_CORPUS_SAVED
    if kind is OPEN_QA and not getattr(config, "reader_trained", True):
        description = UNTRAINED_READER + "\n\n" + description
    if kind is ICT and not has_corpus:
        corpus = ICT_CORPUS
    else:
        corpus = corpus_section(retriever, corpus_source, retriever_manifest, reference)
    sections = {
        "model_name": model_name,
        "description": description,
        "model_details": model_details(model, kind),
        "corpus": corpus,
        "usage": usage_section(model_id, example_question, kind),
        "uses": uses or kind.uses,
        "limitations": limitations or kind.limitations,
        "training": training_section(training_args, training_setup, training_results),
        "evaluation": evaluation_section(results, kind),
        "versions": versions_section(),
    }
    if previous is not None:
        # Keep earlier training/evaluation details when this save has none (e.g. re-saving after evaluation).
        trained = training_args is not None or training_setup or training_results
        if not trained and previous.sections.get("Training"):
            sections["training"] = previous.sections["Training"]
        if not results and previous.sections.get("Evaluation"):
            sections["evaluation"] = previous.sections["Evaluation"]
    return render(ModelCard, "model_card.md", data, sections, previous)


def write_model_card(save_directory: str | os.PathLike, model=None, retriever=None, **kwargs) -> str:
    r"""
    Write `README.md` in `save_directory` (atomically), keeping the hand-written parts of the README already there.

    Meant to be called at the end of `RealmForOpenQA.save_pretrained`:
    `realm_hf.hub.cards.write_model_card(save_directory, model=self, retriever=self.retriever)`.

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
    Render the dataset card of a corpus + index pushed with [`~realm_hf.hub.repositories.push_corpus_to_hub`].

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
    info = corpus_info(retriever, manifest)
    subfolder = (subfolder or "").strip("/")
    shards = None
    if (manifest or {}).get("corpus_format", "parquet") == "parquet":
        shards = f"{subfolder}/corpus/*.parquet" if subfolder else "corpus/*.parquet"
    data = corpus_card_data(license=license, tags=tags, num_blocks=info.get("num_blocks"), data_files=shards)
    usage = (
        "Use it as the knowledge corpus of a REALM model (saved in the model's `config.json`, followed by "
        "`RealmForOpenQA.from_pretrained`):\n\n"
        "```python\n"
        "from realm_hf import RealmForOpenQA\n"
        "from realm_hf.hub.repositories import set_retriever_reference\n\n"
        'model = RealmForOpenQA.from_pretrained("path/or/repo-of-a-realm-model")\n'
        f'set_retriever_reference(model.config, "{repo_id}"'
        + (f', subfolder="{subfolder}"' if subfolder else "")
        + ")\n"
        'model.save_pretrained("realm-model-with-this-corpus", save_retriever=False)\n'
        "```\n\n"
        "or load it directly:\n\n"
        "```python\n"
        "from realm_hf.models.retriever_loading import download_retriever\n"
        "from realm_hf import RealmRetriever\n\n"
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
    return render(DatasetCard, "corpus_card.md", data, sections, previous)


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


def render(card_class: type[RepoCard], template_name: str, data: CardData, sections: dict, previous) -> str:
    """
    Fill a template with `sections`, merge `data` with the previous card's metadata (hand-edited keys win), put the
    hand-written text back, and return the card as `huggingface_hub` writes it.
    """
    merged, hashes = merge_metadata(data.to_dict(), previous)
    try:
        # The library's own reading of the metadata: a hand-edited `model-index` is checked here.
        merged_data = card_class.card_data_class(**merged)
    except ValueError as err:
        logger.warning("Card metadata kept as written (%s).", err)
        card_class, merged_data = RepoCard, CardData(**merged)
    with open(os.path.join(_TEMPLATE_DIR, template_name), encoding="utf-8") as f:
        template = f.read()
    values = dict(sections)
    values["card_data"] = merged_data.to_yaml(original_order=list(merged))
    values["generated"] = json.dumps(hashes, sort_keys=True)
    text = re.sub(
        r"\{\{ (\w+) \}\}", lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), template
    )
    if previous is not None:
        text = restore_handwritten(text, previous)
    return str(card_class(text))


AUTO_START = "<!-- realm-hf:auto-start"
AUTO_END = "<!-- realm-hf:auto-end -->"
AUTO_START_RE = re.compile(r"<!-- realm-hf:auto-start(?P<payload>.*?)-->", re.DOTALL)
# How the draft card of `transformers.Trainer.create_model_card` is recognised.
TRAINER_TAG = "generated_from_trainer"
TRAINER_CARD_COMMENT = "This model card has been generated automatically according to the information the Trainer had"


class ParsedCard:
    """
    An existing card taken apart: its metadata, the text before and after the generated block, the hashes of the
    metadata values realm-hf generated last time, the generated sections, and tags to carry into the new card.
    """

    def __init__(
        self,
        metadata: dict,
        before: str,
        after: str,
        generated_hashes: dict,
        sections: dict,
        inherited_tags: list | None = None,
    ):
        self.metadata = metadata
        self.before = before
        self.after = after
        self.generated_hashes = generated_hashes
        self.sections = sections
        self.inherited_tags = inherited_tags or []


def split_front_matter(text: str) -> tuple[dict, str]:
    """The YAML metadata (found as `huggingface_hub`'s cards find it) and the text after it."""
    match = REGEX_YAML_BLOCK.search(text)
    if not match:
        return {}, text
    try:
        metadata = yaml.safe_load(match.group(2)) or {}
    except yaml.YAMLError:
        logger.warning("The existing README's YAML metadata does not parse; it is replaced by generated metadata.")
        metadata = {}
    if not isinstance(metadata, dict):
        metadata = {}
    return metadata, text[match.end() :]


def parse_card(text: str) -> ParsedCard:
    metadata, body = split_front_matter(text)
    if is_trainer_card(metadata, body):
        return _from_trainer_card(metadata)
    start = AUTO_START_RE.search(body)
    end = body.find(AUTO_END, start.end()) if start else -1
    if not start or end < 0:
        # A hand-written README: all of it is kept, the generated block goes after it.
        return ParsedCard(metadata, body.strip("\n"), "", {}, {})
    try:
        hashes = json.loads(start.group("payload").strip() or "{}")
    except json.JSONDecodeError:
        hashes = {}
    block = body[start.end() : end]
    return ParsedCard(
        metadata,
        body[: start.start()].strip("\n"),
        body[end + len(AUTO_END) :].strip("\n"),
        hashes if isinstance(hashes, dict) else {},
        split_sections(block),
    )


def is_trainer_card(metadata: dict, body: str) -> bool:
    """Whether a README is the draft card `transformers.Trainer.create_model_card` writes (generated, not by hand)."""
    tags = metadata.get("tags") or []
    return TRAINER_TAG in (tags if isinstance(tags, list) else [tags]) or TRAINER_CARD_COMMENT in body


def _from_trainer_card(metadata: dict) -> ParsedCard:
    # transformers' draft card is generated text, so none of it is kept as hand-written: its body goes, and its
    # metadata counts as generated (realm-hf's values replace it), except the tags given to the Trainer, which are
    # carried over, and license/base_model/datasets it knew, which stay unless realm-hf knows better.
    kept = {key: value for key, value in metadata.items() if key not in ("library_name", "tags")}
    if not any((entry or {}).get("results") for entry in kept.get("model-index") or []):
        kept.pop("model-index", None)  # `results: []`: nothing to keep
    tags = metadata.get("tags") or []
    inherited = [tag for tag in (tags if isinstance(tags, list) else [tags]) if tag != TRAINER_TAG]
    return ParsedCard(kept, "", "", {key: value_hash(value) for key, value in kept.items()}, {}, inherited)


def split_sections(block: str) -> dict[str, str]:
    sections = {}
    parts = re.split(r"^## (.+)$", block, flags=re.MULTILINE)
    for title, content in zip(parts[1::2], parts[2::2]):
        sections[title.strip()] = content.strip("\n")
    return sections


def value_hash(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:12]


def merge_metadata(generated: dict, previous: ParsedCard | None) -> tuple[dict, dict]:
    """Generated metadata merged with the previous card's: hand-added or hand-edited keys win."""
    if previous is None:
        return dict(generated), {key: value_hash(value) for key, value in generated.items()}
    merged, hashes = {}, {}
    old, recorded = previous.metadata, previous.generated_hashes
    for key, value in generated.items():
        if key in old and recorded.get(key) != value_hash(old[key]):
            if old[key] != value:
                logger.info("Model card: keeping the hand-edited `%s` metadata over the generated value.", key)
            merged[key] = old[key]  # edited or added by hand: the user's value wins
        elif key in recorded and key not in old:
            continue  # generated before, deleted by hand since: stay deleted
        else:
            merged[key] = value
            hashes[key] = value_hash(value)
    for key, value in old.items():
        if key in merged:
            continue
        if key in recorded and recorded[key] == value_hash(value):
            # Generated last time, not generated now (e.g. no evaluation in this save): keep, still as generated.
            merged[key] = value
            hashes[key] = recorded[key]
        else:
            merged[key] = value  # added or edited by hand
    return merged, hashes


def restore_handwritten(text: str, previous: ParsedCard) -> str:
    """Put the previous card's hand-written text back around the generated block of a freshly rendered card."""
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


def parse_card_metadata(text: str) -> dict:
    """The YAML metadata of a card (`{}` when it has none)."""
    return split_front_matter(text)[0]
