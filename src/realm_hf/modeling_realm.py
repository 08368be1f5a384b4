"""PyTorch REALM models, built from transformers' BERT blocks with the legacy checkpoint keys."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import CrossEntropyLoss
from transformers import PreTrainedModel
from transformers.activations import GELUTanh, NewGELUActivation
from transformers.modeling_outputs import MaskedLMOutput
from transformers.models.bert.modeling_bert import BertEmbeddings, BertLMPredictionHead, BertModel, BertOnlyMLMHead
from transformers.utils import ModelOutput

from .configuration_realm import RealmConfig
from .constants import LEGACY_BLOCK_RECORDS, RETRIEVER_SUBFOLDER
from .provenance import answer_record, block_provenance, span_log_probs
from .reader_inputs import RealmReaderInputs, build_reader_inputs, normalize_answer_ids, tokenize_answers
from .retrieval.encoding import tokenize_blocks
from .retrieval.legacy import load_legacy_block_emb, pickle_allowed

logger = logging.getLogger(__name__)

# Where a RealmForOpenQA directory keeps its corpus, index and manifest.


# --------------------------------------------------------------------------------------------------------------------
# Outputs (same names and fields as the legacy port, plus batched Open-QA outputs)
# --------------------------------------------------------------------------------------------------------------------


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


@dataclass
class RealmReaderOutput(ModelOutput):
    """
    Outputs of [`RealmReader`]. For the legacy single-question input (2-D `input_ids`) the predictions are scalars as
    in the legacy port; for batched input (3-D `input_ids`) they have a leading `batch_size` dimension.

    Args:
        loss (`torch.FloatTensor` of shape `()`, *optional*):
            Mean over questions of retriever loss + reader loss (when gold positions are given).
        retriever_loss (`torch.FloatTensor`, *optional*):
            Marginal log-likelihood loss of the retrieval scores over the blocks that contain an answer.
        reader_loss (`torch.FloatTensor`, *optional*):
            Marginal log-likelihood loss of the span scores over the gold spans.
        retriever_correct (`torch.BoolTensor` of shape `([batch_size,] searcher_beam_size)`, *optional*):
            Whether each block contains an answer.
        reader_correct (`torch.BoolTensor` of shape `([batch_size,] reader_beam_size, num_candidates)`, *optional*):
            Whether each span candidate is a gold span.
        block_idx (`torch.LongTensor`):
            Index (among the read blocks) of the block holding the best span.
        candidate (`torch.LongTensor`):
            Index of the best span candidate.
        start_pos (`torch.LongTensor`):
            Start of the best span in the reader input.
        end_pos (`torch.LongTensor`):
            End (inclusive) of the best span in the reader input.
        reader_logits (`torch.FloatTensor` of shape `([batch_size,] reader_beam_size, num_candidates)`):
            Span scores (retrieval score of the block added), masked outside the block.
        candidate_starts, candidate_ends (`torch.LongTensor` of shape `(num_candidates,)`):
            Start and end position of each span candidate.
        hidden_states, attentions: As in [`RealmEmbedderOutput`].
    """

    loss: torch.FloatTensor | None = None
    retriever_loss: torch.FloatTensor | None = None
    reader_loss: torch.FloatTensor | None = None
    retriever_correct: torch.BoolTensor | None = None
    reader_correct: torch.BoolTensor | None = None
    block_idx: torch.LongTensor | None = None
    candidate: torch.LongTensor | None = None
    start_pos: torch.LongTensor | None = None
    end_pos: torch.LongTensor | None = None
    reader_logits: torch.FloatTensor | None = None
    candidate_starts: torch.LongTensor | None = None
    candidate_ends: torch.LongTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class RealmForOpenQAOutput(ModelOutput):
    """
    Outputs of [`RealmForOpenQA`].

    Args:
        loss (`torch.FloatTensor` of shape `()`, *optional*):
            The legacy marginal loss (retriever + reader), averaged over questions, when answers are given.
        reader_output ([`RealmReaderOutput`]):
            The reader's output for the whole batch.
        predicted_answer_ids (`torch.LongTensor` or `list[torch.LongTensor]`):
            Wordpiece ids of each predicted answer. For a single question this is one tensor, as in the legacy port.
        predicted_answers (`list[str]`):
            Each predicted answer, cut from its block's original text (casing and punctuation kept).
        answer_scores (`torch.FloatTensor` of shape `(batch_size,)`):
            Score of each predicted answer (span logit + retrieval score of its block).
        answer_block_ids (`torch.LongTensor` of shape `(batch_size,)`):
            Corpus id of the block each answer was read from.
        answer_char_spans (`list[tuple[int, int]]`):
            Character offsets `(start, end)` of each answer in its block's text.
        retrieved_block_ids (`torch.LongTensor` of shape `(batch_size, k)`):
            Corpus ids of the retrieved blocks, best first.
        retrieved_scores (`torch.FloatTensor` of shape `(batch_size, k)`):
            Retrieval scores (question · block inner products) of the retrieved blocks.
        retrieved_blocks (`list[list[dict]]`):
            The retrieved blocks (`block_id`, `title`, `text`, `score` and the corpus's other columns): the answers'
            provenance.
        reader_input_ids (`torch.LongTensor` of shape `(batch_size, num_read_blocks, sequence_length)`):
            The reader's (question, block) pairs as the forward tokenized them, so that a caller can cut answers from
            other spans than the best one without tokenizing the pairs again.
        reader_offset_mapping (`torch.LongTensor` of shape `(batch_size, num_read_blocks, seq_len, 2)`, *optional*):
            Character offsets of each token of `reader_input_ids` in its segment (question or block text); `None`
            with a slow tokenizer.
    """

    loss: torch.FloatTensor | None = None
    reader_output: RealmReaderOutput | None = None
    predicted_answer_ids: Any = None
    predicted_answers: list[str] | None = None
    answer_scores: torch.FloatTensor | None = None
    answer_block_ids: torch.LongTensor | None = None
    answer_char_spans: list[tuple[int, int]] | None = None
    retrieved_block_ids: torch.LongTensor | None = None
    retrieved_scores: torch.FloatTensor | None = None
    retrieved_blocks: list[list[dict]] | None = None
    reader_input_ids: torch.LongTensor | None = None
    reader_offset_mapping: torch.LongTensor | None = None


# --------------------------------------------------------------------------------------------------------------------
# Heads
# --------------------------------------------------------------------------------------------------------------------


class RealmScorerProjection(nn.Module):
    """Projection of the [CLS] pooler output to the retrieval space (`dense` + `LayerNorm`)."""

    def __init__(self, config):
        super().__init__()
        # Never used in the forward pass, but part of every legacy embedder checkpoint: kept so those load without
        # missing or unexpected keys.
        self.predictions = BertLMPredictionHead(config)
        self.dense = nn.Linear(config.hidden_size, config.retriever_proj_size)
        self.LayerNorm = nn.LayerNorm(config.retriever_proj_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states):
        return self.LayerNorm(self.dense(hidden_states))


def _mask_to_score(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (1.0 - mask.type(dtype)) * torch.finfo(dtype).min


def _span_candidates(max_sequence_len: int, max_span_width: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    # Same enumeration order as the legacy reader (all width-1 spans, then width-2, ...), so candidate indices match.
    starts, ends = [], []
    for width in range(1, max_span_width + 1):
        starts.append(torch.arange(max_sequence_len - width + 1, device=device))
        ends.append(torch.arange(width - 1, max_sequence_len, device=device))
    return torch.cat(starts, 0), torch.cat(ends, 0)


def _full_candidate_index(
    starts: torch.Tensor, ends: torch.Tensor, full_len: int, max_span_width: int
) -> torch.Tensor:
    """Positions of the spans `(starts, ends)` in the candidate enumeration of a `full_len`-long sequence."""
    # The enumeration is width-major: width w holds full_len - w + 1 spans, ordered by start.
    sizes = [full_len - width + 1 for width in range(1, max_span_width)]
    offsets = torch.tensor([0] + sizes, device=starts.device).cumsum(0)
    return offsets[ends - starts] + starts


class RealmReaderProjection(nn.Module):
    """Scores every span of at most `config.max_span_width` wordpieces that lies inside the block."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.dense_intermediate = nn.Linear(config.hidden_size, config.span_hidden_size * 2)
        self.dense_output = nn.Linear(config.span_hidden_size, 1)
        self.layer_normalization = nn.LayerNorm(config.span_hidden_size, eps=config.reader_layer_norm_eps)
        self.relu = nn.ReLU()

    def forward(self, hidden_states, block_mask):
        """
        Args:
            hidden_states (`torch.FloatTensor` of shape `(num_rows, seq_len, hidden_size)`)
            block_mask (`torch.BoolTensor` of shape `(num_rows, seq_len)`)

        Returns:
            `(reader_logits, candidate_starts, candidate_ends)` of shapes `(num_rows, num_candidates)`,
            `(num_candidates,)`, `(num_candidates,)`.
        """
        max_sequence_len = block_mask.shape[-1]
        starts, ends = _span_candidates(max_sequence_len, self.config.max_span_width, block_mask.device)
        span_mask = torch.index_select(block_mask, -1, starts) * torch.index_select(block_mask, -1, ends)

        start_projection, end_projection = self.dense_intermediate(hidden_states).chunk(2, dim=-1)
        candidate_hidden = torch.index_select(start_projection, 1, starts) + torch.index_select(
            end_projection, 1, ends
        )
        candidate_hidden = self.layer_normalization(self.relu(candidate_hidden))
        reader_logits = self.dense_output(candidate_hidden).squeeze(-1)
        reader_logits = reader_logits + _mask_to_score(span_mask, reader_logits.dtype)
        return reader_logits, starts, ends


def _marginal_log_loss(logits: torch.Tensor, is_correct: torch.Tensor) -> torch.Tensor:
    """Negative log of the probability mass on the correct entries (last dimension)."""
    log_numerator = torch.logsumexp(logits + _mask_to_score(is_correct, logits.dtype), dim=-1)
    log_denominator = torch.logsumexp(logits, dim=-1)
    return log_denominator - log_numerator


# --------------------------------------------------------------------------------------------------------------------
# Base class
# --------------------------------------------------------------------------------------------------------------------


class RealmPreTrainedModel(PreTrainedModel):
    """Base class of the REALM models: weight initialisation, config class and loading details."""

    config_class = RealmConfig
    base_model_prefix = "realm"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _no_split_modules = ["BertEmbeddings", "BertLayer"]
    # Old checkpoints may carry the (non-persistent nowadays) position_ids buffer.
    _keys_to_ignore_on_load_unexpected = [r"position_ids"]
    # Our losses are means (the legacy ones) and ignore `num_items_in_batch`: without this, `Trainer` sees `**kwargs`
    # in `forward`, assumes a summed loss and multiplies it by the number of processes under DDP.
    accepts_loss_kwargs = False

    def post_init(self):
        super().post_init()
        _fuse_gelu_new(self)

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, BertLMPredictionHead):
            module.bias.zero_()
        elif isinstance(module, BertEmbeddings):
            module.position_ids.copy_(torch.arange(module.position_ids.shape[-1]).expand((1, -1)))
            module.token_type_ids.zero_()

    @staticmethod
    def _flatten_inputs(*inputs):
        """Flatten `(batch, num_candidates, seq)` tensors to `(batch * num_candidates, seq)`."""
        return [t.reshape(-1, t.shape[-1]) if t is not None and t.dim() > 2 else t for t in inputs]


def _fuse_gelu_new(model: nn.Module) -> None:
    """
    REALM's configs use `gelu_new`, which transformers computes as five separate element-wise tensor ops in Python;
    `gelu(approximate="tanh")` is the same function in one fused kernel (a fifth of the reader's CPU time at batch 16).
    """
    for module in model.modules():
        for name, child in module.named_children():
            if isinstance(child, NewGELUActivation):
                setattr(module, name, GELUTanh())


def _encoder_kwargs(output_attentions, output_hidden_states):
    kwargs = {}
    if output_attentions is not None:
        kwargs["output_attentions"] = output_attentions
    if output_hidden_states is not None:
        kwargs["output_hidden_states"] = output_hidden_states
    return kwargs


# --------------------------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------------------------


class RealmEmbedder(RealmPreTrainedModel):
    r"""
    The REALM embedder (used both as the query embedder and as the document embedder): a BERT encoder whose [CLS]
    pooler output is projected to `config.retriever_proj_size` dimensions. Relevance of a document `z` to an input
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
        outputs = self.realm(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            **_encoder_kwargs(output_attentions, output_hidden_states),
        )
        projected_score = self.cls(outputs.pooler_output)
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

    Both names mean the same on every REALM model, [`RealmForOpenQA`] included (whose `embedder` is the *question*
    embedder): `query_embedder` embeds questions / masked inputs, `document_embedder` embeds the blocks whose
    vectors fill the index. `embedder` stays the attribute (and state-dict) name of the legacy checkpoints.
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

        encoder_kwargs = _encoder_kwargs(output_attentions, output_hidden_states)
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


def realm_marginal_mlm_loss(
    prediction_scores: torch.Tensor,
    labels: torch.LongTensor,
    relevance_score: torch.Tensor,
    mlm_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""
    REALM's marginal masked-LM loss: -mean over masked tokens of log sum_z p(z|x) p(y|z,x).

    Args:
        prediction_scores (`torch.FloatTensor` of shape `(batch_size * num_candidates, seq_len, vocab_size)`)
        labels (`torch.LongTensor` of shape `(batch_size, seq_len)`): -100 where there is nothing to predict.
        relevance_score (`torch.FloatTensor` of shape `(batch_size, num_candidates)`): logits of p(z|x).
        mlm_mask (`torch.Tensor` of shape `(batch_size, seq_len)`, *optional*): which positions count.
    """
    batch_size, seq_length = labels.shape
    num_candidates = relevance_score.shape[-1]
    mlm_mask = torch.ones_like(labels, dtype=torch.float32) if mlm_mask is None else mlm_mask.type(torch.float32)
    loss_fct = CrossEntropyLoss(reduction="none")
    mlm_logits = prediction_scores.reshape(-1, prediction_scores.shape[-1])
    mlm_targets = labels.tile(1, num_candidates).view(-1)
    masked_lm_log_prob = -loss_fct(mlm_logits, mlm_targets).view(batch_size, num_candidates, seq_length)
    candidate_log_prob = relevance_score.log_softmax(-1).unsqueeze(-1)
    marginal_gold_log_probs = (candidate_log_prob + masked_lm_log_prob).logsumexp(1)
    return -torch.nansum(torch.sum(marginal_gold_log_probs * mlm_mask) / torch.sum(mlm_mask))


class RealmKnowledgeAugEncoder(RealmPreTrainedModel):
    r"""
    The knowledge-augmented encoder of REALM: a BERT masked-LM run on each (input, retrieved block) pair, with the
    marginal masked-LM loss over the blocks weighted by their retrieval probabilities.
    """

    _tied_weights_keys = {
        "cls.predictions.decoder.weight": "realm.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }

    def __init__(self, config: RealmConfig):
        super().__init__(config)
        self.realm = BertModel(config)
        self.cls = BertOnlyMLMHead(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.realm.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.realm.embeddings.word_embeddings = value

    def get_output_embeddings(self):
        return self.cls.predictions.decoder

    def set_output_embeddings(self, new_embeddings):
        self.cls.predictions.decoder = new_embeddings
        self.cls.predictions.bias = new_embeddings.bias

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        relevance_score: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        mlm_mask: torch.LongTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> tuple | MaskedLMOutput:
        r"""
        input_ids (`torch.LongTensor` of shape `(batch_size, num_candidates, sequence_length)`):
            Each input joined with each of its candidate blocks.
        relevance_score (`torch.FloatTensor` of shape `(batch_size, num_candidates)`, *optional*):
            Retrieval logits of the candidates; required with `labels`.
        labels (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
            Masked-LM targets, -100 where there is nothing to predict.
        mlm_mask (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
            Positions counted in the loss.

        Returns:
            [`~transformers.modeling_outputs.MaskedLMOutput`]; `logits` of shape
            `(batch_size * num_candidates, sequence_length, vocab_size)`.
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        if labels is not None and relevance_score is None:
            raise ValueError(
                "You have to specify `relevance_score` when `labels` is specified in order to compute loss."
            )
        flat_ids, flat_mask, flat_types = self._flatten_inputs(input_ids, attention_mask, token_type_ids)
        if inputs_embeds is not None and inputs_embeds.dim() > 3:
            inputs_embeds = inputs_embeds.reshape(-1, *inputs_embeds.shape[-2:])
        outputs = self.realm(
            flat_ids,
            attention_mask=flat_mask,
            token_type_ids=flat_types,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            **_encoder_kwargs(output_attentions, output_hidden_states),
        )
        prediction_scores = self.cls(outputs.last_hidden_state)
        masked_lm_loss = None
        if labels is not None:
            masked_lm_loss = realm_marginal_mlm_loss(prediction_scores, labels, relevance_score, mlm_mask)
        if not return_dict:
            output = tuple(v for v in (prediction_scores, outputs.hidden_states, outputs.attentions) if v is not None)
            return ((masked_lm_loss,) + output) if masked_lm_loss is not None else output
        return MaskedLMOutput(
            loss=masked_lm_loss,
            logits=prediction_scores,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


class RealmReader(RealmPreTrainedModel):
    r"""
    The REALM reader: a BERT encoder over `[CLS] question [SEP] block [SEP]` that scores every span of at most
    `config.max_span_width` wordpieces inside the block; the block's retrieval score is added to its span scores.

    Takes either the legacy single-question layout (`input_ids` of shape `(reader_beam_size, seq_len)`,
    `relevance_score` of shape `(searcher_beam_size,)`) or a batch of questions (`input_ids` of shape
    `(batch_size, reader_beam_size, seq_len)`, `relevance_score` of shape `(batch_size, searcher_beam_size)`).
    """

    _tied_weights_keys = {"cls.predictions.decoder.bias": "cls.predictions.bias"}

    def __init__(self, config: RealmConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.realm = BertModel(config)
        # The reader never predicts tokens, but legacy reader checkpoints hold this head.
        self.cls = BertOnlyMLMHead(config)
        self.qa_outputs = RealmReaderProjection(config)
        # Rows (question, block pairs) are read in groups of similar length of at most this many tokens, each
        # padded only to its own longest row; `None` reads all rows in one padded batch.
        self.max_tokens_per_chunk: int | None = 4096
        self.post_init()

    def _read_rows(self, flat_ids, flat_mask, flat_types, flat_block_mask, encoder_kwargs):
        """
        Encode the flattened rows and score their spans. With right-padded rows of different lengths, rows are
        sorted by length and read in chunks padded to their own length: a batch of questions then costs what its
        rows need rather than `rows x longest row`, and the span tensors (rows x spans x span_hidden_size) stay
        small. Returns `(sequence_output or None, reader_logits, candidate_starts, candidate_ends)`.
        """
        num_rows, seq_len = flat_block_mask.shape
        lengths = flat_mask.sum(-1) if flat_mask is not None else None
        chunked = (
            self.max_tokens_per_chunk is not None
            and flat_ids is not None
            and lengths is not None
            and not encoder_kwargs.get("output_attentions")
            and not encoder_kwargs.get("output_hidden_states")
            and num_rows * seq_len > self.max_tokens_per_chunk
            # Right padding only: every row's mask is a prefix of ones.
            and bool((flat_mask == (torch.arange(seq_len, device=flat_mask.device) < lengths.unsqueeze(-1))).all())
        )
        if not chunked:
            outputs = self.realm(flat_ids, attention_mask=flat_mask, token_type_ids=flat_types, **encoder_kwargs)
            logits, starts, ends = self.qa_outputs(outputs.last_hidden_state, flat_block_mask)
            return outputs, logits, starts, ends

        width = self.config.max_span_width
        starts, ends = _span_candidates(seq_len, width, flat_block_mask.device)
        reader_logits = None
        order = torch.argsort(lengths, descending=True).tolist()
        lengths = lengths.tolist()
        begin = 0
        while begin < num_rows:
            # Rows are sorted longest first: the chunk's first row sets its padded length.
            chunk_len = min(seq_len, max(width, int(lengths[order[begin]])))
            size = max(1, self.max_tokens_per_chunk // chunk_len)
            rows = torch.tensor(order[begin : begin + size], device=flat_block_mask.device)
            begin += size
            outputs = self.realm(
                flat_ids[rows, :chunk_len],
                attention_mask=flat_mask[rows, :chunk_len],
                token_type_ids=flat_types[rows, :chunk_len] if flat_types is not None else None,
                **encoder_kwargs,
            )
            logits, chunk_starts, chunk_ends = self.qa_outputs(
                outputs.last_hidden_state, flat_block_mask[rows, :chunk_len]
            )
            if reader_logits is None:
                # Spans beyond a chunk's length lie in padding: masked, as the one-batch path masks them.
                reader_logits = torch.full(
                    (num_rows, starts.shape[0]),
                    torch.finfo(logits.dtype).min,
                    dtype=logits.dtype,
                    device=logits.device,
                )
            columns = _full_candidate_index(chunk_starts, chunk_ends, seq_len, width)
            reader_logits[rows.unsqueeze(-1), columns.unsqueeze(0)] = logits
        return None, reader_logits, starts, ends

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
        relevance_score: torch.FloatTensor | None = None,
        block_mask: torch.BoolTensor | None = None,
        start_positions: torch.LongTensor | None = None,
        end_positions: torch.LongTensor | None = None,
        has_answers: torch.BoolTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> tuple | RealmReaderOutput:
        r"""
        relevance_score (`torch.FloatTensor` of shape `([batch_size,] searcher_beam_size)`):
            Retrieval logits of the blocks; the first `reader_beam_size` are the blocks in `input_ids`.
        block_mask (`torch.BoolTensor` of shape `([batch_size,] searcher_beam_size, sequence_length)`):
            True on block wordpieces (where answer spans may lie).
        start_positions, end_positions (`torch.LongTensor` of shape `([batch_size,] searcher_beam_size, num_answers)`, *optional*):
            Gold answer positions in each block, -1 for padding.
        has_answers (`torch.BoolTensor` of shape `([batch_size,] searcher_beam_size)`, *optional*):
            Whether each block contains an answer.

        Returns:
            [`RealmReaderOutput`]
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        if relevance_score is None:
            raise ValueError("You have to specify `relevance_score` to calculate logits and loss.")
        if block_mask is None:
            raise ValueError("You have to specify `block_mask` to separate question block and evidence block.")
        reference = input_ids if input_ids is not None else inputs_embeds[..., 0]
        single = reference.dim() == 2
        if single:
            # Legacy layout: one question, its blocks along the first axis.
            input_ids, attention_mask, token_type_ids, inputs_embeds = (
                t.unsqueeze(0) if t is not None else None
                for t in (input_ids, attention_mask, token_type_ids, inputs_embeds)
            )
            relevance_score, block_mask, start_positions, end_positions, has_answers = (
                t.unsqueeze(0) if t is not None else None
                for t in (relevance_score, block_mask, start_positions, end_positions, has_answers)
            )
        batch_size, reader_beam_size, seq_len = (input_ids if input_ids is not None else inputs_embeds[..., 0]).shape
        if seq_len < self.config.max_span_width:
            raise ValueError("The input sequence length must be greater than or equal to config.max_span_width.")

        flat_ids, flat_mask, flat_types = self._flatten_inputs(input_ids, attention_mask, token_type_ids)
        flat_block_mask = block_mask[:, :reader_beam_size].reshape(-1, seq_len)
        encoder_kwargs = _encoder_kwargs(output_attentions, output_hidden_states)
        if inputs_embeds is not None or position_ids is not None:
            if inputs_embeds is not None:
                inputs_embeds = inputs_embeds.reshape(-1, *inputs_embeds.shape[-2:])
            outputs = self.realm(
                flat_ids,
                attention_mask=flat_mask,
                token_type_ids=flat_types,
                position_ids=position_ids,
                inputs_embeds=inputs_embeds,
                **encoder_kwargs,
            )
            reader_logits, candidate_starts, candidate_ends = self.qa_outputs(
                outputs.last_hidden_state, flat_block_mask
            )
        else:
            outputs, reader_logits, candidate_starts, candidate_ends = self._read_rows(
                flat_ids, flat_mask, flat_types, flat_block_mask, encoder_kwargs
            )
        num_candidates = candidate_starts.shape[0]
        # [batch, reader_beam, num_candidates]: span score + retrieval score of its block.
        reader_logits = reader_logits.view(batch_size, reader_beam_size, num_candidates)
        # Span and retrieval logits in at least fp32, also under bf16/fp16 autocast: the marginals over spans and
        # blocks compare logits that differ by less than half precision resolves.
        logit_dtype = torch.promote_types(reader_logits.dtype, torch.float32)
        reader_logits = reader_logits.to(logit_dtype) + relevance_score[:, :reader_beam_size].unsqueeze(-1).to(
            logit_dtype
        )

        flat_best = reader_logits.reshape(batch_size, -1).argmax(-1)
        predicted_block_index = torch.div(flat_best, num_candidates, rounding_mode="floor")
        predicted_candidate = flat_best % num_candidates
        predicted_start = candidate_starts[predicted_candidate]
        predicted_end = candidate_ends[predicted_candidate]

        total_loss = retriever_loss = reader_loss = retriever_correct = reader_correct = None
        if start_positions is not None and end_positions is not None and has_answers is not None:
            # Positions beyond the input are ignored; -1 marks "no answer".
            start_positions = start_positions.clamp(-1, seq_len)
            end_positions = end_positions.clamp(-1, seq_len)
            retriever_correct = has_answers.bool()
            # [batch, reader_beam, num_answers, num_candidates]
            is_gold_start = candidate_starts.view(1, 1, 1, -1) == start_positions[:, :reader_beam_size].unsqueeze(-1)
            is_gold_end = candidate_ends.view(1, 1, 1, -1) == end_positions[:, :reader_beam_size].unsqueeze(-1)
            reader_correct = (is_gold_start & is_gold_end).any(2)

            retriever_loss = _marginal_log_loss(relevance_score, retriever_correct)
            retriever_loss = retriever_loss * retriever_correct.any(-1).type(retriever_loss.dtype)
            reader_loss = _marginal_log_loss(
                reader_logits.reshape(batch_size, -1), reader_correct.reshape(batch_size, -1)
            )
            reader_loss = reader_loss * reader_correct.reshape(batch_size, -1).any(-1).type(reader_loss.dtype)
            total_loss = (retriever_loss + reader_loss).mean()

        if single:
            squeeze = lambda t: t.squeeze(0) if t is not None else None  # noqa: E731
            retriever_loss, reader_loss = squeeze(retriever_loss), squeeze(reader_loss)
            retriever_correct, reader_correct = squeeze(retriever_correct), squeeze(reader_correct)
            reader_logits = squeeze(reader_logits)
            predicted_block_index, predicted_candidate = predicted_block_index[0], predicted_candidate[0]
            # The legacy reader returned 1-element start/end tensors.
            predicted_start, predicted_end = predicted_start[:1], predicted_end[:1]

        if not return_dict:
            output = (predicted_block_index, predicted_candidate, predicted_start, predicted_end)
            if total_loss is not None:
                return (total_loss, retriever_loss, reader_loss, retriever_correct, reader_correct) + output
            return output
        return RealmReaderOutput(
            loss=total_loss,
            retriever_loss=retriever_loss,
            reader_loss=reader_loss,
            retriever_correct=retriever_correct,
            reader_correct=reader_correct,
            block_idx=predicted_block_index,
            candidate=predicted_candidate,
            start_pos=predicted_start,
            end_pos=predicted_end,
            reader_logits=reader_logits,
            candidate_starts=candidate_starts,
            candidate_ends=candidate_ends,
            hidden_states=outputs.hidden_states if outputs is not None else None,
            attentions=outputs.attentions if outputs is not None else None,
        )


class RealmForOpenQA(RealmPreTrainedModel):
    r"""
    End-to-end open-domain question answering: p(y|x) = sum over the top-k blocks z of p(y|z,x) p(z|x).

    The question is embedded with the question embedder (`query_embedder`, stored as `embedder` as in the legacy
    checkpoints), the top blocks are found by maximum inner product search in the `retriever`'s index (the corpus and
    index live outside the model weights), and `reader` scores answer spans in each (question, block) pair. Answers a
    whole batch of questions in one call. `document_embedder` is the model's own block embedder when it trains one
    end to end ([`~RealmForOpenQA.add_document_embedder`]), else `None`: the index was embedded outside the model.

    Args:
        config ([`RealmConfig`]): Model configuration.
        retriever ([`RealmRetriever`], *optional*):
            The knowledge corpus and its index. Anything with `search(question_embeddings, k)`,
            `get_block_embeddings(block_ids)`, `get_block_texts(block_ids)` and a `tokenizer` works.

    Example:

    ```python
    >>> from realm_hf import RealmForOpenQA, RealmTokenizer

    >>> model = RealmForOpenQA.from_pretrained("path/to/realm-model")  # loads the saved corpus + index too
    >>> tokenizer = RealmTokenizer.from_pretrained("path/to/realm-model")
    >>> questions = ["who wrote the art of computer programming?", "what is a compiler?"]
    >>> outputs = model(**tokenizer(questions, padding=True, return_tensors="pt"), questions=questions)
    >>> outputs.predicted_answers, outputs.retrieved_blocks[0][0]["title"]
    ```"""

    _tied_weights_keys = {
        "embedder.cls.predictions.decoder.bias": "embedder.cls.predictions.bias",
        "reader.cls.predictions.decoder.bias": "reader.cls.predictions.bias",
    }
    # The legacy port kept the whole corpus embedding matrix as a model buffer; it now belongs to the retriever.
    _keys_to_ignore_on_load_unexpected = [r"position_ids", r"^block_emb$"]
    # Blocks per document-embedder call when retrieved blocks are re-embedded with gradient (end-to-end training):
    # caps the size of one call's activations; an attribute, not a config field, as results change only by rounding.
    document_embedding_chunk_size = 64

    def __init__(self, config: RealmConfig, retriever=None):
        super().__init__(config)
        self.embedder = RealmEmbedder(config)
        self.reader = RealmReader(config)
        self.document_embedder = RealmEmbedder(config) if getattr(config, "use_document_embedder", False) else None
        self.set_retriever(retriever)
        self.post_init()

    def get_input_embeddings(self):
        """The question embedder's word embeddings (what PEFT and `resize_token_embeddings` look for)."""
        return self.embedder.get_input_embeddings()

    @property
    def query_embedder(self) -> RealmEmbedder:
        """The question embedder, `embedder` (the name its weights carry in every REALM Open-QA checkpoint)."""
        return self.embedder

    def add_document_embedder(self, embedder: RealmEmbedder | None = None, trainable: bool = True) -> RealmEmbedder:
        r"""
        Give the model its own document embedder, for end-to-end retriever training.

        By default REALM fine-tuning keeps the document embedder frozen: the index holds precomputed block
        embeddings and only the question embedder and reader train. With a document embedder, the top
        `config.document_gradient_beam_size` retrieved blocks of each question (default: the reader beam) are
        re-embedded in the forward pass while training, so the retrieval loss reaches the document side too; the
        rest of the searcher beam is scored with the index's stored embeddings. [`RealmReindexCallback`] refreshes
        the index with its weights.

        Args:
            embedder ([`RealmEmbedder`], *optional*):
                Initial weights, e.g. the pre-trained document embedder that built the index. Defaults to a copy of
                the question embedder (they start equal in REALM's fine-tuning from pre-training).
            trainable (`bool`, *optional*, defaults to `True`): Leave its parameters trainable.
        """
        import copy

        embedder = copy.deepcopy(self.embedder) if embedder is None else embedder
        embedder.requires_grad_(trainable)
        self.document_embedder = embedder
        self.config.use_document_embedder = True
        return embedder

    def freeze_document_embedder(self) -> None:
        """Stop training the document embedder (the paper's fine-tuning setting); the index then stays fresh."""
        if self.document_embedder is not None:
            self.document_embedder.requires_grad_(False)

    def _trains_document_embedder(self) -> bool:
        return (
            self.document_embedder is not None
            and self.training
            and torch.is_grad_enabled()
            and any(p.requires_grad for p in self.document_embedder.parameters())
        )

    def _embed_blocks(self, tokenizer, blocks: list[list[dict]]) -> torch.Tensor:
        """
        Embed retrieved blocks with the live document embedder (with gradient): `[batch, n, proj]` for `n` blocks
        per question. One tokenization for all of them (as the index was embedded), then the embedder runs over
        `document_embedding_chunk_size` blocks at a time: that caps the transient memory of one call (attention
        scores, feed-forward activations); what backward keeps still grows with the number of blocks, which
        `config.document_gradient_beam_size` bounds.
        """
        flat = [block for row in blocks for block in row]
        # The same tokenization and truncation as the index was embedded with.
        encoded = tokenize_blocks(
            tokenizer,
            [block.get("title") for block in flat],
            [block["text"] for block in flat],
            max_length=getattr(self.retriever, "max_block_length", None),
            padding=True,
            return_tensors="pt",
        ).to(self.document_embedder.device)
        chunk = max(1, int(self.document_embedding_chunk_size))
        embeddings = torch.cat(
            [
                self.document_embedder(
                    **{key: value[start : start + chunk] for key, value in encoded.items()}, return_dict=True
                ).projected_score
                for start in range(0, len(flat), chunk)
            ]
        )
        return embeddings.view(len(blocks), len(blocks[0]), -1)

    def _document_gradient_beam_size(self, k: int, reader_beam_size: int | None = None) -> int:
        """
        Blocks per question re-embedded with gradient while the document embedder trains:
        `config.document_gradient_beam_size` (default: the blocks read, `config.reader_beam_size` unless the call
        says otherwise), at most `k` (the searcher beam).
        """
        m = getattr(self.config, "document_gradient_beam_size", None)
        if m is None:
            m = self.config.reader_beam_size if reader_beam_size is None else reader_beam_size
        return max(0, min(int(m), k))

    def _training_block_embeddings(
        self, retriever, tokenizer, search, question_projection, reader_beam_size: int | None = None
    ) -> torch.Tensor:
        """
        Block embeddings `[batch, k, proj]` for the relevance scores while the document embedder trains: fresh ones
        (with gradient) for the first `document_gradient_beam_size` blocks of each question's beam, the index's
        stored ones (no gradient) for the rest.
        """
        k = search.block_ids.shape[1]
        m = self._document_gradient_beam_size(k, reader_beam_size)
        device = question_projection.device
        fresh = self._embed_blocks(tokenizer, [row[:m] for row in search.blocks]).to(device) if m else None
        if fresh is not None and m == k:
            return fresh
        # The top blocks carry the gradient into the document side (REALM's pre-training back-propagates through 8
        # candidates); the stored vectors still give the rest of the beam its place in the retrieval marginal,
        # without activations kept for backward.
        stored = retriever.get_block_embeddings(search.block_ids[:, m:]).to(
            device, fresh.dtype if fresh is not None else question_projection.dtype
        )
        return stored if fresh is None else torch.cat([fresh, stored], dim=1)

    @property
    def searcher_beam_size(self) -> int:
        """Blocks retrieved per question: `searcher_beam_size` while training, `reader_beam_size` otherwise."""
        if self.training:
            return self.config.searcher_beam_size
        return self.config.reader_beam_size

    def set_retriever(self, retriever) -> None:
        """Attach (or replace) the knowledge corpus this model retrieves from; its embedding size must match."""
        check_retriever_dim(retriever, self.config)
        self.retriever = retriever

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path,
        *model_args,
        retriever=None,
        load_retriever: bool = True,
        allow_pickle=False,
        **kwargs,
    ):
        r"""
        Load the model and, unless `retriever` is given or `load_retriever=False`, the knowledge corpus saved with it.

        Besides the usual [`~transformers.PreTrainedModel.from_pretrained`] arguments:

        Args:
            retriever ([`RealmRetriever`], *optional*):
                Corpus to attach instead of the one found in the checkpoint.
            load_retriever (`bool`, *optional*, defaults to `True`):
                Load the saved corpus and index. `False` loads the weights alone (nothing is read, downloaded or
                unpickled for the corpus; `model.retriever` is `None` unless `retriever` is given), e.g. to re-embed
                a corpus, convert weights, or answer from given contexts only.
            allow_pickle (`bool`, *optional*, defaults to `False`):
                For legacy checkpoints only: allow unpickling their `block_records.npy` (only for files you trust).
                Prefer converting once with `realm-hf convert`.
        """
        loaded = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded  # output_loading_info=True gives (model, info)
        if retriever is None and load_retriever:
            retriever = _load_retriever_for(model, pretrained_model_name_or_path, allow_pickle=allow_pickle, **kwargs)
        model.set_retriever(retriever)
        return loaded

    def save_pretrained(self, save_directory, *args, save_retriever: bool = True, model_card: bool = True, **kwargs):
        r"""
        Save the weights and config as usual and, when a retriever is attached, the corpus, FAISS index and
        manifest in `save_directory/retriever/`, so that one directory (or Hub repo) holds everything
        [`~RealmForOpenQA.from_pretrained`] needs to answer questions.

        Args:
            save_retriever (`bool`, *optional*, defaults to `True`): Also save the attached retriever.
            model_card (`bool`, *optional*, defaults to `True`): Write (or update) the README.md model card; text
                written by hand in an existing card is kept.
        """
        super().save_pretrained(save_directory, *args, **kwargs)
        if not kwargs.get("is_main_process", True):
            return
        retriever = self.retriever if save_retriever else None
        if retriever is not None:
            retriever.save_pretrained(os.path.join(save_directory, RETRIEVER_SUBFOLDER))
        if model_card:
            from .modelcard import write_model_card

            write_model_card(save_directory, model=self, retriever=retriever)

    def push_to_hub(self, repo_id: str, **kwargs):
        r"""
        Push weights, config, tokenizer, corpus + FAISS index (`retriever/`) and model card to one Hub repo.
        See [`realm_hf.hub.push_to_hub`] for the arguments (e.g. `tokenizer=`, `private=`, `revision=`).
        """
        from .hub import push_to_hub

        return push_to_hub(self, repo_id, **kwargs)

    def require_retriever(self):
        """
        The attached retriever; raises a `ValueError` that says how to attach one (or, for a legacy checkpoint, how
        to convert it) when there is none.
        """
        if self.retriever is None:
            hint = ""
            if getattr(self, "legacy_block_emb", None) is not None:
                hint = (
                    " This is a legacy checkpoint: its block embeddings were found, but its block texts are in a pickled"
                    " `block_records.npy`. Convert it once with `realm-hf convert <legacy_dir> <output_dir>` (or load"
                    " with `allow_pickle=True` if you trust the file)."
                )
            raise ValueError(
                "RealmForOpenQA has no retriever: build a corpus with `RealmRetriever.from_documents(...)` and pass it"
                " with `model.set_retriever(retriever)` or `from_pretrained(..., retriever=retriever)`." + hint
            )
        return self.retriever

    def _require_retriever(self):
        # The private name earlier releases used (and other modules called); kept for their callers.
        return self.require_retriever()

    def embed_questions(self, input_ids, attention_mask=None, token_type_ids=None) -> torch.FloatTensor:
        """Question embeddings, shape `(batch_size, retriever_proj_size)`."""
        return self.embedder(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, return_dict=True
        ).projected_score

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        answer_ids: list | None = None,
        answers: list[list[str]] | None = None,
        questions: list[str] | None = None,
        num_blocks: int | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> tuple | RealmForOpenQAOutput:
        r"""
        input_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`):
            Tokenized questions.
        answer_ids (`list`, *optional*):
            Gold answers as wordpiece ids: one list of answers (each a list of ids) per question. For a single
            question the legacy form `[answer][token]` is accepted too.
        answers (`list[list[str]]`, *optional*):
            Gold answers as strings, one list per question (alternative to `answer_ids`).
        questions (`list[str]`, *optional*):
            Question texts; if omitted they are decoded from `input_ids` (as the legacy port did).
        num_blocks (`int`, *optional*, defaults to `config.reader_beam_size`):
            Blocks the reader reads per question in this call; in evaluation mode also the blocks retrieved (in
            training mode `config.searcher_beam_size` are retrieved for the retrieval loss). A per-call argument: the
            config is never changed, so concurrent calls with different values do not interfere.

        Returns:
            [`RealmForOpenQAOutput`]
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        if num_blocks is not None and (
            isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1
        ):
            raise ValueError(f"`num_blocks` must be a positive integer, got {num_blocks!r}.")
        reader_beam_size = self.config.reader_beam_size if num_blocks is None else num_blocks
        retriever = self.require_retriever()
        tokenizer = retriever.tokenizer
        if input_ids is None:
            raise ValueError("`input_ids` (the tokenized questions) are required.")
        batch_size = input_ids.shape[0]
        if questions is None:
            questions = [tokenizer.decode(ids, skip_special_tokens=True) for ids in input_ids]
        if len(questions) != batch_size:
            raise ValueError(f"Got {len(questions)} question texts for {batch_size} tokenized questions.")
        if answers is not None:
            if answer_ids is not None:
                raise ValueError("Pass either `answers` or `answer_ids`, not both.")
            if len(answers) != batch_size:
                raise ValueError(f"Got answers for {len(answers)} questions but the batch has {batch_size}.")
            answer_ids = tokenize_answers(tokenizer, answers)
        answer_ids = normalize_answer_ids(answer_ids, batch_size)

        # [batch, proj]
        question_projection = self.embed_questions(input_ids, attention_mask, token_type_ids)
        # Training retrieves the searcher beam for the retrieval loss; inference retrieves what it reads.
        k = min(self.searcher_beam_size if self.training or num_blocks is None else num_blocks, len(retriever))
        search = retriever.search(question_projection.detach(), k)
        block_ids = search.block_ids
        if self._trains_document_embedder():
            # End-to-end: fresh embeddings for the top blocks, so the retrieval loss also trains the document
            # embedder; stored ones for the rest of the beam (memory bounded by `document_gradient_beam_size`).
            block_emb = self._training_block_embeddings(
                retriever, tokenizer, search, question_projection, reader_beam_size
            )
        else:
            # Re-score with the stored block vectors so the loss reaches the question embedder, as the legacy
            # einsum did.
            block_emb = retriever.get_block_embeddings(block_ids).to(question_projection.device)
        # Retrieval logits in at least fp32, also under autocast: the softmax over the searcher beam needs their small
        # differences (bf16 keeps about 3 significant digits).
        score_dtype = torch.promote_types(question_projection.dtype, torch.float32)
        with torch.autocast(question_projection.device.type, enabled=False):
            relevance_score = torch.einsum(
                "bd,bkd->bk", question_projection.to(score_dtype), block_emb.to(score_dtype)
            )

        reader_inputs = build_reader_inputs(
            tokenizer,
            questions,
            retriever.get_block_texts(block_ids),
            answer_ids=answer_ids,
            max_length=self.config.reader_seq_len,
            return_offsets_mapping=getattr(tokenizer, "is_fast", False),
        ).to(self.reader.device)
        reader_beam_size = min(reader_beam_size, k)
        reader_output = self.reader(
            input_ids=reader_inputs.input_ids[:, :reader_beam_size],
            attention_mask=reader_inputs.attention_mask[:, :reader_beam_size],
            token_type_ids=reader_inputs.token_type_ids[:, :reader_beam_size],
            relevance_score=relevance_score,
            block_mask=reader_inputs.block_mask,
            has_answers=reader_inputs.has_answers,
            start_positions=reader_inputs.start_positions,
            end_positions=reader_inputs.end_positions,
            return_dict=True,
        )
        outputs = self._collect_answers(reader_output, reader_inputs, block_ids, relevance_score, search)
        if not return_dict:
            return reader_output, outputs.predicted_answer_ids
        return outputs

    def _collect_answers(
        self, reader_output: RealmReaderOutput, reader_inputs: RealmReaderInputs, block_ids, relevance_score, search
    ) -> RealmForOpenQAOutput:
        batch = torch.arange(block_ids.shape[0], device=reader_output.block_idx.device)
        num_read = reader_output.reader_logits.shape[1]
        answer_scores = reader_output.reader_logits[batch, reader_output.block_idx, reader_output.candidate]
        answer_ids, answer_texts, char_spans = [], [], []
        blocks = search.blocks
        for b in range(block_ids.shape[0]):
            row = int(reader_output.block_idx[b])
            start, end = int(reader_output.start_pos[b]), int(reader_output.end_pos[b])
            answer_ids.append(reader_inputs.input_ids[b, row, start : end + 1])
            if reader_inputs.offset_mapping is not None:
                char_start = int(reader_inputs.offset_mapping[b, row, start, 0])
                char_end = int(reader_inputs.offset_mapping[b, row, end, 1])
                char_spans.append((char_start, char_end))
                answer_texts.append(blocks[b][row]["text"][char_start:char_end])
            else:
                char_spans.append(None)
                answer_texts.append(self.retriever.tokenizer.decode(answer_ids[-1]))
        answer_block_ids = block_ids.to(batch.device)[batch, reader_output.block_idx]
        retrieved_blocks = [
            [dict(block, score=float(score)) for block, score in zip(row_blocks, row_scores)]
            for row_blocks, row_scores in zip(blocks, relevance_score.detach().cpu().tolist())
        ]
        return RealmForOpenQAOutput(
            loss=reader_output.loss,
            reader_output=reader_output,
            predicted_answer_ids=answer_ids[0] if len(answer_ids) == 1 else answer_ids,
            predicted_answers=answer_texts,
            answer_scores=answer_scores,
            answer_block_ids=answer_block_ids,
            answer_char_spans=char_spans,
            retrieved_block_ids=block_ids,
            retrieved_scores=relevance_score,
            retrieved_blocks=retrieved_blocks,
            # The read pairs, so callers (the pipeline's top-k answers) need not tokenize them a second time.
            reader_input_ids=reader_inputs.input_ids[:, :num_read],
            reader_offset_mapping=reader_inputs.offset_mapping[:, :num_read]
            if reader_inputs.offset_mapping is not None
            else None,
        )

    @torch.inference_mode()
    def answer(
        self,
        questions: str | list[str],
        tokenizer=None,
        batch_size: int = 16,
        max_question_length: int = 64,
        num_blocks: int | None = None,
    ):
        r"""
        Answer questions end to end, with provenance in the schema the pipeline and `realm-hf ask --json` share
        (docs/provenance.md).

        Args:
            questions (`str` or `list[str]`): The questions.
            tokenizer (*optional*): Question tokenizer; defaults to the retriever's.
            batch_size (`int`, *optional*, defaults to 16): Questions per forward pass.
            max_question_length (`int`, *optional*, defaults to 64): Questions longer than this many wordpieces are
                refused.
            num_blocks (`int`, *optional*, defaults to `config.reader_beam_size`): Blocks retrieved and read per
                question.

        Returns:
            A `dict` per question (a list of them for a list of questions) with `question`, `answer`, `score` (the
            span's probability over every span of every read block), `logit` (REALM's raw score: span logit +
            retrieval score), `start`, `end` (character offsets in `block["text"]`), `block` (the answer's block, see
            [`~realm_hf.provenance.block_provenance`]) and `retrieved` (every read block, best first, same dicts).
        """
        single = isinstance(questions, str)
        questions = [questions] if single else list(questions)
        tokenizer = tokenizer if tokenizer is not None else self.require_retriever().tokenizer
        check_questions(questions, tokenizer, max_question_length)
        was_training = self.training
        self.eval()
        results = []
        try:
            for start in range(0, len(questions), batch_size):
                chunk = questions[start : start + batch_size]
                inputs = tokenizer(chunk, padding=True, return_tensors="pt").to(self.device)
                out = self(
                    input_ids=inputs["input_ids"],
                    attention_mask=inputs["attention_mask"],
                    token_type_ids=inputs.get("token_type_ids"),
                    questions=chunk,
                    num_blocks=num_blocks,
                )
                reader_output = out.reader_output
                for b, question in enumerate(chunk):
                    row, candidate = int(reader_output.block_idx[b]), int(reader_output.candidate[b])
                    log_probs = span_log_probs(reader_output.reader_logits[b])
                    span = out.answer_char_spans[b]
                    retrieved = [block_provenance(block) for block in out.retrieved_blocks[b]]
                    record = answer_record(
                        out.predicted_answers[b],
                        score=float(log_probs[row, candidate].exp()),
                        logit=float(out.answer_scores[b]),
                        start=span[0] if span else None,
                        end=span[1] if span else None,
                        block=retrieved[row],
                    )
                    results.append({"question": question, **record, "retrieved": retrieved})
        finally:
            self.train(was_training)
        return results[0] if single else results


def check_questions(questions: list[str], tokenizer, max_question_length: int) -> None:
    """Refuse empty or over-long questions with a message that says what to do."""
    if not questions:
        raise ValueError("No questions given.")
    for question in questions:
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"Empty question {question!r}: every question needs some text.")
        length = len(tokenizer(question, add_special_tokens=False)["input_ids"])
        if length > max_question_length:
            raise ValueError(
                f"Question of {length} wordpieces is longer than the limit of {max_question_length} "
                f"({question[:60]!r}...): shorten it or raise `max_question_length`."
            )


def check_retriever_dim(retriever, config: RealmConfig) -> None:
    """Refuse a retriever whose embeddings are not `config.retriever_proj_size`-dimensional (`None` passes)."""
    dim = getattr(retriever, "embedding_dim", None)
    if dim is None or int(dim) == int(config.retriever_proj_size):
        return
    raise ValueError(
        f"This retriever holds {int(dim)}-d embeddings, but the model's embedder projects to "
        f"{config.retriever_proj_size} dimensions (config.retriever_proj_size): its inner products would be "
        "meaningless. Use the corpus built for this model, or re-embed it with this model's embedder "
        "(`retriever.embed_corpus(model.embedder)`)."
    )


def _load_retriever_for(model: RealmForOpenQA, path, allow_pickle: bool = False, **kwargs):
    """Find the corpus that belongs to a checkpoint: a saved `retriever/` folder, or a legacy `block_emb` buffer."""
    path = str(path)
    if not os.path.isdir(path):
        # Hub repos: the hub module knows how to fetch the retriever folder next to the weights.
        try:
            from .hub import load_retriever_from_hub
        except ImportError:
            return None
        return load_retriever_from_hub(
            model,
            path,
            **{k: v for k, v in kwargs.items() if k in ("revision", "cache_dir", "token", "local_files_only")},
        )
    retriever_dir = os.path.join(path, RETRIEVER_SUBFOLDER)
    if os.path.isdir(retriever_dir):
        return load_retriever_for_model(model, retriever_dir)
    block_emb = load_legacy_block_emb(path)
    if block_emb is None:
        # No corpus in the directory: the config may name one (a dataset repo or a local folder).
        from .hub import load_referenced_retriever

        return load_referenced_retriever(
            model, **{k: v for k, v in kwargs.items() if k in ("cache_dir", "token", "local_files_only")}
        )
    if os.path.exists(os.path.join(path, LEGACY_BLOCK_RECORDS)) and pickle_allowed(allow_pickle):
        from transformers import AutoTokenizer

        from .retrieval_realm import RealmRetriever

        tokenizer = AutoTokenizer.from_pretrained(path)
        return RealmRetriever.from_legacy(path, tokenizer=tokenizer, block_emb=block_emb, allow_pickle=True)
    # Keep the embeddings reachable (memory-mapped, not a model buffer) so a converter or retriever can use them.
    model.legacy_block_emb = block_emb
    logger.warning(
        "Legacy REALM checkpoint: its %d block embeddings are available as `model.legacy_block_emb`, but its block "
        "texts are in a pickled block_records.npy, which is not loaded by default. Convert once with "
        "`realm-hf convert %s <output_dir>`, or pass `allow_pickle=True` if you trust the file.",
        block_emb.shape[0],
        path,
    )
    return None


def load_retriever_for_model(model, path: str):
    """Load a saved retriever for `model`, checking it against the embedder that fills its index."""
    from .retrieval_realm import RealmRetriever  # local import: retrieval pulls in faiss and datasets

    # The fingerprint (stale-index warning) only means something against the document embedder: the model's own
    # when it trains one. Otherwise the index came from a separate pre-trained embedder: check the dimension only.
    document_embedder = getattr(model, "document_embedder", None)
    if document_embedder is not None:
        return RealmRetriever.from_pretrained(path, embedder=document_embedder)
    return RealmRetriever.from_pretrained(path, expected_dim=model.config.retriever_proj_size)


__all__ = [
    "RealmEmbedder",
    "RealmEmbedderOutput",
    "RealmForOpenQA",
    "RealmForOpenQAOutput",
    "RealmKnowledgeAugEncoder",
    "RealmPreTrainedModel",
    "RealmReader",
    "RealmReaderOutput",
    "RealmScorer",
    "RealmScorerOutput",
    "check_questions",
    "load_legacy_block_emb",
    "realm_marginal_mlm_loss",
]
