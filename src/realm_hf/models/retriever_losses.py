"""
Retriever losses of [`RealmForOpenQA`] beyond REALM's marginal likelihood, chosen by `config.retriever_loss`: EMDR2
and Atlas's attention and perplexity distillation, where the reader supplies the target (docs/training.md).
"""

from __future__ import annotations

import torch

# "marginal" is REALM's own loss, computed by the reader ([`RealmReader`]); the others replace it here.
from .configuration_realm import RETRIEVER_LOSSES


def block_answer_log_likelihood(reader_logits: torch.Tensor, reader_correct: torch.Tensor) -> torch.Tensor:
    r"""
    log p(a | x, z) of each read block: the log of the probability mass that the reader's span distribution *within*
    block z puts on the gold spans.

    Args:
        reader_logits (`torch.FloatTensor` of shape `(batch_size, reader_beam_size, num_candidates)`):
            Span logits of the reader (a block's retrieval score added to its spans cancels in the per-block softmax).
        reader_correct (`torch.BoolTensor` of the same shape): Whether each span is a gold answer span.

    Returns:
        `torch.FloatTensor` of shape `(batch_size, reader_beam_size)`: `-inf` for a block without a gold span.
    """
    log_probs = torch.log_softmax(reader_logits.float(), dim=-1)
    return torch.logsumexp(log_probs.masked_fill(~reader_correct.bool(), float("-inf")), dim=-1)


def emdr2_loss(relevance_score: torch.Tensor, answer_log_likelihood: torch.Tensor) -> torch.Tensor:
    r"""
    EMDR2 (Sachan et al., 2021, "End-to-End Training of Multi-Document Reader and Retriever for Open-Domain Question
    Answering"): the retriever maximises the answer's likelihood marginalised over the K read blocks, with the reader's
    likelihood held fixed,

    L = -log sum_k SG[p(a | x, z_k)] p(z_k | x),   p(z_k | x) = softmax_k(s(x, z_k)) over the read blocks.

    Args:
        relevance_score (`torch.FloatTensor` of shape `(batch_size, searcher_beam_size)`): Retrieval logits; the first
            `reader_beam_size` are the read blocks.
        answer_log_likelihood (`torch.FloatTensor` of shape `(batch_size, reader_beam_size)`):
            [`block_answer_log_likelihood`] (detached here).

    Returns:
        `torch.FloatTensor` of shape `(batch_size,)`: 0 for a question whose read blocks hold no answer.
    """
    read = answer_log_likelihood.shape[1]
    target = answer_log_likelihood.detach()
    found = torch.isfinite(target).any(-1)
    # Rows without an answer get a finite stand-in: a -inf row would give NaN gradients through logsumexp.
    target = torch.where(found.unsqueeze(-1), target, torch.zeros_like(target))
    log_prior = torch.log_softmax(relevance_score[:, :read].float(), dim=-1)
    loss = -torch.logsumexp(log_prior + target, dim=-1)
    return torch.where(found, loss, torch.zeros_like(loss))


def distillation_kl(
    relevance_score: torch.Tensor, target_logits: torch.Tensor, temperature: float = 1.0, mask=None
) -> torch.Tensor:
    r"""
    KL(p_target || p_retriever) over the read blocks, the loss of Atlas's distillation objectives (Izacard et al.,
    2022): p_target = softmax_k(SG[target_logits]), p_retriever = softmax_k(s(x, z_k) / temperature).

    Args:
        relevance_score (`torch.FloatTensor` of shape `(batch_size, searcher_beam_size)`): Retrieval logits.
        target_logits (`torch.FloatTensor` of shape `(batch_size, reader_beam_size)`): Unnormalised log target
            (`-inf` gives a block zero target mass); detached here.
        temperature (`float`, *optional*, defaults to 1.0): Temperature θ of the retriever's distribution.
        mask (`torch.BoolTensor` of shape `(batch_size,)`, *optional*): Questions with a target; others give 0.

    Returns:
        `torch.FloatTensor` of shape `(batch_size,)`.
    """
    read = target_logits.shape[1]
    target = target_logits.detach().float()
    if mask is None:
        mask = torch.isfinite(target).any(-1)
    target = torch.where(mask.unsqueeze(-1), target, torch.zeros_like(target))
    log_target = torch.log_softmax(target, dim=-1)
    log_retriever = torch.log_softmax(relevance_score[:, :read].float() / temperature, dim=-1)
    p_target = log_target.exp()
    # 0 log 0 = 0: blocks with no target mass add nothing (and no NaN).
    terms = torch.where(p_target > 0, p_target * (log_target - log_retriever), torch.zeros_like(p_target))
    loss = terms.sum(-1)
    return torch.where(mask, loss, torch.zeros_like(loss))


def perplexity_distillation_loss(
    relevance_score: torch.Tensor, answer_log_likelihood: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    r"""
    Perplexity distillation (Izacard et al., 2022, "Atlas: Few-shot Learning with Retrieval Augmented Language
    Models", eq. 3): the target ranks the read blocks by how well the reader alone predicts the answer from each,

    p_PDist(z_k) = softmax_k(log p(a | x, z_k)),   L = KL(SG[p_PDist] || softmax_k(s(x, z_k) / θ)).

    Unlike EMDR2 the target ignores the retriever's own prior. A question whose read blocks hold no answer gives 0.
    """
    return distillation_kl(relevance_score, answer_log_likelihood, temperature)


def question_to_block_attention(
    attentions, attention_mask: torch.Tensor, token_type_ids: torch.Tensor, block_mask: torch.Tensor
) -> torch.Tensor:
    r"""
    How much the reader attends to each block: for every (question, block) pair, the attention mass that the first
    segment (`[CLS] question [SEP]`) puts on the block's wordpieces, averaged over query tokens, heads and layers.

    REALM's reader reads each pair on its own, so there is no cross-attention from one output over all blocks as in
    the Fusion-in-Decoder reader of Izacard & Grave (2021); the question-to-block attention inside each pair is the
    well-defined analogue (each pair's attention rows sum to 1, so the masses compare across blocks). Atlas weights
    attention by the value norms; the reader's attention probabilities alone are used here.

    Args:
        attentions (`tuple[torch.FloatTensor]`): One `(num_pairs, num_heads, seq_len, seq_len)` tensor per layer.
        attention_mask, token_type_ids, block_mask (`torch.Tensor` of shape `(num_pairs, seq_len)`): The pairs'
            inputs; block wordpieces are where `block_mask` is true.

    Returns:
        `torch.FloatTensor` of shape `(num_pairs,)`, each in [0, 1].
    """
    if not attentions or any(layer is None for layer in attentions):
        raise ValueError(
            "retriever_loss='attention_distillation' needs the reader's attention probabilities, which only the "
            "eager attention returns: load the model with `attn_implementation='eager'` or call "
            "`model.set_attn_implementation('eager')`."
        )
    # [layers, pairs, heads, query, key] -> mass on block keys, [pairs, heads, query], averaged over layers.
    stacked = torch.stack([layer.float() for layer in attentions])
    mass = (stacked * block_mask.float().view(1, block_mask.shape[0], 1, 1, -1)).sum(-1).mean(0)
    query = (attention_mask.bool() & (token_type_ids == 0)).float()  # [pairs, query]
    per_query = mass.mean(1)  # over heads
    return (per_query * query).sum(-1) / query.sum(-1).clamp(min=1.0)


def attention_distillation_loss(
    relevance_score: torch.Tensor, block_attention: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    r"""
    Attention distillation (Izacard & Grave, 2021, "Distilling Knowledge from Reader to Retriever"; Atlas, Izacard et
    al., 2022, eq. 1): the reader's attention to each read block, α_k ([`question_to_block_attention`]), is the target,

    p_ATTN(z_k) = softmax_k(α_k),   L = KL(SG[p_ATTN] || softmax_k(s(x, z_k) / θ)).

    The target needs no answer: every training question contributes.

    Args:
        relevance_score (`torch.FloatTensor` of shape `(batch_size, searcher_beam_size)`): Retrieval logits.
        block_attention (`torch.FloatTensor` of shape `(batch_size, reader_beam_size)`): α_k of the read blocks.
    """
    mask = torch.ones(block_attention.shape[0], dtype=torch.bool, device=block_attention.device)
    return distillation_kl(relevance_score, block_attention, temperature, mask=mask)


def retriever_loss_from_reader(config, relevance_score: torch.Tensor, reader_output, reader_inputs) -> torch.Tensor:
    r"""
    Per-question retriever loss of `config.retriever_loss` (not `"marginal"`, which the reader computes), from one
    [`RealmForOpenQA`] forward pass: the `relevance_score` over the searcher beam, the reader's output (span logits,
    gold-span flags and, for attention distillation, its attentions) and the reader's inputs.

    Returns:
        `torch.FloatTensor` of shape `(batch_size,)`.
    """
    name = config.retriever_loss
    temperature = float(getattr(config, "retriever_loss_temperature", 1.0))
    if name == "attention_distillation":
        batch_size, read = reader_output.reader_logits.shape[:2]
        seq_len = reader_inputs.input_ids.shape[-1]
        flat = lambda t: t[:, :read].reshape(-1, seq_len)  # noqa: E731
        token_types = reader_inputs.token_type_ids
        if token_types is None:
            raise ValueError("retriever_loss='attention_distillation' needs the pairs' token_type_ids.")
        alpha = question_to_block_attention(
            reader_output.attentions,
            flat(reader_inputs.attention_mask),
            flat(token_types),
            flat(reader_inputs.block_mask),
        )
        return attention_distillation_loss(relevance_score, alpha.view(batch_size, read), temperature)
    likelihood = block_answer_log_likelihood(reader_output.reader_logits, reader_output.reader_correct)
    if name == "emdr2":
        return emdr2_loss(relevance_score, likelihood)
    if name == "perplexity_distillation":
        return perplexity_distillation_loss(relevance_score, likelihood, temperature)
    raise ValueError(f"Unknown retriever_loss {name!r}; choose one of {', '.join(map(repr, RETRIEVER_LOSSES))}.")


def apply_retriever_loss(config, reader_output, relevance_score: torch.Tensor, reader_inputs) -> None:
    """
    Replace the reader's marginal retriever loss (and the total loss) in `reader_output` with `config.retriever_loss`'s
    loss; nothing changes for `"marginal"` or when no loss was computed (no answers given).
    """
    if getattr(config, "retriever_loss", "marginal") == "marginal" or reader_output.loss is None:
        return
    loss = retriever_loss_from_reader(config, relevance_score, reader_output, reader_inputs)
    reader_output.retriever_loss = loss
    reader_output.loss = (loss + reader_output.reader_loss).mean()


def needs_reader_attentions(config, has_answers=None) -> bool:
    """Whether this forward computes a loss (`has_answers` given) that reads the reader's attention probabilities."""
    return has_answers is not None and getattr(config, "retriever_loss", "marginal") == "attention_distillation"


__all__ = [
    "RETRIEVER_LOSSES",
    "apply_retriever_loss",
    "attention_distillation_loss",
    "block_answer_log_likelihood",
    "distillation_kl",
    "emdr2_loss",
    "needs_reader_attentions",
    "perplexity_distillation_loss",
    "question_to_block_attention",
    "retriever_loss_from_reader",
]
