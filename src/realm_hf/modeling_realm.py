"""PyTorch REALM models, built from transformers' BERT blocks with the legacy checkpoint keys: the public facade.

The models live in one module per job; this module re-exports every public name it always had, so that
`from realm_hf.modeling_realm import ...` keeps working. It only imports from them (none imports it), so it closes no
import cycle.

- `modeling_outputs`: the `ModelOutput` dataclasses.
- `modeling_base`: `RealmPreTrainedModel`, the base class every REALM model shares.
- `modeling_embedder`: `RealmEmbedder`, its projection head, `RealmQueryEmbedderMixin` and `RealmScorer`.
- `modeling_knowledge_aug`: `RealmKnowledgeAugEncoder` and `realm_marginal_mlm_loss`.
- `modeling_reader`: `RealmReader`, its span projection and span helpers.
- `modeling_openqa`: `RealmForOpenQA` and `check_questions` (the question rule it applies).
- `retriever_loading`: `load_retriever_for_model` and `check_retriever_dim`.
"""

from .modeling_base import RealmPreTrainedModel
from .modeling_embedder import RealmEmbedder, RealmQueryEmbedderMixin, RealmScorer, RealmScorerProjection  # noqa: F401
from .modeling_knowledge_aug import RealmKnowledgeAugEncoder, realm_marginal_mlm_loss
from .modeling_openqa import RealmForOpenQA, check_questions  # noqa: F401
from .modeling_outputs import RealmEmbedderOutput, RealmForOpenQAOutput, RealmReaderOutput, RealmScorerOutput
from .modeling_reader import RealmReader, RealmReaderProjection  # noqa: F401
from .retrieval.legacy import load_legacy_block_emb
from .retriever_loading import check_retriever_dim, load_retriever_for_model  # noqa: F401

__all__ = [
    "RealmEmbedder",
    "RealmEmbedderOutput",
    "RealmForOpenQA",
    "RealmForOpenQAOutput",
    "RealmKnowledgeAugEncoder",
    "RealmPreTrainedModel",
    "RealmReader",
    "RealmReaderOutput",
    "RealmScorer",
    "RealmScorerOutput",
    "check_questions",
    "load_legacy_block_emb",
    "realm_marginal_mlm_loss",
]
