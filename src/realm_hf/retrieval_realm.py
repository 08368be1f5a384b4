"""
REALM's knowledge corpus: blocks of text in a `datasets.Dataset`, searched by maximum inner product with FAISS.

The implementation lives in the [`realm_hf.retrieval`] package; this module keeps the names it always exported.

[`RealmRetriever`] replaces the legacy port's two pieces, a `[num_blocks, 128]` embedding buffer inside the model
weights (searched by brute force, one question at a time) and a pickled `block_records.npy`, with

- a corpus `datasets.Dataset` (`block_id`, `title`, `text`, metadata such as `doc_id`, and the `embeddings` the
  index was built from), saved as memory-mappable Arrow (or Parquet shards for the Hub),
- a FAISS inner-product index chosen by factory string (`"Flat"`, `"HNSW32"`, `"IVF1024,PQ32"`, ...) whose ids are
  the stable `block_id`s, so blocks can be added and removed without renumbering,
- the WordPiece tokenizer the blocks were split with, and
- a JSON manifest (dimension, block count, index type, fingerprint of the embedder weights) checked on load.

Layout written by [`RealmRetriever.save_pretrained`]:

```
<save_directory>/
    retriever_manifest.json     # format version, index type, metric, dim, num_blocks, embedder fingerprint, ...
    index.faiss                 # faiss.write_index (no pickle); labels = rows of corpus/ (block ids in memory)
    corpus/                     # Dataset.save_to_disk (Arrow, memory-mapped on load) or data-XXXXX-of-XXXXX.parquet
    tokenizer/                  # tokenizer.save_pretrained (a subfolder: a model's own tokenizer may sit at top level)
```

`corpus/` + `index.faiss` open with datasets' own `load_from_disk` + `load_faiss_index` + `get_nearest_examples`
(docs/saved-layout.md).
"""

from .constants import (  # noqa: F401 - re-exported: these names were importable from here
    ALLOW_PICKLE_ENV,
    CORPUS_DIR,
    FORMAT_VERSION,
    INDEX_NAME,
    LEGACY_BLOCK_EMB_KEY,
    LEGACY_BLOCK_RECORDS,
    MANIFEST_NAME,
    TOKENIZER_DIR,
)
from .retrieval.chunking import block_spans, split_documents
from .retrieval.conversion import convert_legacy_checkpoint
from .retrieval.encoding import embed_blocks, fingerprint_module
from .retrieval.legacy import load_legacy_block_emb
from .retrieval.retriever import RealmIndexState, RealmRetriever, RealmSearchOutput

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
