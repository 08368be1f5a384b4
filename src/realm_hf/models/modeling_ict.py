"""
The Inverse Cloze Task (ICT) model of REALM's embedder warm start (Lee et al., 2019, ORQA; used by REALM): a
sentence retrieves the block it came from. Its collator and Trainer are in `training/ict.py`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn
from transformers.utils import ModelOutput

from .configuration_realm import RealmConfig
from .modeling_base import RealmPreTrainedModel
from .modeling_embedder import RealmEmbedder, RealmQueryEmbedderMixin


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
    >>> from realm_hf.models.modeling_ict import RealmForInverseClozeTask
    >>> from realm_hf.training import DataCollatorForInverseClozeTask

    >>> model = init_from_bert(RealmForInverseClozeTask, "path/to/bert", share_query_document_embedder=False)
    >>> batch = DataCollatorForInverseClozeTask(tokenizer, seed=0)(examples)
    >>> model(**batch).loss.backward()
    ```"""

    # What its model card describes (realm_hf/hub/card_content.py).
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


__all__ = ["RealmForInverseClozeTask", "RealmForInverseClozeTaskOutput"]
