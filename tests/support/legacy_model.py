"""The tiny legacy fixture model (transformers 4.57.6's RealmForOpenQA: hidden 32, 2 layers, 12 blocks) as the
training tests use it, with questions whose answers its blocks hold."""

import torch
from transformers import TrainingArguments

from realm_hf import RealmForOpenQA
from realm_hf.retrieval.refresh import embed_corpus
from tests.support.paths import LEGACY_OPENQA

QUESTIONS = [
    {"question": "What is the capital of France?", "answers": ["paris"]},
    {"question": "Who created the Python language?", "answers": ["guido van rossum", "guido"]},
    {"question": "Which country is Paris in?", "answers": ["france", "europe"]},
    {"question": "What is the capital of England?", "answers": ["london"]},
]


def no_dropout(model):
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def make_model(train_document_embedder=True):
    """The tiny legacy fixture model, with a trainable document embedder and an index built by it."""
    torch.manual_seed(0)
    model = RealmForOpenQA.from_pretrained(LEGACY_OPENQA, allow_pickle=True)
    model.config.searcher_beam_size = 6
    if train_document_embedder:
        model.add_document_embedder()
        embed_corpus(model.retriever, model.document_embedder, show_progress=False)
    return no_dropout(model)


def all_embeddings(retriever):
    ids = torch.as_tensor(retriever.store.block_ids).view(1, -1)
    return retriever.store.embeddings(ids)[0]


def training_args(tmp_path, **overrides):
    args = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        learning_rate=5e-3,
        max_steps=8,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        data_seed=0,
    )
    args.update(overrides)
    return TrainingArguments(**args)


def load_legacy_model():
    """The fixture model as saved (dropout on), searching a beam of 6."""
    torch.manual_seed(0)
    model = RealmForOpenQA.from_pretrained(LEGACY_OPENQA, allow_pickle=True)
    model.config.searcher_beam_size = 6
    return model
