"""
The legacy component checkpoints of REALM pre-training (`google/realm-cc-news-pretrained-embedder`, `-scorer`,
`-encoder`): an embedder read from an embedder or a scorer directory, and a pre-training model's parts written as
standalone checkpoints in those layouts and keys. `RealmForPreTraining.from_legacy_checkpoints` and
`export_components` use them.
"""

from __future__ import annotations

import json
import os

from .configuration_realm import RealmConfig
from .modeling_embedder import RealmEmbedder, RealmScorer
from .modeling_knowledge_aug import RealmKnowledgeAugEncoder


def checkpoint_architectures(path: str) -> list[str]:
    """The `architectures` its `config.json` names for the checkpoint directory `path` (`[]` without one)."""
    config_file = os.path.join(path, "config.json")
    if not os.path.exists(config_file):
        return []
    with open(config_file) as f:
        return json.load(f).get("architectures") or []


def load_embedder(path: str | os.PathLike) -> RealmEmbedder:
    """A [`RealmEmbedder`] from an embedder or a scorer checkpoint directory (the scorer's `embedder.*`)."""
    path = str(path)
    if "RealmScorer" in checkpoint_architectures(path):
        return RealmScorer.from_pretrained(path).embedder
    return RealmEmbedder.from_pretrained(path)


def write_components(
    save_directory: str | os.PathLike,
    config: RealmConfig,
    embedder: RealmEmbedder,
    encoder: RealmKnowledgeAugEncoder,
    query_embedder: RealmEmbedder | None = None,
    safe_serialization: bool = True,
) -> dict[str, str]:
    r"""
    Write a pre-training model's parts as standalone checkpoints with the legacy layouts and keys (see
    [`RealmForPreTraining.export_components`]): `embedder/` (the document embedder), `query_embedder/` (given a
    separate one), `scorer/` (a [`RealmScorer`] over the document embedder) and `encoder/`, each with `config` under
    its own architecture.

    Returns:
        `dict` mapping each component name to its directory.
    """
    save_directory = str(save_directory)
    os.makedirs(save_directory, exist_ok=True)
    paths = {}

    def component_config(architecture: str) -> RealmConfig:
        component = RealmConfig.from_dict(config.to_dict())
        component.architectures = [architecture]
        return component

    document = RealmEmbedder(component_config("RealmEmbedder"))
    document.load_state_dict(embedder.state_dict())
    paths["embedder"] = os.path.join(save_directory, "embedder")
    document.save_pretrained(paths["embedder"], safe_serialization=safe_serialization)
    if query_embedder is not None:
        query = RealmEmbedder(component_config("RealmEmbedder"))
        query.load_state_dict(query_embedder.state_dict())
        paths["query_embedder"] = os.path.join(save_directory, "query_embedder")
        query.save_pretrained(paths["query_embedder"], safe_serialization=safe_serialization)
    scorer = RealmScorer(component_config("RealmScorer"))
    scorer.embedder.load_state_dict(embedder.state_dict())
    paths["scorer"] = os.path.join(save_directory, "scorer")
    scorer.save_pretrained(paths["scorer"], safe_serialization=safe_serialization)
    knowledge = RealmKnowledgeAugEncoder(component_config("RealmKnowledgeAugEncoder"))
    knowledge.load_state_dict(encoder.state_dict())
    paths["encoder"] = os.path.join(save_directory, "encoder")
    knowledge.save_pretrained(paths["encoder"], safe_serialization=safe_serialization)
    return paths
