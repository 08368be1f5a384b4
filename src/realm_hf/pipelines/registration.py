"""
The REALM question-answering pipeline in transformers' `pipeline` API: its task in `PIPELINE_REGISTRY`, the
`custom_pipelines` declaration of saved models, and [`pipeline`], the `transformers.pipeline` drop-in.

How the task is supplied
------------------------
transformers 5 removed its built-in `"question-answering"` task: the name sits in the pipelines' `REMOVED_TASKS`
table, and `transformers.pipeline("question-answering", ...)` raises a `KeyError` with a migration message before it
looks at the model, even with `pipeline_class=...` or after `PIPELINE_REGISTRY.register_pipeline(
"question-answering", ...)` (the removed-task check runs first). realm-hf therefore, without patching transformers:

1. registers this pipeline under its own task name, `"realm-question-answering"`, in transformers'
   `PIPELINE_REGISTRY` when `realm_hf` is imported (idempotent), so `transformers.pipeline(
   "realm-question-answering", model=...)` works with any REALM directory, Hub id or [`RealmForOpenQA`];
2. provides [`pipeline`] (`realm_hf.pipeline`), a drop-in for `transformers.pipeline` that maps
   `"question-answering"` (and `task=None`) to this pipeline when the model is a REALM model and hands every other
   call to `transformers.pipeline` unchanged. A later transformers that restores `"question-answering"` keeps working
   for other models, and REALM models keep getting this pipeline rather than the generic extractive one (which
   expects `start_logits`/`end_logits` that REALM does not produce).

Other routes were checked on transformers 5.23 and rejected (details in docs/pipeline.md): a `custom_pipelines` entry
in the model's `config.json` is consulted before the removed-task check, but it needs either
`trust_remote_code=True` plus a code file in the repo, or `pipeline_class=` at every call; registering under
`"question-answering"` is shadowed by the removed-task check and would silently change transformers' behaviour for
every other model if a later version restored the task.
"""

from __future__ import annotations

import json
import os
from typing import Any

from transformers import Pipeline

from ..io.atomic import atomic_write_text
from ..models.modeling_base import RealmPreTrainedModel, local_config
from ..models.modeling_openqa import RealmForOpenQA
from ..precision import parse_dtype
from .question_answering import RealmQuestionAnsweringPipeline

#: Task name under which the pipeline is registered in transformers' `PIPELINE_REGISTRY`.
REALM_QA_TASK = "realm-question-answering"
# Task names that `realm_hf.pipeline` answers with this pipeline when the model is a REALM model.
_QA_TASK_NAMES = ("question-answering", REALM_QA_TASK)


def register_pipeline() -> None:
    """
    Register [`RealmQuestionAnsweringPipeline`] as the `"realm-question-answering"` task in transformers'
    `PIPELINE_REGISTRY`. Idempotent: re-importing `realm_hf` does not register (and warn) twice.
    """
    from transformers.pipelines import PIPELINE_REGISTRY

    current = PIPELINE_REGISTRY.supported_tasks.get(REALM_QA_TASK)
    if current is not None and current.get("impl") is RealmQuestionAnsweringPipeline:
        return
    PIPELINE_REGISTRY.register_pipeline(
        REALM_QA_TASK,
        pipeline_class=RealmQuestionAnsweringPipeline,
        pt_model=RealmForOpenQA,
        type="text",
    )


#: File that `write_pipeline_module` writes next to a saved model, named by the `custom_pipelines` entry.
PIPELINE_MODULE_FILE = "realm_pipeline.py"
_PIPELINE_MODULE_SOURCE = (
    '"""REALM question-answering pipeline for `transformers.pipeline(..., trust_remote_code=True)`: it only imports '
    'the pipeline of the installed realm-hf (`pip install realm-hf`)."""\n\n'
    "from realm_hf.pipeline_realm import RealmQuestionAnsweringPipeline  # noqa: F401\n"
)


def declare_pipeline(config) -> None:
    """
    Declare the REALM pipeline for the `"question-answering"` task in a model config (`config.custom_pipelines`).

    transformers looks a task up in the model's `custom_pipelines` before its own (removed or restored) tasks, so a
    model saved with this config works with `transformers.pipeline("question-answering", model=path,
    pipeline_class=RealmQuestionAnsweringPipeline)`, or with `trust_remote_code=True` when the directory also holds
    the file written by [`write_pipeline_module`]; without either, transformers refuses instead of running a generic
    pipeline on a REALM model.
    """
    entry = {
        "impl": f"{PIPELINE_MODULE_FILE[:-3]}.RealmQuestionAnsweringPipeline",
        "pt": ["AutoModelForQuestionAnswering"],
    }
    custom = dict(getattr(config, "custom_pipelines", None) or {})
    custom["question-answering"] = entry
    config.custom_pipelines = custom


def write_pipeline_module(save_directory: str | os.PathLike) -> str:
    """Write `realm_pipeline.py` (one import of the installed pipeline) for `trust_remote_code=True` loading."""
    path = os.path.join(save_directory, PIPELINE_MODULE_FILE)
    atomic_write_text(path, _PIPELINE_MODULE_SOURCE)
    return path


def is_realm_model(model, config=None, **hub_kwargs) -> bool:
    """
    Whether `model` is a REALM question-answering model: a [`RealmForOpenQA`] instance, or a local directory or Hub
    repo whose `config.json` has `model_type: realm` (and, when it lists architectures, `RealmForOpenQA`).

    Args:
        model (`str`, `os.PathLike` or `PreTrainedModel`): What `pipeline(model=...)` got.
        config (`str` or `PreTrainedConfig`, *optional*): What `pipeline(config=...)` got.
        hub_kwargs: `revision`, `token`, `cache_dir`, `local_files_only` for reading a Hub config.
    """
    if isinstance(model, RealmForOpenQA):
        return True
    if not isinstance(model, (str, os.PathLike)) and model is not None:
        return False
    if config is not None and not isinstance(config, (str, os.PathLike)):
        return _is_realm_qa_config(config.to_dict())
    source = config if config is not None else model
    if source is None:
        return False
    source = str(source)
    if os.path.isdir(source):
        config_file = os.path.join(source, "config.json")
        if not os.path.isfile(config_file):
            return False
        with open(config_file, encoding="utf-8") as f:
            return _is_realm_qa_config(json.load(f))
    try:
        from huggingface_hub import hf_hub_download

        config_file = hf_hub_download(source, "config.json", **{k: v for k, v in hub_kwargs.items() if v is not None})
    except Exception:  # not a repo, offline without cache, ...: let transformers.pipeline report it
        return False
    with open(config_file, encoding="utf-8") as f:
        return _is_realm_qa_config(json.load(f))


def _other_realm_model(model) -> str | None:
    """The class of a REALM model other than `RealmForOpenQA` (an instance, or a local directory's config), else None."""
    if isinstance(model, RealmPreTrainedModel):
        return None if isinstance(model, RealmForOpenQA) else type(model).__name__
    config = local_config(model)  # None: not a local directory, or a config transformers will report
    architectures = (config or {}).get("architectures") or []
    if config is None or config.get("model_type") != "realm" or not architectures or "RealmForOpenQA" in architectures:
        return None
    return architectures[0]


def _is_realm_qa_config(config: dict) -> bool:
    if config.get("model_type") != "realm":
        return False
    architectures = config.get("architectures") or ["RealmForOpenQA"]
    return "RealmForOpenQA" in architectures


def pipeline(task: str | None = None, model: Any = None, **kwargs) -> Pipeline:
    r"""
    `transformers.pipeline` with REALM question answering: `"question-answering"` (or no task) with a REALM model
    builds a [`RealmQuestionAnsweringPipeline`]; every other call goes to `transformers.pipeline` unchanged.

    Args:
        task (`str`, *optional*): `"question-answering"`, `"realm-question-answering"`, or any transformers task.
        model (`str`, `os.PathLike` or [`RealmForOpenQA`]): A REALM directory, Hub repo id or model.
        kwargs: Everything else `transformers.pipeline` takes (`tokenizer`, `revision`, `token`, `device`,
            `model_kwargs`, ...) and the pipeline parameters (`top_k`, `num_blocks`, `max_answer_len`, `batch_size`).
            For a REALM model `dtype` is the compute dtype of every call (bf16 autocast, see
            [`RealmQuestionAnsweringPipeline`]), not the dtype the weights are loaded in, and `trust_remote_code` is
            ignored: realm-hf's own classes load it, and no code file of the folder or repo runs.

    Example:

    ```python
    >>> import realm_hf

    >>> qa = realm_hf.pipeline("question-answering", model="path/to/realm-model")
    >>> qa("what is a compiler?", top_k=2)
    ```
    """
    import transformers

    if task in _QA_TASK_NAMES or task is None:
        model_kwargs = kwargs.get("model_kwargs") or {}
        hub_kwargs = {
            "revision": kwargs.get("revision"),
            "token": kwargs.get("token"),
            "cache_dir": model_kwargs.get("cache_dir"),
        }
        other = _other_realm_model(model) if task is not None else None
        if other is not None:
            # transformers answered "The task question-answering has been removed from transformers", which named
            # neither the model nor what the pipeline needs.
            raise ValueError(
                f"The question-answering pipeline answers with a RealmForOpenQA (retriever and reader); got a {other}. "
                "Pass a RealmForOpenQA model or the directory it was saved to (a reader or an embedder alone cannot "
                "answer: build a RealmForOpenQA with them and a retriever)."
            )
        if task == REALM_QA_TASK or is_realm_model(model, kwargs.get("config"), **hub_kwargs):
            register_pipeline()  # normally done by `import realm_hf`; cheap and idempotent
            kwargs.setdefault("pipeline_class", RealmQuestionAnsweringPipeline)
            # realm-hf's own classes answer (registered above): no file of the folder needs to run, so none does,
            # whatever `trust_remote_code` says (its realm_hf_auto.py may have been edited by anyone).
            kwargs["trust_remote_code"] = False
            if "trust_remote_code" in model_kwargs:
                kwargs["model_kwargs"] = dict(model_kwargs, trust_remote_code=False)
            dtype = parse_dtype(kwargs.pop("dtype", None))  # REALM's compute dtype: weights load as saved
            qa = transformers.pipeline(REALM_QA_TASK, model=model, **kwargs)
            if dtype is not None:
                qa._forward_params["dtype"] = dtype
            return qa
    return transformers.pipeline(task, model=model, **kwargs)


__all__ = [
    "PIPELINE_MODULE_FILE",
    "REALM_QA_TASK",
    "declare_pipeline",
    "is_realm_model",
    "pipeline",
    "register_pipeline",
    "write_pipeline_module",
]
