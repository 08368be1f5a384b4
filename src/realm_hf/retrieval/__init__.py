"""
REALM's knowledge corpus by concept: blocks (chunking, encoding, corpus), the index (and its FAISS helpers), the store
(one state of corpus and index), the retriever over it and its contract, hybrid BM25, metadata filters, building,
refresh and staleness, saving and loading (serialization, manifest), legacy checkpoints and conversion, and sharding
across processes.
"""

import importlib

# Names resolved on first use, so that `realm_hf.retrieval.legacy` (used by model code) loads without faiss/datasets.
_EXPORTS = {
    "BlockStore": "store",
    "BuildOptions": "building",
    "RealmRetriever": "retriever",
    "RealmSearchOutput": "contract",
    "Retriever": "contract",
    "ShardedIndexState": "refresh",
    "ShardedRealmRetriever": "sharding",
    "block_spans": "chunking",
    "convert_legacy_checkpoint": "conversion",
    "embed_blocks": "encoding",
    "embed_corpus": "refresh",
    "fingerprint_module": "encoding",
    "is_stale": "refresh",
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
