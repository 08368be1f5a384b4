"""
REALM's knowledge corpus by concept: blocks (chunking, encoding, corpus), the index, the store (one state of corpus
and index), the retriever over it and its contract, building, saving and loading (serialization), legacy checkpoints
and conversion, and sharding across processes.
"""

import importlib

# Names resolved on first use, so that `realm_hf.retrieval.legacy` (used by model code) loads without faiss/datasets.
_EXPORTS = {
    "BlockStore": "store",
    "BuildOptions": "building",
    "RealmIndexState": "retriever",
    "RealmRetriever": "retriever",
    "RealmSearchOutput": "contract",
    "Retriever": "contract",
    "ShardedIndexState": "sharding",
    "ShardedRealmRetriever": "sharding",
    "block_spans": "chunking",
    "convert_legacy_checkpoint": "conversion",
    "embed_blocks": "encoding",
    "fingerprint_module": "encoding",
    "load_legacy_block_emb": "legacy",
    "pickle_allowed": "legacy",
    "split_documents": "chunking",
    "tokenize_blocks": "encoding",
}


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)


__all__ = sorted(_EXPORTS)
