"""The tiny end-to-end Open-QA setup the multi-process worker scripts share (imported from their own folder)."""

import os

import torch

LEGACY_OPENQA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "legacy", "openqa")
QUESTIONS = [
    {"question": "What is the capital of France?", "answers": ["paris"]},
    {"question": "Who created the Python language?", "answers": ["guido van rossum", "guido"]},
    {"question": "Which country is Paris in?", "answers": ["france", "europe"]},
    {"question": "What is the capital of England?", "answers": ["london"]},
]


def end_to_end_model(dropout: bool = False):
    """
    The tiny legacy Open-QA fixture (hidden 32, 2 layers, 12 blocks) with a trainable document embedder, its index
    embedded by that embedder, a searcher beam of 6, seeded; dropout off unless `dropout`.
    """
    from realm_hf import RealmForOpenQA
    from realm_hf.retrieval.refresh import embed_corpus

    torch.manual_seed(0)
    model = RealmForOpenQA.from_pretrained(LEGACY_OPENQA, allow_pickle=True)
    model.config.searcher_beam_size = 6
    model.add_document_embedder()
    embed_corpus(model.retriever, model.document_embedder, show_progress=False)
    if not dropout:
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
    return model
