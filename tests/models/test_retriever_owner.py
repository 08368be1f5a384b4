"""A model that owns a retriever (`models/retriever_owner.py`): attaching one makes the model's question embedder its own."""

import torch

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
