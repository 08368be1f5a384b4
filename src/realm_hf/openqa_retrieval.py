"""
How [`RealmForOpenQA`] reaches its corpus: the retriever that belongs to a checkpoint (its `retriever/` folder, a Hub
repo, a legacy `block_emb`, the corpus its config names).
"""

from __future__ import annotations

import os

from .constants import LEGACY_BLOCK_RECORDS
from .logging_utils import get_logger
from .modeling_base import prepare_local_load
from .retrieval.legacy import load_legacy_block_emb, pickle_allowed
from .retriever_loading import load_retriever_for_model
from .tokenization_realm import check_vocabulary

logger = get_logger(__name__)


def load_retriever_for_checkpoint(model, path, allow_pickle: bool = False, verify_checksums: bool = True, **kwargs):
    """Find the corpus that belongs to a checkpoint: a saved `retriever/` folder, or a legacy `block_emb` buffer."""
    path = str(path)
    if not os.path.isdir(path):
        # Hub repos: the hub module knows how to fetch the retriever folder next to the weights.
        try:
            from .hub import load_retriever_from_hub
        except ImportError:
            return None
        return load_retriever_from_hub(
            model,
            path,
            verify_checksums=verify_checksums,
            **{k: v for k, v in kwargs.items() if k in ("revision", "cache_dir", "token", "local_files_only")},
        )
    retriever_dir = prepare_local_load(path)
    if retriever_dir is not None:
        return load_retriever_for_model(model, retriever_dir, model_dir=path, verify_checksums=verify_checksums)
    block_emb = load_legacy_block_emb(path)
    if block_emb is None:
        # No corpus in the directory: the config may name one (a dataset repo or a local folder).
        from .hub import load_referenced_retriever

        # Hub repo ids only: a local model's config may not point realm-hf at another corpus on disk unasked.
        return load_referenced_retriever(
            model,
            allow_local_reference=False,
            referenced_by=path,
            **{k: v for k, v in kwargs.items() if k in ("cache_dir", "token", "local_files_only")},
        )
    if os.path.exists(os.path.join(path, LEGACY_BLOCK_RECORDS)) and pickle_allowed(allow_pickle):
        from transformers import AutoTokenizer

        from .retrieval_realm import RealmRetriever

        tokenizer = AutoTokenizer.from_pretrained(path)
        check_vocabulary(tokenizer, path)
        return RealmRetriever.from_legacy(path, tokenizer=tokenizer, block_emb=block_emb, allow_pickle=True)
    # Keep the embeddings reachable (memory-mapped, not a model buffer) so a converter or retriever can use them.
    model.legacy_block_emb = block_emb
    logger.warning(
        "Legacy REALM checkpoint: its %d block embeddings are available as `model.legacy_block_emb`, but its block "
        "texts are in a pickled block_records.npy, which is not loaded by default. Convert once with "
        "`realm-hf convert %s <output_dir>`, or pass `allow_pickle=True` if you trust the file.",
        block_emb.shape[0],
        path,
    )
    return None
