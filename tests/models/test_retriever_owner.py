"""
A model that owns a retriever (`models/retriever_owner.py`): attaching one makes the model's question embedder its
own, and a save writes the retriever as one consistent state, also while another thread adds and removes documents.
"""

import json
import threading

import torch

from realm_hf import RealmForOpenQA
from tests.support.tiny_model import QUESTIONS, build_tiny_model


def test_a_model_makes_its_question_embedder_the_retrievers(tmp_path):
    model, tokenizer = build_tiny_model(str(tmp_path))
    assert model.retriever.question_embedder is model.query_embedder
    inputs = tokenizer(QUESTIONS, padding=True, return_tensors="pt")
    with torch.no_grad():
        embeddings = model.embed_questions(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"])
    assert torch.equal(
        model.retriever.search(QUESTIONS, k=3).block_ids, model.retriever.search(embeddings, k=3).block_ids
    )


def test_model_saves_while_documents_change_each_load_whole(tmp_path):
    """
    A model's save raced with adds and removes in another thread: the index of a save held fewer vectors than its
    manifest said (the good save replaced), or the save raised KeyError. Each save now loads, with the index and
    corpus of one state.
    """
    model, _ = build_tiny_model(str(tmp_path))
    stop, errors = threading.Event(), []

    def churn():
        try:
            while not stop.is_set():
                added = model.retriever.add_documents(
                    [{"title": "Fortran", "text": "fortran is a language by john backus"}],
                    model.embedder,
                    show_progress=False,
                )
                model.retriever.remove_documents(block_ids=added)
        except Exception as error:  # noqa: BLE001 - reported by the test
            errors.append(repr(error))

    editor = threading.Thread(target=churn)
    editor.start()
    failures = []
    try:
        for n in range(8):
            target = tmp_path / f"save-{n}"
            try:
                model.save_pretrained(target, model_card=False)
                loaded = RealmForOpenQA.from_pretrained(target)
            except (KeyError, ValueError) as err:
                failures.append(f"save {n}: {type(err).__name__}: {err}")
                continue
            manifest = json.loads((target / "retriever" / "retriever_manifest.json").read_text())
            assert len(loaded.retriever) == loaded.retriever.store.index.ntotal == manifest["num_blocks"]
            assert loaded.config.num_block_records == manifest["num_blocks"]
    finally:
        stop.set()
        editor.join(timeout=60)
    assert not errors, errors
    assert not failures, failures
