"""REALM pre-training's checkpoints: the ICT warm start and the legacy component checkpoints (embedder, scorer, encoder)."""

from __future__ import annotations

import json
import os
from typing import Self

from ..logging_utils import get_logger
from .configuration_realm import RealmConfig
from .modeling_embedder import RealmEmbedder, RealmScorer
from .modeling_ict import RealmForInverseClozeTask
from .modeling_knowledge_aug import RealmKnowledgeAugEncoder

logger = get_logger(__name__)


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


class RealmPreTrainingCheckpointsMixin:
    """
    The checkpoint half of [`RealmForPreTraining`] (a mixin; see there): the ICT warm start and the legacy component
    checkpoints. Loading and saving with the retriever are [`RetrieverOwnerMixin`]'s, as for every REALM model that
    owns a retriever.
    """

    # ------------------------------------------------------------------------------------------------ ICT warm start

    def load_ict_embedders(self, ict_model_or_path) -> Self:
        r"""
        Initialise both embedders from an Inverse Cloze Task warm start ([`RealmForInverseClozeTask`], a directory it
        was saved to, or a directory written by its `export_embedders`), as REALM does before pre-training.

        With a shared embedder here and separate ICT embedders, the ICT *document* embedder is used (it is the one
        that builds the index), with a warning. The embedders' `retriever_pooling` becomes the ICT model's, since
        the weights were trained with it.
        """

        if isinstance(ict_model_or_path, (str, os.PathLike)):
            path = str(ict_model_or_path)
            if os.path.isdir(os.path.join(path, "embedder")):
                document = RealmEmbedder.from_pretrained(os.path.join(path, "embedder"))
                query_dir = os.path.join(path, "query_embedder")
                query = RealmEmbedder.from_pretrained(query_dir) if os.path.isdir(query_dir) else document
            else:
                ict = RealmForInverseClozeTask.from_pretrained(path)
                document, query = ict.embedder, ict.query_embedder
        else:
            document, query = ict_model_or_path.embedder, ict_model_or_path.query_embedder
        pooling = document.config.retriever_pooling
        if pooling != self.config.retriever_pooling:
            # The weights only mean what ICT taught them under the pooling it trained them with.
            logger.info("Taking the ICT embedders' retriever_pooling=%r with their weights.", pooling)
            for config in {id(m.config): m.config for m in self.modules() if hasattr(m, "config")}.values():
                config.retriever_pooling = pooling
        self.embedder.load_state_dict(document.state_dict())
        if not self.shares_query_document_embedder:
            self.query_embedder.load_state_dict(query.state_dict())
        elif query is not document:
            logger.warning(
                "The ICT model has separate query and document embedders but this model shares one: using the ICT "
                "document embedder for both."
            )
        return self

    # ------------------------------------------------------------------------------------------------ checkpoints

    @classmethod
    def from_legacy_checkpoints(
        cls,
        embedder_or_scorer_dir: str | os.PathLike,
        encoder_dir: str | os.PathLike,
        query_embedder_dir: str | os.PathLike | None = None,
        retriever=None,
        tokenizer=None,
        **config_overrides,
    ) -> Self:
        r"""
        Build a pre-training model from the legacy component checkpoints, e.g.
        `google/realm-cc-news-pretrained-embedder` (or `-scorer`) and `google/realm-cc-news-pretrained-encoder`.

        Args:
            embedder_or_scorer_dir (`str` or `os.PathLike`):
                A [`RealmEmbedder`] directory (keys `realm.*`, `cls.*`) or a [`RealmScorer`] directory (keys
                `embedder.*`, the query and document embedders being one module): the document embedder, also used
                as the query embedder unless `query_embedder_dir` is given.
            encoder_dir (`str` or `os.PathLike`): A [`RealmKnowledgeAugEncoder`] directory.
            query_embedder_dir (`str` or `os.PathLike`, *optional*):
                A separate query [`RealmEmbedder`]; sets `share_query_document_embedder=False`.
            retriever, tokenizer (*optional*): Attached to the model.
            **config_overrides: Set on the config (e.g. `num_candidates=8`, `max_joint_length=...`).
        """
        return build_from_component_checkpoints(
            cls, embedder_or_scorer_dir, encoder_dir, query_embedder_dir, retriever, tokenizer, **config_overrides
        )

    def export_components(self, save_directory: str | os.PathLike, safe_serialization: bool = True) -> dict[str, str]:
        r"""
        Write the parts as standalone checkpoints with the legacy layouts and keys, loadable on their own:

        - `embedder/`: the document embedder, a [`RealmEmbedder`] (keys `realm.*`, `cls.*`): what builds the index,
          and what [`RealmForOpenQA`] / ORQA fine-tuning starts from;
        - `query_embedder/`: the query [`RealmEmbedder`] (only when separate);
        - `scorer/`: a [`RealmScorer`] (keys `embedder.*`, like `realm-cc-news-pretrained-scorer`); with separate
          embedders it holds the document embedder, and `RealmScorer.from_pretrained(path,
          query_embedder=RealmEmbedder.from_pretrained(query_embedder/))` restores the pair;
        - `encoder/`: the [`RealmKnowledgeAugEncoder`] (keys `realm.*`, `cls.predictions.*`).

        Returns:
            `dict` mapping each component name to its directory.
        """
        return export_component_checkpoints(self, save_directory, safe_serialization=safe_serialization)
