"""
Training utilities for REALM: collators, the re-index callback, the Trainers (Open-QA, pre-training, ICT warm start;
each writes realm-hf's model card) and the ICT warm start.
"""

from ..models.modeling_ict import RealmForInverseClozeTask
from .callbacks import RealmReindexCallback
from .ict import DataCollatorForInverseClozeTask, RealmICTTrainer
from .openqa import DataCollatorForOpenQA, RealmOpenQATrainer, evaluate_openqa, mark_reader_trained
from .pretraining import DataCollatorForSalientSpanMasking, RealmPreTrainingTrainer
from .recipes import freeze_lower_layers, two_rate_adamw
from .saving import RealmCheckpointMixin, RealmModelCardMixin

__all__ = [
    "DataCollatorForInverseClozeTask",
    "RealmCheckpointMixin",
    "DataCollatorForOpenQA",
    "DataCollatorForSalientSpanMasking",
    "RealmForInverseClozeTask",
    "RealmICTTrainer",
    "RealmModelCardMixin",
    "RealmOpenQATrainer",
    "RealmPreTrainingTrainer",
    "RealmReindexCallback",
    "evaluate_openqa",
    "freeze_lower_layers",
    "mark_reader_trained",
    "two_rate_adamw",
]
