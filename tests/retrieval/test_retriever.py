"""RealmRetriever: splitting, embedding, exact/approximate search, save/load, manifest checks, updates, legacy."""

import warnings

import numpy as np
import pytest
import torch

from realm_hf.retrieval.encoding import embed_blocks, fingerprint_module
from realm_hf.retrieval.retriever import RealmRetriever
from tests.support.retrieval import (
    MAX_BLOCK_LENGTH,
    NEW_DOC,
    PROJ,
    brute_force,
    embed_questions,
    structured_vectors,
)

# ------------------------------------------------------------------------------------------------------------------
# Splitting and embedding
# ------------------------------------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------------------------------------
# Search
# ------------------------------------------------------------------------------------------------------------------


def test_flat_search_is_exact(retriever, embedder, tokenizer):
    questions = ["when was port estrel founded?", "who designed quillon?", "what is the ferrow ibex?", "drum memory"]
    queries = embed_questions(embedder, tokenizer, questions)
    out = retriever.search(queries.requires_grad_(), k=5)
    stored = retriever.store.embeddings(torch.as_tensor(retriever.store.block_ids)).numpy()
    expected_rows, expected_scores = brute_force(queries.detach().numpy(), stored, 5)
    assert out.block_ids.dtype == torch.int64 and out.block_ids.shape == (4, 5)
    assert out.block_ids.tolist() == retriever.store.block_ids[expected_rows].tolist()  # recall 1.0, same order
    np.testing.assert_allclose(out.scores.numpy(), expected_scores, rtol=1e-5, atol=1e-5)
    assert torch.all(out.scores[:, :-1] >= out.scores[:, 1:])
    # The stored vectors are what the model re-scores with: question . block reproduces the scores.
    rescored = torch.einsum("bd,bkd->bk", queries.detach(), retriever.store.embeddings(out.block_ids))
    torch.testing.assert_close(rescored, out.scores, atol=1e-5, rtol=1e-5)
    block = out.blocks[1][0]
    assert {"block_id", "title", "text", "score", "doc_id"} <= set(block)
    assert block["block_id"] == int(out.block_ids[1, 0]) and block["score"] == pytest.approx(float(out.scores[1, 0]))
    assert retriever.store.texts(out.block_ids)[1][0] == block["text"]
    # One question, numpy input.
    single = retriever.search(queries[0].detach().numpy(), k=3)
    assert single.block_ids.tolist() == [out.block_ids[0, :3].tolist()]


def test_search_argument_errors(retriever):
    with pytest.raises(ValueError, match=f"larger than.*blocks.*\\({len(retriever)}\\)"):
        retriever.search(np.zeros((1, PROJ), np.float32), k=len(retriever) + 1)
    with pytest.raises(ValueError, match=f"projection size {PROJ}"):
        retriever.search(np.zeros((2, PROJ + 1), np.float32), k=2)
    with pytest.raises(ValueError, match="nprobe"):
        retriever.search(np.zeros((1, PROJ), np.float32), k=2, nprobe=4)
    with pytest.raises(KeyError):
        retriever.store.texts([[10**9]])
    assert retriever.num_blocks == len(retriever) == retriever.store.index.index.ntotal
    assert retriever.embedding_dim == PROJ and retriever.store.index_type == "Flat"


# ------------------------------------------------------------------------------------------------------------------
# Save / load
# ------------------------------------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------------------------------------
# Updating knowledge
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("factory", ["Flat", "HNSW32", "IVF4,Flat"])
def test_add_and_remove_documents_change_results(documents, embedder, tokenizer, tmp_path, factory):
    retriever = RealmRetriever.from_documents(
        documents, embedder, tokenizer, max_block_length=MAX_BLOCK_LENGTH, index=factory, show_progress=False
    )
    # Go through save/load: the index is then memory-mapped and must be copied before it is modified.
    retriever.save_pretrained(tmp_path)
    retriever = RealmRetriever.from_pretrained(tmp_path, embedder=embedder)
    params = {"nprobe": 4} if factory.startswith("IVF") else {}
    n_before, old_max = len(retriever), int(retriever.store.block_ids.max())
    new_ids = retriever.add_documents([NEW_DOC], embedder, show_progress=False)
    assert min(new_ids) == old_max + 1 and len(retriever) == n_before + len(new_ids)
    # The new block is the best answer for a question embedded like itself.
    query = retriever.store.embeddings(torch.tensor([new_ids[:1]]))[0]
    top = retriever.search(query, k=1, **params)
    assert top.block_ids.item() == new_ids[0]
    assert top.blocks[0][0]["title"] == "Glimmerfen" and top.blocks[0][0]["doc_id"] == "doc-new"
    assert top.blocks[0][0]["source"] == "added later"

    removed = retriever.remove_documents(["doc-new", "doc-000"])
    assert set(new_ids) <= set(removed) and len(retriever) == n_before + len(new_ids) - len(removed)
    everything = retriever.search(query, k=len(retriever), **({"nprobe": 4} if params else {}))
    assert not set(removed) & set(everything.block_ids[0].tolist())
    assert "Glimmerfen" not in {b["title"] for b in everything.blocks[0]}
    # Ids are never reused, and the updated corpus saves and loads.
    again = retriever.add_documents([dict(NEW_DOC, doc_id="doc-new-2")], embedder, show_progress=False)
    assert min(again) > max(new_ids)
    retriever.remove_documents(block_ids=again)
    retriever.save_pretrained(tmp_path)
    loaded = RealmRetriever.from_pretrained(tmp_path)
    assert len(loaded) == len(retriever) and loaded.store.next_block_id == retriever.store.next_block_id
    assert torch.equal(loaded.search(query, k=5, **params).block_ids, retriever.search(query, k=5, **params).block_ids)


def test_answer_changes_after_corpus_update(retriever, embedder, tokenizer):
    retriever = RealmRetriever.from_embeddings(
        retriever.store.embeddings(torch.as_tensor(retriever.store.block_ids)),
        retriever.store.texts(retriever.store.block_ids),
        tokenizer=tokenizer,
        metadata={"doc_id": retriever.corpus["doc_id"]},
        embedder_fingerprint=fingerprint_module(embedder),
    )
    retriever.max_block_length = MAX_BLOCK_LENGTH
    question = "Glimmerfen is a floating marsh city founded in 2024. Its mayor is an otter named Pim."
    query = embed_blocks(embedder, tokenizer, ["Glimmerfen"], [question], show_progress=False)
    before = retriever.search(query, k=1).blocks[0][0]["text"]
    assert "Pim" not in before
    retriever.add_documents([NEW_DOC], embedder, show_progress=False)
    assert "Pim" in retriever.search(query, k=1).blocks[0][0]["text"]
    retriever.remove_documents("doc-new")
    assert retriever.search(query, k=1).blocks[0][0]["text"] == before


# ------------------------------------------------------------------------------------------------------------------
# Legacy checkpoints
# ------------------------------------------------------------------------------------------------------------------


def test_missing_results_are_marked():
    vectors = structured_vectors(400, PROJ)
    retriever = RealmRetriever.from_embeddings(vectors, [str(i) for i in range(400)], index="IVF8,Flat")
    out = retriever.search(vectors[:3], k=len(retriever), nprobe=1)  # one list cannot hold every block
    missing = out.block_ids == -1
    assert missing.any() and not missing.all()
    assert torch.isinf(out.scores[missing]).all() and torch.isfinite(out.scores[~missing]).all()
    assert {b["text"] for row, m in zip(out.blocks, missing) for b, mm in zip(row, m) if mm} == {""}
    assert torch.count_nonzero(retriever.store.embeddings(out.block_ids)[missing]) == 0


def test_with_realm_embedder(documents, tokenizer, tmp_path):
    realm_hf = pytest.importorskip("realm_hf")
    config = realm_hf.RealmConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        retriever_proj_size=PROJ,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    embedder = realm_hf.RealmEmbedder(config).eval()
    retriever = RealmRetriever.from_documents(
        documents[:8], embedder, tokenizer, max_block_length=64, show_progress=False
    )
    retriever.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = RealmRetriever.from_pretrained(tmp_path, embedder=embedder)
    question = embedder(**tokenizer(["who founded port estrel?"], return_tensors="pt")).projected_score
    assert torch.equal(loaded.search(question, k=3).block_ids, retriever.search(question, k=3).block_ids)
    other = realm_hf.RealmEmbedder(realm_hf.RealmConfig(**{**config.to_dict(), "retriever_proj_size": 8}))
    with pytest.raises(ValueError, match="retriever_proj_size"):
        RealmRetriever.from_pretrained(tmp_path, embedder=other)
