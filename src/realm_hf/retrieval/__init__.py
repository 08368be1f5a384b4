"""REALM's knowledge corpus split by job: chunking, block encoding, corpus, FAISS index, serialization, legacy."""

from .chunking import block_spans, split_documents
from .encoding import embed_blocks, fingerprint_module
from .legacy import convert_legacy_checkpoint, load_legacy_block_emb
from .retriever import RealmIndexState, RealmRetriever, RealmSearchOutput

__all__ = [
    "RealmIndexState",
    "RealmRetriever",
    "RealmSearchOutput",
    "block_spans",
    "convert_legacy_checkpoint",
    "embed_blocks",
    "fingerprint_module",
    "load_legacy_block_emb",
    "split_documents",
]
