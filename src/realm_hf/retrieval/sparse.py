"""
Hybrid retrieval: [`HybridRealmRetriever`], a [`RealmRetriever`] whose store holds a BM25 index (`bm25s`,
[`BM25BlockIndex`]) beside the dense one; its candidates are added to the dense ones and ranked by the dense scorer
(or fused by reciprocal rank), so REALM's p(z|x) stays a softmax of dense scores.
"""

from __future__ import annotations

import dataclasses
import os

from .bm25 import (  # noqa: F401 - re-exported: the hybrid retrieval API lives here
    HYBRID_MODES,
    SPARSE_BLOCK_IDS_NAME,
    SPARSE_PARAMS_NAME,
    BM25BlockIndex,
    block_search_text,
    check_hybrid_settings,
    reciprocal_rank_fusion,
    require_bm25s,
)
from .retriever import RealmRetriever


class HybridRealmRetriever(RealmRetriever):
    r"""
    A [`RealmRetriever`] with a BM25 index beside its dense one, in the same [`BlockStore`]: `search` takes the
    question texts too and returns a [`RealmSearchOutput`] over the union of both candidate lists. Adding or removing
    documents rebuilds the BM25 index with the corpus, in the same step, and a save writes both under one manifest
    (`sparse_bm25/`, checked on load).

    Built over an existing `retriever`, it shares that retriever's live store (the BM25 index is added to it): a change
    made through either object is seen by both, and a search of `retriever` given question texts is hybrid too.

    Modes:
        - `"candidates"` (default): the dense top `k` plus the BM25 top `sparse_k`, ranked by the dense score q·e of
          their stored embeddings; the model's p(z|x) stays a softmax of dense scores, over more candidates.
        - `"rrf"`: the same candidates ordered by reciprocal-rank fusion of the dense and BM25 ranks, the fused top
          `k`; the scores returned are still the dense inner products (what [`RealmForOpenQA`] re-computes).

    Args:
        retriever ([`RealmRetriever`]): The dense retriever.
        sparse ([`BM25BlockIndex`], *optional*): Built from the retriever's blocks when not given (and when the
            retriever holds none).
        mode (`str`, *optional*, defaults to `"candidates"`): `"candidates"` or `"rrf"`.
        sparse_k (`int`, *optional*): BM25 candidates per question; defaults to `k`.
    """

    def __init__(
        self, retriever: RealmRetriever, sparse: BM25BlockIndex | None = None, mode: str = "candidates", sparse_k=None
    ):
        check_hybrid_settings(mode, sparse_k)
        self._live, self.tokenizer, self.max_block_length = (
            retriever._live,
            retriever.tokenizer,
            retriever.max_block_length,
        )
        with self._lock:
            live = self._store
            sparse = sparse if sparse is not None else live.sparse
            if sparse is None:
                sparse = BM25BlockIndex.from_corpus(live.corpus)
            self._store = dataclasses.replace(live, sparse=sparse.with_settings(mode, sparse_k))

    @property
    def sparse(self) -> BM25BlockIndex:
        """The BM25 index of the current store."""
        return self._store.sparse

    @property
    def mode(self) -> str:
        """`"candidates"` or `"rrf"` (see the class docstring)."""
        return self._store.sparse.mode

    @property
    def sparse_k(self) -> int | None:
        """BM25 candidates per question (`None`: the search's `k`)."""
        return self._store.sparse.sparse_k

    @classmethod
    def from_pretrained(
        cls, pretrained_path_or_repo_id: str | os.PathLike, mode: str | None = None, sparse_k=None, **kwargs
    ) -> HybridRealmRetriever:
        """
        Load a hybrid retriever saved with [`~RealmRetriever.save_pretrained`]: the corpus, dense index and BM25
        index (every file checked against the manifest), searched with the saved `mode` and `sparse_k` unless given. A
        directory saved without a BM25 index gets one built from its corpus. `kwargs` go to
        [`RealmRetriever.from_pretrained`].
        """
        dense = RealmRetriever.from_pretrained(pretrained_path_or_repo_id, **kwargs)
        saved = dense.store.sparse
        return cls(
            dense,
            mode=mode if mode is not None else (saved.mode if saved is not None else "candidates"),
            sparse_k=sparse_k if sparse_k is not None else (saved.sparse_k if saved is not None else None),
        )


def attach_saved_sparse_index(dense: RealmRetriever, path=None) -> RealmRetriever:
    """
    `dense` (loaded with [`RealmRetriever.from_pretrained`], which reads a saved BM25 index into its store) as a
    [`HybridRealmRetriever`] over the same store when it holds one, with the saved `mode` and `sparse_k`; else `dense`
    itself. `path`, the directory it was loaded from, is not read again (kept for the loaders that pass it).
    """
    sparse = dense.store.sparse
    if sparse is None or isinstance(dense, HybridRealmRetriever):
        return dense
    return HybridRealmRetriever(dense, mode=sparse.mode, sparse_k=sparse.sparse_k)
