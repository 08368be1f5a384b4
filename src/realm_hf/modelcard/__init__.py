"""
Model cards (README.md) for REALM models and corpus cards for shared corpora.

A card is a `huggingface_hub.ModelCard` (`DatasetCard` for a corpus): `ModelCardData` metadata (library, pipeline tag,
tags, and license, language, datasets, base model only when known), evaluation results as `EvalResult` entries
(`model-index`), and a body rendered from the templates in `realm_hf/templates/` (the model card template is
documented as `model_cards/README_TEMPLATE.md` in the repository) with a generated block between
`<!-- realm-hf:auto-start ... -->` and `<!-- realm-hf:auto-end -->`. Every writer uses it: `save_pretrained`, the Hub
push, the CLI and the Trainers' `create_model_card` (`RealmOpenQATrainer`, `RealmPreTrainingTrainer`,
`RealmICTTrainer`). The card describes what the model is (`tasks.py`: Open-QA, REALM pre-training or the ICT warm
start, from the model's class). See docs/hub.md.

Regenerating a card keeps what people wrote (`handwritten.py`): text outside the generated block stays where it is,
and metadata keys that were added or edited by hand win over generated ones. The start marker records a short hash of
each generated metadata value, which is how an edited value is told from a stale generated one. Information that a
later save does not provide (evaluation results, training settings) is carried over from the previous card rather
than dropped. transformers' draft Trainer card is recognised as generated, not hand-written, and replaced.

Modules: `cards.py` (generate and write), `metadata.py` (card data, evaluation results), `sections.py` (the Markdown
sections), `tasks.py` (what each kind of model's card says), `handwritten.py` (keeping what people wrote).
"""

from .cards import (
    USAGE_MODEL_PLACEHOLDER,
    extract_code_blocks,
    generate_corpus_card,
    generate_model_card,
    write_corpus_card,
    write_model_card,
)
from .handwritten import AUTO_END, AUTO_START, parse_card_metadata
from .sections import corpus_info

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
