import json
import os

import pytest
from transformers import BertTokenizer

from realm_hf.retrieval.retriever import RealmRetriever
from tests.support.paths import CORPUS_DIR
from tests.support.retrieval import MAX_BLOCK_LENGTH, TinyEmbedder


@pytest.fixture(scope="module")
def tokenizer():
    return BertTokenizer(vocab=os.path.join(CORPUS_DIR, "vocab.txt"))


@pytest.fixture(scope="module")
def documents():
    with open(os.path.join(CORPUS_DIR, "documents.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def embedder(tokenizer):
    return TinyEmbedder(len(tokenizer)).eval()


@pytest.fixture(scope="module")
def retriever(documents, embedder, tokenizer):
    return RealmRetriever.from_documents(
        documents, embedder, tokenizer, max_block_length=MAX_BLOCK_LENGTH, batch_size=8, show_progress=False
    )
