"""End-to-end retriever training with a bounded document-embedder gradient (`config.document_gradient_beam_size`).

While the document embedder trains, `RealmForOpenQA` re-embeds only the top m blocks of each question's searcher
beam with gradient and scores the rest of the beam with the index's stored embeddings. The model is the tiny legacy
fixture of support/legacy_model.py (hidden 32, 2 layers, 12 blocks, searcher beam 6, reader beam 3).
"""

import pytest
import torch

from realm_hf import RealmConfig, RealmForOpenQA
from realm_hf.models.reader_inputs import build_reader_inputs, tokenize_answers
from realm_hf.training.openqa import DataCollatorForOpenQA
from tests.support.legacy_model import QUESTIONS, make_model
from tests.support.paths import LEGACY_OPENQA

K = 6  # make_model's searcher beam


@pytest.fixture(scope="module")
def trained_model():
    model = make_model(train_document_embedder=True)
    assert model.config.searcher_beam_size == K and model.config.reader_beam_size < K
    # make_model's index was embedded with the document embedder's current weights: move them (as training does),
    # so that a block's fresh embedding and its stored one differ and mixing them up changes the numbers.
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.document_embedder.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    return model


@pytest.fixture
def model(trained_model):
    trained_model.train()
    trained_model.zero_grad(set_to_none=True)
    yield trained_model
    trained_model.config.document_gradient_beam_size = None
    trained_model.__dict__.pop("document_embedding_chunk_size", None)
    trained_model.zero_grad(set_to_none=True)


@pytest.fixture(scope="module")
def batch(trained_model):
    return DataCollatorForOpenQA(trained_model.retriever.tokenizer)(QUESTIONS)


def block_inputs(model, blocks):
    """The document embedder's inputs for `blocks` as the forward pass before bounding built them (one batch)."""
    tokenizer = model.retriever.tokenizer
    return tokenizer(
        [block.get("title") or "" for block in blocks],
        [block["text"] for block in blocks],
        padding=True,
        truncation=True,
        max_length=model.retriever.max_block_length or min(int(tokenizer.model_max_length), 512),
        return_tensors="pt",
    )


def hand_loss(model, batch, m):
    """
    The training loss written out: the relevance scores from fresh embeddings (one batch, with gradient) for the
    first `m` blocks of each beam and stored ones for the rest, then the reader's loss. With `m = K` it is the
    formula from before `document_gradient_beam_size`: every block of the beam re-embedded.
    """
    retriever, tokenizer = model.retriever, model.retriever.tokenizer
    question = model.embed_questions(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    search = retriever.search(question.detach(), K)
    parts = []
    if m:
        fresh = model.document_embedder(**block_inputs(model, [b for row in search.blocks for b in row[:m]]))
        parts.append(fresh.projected_score.view(len(QUESTIONS), m, -1))
    parts.append(retriever.store.embeddings(search.block_ids[:, m:]))
    relevance = torch.einsum("bd,bkd->bk", question, torch.cat(parts, dim=1))
    inputs = build_reader_inputs(
        tokenizer,
        batch["questions"],
        retriever.store.texts(search.block_ids),
        answer_ids=tokenize_answers(tokenizer, batch["answers"]),
        max_length=model.config.reader_seq_len,
    )
    r = model.config.reader_beam_size
    out = model.reader(
        input_ids=inputs.input_ids[:, :r],
        attention_mask=inputs.attention_mask[:, :r],
        token_type_ids=inputs.token_type_ids[:, :r],
        relevance_score=relevance,
        block_mask=inputs.block_mask,
        has_answers=inputs.has_answers,
        start_positions=inputs.start_positions,
        end_positions=inputs.end_positions,
        return_dict=True,
    )
    return out.loss, relevance


def gradients(module):
    return {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}


def model_step(model, batch):
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    return out, gradients(model.embedder), gradients(model.document_embedder)


def hand_step(model, batch, m):
    model.zero_grad(set_to_none=True)
    loss, relevance = hand_loss(model, batch, m)
    loss.backward()
    return loss, relevance, gradients(model.embedder), gradients(model.document_embedder)


def assert_same_gradients(actual, expected):
    assert actual.keys() == expected.keys() and expected
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], atol=1e-6, rtol=1e-5, msg=name)


def test_only_the_top_m_blocks_are_re_embedded_with_gradient(model, batch):
    m = 2
    model.config.document_gradient_beam_size = m
    model.document_embedding_chunk_size = 3  # 4 questions x 2 blocks: calls of 3, 3 and 2 blocks
    calls = []
    hook = model.document_embedder.register_forward_hook(
        lambda module, args, kwargs, output: calls.append(kwargs["input_ids"]), with_kwargs=True
    )
    try:
        out, _, document_grads = model_step(model, batch)
    finally:
        hook.remove()
    assert out.retrieved_block_ids.shape == (len(QUESTIONS), K)
    assert [len(ids) for ids in calls] == [3, 3, 2]
    # Exactly the first m blocks of each beam, in beam order, tokenized as one batch as before.
    first_m = [block for row in out.retrieved_blocks for block in row[:m]]
    assert torch.equal(torch.cat(calls), block_inputs(model, first_m)["input_ids"])
    # The gradient reaches the document embedder: its projection, encoder and word embeddings.
    for name in ("cls.dense.weight", "realm.encoder.layer.0.attention.self.query.weight"):
        assert document_grads[name].abs().sum() > 0, name
    assert document_grads["realm.embeddings.word_embeddings.weight"].abs().sum() > 0
    # Blocks beyond m are scored with the stored embeddings; the first m with fresh ones, which differ here.
    with torch.no_grad():
        question = model.embed_questions(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        stored = torch.einsum("bd,bkd->bk", question, model.retriever.store.embeddings(out.retrieved_block_ids))
    torch.testing.assert_close(out.retrieved_scores[:, m:].detach(), stored[:, m:], atol=1e-6, rtol=0)
    assert (out.retrieved_scores[:, :m].detach() - stored[:, :m]).abs().min() > 1e-4


@pytest.mark.parametrize("m, chunk", [(K, 64), (K, 5), (100, 64)])
def test_m_at_least_the_searcher_beam_is_the_all_blocks_formula(model, batch, m, chunk):
    model.config.document_gradient_beam_size = m
    model.document_embedding_chunk_size = chunk
    out, question_grads, document_grads = model_step(model, batch)
    loss, relevance, expected_question_grads, expected_document_grads = hand_step(model, batch, K)
    torch.testing.assert_close(out.loss, loss, atol=1e-6, rtol=0)
    # Scores are ~10 here: another split of the blocks into calls moves them by float32 rounding (~3e-7 relative).
    torch.testing.assert_close(out.retrieved_scores, relevance, atol=1e-6, rtol=1e-6)
    assert_same_gradients(document_grads, expected_document_grads)
    assert_same_gradients(question_grads, expected_question_grads)


def test_m_below_the_searcher_beam_mixes_fresh_and_stored_embeddings(model, batch):
    m = 2
    model.config.document_gradient_beam_size = m
    out, question_grads, document_grads = model_step(model, batch)
    loss, relevance, expected_question_grads, expected_document_grads = hand_step(model, batch, m)
    torch.testing.assert_close(out.loss, loss, atol=1e-6, rtol=0)
    torch.testing.assert_close(out.retrieved_scores, relevance, atol=1e-6, rtol=0)
    assert_same_gradients(question_grads, expected_question_grads)
    assert_same_gradients(document_grads, expected_document_grads)
    # The mix is not the all-blocks formula in disguise: bounding changes the loss here.
    with torch.no_grad():
        all_fresh, _ = hand_loss(model, batch, K)
    assert abs(loss.item() - all_fresh.item()) > 1e-4


def test_default_is_the_reader_beam_and_zero_uses_stored_embeddings_only(model, batch):
    calls = []
    hook = model.document_embedder.register_forward_hook(
        lambda module, args, kwargs, output: calls.append(len(kwargs["input_ids"])), with_kwargs=True
    )
    try:
        assert model.config.document_gradient_beam_size is None
        model_step(model, batch)
        assert sum(calls) == len(QUESTIONS) * model.config.reader_beam_size
        calls.clear()
        model.config.document_gradient_beam_size = 0
        out, _, document_grads = model_step(model, batch)
    finally:
        hook.remove()
    assert calls == [] and document_grads == {}
    loss, _ = hand_loss(model, batch, 0)
    torch.testing.assert_close(out.loss, loss, atol=1e-6, rtol=0)


def test_config_field_defaults_loads_and_round_trips(tmp_path):
    # A config.json written before the field existed (the legacy fixture) loads with the default.
    assert RealmConfig.from_pretrained(LEGACY_OPENQA).document_gradient_beam_size is None
    config = RealmConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, document_gradient_beam_size=8)
    config.save_pretrained(tmp_path)
    assert RealmConfig.from_pretrained(tmp_path).document_gradient_beam_size == 8
    for bad in (-1, 2.5, "5", True):
        with pytest.raises(ValueError, match="document_gradient_beam_size"):
            RealmConfig(document_gradient_beam_size=bad)
    assert RealmForOpenQA.document_embedding_chunk_size == 64
