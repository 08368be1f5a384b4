"""Folder, file and environment-variable names shared by the modules that save, load and publish REALM models."""

# Where a RealmForOpenQA directory (or Hub repo) keeps its corpus, index and manifest.
RETRIEVER_SUBFOLDER = "retriever"

# Entries of a retriever directory (RealmRetriever.save_pretrained).
MANIFEST_NAME = "retriever_manifest.json"
INDEX_NAME = "index.faiss"
CORPUS_DIR = "corpus"
# The cache files `datasets` writes beside a dataset opened with `load_from_disk` when it is mapped or filtered
# (`cache-<fingerprint>.arrow`, `_<rank>_of_<n>` with `num_proc`): never read by a load, so never part of a save.
DATASETS_CACHE_FILES = "cache-*.arrow"
TOKENIZER_DIR = "tokenizer"
# The BM25 index of hybrid retrieval (`retrieval/bm25.py`), saved beside the dense index under the same manifest.
SPARSE_INDEX_DIR = "sparse_bm25"
# What a retriever directory holds, in the order a save swaps it in (the manifest last).
RETRIEVER_ENTRIES = (CORPUS_DIR, INDEX_NAME, TOKENIZER_DIR, SPARSE_INDEX_DIR, MANIFEST_NAME)
# A sharded retriever directory (ShardedRealmRetriever.save_pretrained): one manifest naming N shard folders, each a
# retriever directory of its own (the blocks one process holds).
SHARDED_MANIFEST_NAME = "sharded_retriever_manifest.json"
SHARD_FOLDER_FORMAT = "shard-{index:05d}-of-{count:05d}"
# 2: index labels are rows of the saved corpus (`index_labels: row`); 1: block ids.
FORMAT_VERSION = 2

# Files of a legacy (transformers 4) RealmForOpenQA checkpoint.
LEGACY_BLOCK_RECORDS = "block_records.npy"
LEGACY_BLOCK_EMB_KEY = "block_emb"

# The module a saved model or tokenizer directory holds for transformers' Auto classes (`auto_map`, auto_map.py).
AUTO_MODULE_FILE = "realm_hf_auto.py"

# Setting it to 1/true/yes allows unpickling legacy block_records.npy files.
ALLOW_PICKLE_ENV = "REALM_HF_ALLOW_PICKLE"

# The token that allows adding and removing documents on a `realm-hf serve` server (else `--write-token`).
SERVE_WRITE_TOKEN_ENV = "REALM_HF_SERVE_WRITE_TOKEN"
# More host names a `realm-hf serve` server answers to besides loopback (comma-separated), e.g. behind a proxy.
SERVE_ALLOWED_HOSTS_ENV = "REALM_HF_SERVE_ALLOWED_HOSTS"

__all__ = [
    "ALLOW_PICKLE_ENV",
    "AUTO_MODULE_FILE",
    "CORPUS_DIR",
    "FORMAT_VERSION",
    "INDEX_NAME",
    "LEGACY_BLOCK_EMB_KEY",
    "LEGACY_BLOCK_RECORDS",
    "MANIFEST_NAME",
    "RETRIEVER_SUBFOLDER",
    "SERVE_ALLOWED_HOSTS_ENV",
    "SERVE_WRITE_TOKEN_ENV",
    "SHARDED_MANIFEST_NAME",
    "SHARD_FOLDER_FORMAT",
    "TOKENIZER_DIR",
]
