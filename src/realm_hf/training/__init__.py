"""Training utilities for REALM: collators (salient span masking), callbacks and trainer helpers."""

from .masking import DataCollatorForSalientSpanMasking

__all__ = ["DataCollatorForSalientSpanMasking"]
