"""
Training for REALM: the Trainers (Open-QA, pre-training, the ICT warm start, each writing realm-hf's model card; the
warm-ups) with their collators, what they save and push, the re-index callback, the optimizers.
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
