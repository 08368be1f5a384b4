"""The REALM question-answering pipeline by job: the pipeline class (with its inputs and options), its registration (its answers are `openqa_answers`', shared with `RealmForOpenQA.answer`)."""

from .question_answering import RealmQuestionAnsweringPipeline
from .registration import (
    PIPELINE_MODULE_FILE,
    REALM_QA_TASK,
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
