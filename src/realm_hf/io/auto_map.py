"""
`auto_map` for saved REALM directories: transformers' Auto classes, used without `import realm_hf`, point to realm-hf.

transformers 5 has no REALM (it was removed in 5.0), so without realm-hf a saved `config.json` with `model_type: realm`
fails with transformers' "upgrade transformers" advice, and `AutoTokenizer` quietly builds a generic tokenizer.
Every REALM model and tokenizer realm-hf saves therefore carries an `auto_map` (in `config.json` and
`tokenizer_config.json`) naming classes in `realm_hf_auto.py`, a few lines written next to them that import the
installed realm-hf and raise "`pip install realm-hf`, then `import realm_hf`" when it is missing. transformers runs that
file only with `trust_remote_code=True`; without it, it asks for `trust_remote_code=True` instead of giving the wrong
advice. Once `realm_hf` is imported, `AutoConfig` and the Auto model classes use the registered classes and never run
the file; `AutoTokenizer` with `trust_remote_code=True` still runs it (transformers 5 prefers a tokenizer's `auto_map`
to a registered class), which gives realm-hf's own `RealmTokenizer`.
See docs/hub.md.
"""

from __future__ import annotations

import os

from ..constants import AUTO_MODULE_FILE
from .atomic import atomic_write_text

_MODULE = AUTO_MODULE_FILE[: -len(".py")]
_MODULE_SOURCE = '''"""
This model was saved by realm-hf (REALM for the Hugging Face ecosystem), which transformers 5 does not include.

transformers' Auto classes run this file (through `auto_map`) only with `trust_remote_code=True`; it imports the
installed realm-hf. The usual way needs no remote code: `pip install realm-hf`, then `import realm_hf` before loading.
"""

try:
    from realm_hf import (
        RealmConfig,
        RealmEmbedder,
        RealmForOpenQA,
        RealmForPreTraining,
        RealmKnowledgeAugEncoder,
        RealmReader,
        RealmScorer,
        RealmTokenizer,
        RealmTokenizerFast,
    )
except ModuleNotFoundError as err:
    if err.name != "realm_hf":
        raise
    raise ImportError(
        "This is a realm-hf (REALM) model, and transformers 5 has no REALM classes of its own: install realm-hf with "
        "`pip install realm-hf`, then `import realm_hf` before loading it (for example with "
        "`realm_hf.RealmForOpenQA.from_pretrained(...)` or transformers' Auto classes)."
    ) from None

__all__ = [
    "RealmConfig",
    "RealmEmbedder",
    "RealmForOpenQA",
    "RealmForPreTraining",
    "RealmKnowledgeAugEncoder",
    "RealmReader",
    "RealmScorer",
    "RealmTokenizer",
    "RealmTokenizerFast",
]
'''


def model_auto_map(model) -> dict[str, str]:
    """
    The `auto_map` of a REALM model's config: `AutoConfig`, and each Auto model class that `import realm_hf`
    registers the model's class under (read from transformers' mappings, so it follows `realm_hf/__init__.py`).
    """
    import transformers

    auto_map = {"AutoConfig": f"{_MODULE}.{type(model.config).__name__}"}
    for name in ("AutoModel", "AutoModelForQuestionAnswering", "AutoModelForMaskedLM", "AutoModelForPreTraining"):
        registered = getattr(transformers, name)._model_mapping.get(type(model.config), ())
        registered = registered if isinstance(registered, tuple) else (registered,)
        if type(model) in registered:
            auto_map[name] = f"{_MODULE}.{type(model).__name__}"
    return auto_map


def tokenizer_auto_map() -> dict[str, list]:
    """The `auto_map` of a REALM tokenizer's `tokenizer_config.json` (`[slow, fast]`, as transformers writes it)."""
    return {"AutoTokenizer": [f"{_MODULE}.RealmTokenizer", None]}


def prepare_save(obj) -> None:
    """
    Before `obj` (a REALM config, model or tokenizer) is saved: forget a `register_for_auto_class` made by an earlier
    `trust_remote_code=True` load in this process. transformers calls it on the class it ran through `auto_map`; left
    set, the next save would copy realm-hf's own source files into the directory and point `auto_map` at them.
    """
    for cls in (*type(obj).__mro__, *type(getattr(obj, "config", None)).__mro__):
        if "_auto_class" in vars(cls) and cls.__module__.startswith("realm_hf."):
            cls._auto_class = None


def write_auto_module(save_directory: str | os.PathLike) -> str:
    """Write `realm_hf_auto.py` (atomically) into a saved model or tokenizer directory; returns its path."""
    path = os.path.join(save_directory, AUTO_MODULE_FILE)
    atomic_write_text(path, _MODULE_SOURCE)
    return path


__all__ = ["model_auto_map", "prepare_save", "tokenizer_auto_map", "write_auto_module"]
