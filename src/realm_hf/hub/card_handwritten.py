"""Keeping what people wrote in a card: its parts around the generated block and the metadata they added or edited."""

from __future__ import annotations

import hashlib
import json
import re

import yaml
from huggingface_hub.repocard import REGEX_YAML_BLOCK

from ..logging_utils import get_logger

logger = get_logger(__name__)

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
