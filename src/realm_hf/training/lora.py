"""
LoRA for REALM through `peft`: adapters on the reader's and the question embedder's attention, trained with the
usual fine-tuning code ([`RealmOpenQATrainer`] or a plain loop), saved as a small safetensors adapter, loaded back
onto a base model, and merged into plain weights.

```python
>>> from realm_hf import RealmForOpenQA
>>> from realm_hf.training.lora import add_lora, load_adapter, merge_adapter, save_adapter

>>> model = RealmForOpenQA.from_pretrained("path/to/realm-model")
>>> peft_model = add_lora(model, targets=("reader", "query_embedder"), r=8)
>>> # ... train peft_model with RealmOpenQATrainer ...
>>> save_adapter(peft_model, "my-adapter")  # adapter_config.json + adapter_model.safetensors

>>> peft_model = load_adapter(RealmForOpenQA.from_pretrained("path/to/realm-model"), "my-adapter")
>>> merged = merge_adapter(peft_model)  # a plain RealmForOpenQA again, retriever attached
>>> merged.save_pretrained("merged-model")
```

The corpus index is not touched: its block embeddings come from the document embedder, which LoRA leaves alone by
default, so the index built for the base model stays valid for the adapted one.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Sequence

import torch

from ..io.atomic import normalize_permissions
from ..io.consistent_reads import consistent_read
from ..io.staged_saves import staged_save
from ..logging_utils import get_logger
from ..models.modeling_embedder import RealmEmbedder
from ..models.modeling_knowledge_aug import RealmKnowledgeAugEncoder
from ..models.modeling_reader import RealmReader

logger = get_logger(__name__)

# Component names every REALM model answers to with the same meaning (`query_embedder` embeds questions / masked
# inputs, `document_embedder` the indexed blocks), so a component is found by attribute, with no per-class table.
# The paper's fine-tuning trains the question embedder and the reader and keeps the document embedder fixed (the
# index is precomputed with it), hence the default targets.
COMPONENTS = ("reader", "query_embedder", "document_embedder", "encoder", "embedder")
DEFAULT_TARGETS = ("reader", "query_embedder")
DEFAULT_TARGET_MODULES = ("query", "value")
#: The reader's span head: new in a model fresh from `init_from_bert`, so trained in full (peft's `modules_to_save`),
#: as peft trains the new task head of a sequence-classification model.
SPAN_HEAD = "qa_outputs"


def _self_components(model: torch.nn.Module) -> tuple[str, ...]:
    """The component names a single-component model answers to itself (its LoRA pattern then has no prefix)."""

    if isinstance(model, RealmReader):
        return ("reader",)
    if isinstance(model, RealmEmbedder):
        return ("query_embedder", "document_embedder", "embedder")
    if isinstance(model, RealmKnowledgeAugEncoder):
        return ("encoder",)
    return ()


def _component_path(model: torch.nn.Module, target: str) -> str | None:
    """
    The submodule path of component `target` of `model`: `""` for the model itself, `None` when the model has no
    such module. An alias (`RealmForOpenQA.query_embedder` is `embedder`) resolves to the path the weights carry.
    """
    if target in _self_components(model):
        return ""
    module = getattr(model, target, None)
    if not isinstance(module, torch.nn.Module):
        return None
    # `named_modules` names a shared module once, by its registered path: what peft matches against.
    return next((name for name, candidate in model.named_modules() if candidate is module), None)


@contextlib.contextmanager
def _input_embeddings_for_peft(model: torch.nn.Module):
    """
    `peft` asks the model for `get_input_embeddings()` (to find weights tied to the embeddings). REALM models made of
    several encoders (e.g. [`RealmForOpenQA`]: question embedder + reader) have no single input embedding and raise
    `NotImplementedError`; for the duration of the call, answer with the first component's embeddings.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        base.get_input_embeddings()
    except NotImplementedError:
        pass
    else:
        yield
        return
    component = next(
        (
            getattr(base, name)
            for name in ("reader", "embedder", "encoder")
            if hasattr(getattr(base, name, None), "get_input_embeddings")
        ),
        None,
    )
    if component is None:
        yield
        return
    # An instance attribute shadows the class method; removed again below so the model is left as it was.
    base.get_input_embeddings = component.get_input_embeddings
    try:
        yield
    finally:
        del base.get_input_embeddings


def lora_target_regex(
    model: torch.nn.Module,
    targets: Sequence[str] = DEFAULT_TARGETS,
    target_modules: Sequence[str] = DEFAULT_TARGET_MODULES,
) -> str:
    r"""
    The `target_modules` regular expression that selects the attention projections `target_modules` of the BERT
    encoders in the components `targets` of `model` (and nothing else: e.g. `embedder` never matches
    `document_embedder`).

    Args:
        model (`torch.nn.Module`): A REALM model ([`RealmForOpenQA`], [`RealmReader`], [`RealmEmbedder`], ...).
        targets (`Sequence[str]`): Components: `"reader"`, `"query_embedder"`, `"document_embedder"`, `"encoder"`
            (whichever the model has; the embedder names mean the same on every REALM model), or the attribute name
            of a submodule.
        target_modules (`Sequence[str]`): Linear layers of the BERT attention: any of `"query"`, `"key"`,
            `"value"` (in `attention.self`) and `"dense"` (the attention output projection, `attention.output`).

    Returns:
        `str`: A pattern for `peft.LoraConfig(target_modules=...)`, which `peft` matches with `re.fullmatch`.

    Example: for [`RealmForOpenQA`] with the defaults,
    `(?:reader|embedder)\.realm\.encoder\.layer\.\d+\.attention\.(?:self\.(?:query|value))`.
    """
    if isinstance(targets, str):
        targets = (targets,)
    if isinstance(target_modules, str):
        target_modules = (target_modules,)
    if not targets:
        raise ValueError("`targets` is empty: name at least one component, e.g. ('reader', 'query_embedder').")
    if not target_modules:
        raise ValueError("`target_modules` is empty: name at least one attention projection, e.g. ('query', 'value').")
    prefixes = []
    for target in targets:
        path = _component_path(model, target)
        if path is None:
            if target in COMPONENTS and hasattr(model, target):
                raise ValueError(
                    f"{type(model).__name__}.{target} is not set, so {target!r} cannot get LoRA adapters."
                )
            known = [name for name in COMPONENTS if _component_path(model, name) is not None] or ["(none known)"]
            raise ValueError(
                f"{type(model).__name__} has no component {target!r} to put LoRA on; choose from {', '.join(known)}."
            )
        if path not in prefixes:
            prefixes.append(path)
    if "" in prefixes:
        prefix = ""  # the model is the component itself
    else:
        prefix = "(?:" + "|".join(re.escape(p) for p in prefixes) + r")\."
    layers = []
    self_projections = [m for m in target_modules if m in ("query", "key", "value")]
    unknown = [m for m in target_modules if m not in ("query", "key", "value", "dense")]
    if unknown:
        raise ValueError(
            f"Unknown attention projection(s) {unknown}: `target_modules` may contain 'query', 'key', 'value', 'dense'."
        )
    if self_projections:
        layers.append(r"self\.(?:" + "|".join(self_projections) + ")")
    if "dense" in target_modules:
        layers.append(r"output\.dense")
    return prefix + r"realm\.encoder\.layer\.\d+\.attention\.(?:" + "|".join(layers) + ")"


def add_lora(
    model: torch.nn.Module,
    targets: Sequence[str] = DEFAULT_TARGETS,
    r: int = 8,
    alpha: int = 16,
    dropout: float = 0.0,
    target_modules: Sequence[str] = DEFAULT_TARGET_MODULES,
    adapter_name: str = "default",
    modules_to_save: Sequence[str] | None = None,
    **lora_kwargs,
):
    r"""
    Wrap a REALM model in a `peft` LoRA model whose trainable parameters are low-rank adapters on the attention
    projections of the chosen components, and, when the model's reader was never trained, its span head.

    A model fresh from [`init_from_bert`] (`config.reader_trained=False`) has a random span head (`qa_outputs`), and
    adapters on the attention cannot make a random head answer: as peft trains a new task head in full (the classifier
    of `task_type="SEQ_CLS"`), the span head then trains in full through `modules_to_save` (a few thousand weights;
    saved with the adapter, merged by [`merge_adapter`]). `config.reader_trained` becomes `True` at the first
    optimizer step only when the span head trains ([`~realm_hf.training.openqa.mark_reader_trained`]).

    The returned `PeftModel` behaves like the model: `peft_model(input_ids=..., questions=..., answers=...)` passes
    every keyword through, `peft_model.retriever`, `peft_model.answer(...)` and `peft_model.embed_questions(...)`
    reach the wrapped model, and it trains with [`RealmOpenQATrainer`]. To replace the retriever call
    `peft_model.set_retriever(...)` (plain attribute assignment would land on the wrapper).

    Args:
        model (`torch.nn.Module`): The model to adapt, e.g. [`RealmForOpenQA`] or [`RealmReader`]. Modified in place
            (adapter layers are injected and every other parameter is frozen).
        targets (`Sequence[str]`, *optional*, defaults to `("reader", "query_embedder")`):
            Components to adapt (see [`lora_target_regex`]). Adapting `"document_embedder"` makes the index stale:
            re-index after training.
        r (`int`, *optional*, defaults to 8): LoRA rank.
        alpha (`int`, *optional*, defaults to 16): LoRA scaling numerator (`lora_alpha`).
        dropout (`float`, *optional*, defaults to 0.0): Dropout on the LoRA input.
        target_modules (`Sequence[str]`, *optional*, defaults to `("query", "value")`): Attention projections.
        adapter_name (`str`, *optional*, defaults to `"default"`): Name of the adapter.
        modules_to_save (`Sequence[str]`, *optional*): Modules trained in full beside the adapters (peft's option).
            By default the span head (`"qa_outputs"`) when `config.reader_trained` is `False`, else none. A list
            without the span head for a never-trained reader is refused: the model would answer at random.
        **lora_kwargs: Other `peft.LoraConfig` arguments (`use_rslora`, `init_lora_weights`, ...).

    Returns:
        `peft.PeftModel`
    """
    check_lora_options(r=r, alpha=alpha, dropout=dropout)
    pattern = lora_target_regex(model, targets, target_modules)
    modules_to_save = _modules_to_save(model, modules_to_save)
    from peft import LoraConfig, get_peft_model  # optional at import time: only LoRA needs it

    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=pattern,
        bias=lora_kwargs.pop("bias", "none"),
        modules_to_save=modules_to_save,
        **lora_kwargs,
    )
    with _input_embeddings_for_peft(model):
        peft_model = get_peft_model(model, config, adapter_name=adapter_name)
    trainable = [name for name, p in peft_model.named_parameters() if p.requires_grad]
    if not trainable:
        raise ValueError(f"No module of {type(model).__name__} matched {pattern!r}: nothing to train.")
    logger.info("LoRA on %s: %d trainable tensors (pattern %s).", type(model).__name__, len(trainable), pattern)
    return peft_model


def check_lora_options(r=8, alpha=16, dropout=0.0) -> None:
    """
    Raise a `ValueError` naming the option for a LoRA rank `r` that is not a positive integer, an `alpha` that is not
    a positive number, or a `dropout` outside [0, 1) (`realm-hf train` checks its `lora:` section with it before any
    model loads).
    """
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise ValueError(f"LoRA rank `r` must be a positive integer, got {r!r}.")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
        raise ValueError(f"LoRA `alpha` must be a positive number, got {alpha!r}.")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"LoRA `dropout` must be in [0, 1), got {dropout!r}.")


def _has_untrained_reader(model: torch.nn.Module) -> bool:
    config = getattr(model, "config", None)
    has_reader = any(isinstance(module, RealmReader) for module in model.modules())
    return has_reader and not getattr(config, "reader_trained", True)


def _modules_to_save(model: torch.nn.Module, modules_to_save: Sequence[str] | None) -> list[str] | None:
    """`modules_to_save` for peft: the span head of a never-trained reader by default; a list without it refused."""
    if isinstance(modules_to_save, str):
        modules_to_save = [modules_to_save]
    untrained = _has_untrained_reader(model)
    if modules_to_save is None:
        if not untrained:
            return None
        logger.info(
            "The reader's span head was never trained (config.reader_trained=False): it trains in full beside the "
            "LoRA adapters (modules_to_save=[%r]).",
            SPAN_HEAD,
        )
        return [SPAN_HEAD]
    modules_to_save = list(modules_to_save)
    if untrained and not any(name == SPAN_HEAD or name.endswith("." + SPAN_HEAD) for name in modules_to_save):
        raise ValueError(
            f"The reader's span head ({SPAN_HEAD}) was never trained (config.reader_trained=False, as after "
            f"init_from_bert), and modules_to_save={modules_to_save!r} leaves it frozen: LoRA on the attention cannot "
            f"make a random head answer. Leave `modules_to_save` unset (the span head then trains in full) or add "
            f"{SPAN_HEAD!r} to it."
        )
    return modules_to_save or None


def save_adapter(peft_model, save_directory: str | os.PathLike, **kwargs) -> str:
    r"""
    Save only the adapter: `adapter_config.json` and `adapter_model.safetensors` (no pickle), a few hundred KB for a
    base-size model. All or nothing, even if killed: the files are written into a temporary folder inside
    `save_directory` and swapped in under a journal ([`realm_hf.io.staged_saves.staged_save`], as a model save), so the
    directory holds the previous adapter or this one, never a config of one and weights of the other. Other files in
    the directory are kept.

    Args:
        peft_model (`peft.PeftModel`): The adapted model (from [`add_lora`] or [`load_adapter`]).
        save_directory (`str` or `os.PathLike`): Target directory (created if needed; existing adapter files are
            replaced).
        **kwargs: Passed to `PeftModel.save_pretrained` (e.g. `selected_adapters`); `safe_serialization` is
            always `True`.

    Returns:
        `str`: The directory.
    """
    if not hasattr(peft_model, "peft_config"):
        raise ValueError("save_adapter expects a peft model (from add_lora or load_adapter), not a plain model.")
    save_directory = os.path.abspath(os.fspath(save_directory))
    if os.path.exists(save_directory) and not os.path.isdir(save_directory):
        raise ValueError(f"{save_directory} exists and is not a directory.")
    kwargs["safe_serialization"] = True
    with staged_save(save_directory) as save:
        with _input_embeddings_for_peft(peft_model):
            peft_model.save_pretrained(save.staging, **kwargs)
        normalize_permissions(save.staging)  # safetensors writes private temporary files; adapters are ordinary
        # Each file, not whole folders: adapters saved earlier under other names (their subfolders) are kept.
        save.replace = sorted(
            os.path.relpath(os.path.join(root, name), save.staging).replace(os.sep, "/")
            for root, _dirs, files in os.walk(save.staging)
            for name in files
        )
    return save_directory


def load_adapter(
    base_model: torch.nn.Module,
    adapter_directory: str | os.PathLike,
    adapter_name: str = "default",
    is_trainable: bool = False,
    **kwargs,
):
    r"""
    Load a saved adapter onto a base model (the same architecture and base weights the adapter was trained on).

    Args:
        base_model (`torch.nn.Module`): A fresh base model, e.g. `RealmForOpenQA.from_pretrained(base_dir)`; its
            retriever stays attached and reachable as `peft_model.retriever`.
        adapter_directory (`str` or `os.PathLike`): What [`save_adapter`] wrote (or a Hub adapter repo id).
        adapter_name (`str`, *optional*, defaults to `"default"`)
        is_trainable (`bool`, *optional*, defaults to `False`): Keep the adapter trainable (to continue training).
        **kwargs: Passed to `peft.PeftModel.from_pretrained`.

    Returns:
        `peft.PeftModel`
    """
    from peft import PeftModel

    adapter_directory = os.fspath(adapter_directory)
    if os.path.isdir(adapter_directory):
        if not os.path.exists(os.path.join(adapter_directory, "adapter_config.json")):
            raise OSError(f"{adapter_directory} has no adapter_config.json: it is not a saved adapter.")
        if not os.path.exists(os.path.join(adapter_directory, "adapter_model.safetensors")):
            # peft would fall back to adapter_model.bin (pickle); refuse, as everything else in realm-hf does.
            raise OSError(
                f"{adapter_directory} has no adapter_model.safetensors; pickled adapters are not loaded. "
                "Re-save the adapter with `save_adapter` (safetensors)."
            )
    # Read as one save: a save_adapter killed during its swap is completed first, one in progress waited for.
    with consistent_read(adapter_directory), _input_embeddings_for_peft(base_model):
        peft_model = PeftModel.from_pretrained(
            base_model, adapter_directory, adapter_name=adapter_name, is_trainable=is_trainable, **kwargs
        )
    if not is_trainable:
        peft_model.eval()
    return peft_model


def merge_adapter(peft_model, safe_merge: bool = True):
    r"""
    Fold the LoRA weights into the base weights and drop the adapter layers (`merge_and_unload`).

    Args:
        peft_model (`peft.PeftModel`): The adapted model.
        safe_merge (`bool`, *optional*, defaults to `True`): Check the merged weights for NaNs before replacing the
            originals.

    Returns:
        The base model class (e.g. a plain [`RealmForOpenQA`], retriever still attached) with merged weights; it
        saves and loads like any other REALM model.
    """
    if not hasattr(peft_model, "merge_and_unload"):
        raise ValueError("merge_adapter expects a peft model (from add_lora or load_adapter).")
    with _input_embeddings_for_peft(peft_model):
        return peft_model.merge_and_unload(safe_merge=safe_merge)


def lora_parameter_names(model: torch.nn.Module) -> list[str]:
    """Names of the trainable parameters of `model` (after [`add_lora`]: exactly the LoRA matrices)."""
    return [name for name, param in model.named_parameters() if param.requires_grad]


__all__ = [
    "COMPONENTS",
    "DEFAULT_TARGETS",
    "DEFAULT_TARGET_MODULES",
    "SPAN_HEAD",
    "add_lora",
    "check_lora_options",
    "load_adapter",
    "lora_parameter_names",
    "lora_target_regex",
    "merge_adapter",
    "save_adapter",
]
