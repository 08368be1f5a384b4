"""The REALM pre-training Trainer: [`RealmPreTrainingTrainer`], whose model card describes the pre-training recipe."""

from __future__ import annotations

from typing import Any

from transformers import Trainer

from .callbacks import RealmReindexCallback
from .masking import DataCollatorForSalientSpanMasking
from .saving import RealmModelCardMixin, data_columns

# Columns that name the block(s) an input was cut from: what keeps REALM from retrieving it (no trivial retrieval).
SOURCE_BLOCK_COLUMNS = ("block_id", "source_block_ids", "source_block_id")


class RealmPreTrainingTrainer(RealmModelCardMixin, Trainer):
    """
    [`~transformers.Trainer`] for REALM pre-training of [`RealmForPreTraining`] (retrieval-augmented masked language
    modelling), as built by [`~realm_hf.training.recipes.pretraining_trainer`].

    Training is the stock Trainer's; `create_model_card()` (hence `push_to_hub()`) writes realm-hf's pre-training
    card instead of transformers' draft: what the model is, the recipe as configured (the masking of the collator,
    whether source blocks are excluded, the index refresh), the training arguments, the training
    loss and the last evaluation logged (the masked-LM `eval_loss` and any other `eval_` metric). The arguments are
    those of [`~transformers.Trainer`]; `args.remove_unused_columns` must be `False` (the collator reads the raw text,
    spans and block ids).
    """

    def model_card_setup(self) -> dict[str, Any]:
        # The number of candidates (null document included) is the model's, in the card's model details.
        setup = {"Masking": masking_description(self.data_collator)}
        given = sorted(data_columns(self.train_dataset) & set(SOURCE_BLOCK_COLUMNS))
        setup["No trivial retrieval"] = (
            f"on: the block each input was cut from (`{given[0]}`) is never retrieved for it"
            if given
            else "off: the training data names no source block (`block_id` / `source_block_ids`)"
        )
        refreshers = [cb for cb in self.callback_handler.callbacks if isinstance(cb, RealmReindexCallback)]
        if refreshers:
            refresher = refreshers[0]
            how = "in the background" if getattr(refresher, "background", False) else "inline"
            setup["Index refresh"] = f"every {refresher.refresh_steps} steps, {how}"
        else:
            setup["Index refresh"] = "none (the index stays as built)"
        return setup


def masking_description(collator) -> str:
    """How a pre-training collator masks its inputs, in words (for the model card)."""
    if not isinstance(collator, DataCollatorForSalientSpanMasking):
        return f"`{type(collator).__name__}`"
    sources = [f"spans given with the data (`{collator.spans_column}`)"]
    if collator.detect_dates_and_numbers:
        sources.append("dates and numbers")
    if collator.ner_pipeline is not None:
        sources.append("named entities")
    amount = (
        f"up to {collator.max_spans_per_example} span(s) per input"
        if collator.max_spans_per_example is not None
        else "no span limit"
    )
    if collator.mask_rate is not None:
        amount += f", at most {collator.mask_rate:g} of its wordpieces"
    return (
        f"salient span masking: {', '.join(sources)}; {amount}, at most {collator.max_span_length} wordpieces each; "
        "random whole words where an input has no salient span"
    )


__all__ = ["RealmPreTrainingTrainer", "masking_description"]
