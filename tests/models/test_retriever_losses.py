"""`config.retriever_loss`: EMDR2, perplexity and attention distillation, checked against values computed by hand.

Expected values are computed here with plain Python floats from the logits (and attentions) the model returns, never
with `realm_hf.models.retriever_losses`. The model is the tiny legacy fixture of support/legacy_model.py (hidden 32,
2 layers, 12 blocks, searcher beam 6, reader beam 3, dropout off).
"""

import math

import pytest
import torch

from realm_hf import RealmConfig
from realm_hf.models.retriever_losses import (
    attention_distillation_loss,
    emdr2_loss,
    perplexity_distillation_loss,
    question_to_block_attention,
)
from realm_hf.training.openqa import DataCollatorForOpenQA
from tests.support.legacy_model import QUESTIONS, make_model


def log_sum_exp(values):
    values = [v for v in values if v != -math.inf]
    if not values:
        return -math.inf
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def softmax(values, temperature=1.0):
    scaled = [v / temperature for v in values]
    norm = log_sum_exp(scaled)
    return [math.exp(v - norm) for v in scaled]


def kl(target, model):
    return sum(t * (math.log(t) - math.log(m)) for t, m in zip(target, model) if t > 0)


def block_likelihoods(span_logits, correct):
    """p(a | x, z) of each block: softmax over the block's spans, mass on the gold ones."""
    out = []
    for logits, flags in zip(span_logits, correct):
        norm = log_sum_exp(logits)
        mass = sum(math.exp(v - norm) for v, flag in zip(logits, flags) if flag)
        out.append(mass)
    return out


def expected_emdr2(scores, likelihoods):
    if not any(likelihoods):
        return 0.0
    prior = softmax(scores)
    return -math.log(sum(p * lik for p, lik in zip(prior, likelihoods)))


def expected_pdist(scores, likelihoods, temperature=1.0):
    if not any(likelihoods):
        return 0.0
    target = [lik / sum(likelihoods) for lik in likelihoods]
    return kl(target, softmax(scores, temperature))


# ----------------------------------------------------------------------------- the formulas, on small tensors


def test_formulas_on_hand_made_logits():
    scores = torch.tensor([[2.0, 1.0, 0.0, -5.0], [0.5, 0.5, 3.0, 1.0]])  # searcher beam 4, 3 read
    log_lik = torch.tensor([[math.log(0.5), -math.inf, math.log(0.1)], [-math.inf, -math.inf, -math.inf]])
    emdr2 = emdr2_loss(scores, log_lik)
    prior = softmax([2.0, 1.0, 0.0])
    assert emdr2[0].item() == pytest.approx(-math.log(prior[0] * 0.5 + prior[2] * 0.1), rel=1e-6)
    assert emdr2[1].item() == 0.0  # no read block holds an answer

    pdist = perplexity_distillation_loss(scores, log_lik, temperature=0.5)
    target = [0.5 / 0.6, 0.0, 0.1 / 0.6]
    assert pdist[0].item() == pytest.approx(kl(target, softmax([2.0, 1.0, 0.0], 0.5)), rel=1e-6)
    assert pdist[1].item() == 0.0

    alpha = torch.tensor([[0.2, 0.7, 0.1], [0.3, 0.3, 0.4]])
    attn = attention_distillation_loss(scores, alpha, temperature=2.0)
    for row in range(2):
        want = kl(softmax(alpha[row].tolist()), softmax(scores[row, :3].tolist(), 2.0))
        assert attn[row].item() == pytest.approx(want, rel=1e-5)


def test_losses_have_finite_gradients_only_through_the_retrieval_scores():
    scores = torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 0.0]], requires_grad=True)
    log_lik = torch.tensor([[-math.inf, math.log(0.3), -math.inf], [-math.inf] * 3], requires_grad=True)
    for loss in (emdr2_loss(scores, log_lik), perplexity_distillation_loss(scores, log_lik)):
        scores.grad = None
        loss.sum().backward()
        assert torch.isfinite(scores.grad).all()
        assert torch.equal(scores.grad[1], torch.zeros(3))  # no answer: no signal
        assert log_lik.grad is None  # the reader's target is held fixed (stop-gradient)


def test_question_to_block_attention_by_hand():
    # One pair: [CLS] q [SEP] b1 b2 [SEP] pad; two layers, one head.
    attention_mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0]])
    token_type_ids = torch.tensor([[0, 0, 0, 1, 1, 1, 0]])
    block_mask = torch.tensor([[0, 0, 0, 1, 1, 0, 0]], dtype=torch.bool)
    torch.manual_seed(0)
    layers = tuple(torch.softmax(torch.randn(1, 1, 7, 7), -1) for _ in range(2))
    got = question_to_block_attention(layers, attention_mask, token_type_ids, block_mask)
    # Query rows 0..2 (the first segment), block keys 3 and 4, averaged over the 3 rows and the 2 layers.
    want = sum(float(layer[0, 0, q, 3] + layer[0, 0, q, 4]) for layer in layers for q in range(3)) / 6
    assert got.item() == pytest.approx(want, rel=1e-6)
    with pytest.raises(ValueError, match="eager"):
        question_to_block_attention((), attention_mask, token_type_ids, block_mask)


def test_config_checks_and_keeps_the_fields(tmp_path):
    with pytest.raises(ValueError, match="retriever_loss"):
        RealmConfig(retriever_loss="emdr")
    with pytest.raises(ValueError, match="retriever_loss_temperature"):
        RealmConfig(retriever_loss_temperature=0)
    config = RealmConfig(retriever_loss="emdr2", retriever_loss_temperature=0.5)
    config.save_pretrained(tmp_path)
    loaded = RealmConfig.from_pretrained(tmp_path)
    assert (loaded.retriever_loss, loaded.retriever_loss_temperature) == ("emdr2", 0.5)
    assert RealmConfig().retriever_loss == "marginal"


# ----------------------------------------------------------------------------- through the tiny model


def forward(model, loss_name):
    model.config.retriever_loss = loss_name
    batch = DataCollatorForOpenQA(model.retriever.tokenizer)(QUESTIONS)
    model.train()
    model.zero_grad(set_to_none=True)
    return model(**batch)


@pytest.fixture(scope="module")
def model():
    return make_model(train_document_embedder=False)


def test_default_is_realm_marginal_and_other_losses_keep_the_reader_loss(model):
    marginal = forward(model, "marginal")
    out = marginal.reader_output
    # REALM's retrieval loss by hand: -log of the searcher-beam probability of the answer-holding blocks.
    for b in range(len(QUESTIONS)):
        scores = marginal.retrieved_scores[b].tolist()
        holds = out.retriever_correct[b].tolist()
        want = 0.0 if not any(holds) else -math.log(sum(p for p, h in zip(softmax(scores), holds) if h))
        assert out.retriever_loss[b].item() == pytest.approx(want, rel=1e-5, abs=1e-6)
    emdr2 = forward(model, "emdr2")
    torch.testing.assert_close(emdr2.reader_output.reader_loss, out.reader_loss)
    torch.testing.assert_close(emdr2.loss, (emdr2.reader_output.retriever_loss + out.reader_loss).mean())


@pytest.mark.parametrize("loss_name", ["emdr2", "perplexity_distillation"])
def test_answer_likelihood_losses_match_hand_computed_values(model, loss_name):
    model.config.retriever_loss_temperature = 1.0
    out = forward(model, loss_name)
    reader = out.reader_output
    read = reader.reader_logits.shape[1]
    assert reader.reader_correct.any(), "the fixture questions must find answers in some read blocks"
    for b in range(len(QUESTIONS)):
        likelihoods = block_likelihoods(reader.reader_logits[b].tolist(), reader.reader_correct[b].tolist())
        scores = out.retrieved_scores[b, :read].tolist()
        want = (expected_emdr2 if loss_name == "emdr2" else expected_pdist)(scores, likelihoods)
        assert reader.retriever_loss[b].item() == pytest.approx(want, rel=1e-4, abs=1e-6)
    # The gradient reaches the question embedder, and not the reader through the target.
    out.loss.backward()
    assert model.embedder.cls.dense.weight.grad.abs().sum() > 0


def test_attention_distillation_matches_hand_computed_values(model):
    tokenizer = model.retriever.tokenizer
    model.config.retriever_loss = "attention_distillation"
    with pytest.raises(ValueError, match="eager"):
        forward(model, "attention_distillation")  # sdpa returns no attention probabilities
    model.set_attn_implementation("eager")
    try:
        out = forward(model, "attention_distillation")
    finally:
        model.set_attn_implementation("sdpa")
        model.config.retriever_loss = "marginal"
    reader = out.reader_output
    read = reader.reader_logits.shape[1]
    sep = tokenizer.sep_token_id
    for b in range(len(QUESTIONS)):
        alphas = []
        for k in range(read):
            ids = out.reader_input_ids[b, k].tolist()
            first_sep = ids.index(sep)
            second_sep = ids.index(sep, first_sep + 1)
            queries = range(0, first_sep + 1)  # [CLS] question [SEP]
            keys = range(first_sep + 1, second_sep)  # the block's wordpieces
            row = b * read + k
            total = 0.0
            for layer in (layer.detach() for layer in reader.attentions):
                heads = layer.shape[1]
                for h in range(heads):
                    for q in queries:
                        total += sum(float(layer[row, h, q, key]) for key in keys) / heads
            alphas.append(total / (len(reader.attentions) * len(queries)))
        scores = out.retrieved_scores[b, :read].tolist()
        want = kl(softmax(alphas), softmax(scores))
        assert reader.retriever_loss[b].item() == pytest.approx(want, rel=1e-4, abs=1e-7)
    assert (reader.retriever_loss > 0).all()  # no answer needed: every question has a target
