"""Inverse Cloze Task (ICT) warm start of REALM's embedders (Lee et al., 2019, ORQA; used by REALM)."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import Trainer
from transformers.utils import ModelOutput

from ..hub.trainer_cards import RealmModelCardMixin
from ..logging_utils import get_logger
from ..models.configuration_realm import RealmConfig
from ..models.modeling_base import RealmPreTrainedModel
from ..models.modeling_embedder import RealmEmbedder, RealmQueryEmbedderMixin
from ..models.tokenization_realm import tokenizer_call
from ..sentences import split_sentences

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


@dataclass
class RealmForInverseClozeTaskOutput(ModelOutput):
    r"""
    Outputs of [`RealmForInverseClozeTask`].

    Args:
        loss (`torch.FloatTensor` of shape `()`, *optional*):
            Cross-entropy of each query against the blocks of the batch, its own block being the target.
        logits (`torch.FloatTensor` of shape `(batch_size, batch_size)`):
            Query · block scores; entry `(i, j)` scores block `j` for query `i`.
        query_embeddings (`torch.FloatTensor` of shape `(batch_size, retriever_proj_size)`)
        block_embeddings (`torch.FloatTensor` of shape `(batch_size, retriever_proj_size)`)
    """

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    query_embeddings: torch.FloatTensor | None = None
    block_embeddings: torch.FloatTensor | None = None


class RealmForInverseClozeTask(RealmQueryEmbedderMixin, RealmPreTrainedModel):
    r"""
    Inverse Cloze Task warm start of REALM's retriever: a sentence should retrieve the block it came from, against the
    other blocks of the batch (in-batch softmax over q·d). Without it the retriever starts random, retrieves nothing
    useful and so gets no useful gradient from the masked-LM loss (the paper's "cold start" problem).

    Submodules `query_embedder` and `embedder` (document embedder, also `document_embedder`), both
    [`RealmEmbedder`]; with `config.share_query_document_embedder=True` (the legacy layout) `query_embedder` is
    `embedder`. Initialise them from BERT with [`~realm_hf.models.initialization.init_from_bert`], train with
    [`DataCollatorForInverseClozeTask`], then hand them to [`RealmForPreTraining.load_ict_embedders`] (or write them
    with [`~RealmForInverseClozeTask.export_embedders`]).

    Args:
        config ([`RealmConfig`]): Model configuration.

    Example:

    ```python
    >>> from realm_hf.models.initialization import init_from_bert
    >>> from realm_hf.training.ict import DataCollatorForInverseClozeTask, RealmForInverseClozeTask

    >>> model = init_from_bert(RealmForInverseClozeTask, "path/to/bert", share_query_document_embedder=False)
    >>> batch = DataCollatorForInverseClozeTask(tokenizer, seed=0)(examples)
    >>> model(**batch).loss.backward()
    ```"""

    # What its model card describes (realm_hf/hub/card_tasks.py).
    model_card_task = "ict"

    def __init__(self, config: RealmConfig):
        super().__init__(config)
        self.embedder = RealmEmbedder(config)
        share = getattr(config, "share_query_document_embedder", None)
        if share is not None and not share:
            # Straight into _modules: the `query_embedder` property makes add_module think the name is taken.
            self._modules["query_embedder"] = RealmEmbedder(config)
        self.post_init()
        # The embedders' legacy MLM heads are never used: no gradient, so DDP need not wait for one.
        for embedder in {id(m): m for m in (self.embedder, self.query_embedder)}.values():
            embedder.cls.predictions.requires_grad_(False)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        block_input_ids: torch.LongTensor | None = None,
        block_attention_mask: torch.Tensor | None = None,
        block_token_type_ids: torch.LongTensor | None = None,
        block_id: torch.LongTensor | None = None,
        return_loss: bool = True,
        return_dict: bool | None = None,
        **kwargs,
    ) -> tuple | RealmForInverseClozeTaskOutput:
        r"""
        input_ids (`torch.LongTensor` of shape `(batch_size, query_length)`): The query sentences.
        block_input_ids (`torch.LongTensor` of shape `(batch_size, block_length)`): Each query's block (row i is
            the positive of query i and a negative of the others).
        block_id (`torch.LongTensor` of shape `(batch_size,)`, *optional*): Corpus block ids: another row of the
            batch from the same block is not counted as a negative.
        return_loss (`bool`, *optional*, defaults to `True`): Compute the in-batch loss.

        Returns:
            [`RealmForInverseClozeTaskOutput`]
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        if input_ids is None or block_input_ids is None:
            raise ValueError("`input_ids` (queries) and `block_input_ids` (blocks) are both required.")
        query_embeddings = self.query_embedder(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, return_dict=True
        ).projected_score
        block_embeddings = self.embedder(
            input_ids=block_input_ids,
            attention_mask=block_attention_mask,
            token_type_ids=block_token_type_ids,
            return_dict=True,
        ).projected_score
        logits = query_embeddings @ block_embeddings.transpose(0, 1)
        if block_id is not None:
            # Two rows from one block: the other copy is a positive, not a negative, so it leaves the softmax.
            block_id = block_id.view(-1).to(logits.device)
            same = (block_id.unsqueeze(0) == block_id.unsqueeze(1)) & ~torch.eye(
                len(block_id), dtype=torch.bool, device=logits.device
            )
            logits = logits.masked_fill(same, torch.finfo(logits.dtype).min)
        loss = None
        if return_loss:
            targets = torch.arange(logits.shape[0], device=logits.device)
            loss = nn.functional.cross_entropy(logits, targets)
        output = RealmForInverseClozeTaskOutput(
            loss=loss, logits=logits, query_embeddings=query_embeddings, block_embeddings=block_embeddings
        )
        return output if return_dict else output.to_tuple()

    def save_pretrained(self, save_directory, *args, model_card: bool = True, save_retriever: bool = False, **kwargs):
        r"""
        Save weights and config all at once or not at all (see [`RealmPreTrainedModel.save_pretrained`]), with
        realm-hf's model card (an ICT warm-start card).

        Args:
            model_card (`bool`, *optional*, defaults to `True`): Write (or update) the README.md model card; text
                written by hand in an existing card is kept, and transformers' draft Trainer card is replaced.
            save_retriever (`bool`, *optional*, defaults to `False`): Accepted as the other REALM models take it (an
                ICT model has no retriever), so that [`realm_hf.hub.repositories.push_to_hub`] saves it like them.
        """
        write_card = self._card_writer(save_directory) if model_card else None
        self._save_directory(save_directory, args, kwargs, write_extra=write_card)

    def push_to_hub(self, repo_id: str, **kwargs):
        r"""
        Push weights, config, tokenizer (`tokenizer=`) and realm-hf's ICT model card to a Hub repo (transformers' own
        `push_to_hub` would replace the card with a generic one). See [`realm_hf.hub.repositories.push_to_hub`] for the arguments.
        """
        # local import, as in RealmForOpenQA.push_to_hub: needed only to push
        from ..hub.repositories import push_to_hub

        return push_to_hub(self, repo_id, **kwargs)

    def export_embedders(self, save_directory: str | os.PathLike, **save_kwargs) -> dict[str, str]:
        r"""
        Save the embedders as standalone [`RealmEmbedder`] checkpoints: `embedder/` (document) and `query_embedder/`
        (the same weights when shared). [`RealmForPreTraining.load_ict_embedders`] reads this directory; `embedder/`
        is also what builds the first index ([`RealmRetriever.from_documents`]).

        Returns:
            `dict` with the paths of `embedder` and `query_embedder`.
        """
        save_directory = str(save_directory)
        os.makedirs(save_directory, exist_ok=True)
        paths = {}
        for name, module in (("embedder", self.embedder), ("query_embedder", self.query_embedder)):
            config = RealmConfig.from_dict(self.config.to_dict())
            config.architectures = ["RealmEmbedder"]
            standalone = RealmEmbedder(config)
            standalone.load_state_dict(module.state_dict())
            paths[name] = os.path.join(save_directory, name)
            standalone.save_pretrained(paths[name], **save_kwargs)
        return paths


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
    "RealmForInverseClozeTask",
    "RealmForInverseClozeTaskOutput",
    "RealmICTTrainer",
    "split_sentences",
]
