"""
Inverse Cloze Task (ICT) warm start of REALM's embedders (Lee et al., 2019, ORQA; used by REALM): its collator and
Trainer. The model, [`RealmForInverseClozeTask`], is in `models/modeling_ict.py`.
"""

from __future__ import annotations

import random
from typing import Any

import torch
from transformers import Trainer

from ..logging_utils import get_logger
from ..text.sentences import split_sentences
from ..text.tokenizer_calls import tokenizer_call
from .saving import RealmModelCardMixin

logger = get_logger(__name__)


class DataCollatorForInverseClozeTask:
    r"""
    Builds Inverse Cloze Task batches: for each block, one random sentence becomes the query and the block is the
    positive "document"; with probability `remove_sentence_prob` (0.9 in ORQA) the query sentence is removed from the
    block, so the embedders must learn more than word overlap, while keeping it sometimes teaches them that overlap
    still matters. The other blocks of the batch are the negatives.

    Examples are dicts with `sentences` (`list[str]`) or `text` (split with a simple sentence splitter), optionally
    `title` (kept with the block, as the retriever does) and `block_id` (passed through, so that in-batch duplicates
    of one block are not used as negatives).

    Args:
        tokenizer: A BERT/REALM tokenizer.
        max_query_length (`int`, *optional*, defaults to 64): Wordpieces per query, special tokens included.
        max_block_length (`int`, *optional*, defaults to 288): Wordpieces per block (`[CLS] title [SEP] text [SEP]`).
        remove_sentence_prob (`float`, *optional*, defaults to 0.9): Probability of removing the query from its block.
        seed (`int`, *optional*): Seed of the collator's own random generator (reproducible batches).

    Returns (on call):
        `dict` with `input_ids`, `attention_mask`, `token_type_ids` (the queries, `(batch_size, query_length)`),
        `block_input_ids`, `block_attention_mask`, `block_token_type_ids` (`(batch_size, block_length)`) and
        `block_id` when the examples have one.

    Example:

    ```python
    >>> collator = DataCollatorForInverseClozeTask(tokenizer, max_query_length=32, max_block_length=128, seed=0)
    >>> batch = collator([{"title": "Lisp", "text": "Lisp is a language. It has many parentheses."}])
    ```"""

    def __init__(
        self,
        tokenizer,
        max_query_length: int = 64,
        max_block_length: int = 288,
        remove_sentence_prob: float = 0.9,
        seed: int | None = None,
    ):
        if not 0.0 <= remove_sentence_prob <= 1.0:
            raise ValueError(f"remove_sentence_prob must be in [0, 1], got {remove_sentence_prob}.")
        self.tokenizer = tokenizer
        self.max_query_length = max_query_length
        self.max_block_length = max_block_length
        self.remove_sentence_prob = remove_sentence_prob
        self.rng = random.Random(seed)

    @staticmethod
    def sentences_of(example: dict[str, Any]) -> list[str]:
        """The sentences of an example: its `sentences` field, or its `text` split into sentences."""
        sentences = example.get("sentences")
        if sentences is None:
            sentences = split_sentences(example.get("text", ""))
        return [s for s in sentences if s and s.strip()]

    def build_pair(self, example: dict[str, Any]) -> dict[str, Any]:
        r"""
        Draw one (query, block) pair from an example.

        Returns:
            `dict` with `query` (the sentence), `title`, `block` (the block text), `removed` (whether the query was
            taken out of the block) and `query_index` (the sentence's index). A one-sentence block keeps its sentence
            (removing it would leave nothing to retrieve by).
        """
        sentences = self.sentences_of(example)
        if not sentences:
            raise ValueError(f"Example without text for the Inverse Cloze Task: {example!r}")
        index = self.rng.randrange(len(sentences))
        remove = len(sentences) > 1 and self.rng.random() < self.remove_sentence_prob
        block_sentences = sentences[:index] + sentences[index + 1 :] if remove else sentences
        return {
            "query": sentences[index],
            "title": example.get("title") or "",
            "block": " ".join(block_sentences),
            "removed": remove,
            "query_index": index,
        }

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        pairs = [self.build_pair(example) for example in examples]
        queries = tokenizer_call(
            self.tokenizer,
            [pair["query"] for pair in pairs],
            padding=True,
            truncation=True,
            max_length=self.max_query_length,
            return_token_type_ids=True,
            return_tensors="pt",
        )
        from ..retrieval.encoding import tokenize_blocks  # the block layout of retrieval and pre-training

        blocks = tokenize_blocks(
            self.tokenizer,
            [pair["title"] for pair in pairs],
            [pair["block"] for pair in pairs],
            max_length=self.max_block_length,
            padding=True,
            return_tensors="pt",
        )
        batch = {
            "input_ids": queries["input_ids"],
            "attention_mask": queries["attention_mask"],
            "token_type_ids": queries["token_type_ids"],
            "block_input_ids": blocks["input_ids"],
            "block_attention_mask": blocks["attention_mask"],
            "block_token_type_ids": blocks["token_type_ids"],
        }
        if all("block_id" in example for example in examples):
            batch["block_id"] = torch.tensor([int(example["block_id"]) for example in examples], dtype=torch.long)
        return batch


class RealmICTTrainer(RealmModelCardMixin, Trainer):
    """
    [`~transformers.Trainer`] for the Inverse Cloze Task warm start of [`RealmForInverseClozeTask`], as built by
    [`~realm_hf.training.recipes.ict_trainer`].

    Training is the stock Trainer's; `create_model_card()` (hence `push_to_hub()`) writes realm-hf's ICT card instead
    of transformers' draft: what the model is, the recipe of its [`DataCollatorForInverseClozeTask`] (query removal,
    lengths, in-batch negatives), the training arguments, the training loss and the last evaluation logged.
    """

    def model_card_setup(self) -> dict[str, Any]:
        setup = {"Negatives": f"the other blocks of the batch ({self.args.per_device_train_batch_size} per device)"}
        collator = self.data_collator
        if isinstance(collator, DataCollatorForInverseClozeTask):
            setup["Query sentence removed from its block"] = f"with probability {collator.remove_sentence_prob:g}"
            setup["Query length (wordpieces)"] = collator.max_query_length
            setup["Block length (wordpieces)"] = collator.max_block_length
        return setup


__all__ = [
    "DataCollatorForInverseClozeTask",
    "RealmICTTrainer",
    "split_sentences",
]
