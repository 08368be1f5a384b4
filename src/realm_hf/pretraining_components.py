"""REALM pre-training's parts as the legacy component checkpoints (embedder, scorer, encoder): import and export."""

from __future__ import annotations

import json
import os

from .configuration_realm import RealmConfig
from .modeling_embedder import RealmEmbedder, RealmScorer
from .modeling_knowledge_aug import RealmKnowledgeAugEncoder


def build_from_component_checkpoints(
    model_class,
    embedder_or_scorer_dir: str | os.PathLike,
    encoder_dir: str | os.PathLike,
    query_embedder_dir: str | os.PathLike | None = None,
    retriever=None,
    tokenizer=None,
    **config_overrides,
):
    """The body of [`RealmForPreTraining.from_legacy_checkpoints`] (see there); `model_class` is the class to build."""
    embedder = load_embedder(embedder_or_scorer_dir)
    encoder = RealmKnowledgeAugEncoder.from_pretrained(encoder_dir)
    config = RealmConfig.from_dict(encoder.config.to_dict())
    config.architectures = [model_class.__name__]
    config.share_query_document_embedder = query_embedder_dir is None
    for key, value in config_overrides.items():
        setattr(config, key, value)
    model = model_class(config, retriever=retriever, tokenizer=tokenizer)
    model.embedder.load_state_dict(embedder.state_dict())
    model.encoder.load_state_dict(encoder.state_dict())
    if query_embedder_dir is not None:
        model.query_embedder.load_state_dict(load_embedder(query_embedder_dir).state_dict())
    return model


def export_component_checkpoints(model, save_directory: str | os.PathLike, safe_serialization: bool = True) -> dict:
    """The body of [`RealmForPreTraining.export_components`] (see there)."""
    save_directory = str(save_directory)
    os.makedirs(save_directory, exist_ok=True)
    paths = {}

    def component_config(architecture: str) -> RealmConfig:
        config = RealmConfig.from_dict(model.config.to_dict())
        config.architectures = [architecture]
        return config

    embedder = RealmEmbedder(component_config("RealmEmbedder"))
    embedder.load_state_dict(model.embedder.state_dict())
    paths["embedder"] = os.path.join(save_directory, "embedder")
    embedder.save_pretrained(paths["embedder"], safe_serialization=safe_serialization)
    if not model.shares_query_document_embedder:
        query = RealmEmbedder(component_config("RealmEmbedder"))
        query.load_state_dict(model.query_embedder.state_dict())
        paths["query_embedder"] = os.path.join(save_directory, "query_embedder")
        query.save_pretrained(paths["query_embedder"], safe_serialization=safe_serialization)
    scorer = RealmScorer(component_config("RealmScorer"))
    scorer.embedder.load_state_dict(model.embedder.state_dict())
    paths["scorer"] = os.path.join(save_directory, "scorer")
    scorer.save_pretrained(paths["scorer"], safe_serialization=safe_serialization)
    encoder = RealmKnowledgeAugEncoder(component_config("RealmKnowledgeAugEncoder"))
    encoder.load_state_dict(model.encoder.state_dict())
    paths["encoder"] = os.path.join(save_directory, "encoder")
    encoder.save_pretrained(paths["encoder"], safe_serialization=safe_serialization)
    return paths


def _checkpoint_architectures(path: str) -> list[str]:
    config_file = os.path.join(path, "config.json")
    if not os.path.exists(config_file):
        return []
    with open(config_file) as f:
        return json.load(f).get("architectures") or []


def load_embedder(path: str | os.PathLike) -> RealmEmbedder:
    """A [`RealmEmbedder`] from an embedder or a scorer checkpoint directory (the scorer's `embedder.*`)."""
    path = str(path)
    if "RealmScorer" in _checkpoint_architectures(path):
        return RealmScorer.from_pretrained(path).embedder
    return RealmEmbedder.from_pretrained(path)
