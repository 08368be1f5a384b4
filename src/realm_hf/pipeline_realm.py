"""
Question answering with REALM through transformers' `pipeline` API, kept under its old module name: the
implementation is [`realm_hf.pipelines`] (the pipeline class, its inputs, its answers and its registration).
"""

from .pipelines import (
    PIPELINE_MODULE_FILE,
    REALM_QA_TASK,
    RealmQuestionAnsweringPipeline,
    declare_pipeline,
    is_realm_model,
    pipeline,
    register_pipeline,
    write_pipeline_module,
)

__all__ = [
    "PIPELINE_MODULE_FILE",
    "REALM_QA_TASK",
    "RealmQuestionAnsweringPipeline",
    "declare_pipeline",
    "is_realm_model",
    "pipeline",
    "register_pipeline",
    "write_pipeline_module",
]
