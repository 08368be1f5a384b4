"""A tiny stand-in embedder with RealmEmbedder's interface, the vectors and documents the retrieval tests search."""

import numpy as np
import torch
from torch import nn
from transformers import BertConfig, BertModel

MAX_BLOCK_LENGTH = 48
PROJ = 16


class TinyEmbedder(nn.Module):
    """The RealmEmbedder interface: BERT [CLS] pooler output -> dense -> LayerNorm, as `projected_score`."""

    def __init__(self, vocab_size, seed=0, proj=PROJ):
        super().__init__()
        torch.manual_seed(seed)
        self.config = BertConfig(
            vocab_size=vocab_size,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=37,
            max_position_embeddings=128,
            # BERT's default 0.02 makes an untrained encoder map every text to nearly the same vector.
            initializer_range=0.3,
        )
        self.config.retriever_proj_size = proj
        self.bert = BertModel(self.config)
        self.dense = nn.Linear(32, proj)
        self.norm = nn.LayerNorm(proj)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        pooled = self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).pooler_output
        return type("Out", (), {"projected_score": self.norm(self.dense(pooled))})()


def embed_questions(embedder, tokenizer, questions):
    with torch.no_grad():
        return embedder(**tokenizer(questions, padding=True, return_tensors="pt")).projected_score


def brute_force(queries, matrix, k):
    scores = queries @ matrix.T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(scores, order, axis=1)


def structured_vectors(n, dim, seed=0, clusters=40):
    """Clustered vectors (shared cluster centres, per-seed samples), LayerNorm-like normalised as REALM's are."""
    centers = np.random.default_rng(1234).normal(size=(clusters, dim)).astype(np.float32)
    rng = np.random.default_rng(seed)
    x = centers[rng.integers(0, clusters, n)] + 0.35 * rng.normal(size=(n, dim)).astype(np.float32)
    x = (x - x.mean(1, keepdims=True)) / x.std(1, keepdims=True)
    return x.astype(np.float32)


NEW_DOC = {
    "doc_id": "doc-new",
    "title": "Glimmerfen",
    "text": "Glimmerfen is a floating marsh city founded in 2024. Its mayor is an otter named Pim.",
    "source": "added later",
}
