"""Hybrid retrieval: a BM25 index (`bm25s`, `realm_hf.retrieval.bm25`) beside the dense one, `RealmRetriever.use_bm25`.

Skipped where `bm25s` (the `hybrid` extra) is not installed. The model is the tiny legacy fixture of
support/legacy_model.py (12 blocks); expected values are computed here from the blocks' texts and stored embeddings.
"""

import os

import numpy as np
import pytest
import torch

from tests.support.legacy_model import QUESTIONS, make_model

pytest.importorskip("bm25s")

from realm_hf.retrieval.bm25 import BM25BlockIndex, reciprocal_rank_fusion  # noqa: E402
from realm_hf.training.openqa import DataCollatorForOpenQA  # noqa: E402


def all_blocks(retriever):
    return retriever.store.blocks(torch.as_tensor(np.asarray(retriever.store.block_ids)))


def test_bm25_finds_the_block_that_shares_the_rare_words():
    model = make_model(train_document_embedder=False)
    blocks = all_blocks(model.retriever)
    sparse = BM25BlockIndex.from_corpus(model.retriever.store.corpus)
    assert len(sparse) == len(blocks)
    # A question made of one block's own words ranks that block first.
    target = blocks[5]
    words = " ".join(target["text"].split()[:8])
    ids, scores = sparse.nearest([words], 3)
    assert ids[0, 0] == target["block_id"]
    assert scores[0, 0] > 0
    # No shared term: no candidate at all.
    ids, scores = sparse.nearest(["zzzqqq"], 3)
    assert (ids == -1).all() and (scores == 0).all()


def test_reciprocal_rank_fusion_by_hand():
    dense = np.array([[1, 2, 3]])
    sparse = np.array([[3, 4, -1]])
    fused = reciprocal_rank_fusion([dense, sparse], k=4, constant=60)
    # 3: 1/63 + 1/61; 1: 1/61; 4: 1/62; 2: 1/62 (ties by id).
    assert fused.tolist() == [[3, 1, 2, 4]]


def test_save_and_load_without_pickle_and_checked(tmp_path):
    model = make_model(train_document_embedder=False)
    sparse = BM25BlockIndex.from_corpus(model.retriever.store.corpus)
    files = sparse.save(str(tmp_path))
    assert all(not name.endswith((".pkl", ".pickle")) for name in files)
    for name in files:
        if name.endswith(".npy"):
            np.load(tmp_path / name, allow_pickle=False)  # refuses object arrays: nothing pickled
    loaded = BM25BlockIndex.load(str(tmp_path), files)
    question = ["what is the capital of france paris"]
    assert np.array_equal(loaded.nearest(question, 4)[0], sparse.nearest(question, 4)[0])
    with open(os.path.join(tmp_path, "bm25_block_ids.npy"), "r+b") as f:
        f.seek(-1, 2)
        f.write(b"\x07")
    with pytest.raises(ValueError, match="save the hybrid retriever again"):
        BM25BlockIndex.load(str(tmp_path), files)


@pytest.mark.parametrize("mode", ["candidates", "rrf"])
def test_hybrid_search_adds_bm25_candidates_scored_by_the_dense_embeddings(mode):
    model = make_model(train_document_embedder=False)
    hybrid = model.retriever.use_bm25(mode=mode, sparse_k=3)
    batch = DataCollatorForOpenQA(model.retriever.tokenizer)(QUESTIONS)
    model.eval()
    with torch.no_grad():
        query = model.embed_questions(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    dense = model.retriever.search(query, 2, return_blocks=False).block_ids
    sparse_ids, _ = hybrid.store.sparse.nearest(batch["questions"], 3)
    out = hybrid.search(query, 2, questions=batch["questions"], return_embeddings=True)
    for row in range(len(QUESTIONS)):
        found = [i for i in out.block_ids[row].tolist() if i >= 0]
        union = set(dense[row].tolist()) | {i for i in sparse_ids[row].tolist() if i >= 0}
        if mode == "candidates":
            assert set(found) == union
        else:
            assert len(found) == 2 and set(found) <= union
        # Scores are dense inner products with the stored embeddings, best first in "candidates".
        stored = model.retriever.store.embeddings(torch.tensor([found]))[0]
        torch.testing.assert_close(out.scores[row, : len(found)], stored @ query[row])
        if mode == "candidates":
            assert out.scores[row, : len(found)].tolist() == sorted(
                out.scores[row, : len(found)].tolist(), reverse=True
            )
    # Without question texts it is the dense search.
    assert torch.equal(hybrid.search(query, 2, return_blocks=False).block_ids, dense)


def test_model_trains_and_answers_through_the_hybrid_retriever_and_it_follows_updates():
    model = make_model(train_document_embedder=False)
    hybrid = model.retriever.use_bm25(sparse_k=4)
    model.set_retriever(hybrid)
    batch = DataCollatorForOpenQA(model.retriever.tokenizer)(QUESTIONS)
    model.train()
    out = model(**batch)
    assert out.retrieved_block_ids.shape[1] >= model.config.searcher_beam_size
    out.loss.backward()
    assert torch.isfinite(out.loss)
    answers = model.answer([q["question"] for q in QUESTIONS])
    assert len(answers) == len(QUESTIONS)
    # Removing a block re-indexes BM25 in the same step (one store holds both indexes): it is never returned.
    dense = model.retriever
    removed = int(hybrid.store.sparse.block_ids[0])
    hybrid.remove_documents(block_ids=[removed])
    assert removed not in hybrid.store.sparse.block_ids.tolist()
    assert np.array_equal(hybrid.store.sparse.block_ids, hybrid.store.block_ids)
    assert dense is hybrid


def test_the_bm25_index_follows_added_documents_in_the_same_store():
    model = make_model(train_document_embedder=False)
    dense = model.retriever
    hybrid = dense.use_bm25(sparse_k=3)
    # The BM25 index goes into the retriever's own store: one retriever, one store, whichever name it is used by.
    assert hybrid is dense and dense.store.sparse is hybrid.store.sparse
    new_ids = dense.add_documents(
        [{"title": "Zorblax", "text": "zorblax quintessential marmalade volcano", "doc_id": 99}],
        model.embedder,
        show_progress=False,
    )
    assert hybrid.store is dense.store
    assert np.array_equal(hybrid.store.sparse.block_ids, hybrid.store.block_ids)
    ids, _ = hybrid.store.sparse.nearest(["zorblax marmalade"], 1)
    assert ids[0, 0] in new_ids
    # The new block is a BM25 candidate of a question naming its rare words, whatever its dense score.
    query = torch.zeros(1, dense.embedding_dim)
    out = hybrid.search(query, 1, questions=["zorblax marmalade"])
    assert set(new_ids) & set(out.block_ids[0].tolist())


def test_saved_with_the_dense_index_under_one_manifest_and_checked(tmp_path):
    import json

    from realm_hf.retrieval import RealmRetriever

    model = make_model(train_document_embedder=False)
    # A plain retriever's save is unchanged: no BM25 folder, no manifest entry.
    model.retriever.save_pretrained(tmp_path / "plain")
    plain_manifest = json.loads((tmp_path / "plain" / "retriever_manifest.json").read_text())
    assert "sparse_index" not in plain_manifest and not (tmp_path / "plain" / "sparse_bm25").exists()

    hybrid = model.retriever.use_bm25(sparse_k=3)
    hybrid.save_pretrained(tmp_path / "hybrid")
    manifest = json.loads((tmp_path / "hybrid" / "retriever_manifest.json").read_text())
    assert manifest["sparse_index"]["dir"] == "sparse_bm25"
    sparse_files = [name for name in manifest["files"] if name.startswith("sparse_bm25/")]
    assert any(name.endswith(".npy") for name in sparse_files)
    assert all("sha256" in manifest["files"][name] for name in sparse_files)

    loaded = RealmRetriever.from_pretrained(tmp_path / "hybrid").use_bm25(sparse_k=3)
    questions = [q["question"] for q in QUESTIONS]
    assert np.array_equal(loaded.store.sparse.nearest(questions, 3)[0], hybrid.store.sparse.nearest(questions, 3)[0])
    # A plain load of the same directory brings the BM25 index back with its saved settings (and checks its files).
    plain = RealmRetriever.from_pretrained(tmp_path / "hybrid")
    assert len(plain) == len(model.retriever) and plain.store.sparse.sparse_k == 3

    vocab = next(tmp_path.glob("hybrid/sparse_bm25/vocab*.json"))
    vocab.write_text(vocab.read_text().replace('"', "'", 1) + " ")
    with pytest.raises((ValueError, OSError)):
        RealmRetriever.from_pretrained(tmp_path / "hybrid")


def test_model_saved_with_a_hybrid_retriever_loads_it_back(tmp_path):
    from realm_hf import RealmForOpenQA

    model = make_model(train_document_embedder=False)
    model.set_retriever(model.retriever.use_bm25(sparse_k=2))
    model.save_pretrained(tmp_path / "model")
    loaded = RealmForOpenQA.from_pretrained(tmp_path / "model")
    assert loaded.retriever.store.sparse is not None
    questions = [q["question"] for q in QUESTIONS]
    sparse = loaded.retriever.store.sparse
    assert (sparse.mode, sparse.sparse_k) == ("candidates", 2)  # the saved settings
    want, got = model.answer(questions), loaded.answer(questions)
    assert [[b["block_id"] for b in a["retrieved"]] for a in got] == [
        [b["block_id"] for b in a["retrieved"]] for a in want
    ]
    assert [a["answer"] for a in got] == [a["answer"] for a in want]


def test_evaluation_recall_counts_what_the_hybrid_retriever_returns():
    """recall@k deeper than the reader beam is measured with the question texts, as the model answers: hybrid too."""
    import datasets

    from realm_hf.metrics import has_answer
    from realm_hf.training.openqa import evaluate_openqa

    model = make_model(train_document_embedder=False)
    blocks = all_blocks(model.retriever)
    # One question per block, made of its first words; its answer, the block's last two words.
    rows = [
        {"question": " ".join(b["text"].split()[:8]), "answers": [" ".join(b["text"].split()[-2:])]} for b in blocks
    ]
    hybrid = model.retriever.use_bm25(mode="rrf", sparse_k=1)
    model.set_retriever(hybrid)
    k = model.config.reader_beam_size + 1  # deeper than the blocks the reader reads
    tokenizer = hybrid.tokenizer
    encoded = tokenizer([r["question"] for r in rows], padding=True, return_tensors="pt")
    with torch.no_grad():
        queries = model.eval().embed_questions(**encoded)

    def recall(search):
        return np.mean(
            [any(has_answer(b["text"], r["answers"]) for b in bl[:k]) for r, bl in zip(rows, search.blocks)]
        )

    expected = recall(hybrid.search(queries, k, questions=[r["question"] for r in rows]))
    dense_only = recall(hybrid.search(queries, k))
    assert expected != dense_only  # the case tells the two apart
    result = evaluate_openqa(model, datasets.Dataset.from_list(rows), recall_ks=(1, k), show_progress=False)
    assert result[f"recall@{k}"] == pytest.approx(expected)


def test_hybrid_search_refuses_question_texts_of_the_wrong_kind(tiny):
    hybrid = tiny[0].retriever.use_bm25()
    queries = torch.randn(2, 16)
    # Before: "ab" was two questions, "a" and "b", searched in silence.
    with pytest.raises(TypeError, match="not one string"):
        hybrid.search(queries, k=2, questions="ab")
    # Before: AttributeError: 'NoneType' object has no attribute 'lower', inside bm25s.
    with pytest.raises(TypeError, match="Question text 0 is a NoneType"):
        hybrid.search(queries, k=2, questions=[None, "lisp"])
