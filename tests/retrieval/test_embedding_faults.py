"""Faults in block embeddings and index refreshes: NaN/inf vectors never enter an index, a refresh the model could not
search is refused before the swap (training goes on with the old index), and block id -1 is explained by its cause.
"""

import copy
import logging
import os

import datasets
import faiss
import numpy as np
import pytest
import torch
from transformers import BertTokenizer

from realm_hf import RealmEmbedder
from realm_hf.retrieval.refresh import embed_corpus
from realm_hf.retrieval.retriever import RealmRetriever
from realm_hf.training.callbacks import RealmReindexCallback
from realm_hf.training.openqa import DataCollatorForOpenQA, RealmOpenQATrainer
from tests.support.legacy_model import QUESTIONS, all_embeddings, make_model, training_args
from tests.support.paths import CORPUS_DIR
from tests.support.retrieval import PROJ, TinyEmbedder, structured_vectors

DOCUMENTS = [
    {"title": "Paris", "text": "Paris is the capital of France."},
    {"title": "London", "text": "London is the capital of England."},
    {"title": "Python", "text": "Python was created by Guido van Rossum."},
]


@pytest.fixture(scope="module")
def tokenizer():
    return BertTokenizer(vocab=os.path.join(CORPUS_DIR, "vocab.txt"))


def diverged(embedder, value=float("nan")):
    """A copy of `embedder` whose projection gives `value` everywhere (NaN: diverged weights; inf: fp16 overflow)."""
    broken = copy.deepcopy(embedder)
    with torch.no_grad():
        broken.dense.bias.fill_(value)
    return broken


# ------------------------------------------------------------------------------------------------------------------
# NaN/inf embeddings never enter an index
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("index", ["Flat", "IVF2,Flat", "HNSW8"])
def test_from_embeddings_refuses_non_finite_rows_naming_the_blocks(index):
    vectors = structured_vectors(100, PROJ)
    vectors[[2, 5]] = np.nan
    vectors[7, 0] = np.inf
    with pytest.raises(ValueError, match=r"3 of 100 block embeddings.*NaN or inf.*\[2, 5, 7\]"):
        RealmRetriever.from_embeddings(vectors, [str(i) for i in range(100)], index=index)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_diverged_embedder_is_refused_by_every_way_into_an_index(tokenizer, value):
    embedder = TinyEmbedder(len(tokenizer)).eval()
    broken = diverged(embedder, value)
    kwargs = {"max_block_length": 32, "show_progress": False}
    with pytest.raises(ValueError, match="diverged in training.*overflowed in fp16"):
        RealmRetriever.from_documents(DOCUMENTS, broken, tokenizer, **kwargs)

    retriever = RealmRetriever.from_documents(DOCUMENTS, embedder, tokenizer, **kwargs)
    before = all_embeddings(retriever).clone()
    with pytest.raises(ValueError, match="3 of 3 block embeddings.*NaN or inf"):
        embed_corpus(retriever, broken, show_progress=False)
    with (
        pytest.raises(ValueError, match="1 of 1 block embeddings.*NaN or inf"),
        pytest.warns(UserWarning, match="different embedder"),
    ):
        retriever.add_documents(
            [{"title": "Lisp", "text": "Lisp was invented by John McCarthy."}], broken, show_progress=False
        )
    # Nothing changed: same blocks, same vectors, searches still answer.
    assert len(retriever) == 3 and retriever.store.index.index.ntotal == 3
    torch.testing.assert_close(all_embeddings(retriever), before, atol=0, rtol=0)
    assert retriever.search(before[:1], k=3).block_ids.min() >= 0


def test_non_finite_question_embeddings_are_refused():
    retriever = RealmRetriever.from_embeddings(structured_vectors(10, PROJ), [str(i) for i in range(10)])
    queries = np.ones((3, PROJ), np.float32)
    queries[1, 4] = np.nan
    with pytest.raises(ValueError, match=r"1 of 3 question embeddings.*NaN or inf.*rows \[1\].*diverged"):
        retriever.search(queries, k=2)


def test_missing_results_name_their_cause(caplog):
    vectors = structured_vectors(400, PROJ)
    ivf = RealmRetriever.from_embeddings(vectors, [str(i) for i in range(400)], index="IVF8,Flat")
    with caplog.at_level(logging.WARNING, logger="realm_hf"):
        ivf.search(vectors[:3], k=len(ivf), nprobe=1)  # one list cannot hold every block
    assert "`nprobe`" in caplog.text
    caplog.clear()

    # An exhaustive index only drops results for non-finite stored vectors (e.g. an index written by an older
    # version, or corrupted): the hint must not send the user to nprobe/efSearch.
    flat = RealmRetriever.from_embeddings(vectors[:10], [str(i) for i in range(10)], index="Flat")
    inner = faiss.downcast_index(faiss.downcast_index(flat.store.index.index).index)
    faiss.rev_swig_ptr(inner.get_xb(), 10 * PROJ)[3 * PROJ] = np.nan  # block 3, written past the checks
    with caplog.at_level(logging.WARNING, logger="realm_hf"):
        out = flat.search(vectors[:1], k=10)
    assert (out.block_ids == -1).any()
    assert "nprobe" not in caplog.text and "efSearch" not in caplog.text
    assert "NaN/inf or corrupt: rebuild it" in caplog.text


# ------------------------------------------------------------------------------------------------------------------
# Refreshes the model could not search are refused before the swap
# ------------------------------------------------------------------------------------------------------------------


def test_refresh_with_another_projection_size_is_refused_and_training_goes_on(tmp_path, caplog):
    model = make_model(train_document_embedder=False)
    other = copy.deepcopy(model.config)
    other.retriever_proj_size = model.config.retriever_proj_size + 8
    # A document embedder from another checkpoint, attached by mistake (frozen, so training uses the stored vectors).
    model.add_document_embedder(RealmEmbedder(other), trainable=False)
    before = all_embeddings(model.retriever).clone()
    reindex = RealmReindexCallback(model.retriever, refresh_steps=2, background=False, refresh_at_end=False)
    trainer = RealmOpenQATrainer(
        model=model,
        args=training_args(tmp_path, max_steps=5),
        train_dataset=datasets.Dataset.from_list(QUESTIONS),
        callbacks=[reindex],
    )
    with caplog.at_level(logging.ERROR, logger="realm_hf"):
        trainer.train()
    assert trainer.state.global_step == 5
    assert (reindex.refresh_count, reindex.failed_refreshes) == (0, 2)
    assert "training continues on the old index" in caplog.text and "same projection size" in caplog.text
    assert [
        entry["reindex/failed_refreshes"] for entry in trainer.state.log_history if "reindex/failed_refreshes" in entry
    ][-1] == 2
    assert all("error" in record and "dimension" in record["error"] for record in reindex.history)
    torch.testing.assert_close(all_embeddings(model.retriever), before, atol=0, rtol=0)


def test_nan_refresh_of_a_diverged_run_is_a_failure_not_a_success():
    model = make_model(train_document_embedder=False)
    document_embedder = model.add_document_embedder(trainable=False)
    before = all_embeddings(model.retriever).clone()
    model.train()
    reindex = RealmReindexCallback(model.retriever, refresh_steps=2, background=False, refresh_at_end=False)
    optimizer = torch.optim.AdamW(model.embedder.parameters(), lr=1e-3)
    collator = DataCollatorForOpenQA(model.retriever.tokenizer)
    logs = []
    for step in range(1, 5):
        if step == 2:
            with torch.no_grad():  # the document side diverges
                next(document_embedder.parameters()).fill_(float("nan"))
        loss = model(**collator(QUESTIONS[:2])).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        logs.append(reindex.step(step, model))
    assert (reindex.refresh_count, reindex.failed_refreshes) == (0, 2)
    assert logs[1] == {"reindex/failed_refreshes": 1.0} and logs[3] == {"reindex/failed_refreshes": 2.0}
    assert "NaN or inf" in reindex.history[-1]["error"]
    torch.testing.assert_close(all_embeddings(model.retriever), before, atol=0, rtol=0)
    model.eval()
    assert model.answer(QUESTIONS[0]["question"])["block"]["block_id"] >= 0
