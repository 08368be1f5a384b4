"""Changing a live retriever's knowledge: adding and removing documents and blocks, corpus and index in step."""

from __future__ import annotations

from typing import TYPE_CHECKING

import faiss
import numpy as np
import torch

from ..logging_utils import get_logger, warn
from .building import split_and_embed, with_token_ids
from .corpus import TOKEN_IDS_COLUMN, BlockCorpus, as_id_array
from .encoding import fingerprint_module
from .index import add_embeddings, build_index, supports_remove

if TYPE_CHECKING:
    from .retriever import RealmRetriever

logger = get_logger(__name__)


def add_documents(
    retriever: RealmRetriever,
    documents,
    embedder: torch.nn.Module,
    batch_size: int,
    device: str | torch.device | None,
    dtype: str | torch.dtype | None,
    show_progress: bool,
) -> list[int]:
    """[`RealmRetriever.add_documents`]."""
    if retriever.tokenizer is None:
        raise ValueError("This retriever has no tokenizer to split documents with: set `retriever.tokenizer`.")
    fingerprint = fingerprint_module(embedder)
    if retriever.embedder_fingerprint is not None and fingerprint != retriever.embedder_fingerprint:
        warn(
            "Adding documents embedded by a different embedder than the one that built this corpus: their scores "
            "are not comparable. Re-embed the whole corpus with `retriever.embed_corpus(embedder)`.",
            stacklevel=3,
        )
    max_block_length = retriever.max_block_length or 288
    first_doc_id = retriever._corpus.next_doc_id(fallback=retriever._next_block_id)
    columns, embeddings = split_and_embed(
        documents,
        embedder,
        retriever.tokenizer,
        max_block_length,
        first_doc_id,
        "No blocks to add: the documents are empty.",
        # Before the embedding work; `add_blocks` checks again under the lock.
        check=lambda columns: _check_new_doc_ids(retriever._corpus, list(dict.fromkeys(columns["doc_id"]))),
        batch_size=batch_size,
        device=device,
        dtype=dtype,
        show_progress=show_progress,
    )
    return add_blocks(retriever, columns, embeddings)


def _check_new_doc_ids(corpus: BlockCorpus, doc_ids: list) -> None:
    """Refuse documents whose `doc_id` the corpus already has: `remove_documents` would then remove both."""
    if "doc_id" not in corpus.dataset.column_names or not doc_ids:
        return
    corpus.check_doc_ids(doc_ids)  # one doc_id type per corpus: never cast, so 3 and "3" never meet
    new = set(doc_ids)
    taken = new.intersection(corpus.dataset.with_format("numpy", columns=["doc_id"])[:]["doc_id"].tolist())
    if taken:
        raise ValueError(
            f"The corpus already has documents with doc_id {sorted(taken, key=str)[:10]}: doc_ids must be unique. "
            "Remove the old version first (`retriever.remove_documents(doc_ids)`), or give the new documents other "
            "ids."
        )


def add_blocks(retriever: RealmRetriever, columns: dict, embeddings: np.ndarray) -> list[int]:
    """Append embedded blocks with fresh ids to the corpus and the index, in one swap under the retriever's lock."""
    if embeddings.shape[1] != retriever.embedding_dim:
        raise ValueError(
            f"New embeddings have dimension {embeddings.shape[1]} but the corpus has {retriever.embedding_dim}."
        )
    # The new blocks' token ids when the corpus stores them (tokenized outside the lock), none when it does not.
    if retriever._corpus.has_token_ids and TOKEN_IDS_COLUMN not in columns and retriever.tokenizer is not None:
        columns = with_token_ids(columns, retriever.tokenizer)
    elif not retriever._corpus.has_token_ids:
        columns = {name: values for name, values in columns.items() if name != TOKEN_IDS_COLUMN}
    with retriever._lock:
        if columns.get("doc_id") is not None:
            _check_new_doc_ids(retriever._corpus, list(dict.fromkeys(columns["doc_id"])))
        new_ids = np.arange(retriever._next_block_id, retriever._next_block_id + len(embeddings), dtype=np.int64)
        # Everything that can fail comes before the first change to the live state.
        corpus = BlockCorpus(retriever._corpus.appended({"block_id": new_ids, **columns}, embeddings))
        index = retriever._index.owned_cpu_index()
        add_embeddings(index, embeddings, new_ids)
        retriever._corpus, retriever._index = corpus, retriever._index.replaced_by(index)
        retriever._next_block_id = int(new_ids[-1]) + 1
    return new_ids.tolist()


def remove_documents(retriever: RealmRetriever, doc_ids, block_ids) -> list[int]:
    """[`RealmRetriever.remove_documents`]."""
    if doc_ids is None and block_ids is None:
        raise ValueError("Pass `doc_ids` and/or `block_ids` to remove.")
    # The rows to remove are found under the lock too: blocks added meanwhile would shift them.
    with retriever._lock:
        live = retriever._corpus
        remove = np.zeros(len(live), dtype=bool)
        if doc_ids is not None:
            remove |= live.doc_mask(doc_ids)
        if block_ids is not None:
            rows = live.rows(as_id_array(block_ids).reshape(-1))
            remove[rows[rows >= 0]] = True
        removed = live.row_ids[remove]
        if len(removed) == 0:
            return []
        if len(removed) == len(live):
            raise ValueError("Removing these documents would leave the corpus empty; build a new retriever instead.")
        corpus = BlockCorpus(live.dataset.select(np.flatnonzero(~remove)))
        if supports_remove(retriever.index):
            index = retriever._index.owned_cpu_index()
            index.remove_ids(np.ascontiguousarray(removed, dtype=np.int64))
        else:
            logger.info("FAISS cannot remove ids from an %s index: rebuilding it without them.", retriever.index_type)
            index = rebuilt_index(retriever, corpus)
        if index.ntotal != len(corpus):
            raise RuntimeError(f"Index ({index.ntotal}) and corpus ({len(corpus)}) disagree after removal.")
        retriever._corpus, retriever._index = corpus, retriever._index.replaced_by(index)
    return removed.tolist()


def rebuilt_index(retriever: RealmRetriever, corpus: BlockCorpus, train_size: int | None = None) -> faiss.Index:
    """A CPU index of the retriever's index type over `corpus`'s stored embeddings (for indexes that cannot remove ids)."""
    logger.info(
        "Rebuilding the %s index over %d blocks from the stored embeddings.", retriever.index_type, len(corpus)
    )
    rng = np.random.default_rng(0)

    def sample(size: int) -> np.ndarray:
        return corpus.embedding_rows(np.sort(rng.choice(len(corpus), size=size, replace=False)))

    chunks = corpus.iter_embeddings()
    return build_index(retriever.index_type, retriever.embedding_dim, chunks, len(corpus), sample, train_size)
