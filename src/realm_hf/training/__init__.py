"""Training utilities for REALM: collators, the re-index callback, the Open-QA trainer and the ICT warm start."""

from .callbacks import RealmReindexCallback
from .ict import DataCollatorForInverseClozeTask, RealmForInverseClozeTask
from .masking import DataCollatorForSalientSpanMasking
from .openqa import DataCollatorForOpenQA, RealmOpenQATrainer, evaluate_openqa
from .optimization import freeze_lower_layers, two_rate_adamw

__all__ = [
    "DataCollatorForInverseClozeTask",
    "DataCollatorForOpenQA",
    "DataCollatorForSalientSpanMasking",
    "RealmForInverseClozeTask",
    "RealmOpenQATrainer",
    "RealmReindexCallback",
    "evaluate_openqa",
    "freeze_lower_layers",
    "two_rate_adamw",
]
