"""realm-hf: REALM (Retrieval-Augmented Language Model Pre-Training) for the Hugging Face ecosystem.

Importing the package registers the `realm` model type with transformers' Auto classes (config, models, tokenizer)
and the REALM question-answering pipeline. Registration is idempotent and touches no global state besides those
registries: no logging configuration, no monkeypatching.
"""

from .models.configuration_realm import RealmConfig
from .models.initialization import init_from_bert, realm_config_from_bert
from .models.modeling_base import RealmPreTrainedModel
from .models.modeling_embedder import RealmEmbedder, RealmEmbedderOutput, RealmScorer, RealmScorerOutput
from .models.modeling_knowledge_aug import RealmKnowledgeAugEncoder
from .models.modeling_openqa import RealmForOpenQA
from .models.modeling_pretraining import RealmForPreTraining, RealmForPreTrainingOutput
from .models.modeling_reader import RealmReader, RealmReaderOutput
from .models.openqa_answers import RealmForOpenQAOutput
from .models.reader_inputs import RealmReaderInputs, build_reader_inputs
from .models.tokenization_realm import RealmTokenizer, RealmTokenizerFast
from .version import __version__

# The retrievers load on first use (`realm_hf.RealmRetriever`): they import faiss and datasets, which neither the Auto
# registration below nor answering from a saved model needs up front (a saved model loads its retriever itself).
_LAZY = {
    "RealmRetriever": "realm_hf.retrieval.retriever",
    "RealmSearchOutput": "realm_hf.retrieval.retriever",
    "ShardedRealmRetriever": "realm_hf.retrieval.sharding",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # looked up once
        return value
    raise AttributeError(f"module 'realm_hf' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def _register() -> None:
    from transformers import (
        AutoConfig,
        AutoModel,
        AutoModelForMaskedLM,
        AutoModelForPreTraining,
        AutoModelForQuestionAnswering,
        AutoTokenizer,
    )
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    # Guard against re-import (e.g. importlib.reload): registering twice raises in transformers.
    if "realm" in CONFIG_MAPPING and CONFIG_MAPPING["realm"] is RealmConfig:
        return
    AutoConfig.register("realm", RealmConfig, exist_ok=True)
    # One config class serves five architectures: a tuple lets the Auto classes pick the one named in
    # `config.architectures` (the first is the default), so AutoModel loads each legacy checkpoint as what it is.
    AutoModel.register(
        RealmConfig,
        (RealmEmbedder, RealmForOpenQA, RealmReader, RealmScorer, RealmKnowledgeAugEncoder),
        exist_ok=True,
    )
    AutoModelForQuestionAnswering.register(RealmConfig, (RealmForOpenQA, RealmReader), exist_ok=True)
    AutoModelForMaskedLM.register(RealmConfig, RealmKnowledgeAugEncoder, exist_ok=True)
    AutoModelForPreTraining.register(RealmConfig, RealmForPreTraining, exist_ok=True)
    AutoTokenizer.register(
        RealmConfig,
        slow_tokenizer_class=RealmTokenizer,
        fast_tokenizer_class=RealmTokenizerFast,
        exist_ok=True,
    )

    # --- question-answering pipeline (pipelines/registration.py): task "realm-question-answering"; idempotent ---
    from .pipelines import register_pipeline

    register_pipeline()


_register()

from .pipelines import RealmQuestionAnsweringPipeline, pipeline  # noqa: E402

__all__ = [
    "RealmConfig",
    "RealmEmbedder",
    "RealmEmbedderOutput",
    "RealmForOpenQA",
    "RealmForOpenQAOutput",
    "RealmForPreTraining",
    "RealmForPreTrainingOutput",
    "RealmKnowledgeAugEncoder",
    "RealmPreTrainedModel",
    "RealmQuestionAnsweringPipeline",
    "RealmReader",
    "RealmReaderInputs",
    "RealmReaderOutput",
    "RealmRetriever",
    "RealmScorer",
    "RealmScorerOutput",
    "RealmSearchOutput",
    "RealmTokenizer",
    "RealmTokenizerFast",
    "ShardedRealmRetriever",
    "build_reader_inputs",
    "init_from_bert",
    "pipeline",
    "realm_config_from_bert",
    "__version__",
]
