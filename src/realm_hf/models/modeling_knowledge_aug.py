"""The knowledge-augmented encoder of REALM pre-training and its marginal masked-LM loss."""

from __future__ import annotations

import torch
from torch.nn import CrossEntropyLoss
from transformers.modeling_outputs import MaskedLMOutput
from transformers.models.bert.modeling_bert import BertModel, BertOnlyMLMHead

from .configuration_realm import RealmConfig
from .modeling_base import RealmPreTrainedModel, check_input_shape, check_token_ids, encoder_output_kwargs


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

    @staticmethod
    def _check_loss_shapes(reference, relevance_score, labels, mlm_mask) -> None:
        """
        The loss inputs against `input_ids`: mismatches failed in torch's cross-entropy ("Expected input batch_size
        (72) to match target batch_size (78)") or, for a 1-D `relevance_score`, broadcast over the batch in silence.
        """
        meaning = "(batch_size, num_candidates): the retrieval logits of each input's candidate blocks"
        if reference.dim() == 3:
            batch_size, num_candidates, seq_len = reference.shape
        else:  # (batch_size * num_candidates, seq_len), flattened by the caller
            check_input_shape("relevance_score", relevance_score, (labels.shape[0], None), meaning)
            batch_size, num_candidates = relevance_score.shape
            seq_len = reference.shape[-1]
            if batch_size * num_candidates != reference.shape[0]:
                raise ValueError(
                    f"`input_ids` has shape {tuple(reference.shape)}, not ({batch_size} * {num_candidates} = "
                    f"{batch_size * num_candidates}, seq_len) for the {batch_size} x {num_candidates} scores of "
                    "`relevance_score`: pass each input joined with each of its candidate blocks, as (batch_size, "
                    "num_candidates, seq_len)."
                )
        check_input_shape("relevance_score", relevance_score, (batch_size, num_candidates), meaning)
        meaning = "(batch_size, seq_len): one masked-LM target per token of each input"
        check_input_shape("labels", labels, (batch_size, seq_len), meaning)
        check_input_shape("mlm_mask", mlm_mask, (batch_size, seq_len), meaning)
        if labels.is_floating_point():
            raise TypeError(f"`labels` must hold integer wordpiece ids (-100: no target), got {labels.dtype}.")

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
        check_token_ids("input_ids", input_ids, self.config)
        if labels is not None:
            self._check_loss_shapes(
                input_ids if input_ids is not None else inputs_embeds[..., 0], relevance_score, labels, mlm_mask
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
            **encoder_output_kwargs(output_attentions, output_hidden_states),
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
