"""The retrieval side of REALM: the embedder, its projection head, the query-embedder mixin, the scorer and their outputs."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers.models.bert.modeling_bert import BertLMPredictionHead, BertModel
from transformers.utils import ModelOutput

from .configuration_realm import RealmConfig
from .modeling_base import RealmPreTrainedModel, check_input_shape, check_token_ids, encoder_output_kwargs


@dataclass
class RealmEmbedderOutput(ModelOutput):
    """
    Outputs of [`RealmEmbedder`].

    Args:
        projected_score (`torch.FloatTensor` of shape `(batch_size, config.retriever_proj_size)`):
            The retrieval embedding: the projected, layer-normalised [CLS] pooler output.
        hidden_states (`tuple(torch.FloatTensor)`, *optional*):
            Hidden states of the encoder, when `output_hidden_states=True`.
        attentions (`tuple(torch.FloatTensor)`, *optional*):
            Attention weights, when `output_attentions=True`.
    """

    projected_score: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class RealmScorerOutput(ModelOutput):
    """
    Outputs of [`RealmScorer`].

    Args:
        relevance_score (`torch.FloatTensor` of shape `(batch_size, config.num_candidates)`):
            Relevance score of each candidate (before softmax).
        query_score (`torch.FloatTensor` of shape `(batch_size, config.retriever_proj_size)`):
            Query embeddings.
        candidate_score (`torch.FloatTensor` of shape `(batch_size, config.num_candidates, config.retriever_proj_size)`):
            Candidate embeddings.
    """

    relevance_score: torch.FloatTensor | None = None
    query_score: torch.FloatTensor | None = None
    candidate_score: torch.FloatTensor | None = None


class RealmScorerProjection(nn.Module):
    """Projection of the pooled text vector to the retrieval space (`dense` + `LayerNorm`)."""

    def __init__(self, config):
        super().__init__()
        # Never used in the forward pass, but part of every legacy embedder checkpoint: kept so those load without
        # missing or unexpected keys.
        self.predictions = BertLMPredictionHead(config)
        self.dense = nn.Linear(config.hidden_size, config.retriever_proj_size)
        self.LayerNorm = nn.LayerNorm(config.retriever_proj_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states):
        return self.LayerNorm(self.dense(hidden_states))


class RealmEmbedder(RealmPreTrainedModel):
    r"""
    The REALM embedder (used both as the query embedder and as the document embedder): a BERT encoder whose [CLS]
    pooler output (or mean-pooled last hidden state, `config.retriever_pooling="mean"`) is projected to
    `config.retriever_proj_size` dimensions. Relevance of a document `z` to an input
    `x` is the inner product of their embeddings.

    Example:

    ```python
    >>> from realm_hf import RealmEmbedder, RealmTokenizer

    >>> tokenizer = RealmTokenizer.from_pretrained("path/to/realm-cc-news-pretrained-embedder")
    >>> model = RealmEmbedder.from_pretrained("path/to/realm-cc-news-pretrained-embedder")
    >>> projected_score = model(**tokenizer("Hello, my dog is cute", return_tensors="pt")).projected_score
    ```"""

    _tied_weights_keys = {"cls.predictions.decoder.bias": "cls.predictions.bias"}

    def __init__(self, config: RealmConfig):
        super().__init__(config)
        self.realm = BertModel(config)
        self.cls = RealmScorerProjection(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.realm.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.realm.embeddings.word_embeddings = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> tuple | RealmEmbedderOutput:
        r"""
        Returns:
            [`RealmEmbedderOutput`] with `projected_score` of shape `(batch_size, retriever_proj_size)`.
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        check_token_ids("input_ids", input_ids, self.config)
        if input_ids is not None and input_ids.dim() != 2:
            # BERT failed with "not enough values to unpack (expected 2, got 1)".
            raise ValueError(
                f"`input_ids` has shape {tuple(input_ids.shape)}; the embedder takes (batch_size, seq_len) (one text: "
                "`input_ids[None]`, or the tokenizer with `return_tensors='pt'`)."
            )
        check_input_shape(
            "attention_mask",
            attention_mask,
            tuple(input_ids.shape) if input_ids is not None else (None, None),
            "one entry per token of `input_ids`",
        )
        outputs = self.realm(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            **encoder_output_kwargs(output_attentions, output_hidden_states),
        )
        if self.config.retriever_pooling == "mean":
            # Sentence encoders' own pooling: their [CLS] vector was never trained as a sentence embedding.
            hidden = outputs.last_hidden_state
            if attention_mask is None:
                pooled = hidden.mean(dim=1)
            else:
                mask = attention_mask.to(hidden.dtype).unsqueeze(-1)
                pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        else:
            pooled = outputs.pooler_output
        projected_score = self.cls(pooled)
        if not return_dict:
            return tuple(v for v in (projected_score, outputs.hidden_states, outputs.attentions) if v is not None)
        return RealmEmbedderOutput(
            projected_score=projected_score, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class RealmQueryEmbedderMixin:
    """
    `query_embedder` and `document_embedder` for the models whose `embedder` submodule is the document (block)
    embedder ([`RealmScorer`], [`RealmForPreTraining`], [`RealmForInverseClozeTask`]). The query embedder is a
    separate [`RealmEmbedder`] registered as the `query_embedder` submodule, or else `embedder` itself (shared
    weights, registered once so that its weights are saved once).

    The names mean the same on every REALM model, [`RealmForOpenQA`] included (whose `embedder` is the *question*
    embedder): `query_embedder` embeds questions / masked inputs, `document_embedder` embeds the blocks, and
    `index_embedder` is the one whose vectors fill the index (the document embedder; on an Open-QA model without one,
    the question embedder). `embedder` stays the attribute (and state-dict) name of the legacy checkpoints.
    """

    @property
    def query_embedder(self) -> RealmEmbedder:
        """The embedder of the queries: a separate one, or `embedder` when they are shared."""
        separate = self._modules.get("query_embedder")
        return separate if separate is not None else self.embedder

    @property
    def document_embedder(self) -> RealmEmbedder:
        """The embedder of the blocks (`embedder`): what a re-index must embed the corpus with."""
        return self.embedder

    @property
    def index_embedder(self) -> RealmEmbedder:
        """The embedder that fills the index: the document embedder (`embedder`), as on every REALM model."""
        return self.embedder


class RealmScorer(RealmQueryEmbedderMixin, RealmPreTrainedModel):
    r"""
    The REALM retrieval scorer: embeds an input with the query embedder and `config.num_candidates` candidate blocks
    with the document embedder and returns their inner products, the logits of p(z|x). Used in pre-training to
    re-score retrieved blocks with the current weights, so that the gradient reaches both embedders.

    Submodules: `embedder`, the candidate (document) embedder, also reachable as `document_embedder`; and
    `query_embedder`, the input embedder (the same module as `embedder` unless one is passed).

    Args:
        config ([`RealmConfig`]): Model configuration.
        query_embedder ([`RealmEmbedder`], *optional*):
            Embedder for the inputs. Defaults to the candidate embedder (shared weights), as in the legacy port.
    """

    _tied_weights_keys = {"embedder.cls.predictions.decoder.bias": "embedder.cls.predictions.bias"}

    def __init__(self, config: RealmConfig, query_embedder: RealmEmbedder | None = None):
        super().__init__(config)
        self.embedder = RealmEmbedder(config)
        if query_embedder is not None:
            # Straight into _modules: add_module refuses the name because of the `query_embedder` property.
            self._modules["query_embedder"] = query_embedder
        else:
            # A shared embedder is registered once: legacy checkpoints repeat its weights under `query_embedder.*`,
            # which are the same tensors and are skipped on load.
            self._keys_to_ignore_on_load_unexpected = [r"position_ids", r"^query_embedder\."]
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        candidate_input_ids: torch.LongTensor | None = None,
        candidate_attention_mask: torch.Tensor | None = None,
        candidate_token_type_ids: torch.LongTensor | None = None,
        candidate_inputs_embeds: torch.FloatTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> tuple | RealmScorerOutput:
        r"""
        candidate_input_ids (`torch.LongTensor` of shape `(batch_size, num_candidates, sequence_length)`):
            Candidate blocks, e.g. from [`RealmTokenizer.batch_encode_candidates`].

        Returns:
            [`RealmScorerOutput`] with `relevance_score` of shape `(batch_size, num_candidates)`.
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        if input_ids is None and inputs_embeds is None:
            raise ValueError("You have to specify either input_ids or inputs_embeds.")
        if candidate_input_ids is None and candidate_inputs_embeds is None:
            raise ValueError("You have to specify either candidate_input_ids or candidate_inputs_embeds.")

        query_batch = input_ids.shape[0] if input_ids is not None else inputs_embeds.shape[0]
        candidates = candidate_input_ids if candidate_input_ids is not None else candidate_inputs_embeds[..., 0]
        # One query against another query's candidates broadcast in silence in the einsum below (batch 1 against 2).
        check_input_shape(
            "candidate_input_ids",
            candidates,
            (query_batch, None, None),
            "(batch_size, num_candidates, seq_len): each query's candidate blocks, the batch size of `input_ids`",
        )
        encoder_kwargs = encoder_output_kwargs(output_attentions, output_hidden_states)
        query_score = self.query_embedder(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            return_dict=True,
            **encoder_kwargs,
        ).projected_score

        num_candidates = (
            candidate_input_ids.shape[1] if candidate_input_ids is not None else candidate_inputs_embeds.shape[1]
        )
        flat_ids, flat_mask, flat_types = self._flatten_inputs(
            candidate_input_ids, candidate_attention_mask, candidate_token_type_ids
        )
        if candidate_inputs_embeds is not None:
            candidate_inputs_embeds = candidate_inputs_embeds.reshape(-1, *candidate_inputs_embeds.shape[-2:])
        candidate_score = self.embedder(
            flat_ids,
            attention_mask=flat_mask,
            token_type_ids=flat_types,
            inputs_embeds=candidate_inputs_embeds,
            return_dict=True,
            **encoder_kwargs,
        ).projected_score
        candidate_score = candidate_score.view(-1, num_candidates, self.config.retriever_proj_size)
        relevance_score = torch.einsum("bd,bnd->bn", query_score, candidate_score)
        if not return_dict:
            return relevance_score, query_score, candidate_score
        return RealmScorerOutput(
            relevance_score=relevance_score, query_score=query_score, candidate_score=candidate_score
        )
