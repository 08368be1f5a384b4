"""Living with a stale index: Atlas's re-ranking (`config.rerank_beam_size`), query-side-only fine-tuning as one
switch, and the staleness recall logged by `RealmReindexCallback`.

The model is the tiny legacy fixture of support/legacy_model.py (hidden 32, 2 layers, 12 blocks, searcher beam 6,
reader beam 3, dropout off). The index goes stale by moving the document embedder's projection after the index was
built.
"""

import pytest
import torch

from realm_hf import RealmConfig
from realm_hf.retrieval.refresh import embed_corpus, is_stale
from realm_hf.training import RealmReindexCallback
from realm_hf.training.openqa import DataCollatorForOpenQA
from realm_hf.training.recipes import set_document_embedder_trainable
from tests.support.legacy_model import QUESTIONS, make_model


def make_stale(model, seed=1, scale=1.0):
    """Move the document embedder away from the weights that embedded the index."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        weight = model.document_embedder.cls.dense.weight
        weight.add_(scale * torch.randn(weight.shape, generator=generator))


def fresh_top_blocks(model, batch, k):
    """Top-k block ids and scores by the current document embedder, over the whole corpus (by hand)."""
    retriever = model.retriever
    with torch.no_grad():
        embeddings = embed_corpus(retriever, model.document_embedder, show_progress=False, update_index=False)
        questions = model.embed_questions(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    scores = questions @ embeddings.T
    top = scores.topk(k, dim=1)
    block_ids = torch.as_tensor(retriever.store.block_ids)
    return block_ids[top.indices], top.values


def test_config_checks_rerank_beam_size():
    with pytest.raises(ValueError, match="rerank_beam_size"):
        RealmConfig(rerank_beam_size=0)
    assert RealmConfig().rerank_beam_size is None


def test_rerank_reads_the_blocks_the_current_document_embedder_ranks_first():
    model = make_model(train_document_embedder=True)
    make_stale(model)
    batch = DataCollatorForOpenQA(model.retriever.tokenizer)(QUESTIONS)
    model.eval()
    k = model.config.reader_beam_size
    want_ids, want_scores = fresh_top_blocks(model, batch, k)
    with torch.no_grad():
        stale = model(**batch)
        model.config.rerank_beam_size = len(model.retriever)  # over-retrieve the whole corpus: exact re-ranking
        reranked = model(**batch)
    # The stale index reads other blocks for some question; re-ranking reads exactly the fresh top k.
    assert not torch.equal(stale.retrieved_block_ids, want_ids)
    assert torch.equal(reranked.retrieved_block_ids, want_ids)
    torch.testing.assert_close(reranked.retrieved_scores, want_scores, rtol=1e-5, atol=1e-5)


def test_rerank_trains_and_needs_a_document_embedder():
    model = make_model(train_document_embedder=True)
    make_stale(model)
    model.config.rerank_beam_size = 10
    batch = DataCollatorForOpenQA(model.retriever.tokenizer)(QUESTIONS)
    model.train()
    out = model(**batch)
    assert out.retrieved_block_ids.shape == (len(QUESTIONS), model.config.searcher_beam_size)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert model.document_embedder.cls.dense.weight.grad.abs().sum() > 0

    plain = make_model(train_document_embedder=False)
    plain.config.rerank_beam_size = 10
    with pytest.raises(ValueError, match="add_document_embedder"):
        plain(**batch)


def test_query_side_only_switch_keeps_the_index_fresh():
    model = make_model(train_document_embedder=True)
    embedder = set_document_embedder_trainable(model, False)
    assert embedder is model.document_embedder
    assert not any(p.requires_grad for p in model.document_embedder.parameters())
    before = {name: t.clone() for name, t in model.document_embedder.state_dict().items()}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-2)
    model.train()
    batch = DataCollatorForOpenQA(model.retriever.tokenizer)(QUESTIONS)
    question_weight = model.embedder.cls.dense.weight.clone()
    for _ in range(2):
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    # The question side trained; the document side and hence the index did not move.
    assert not torch.equal(model.embedder.cls.dense.weight, question_weight)
    for name, tensor in model.document_embedder.state_dict().items():
        assert torch.equal(tensor, before[name]), name
    assert is_stale(model.retriever, model.document_embedder) is False


def test_reindex_logs_recall_of_the_stale_index_against_the_fresh_one():
    model = make_model(train_document_embedder=True)
    questions = [item["question"] for item in QUESTIONS]
    k = 4
    reindex = RealmReindexCallback(
        model.retriever, refresh_steps=1, background=False, staleness_questions=questions, staleness_k=k
    )
    model.eval()
    # Nothing changed since the index was built: the refresh finds the same blocks.
    logs = reindex.refresh_now(model, global_step=1)
    assert logs[f"reindex/stale_recall@{k}"] == 1.0

    make_stale(model, scale=3.0)
    batch = DataCollatorForOpenQA(model.retriever.tokenizer)(QUESTIONS)
    with torch.no_grad():
        query = model.embed_questions(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    stale_ids = model.retriever.search(query, k, return_blocks=False).block_ids.tolist()
    logs = reindex.refresh_now(model, global_step=2)
    fresh_ids = model.retriever.search(query, k, return_blocks=False).block_ids.tolist()
    want = sum(len(set(s) & set(f)) / k for s, f in zip(stale_ids, fresh_ids)) / len(questions)
    assert want < 1.0
    assert logs[f"reindex/stale_recall@{k}"] == pytest.approx(want, abs=1e-4)
    assert reindex.history[-1][f"reindex/stale_recall@{k}"] == logs[f"reindex/stale_recall@{k}"]

    with pytest.raises(ValueError, match="staleness_questions"):
        RealmReindexCallback(model.retriever, staleness_questions="what is a compiler?")
    with pytest.raises(ValueError, match="staleness_k"):
        RealmReindexCallback(model.retriever, staleness_questions=questions, staleness_k=0)
