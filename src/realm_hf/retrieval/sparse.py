"""
Hybrid retrieval: a sparse BM25 index (`bm25s`) beside a retriever's dense index, its candidates added to the dense
ones and ranked by the dense scorer (or fused by reciprocal rank), so REALM's p(z|x) stays a softmax of dense scores.
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import torch

from ..file_utils import check_relative_name, file_sha256
from .searching import RealmSearchOutput

logger = logging.getLogger(__name__)

SPARSE_PARAMS_NAME = "bm25_params.json"
SPARSE_BLOCK_IDS_NAME = "bm25_block_ids.npy"
HYBRID_MODES = ("candidates", "rrf")


def require_bm25s():
    """Import `bm25s`, optional: only hybrid retrieval needs it."""
    try:
        import bm25s
    except ImportError as error:
        raise ImportError(
            "Hybrid (BM25 + dense) retrieval needs the `bm25s` package: pip install 'realm-hf[hybrid]'."
        ) from error
    return bm25s


def block_search_text(block: dict) -> str:
    """What BM25 indexes of a block: its title (when it has one) and its text."""
    title = block.get("title")
    return f"{title} {block['text']}" if title else block["text"]


class BM25BlockIndex:
    r"""
    A BM25 index over a corpus's blocks, labelled with their block ids (the same ids as the dense index).

    `bm25s` keeps no incremental update: after documents are added or removed, [`~BM25BlockIndex.from_blocks`]
    rebuilds it (tokenizing the corpus once; BM25's document frequencies change with every block anyway).

    Args:
        bm25: A fitted `bm25s.BM25`.
        block_ids (`np.ndarray`): The block id of each of its documents, in order.
        stopwords (`str`, *optional*): The stopword list its texts were tokenized with (questions use the same).
    """

    def __init__(self, bm25, block_ids, stopwords: str | None = "en"):
        self.bm25 = bm25
        self.block_ids = np.asarray(block_ids, dtype=np.int64)
        self.stopwords = stopwords
        # The hybrid retriever's `mode` and `sparse_k`, saved with the index so a loaded model searches as it did.
        self.hybrid_settings: dict = {}

    @classmethod
    def from_blocks(cls, blocks: list[dict], k1: float = 1.5, b: float = 0.75, stopwords: str | None = "en"):
        """Index blocks (dicts with `block_id`, `text` and optionally `title`, as `RealmRetriever.get_blocks` gives)."""
        bm25s = require_bm25s()
        if not blocks:
            raise ValueError("A BM25 index needs at least one block.")
        texts = [block_search_text(block) for block in blocks]
        bm25 = bm25s.BM25(k1=k1, b=b)
        bm25.index(bm25s.tokenize(texts, stopwords=stopwords, show_progress=False), show_progress=False)
        return cls(bm25, [int(block["block_id"]) for block in blocks], stopwords)

    @classmethod
    def from_retriever(cls, retriever, **kwargs):
        """Index every block of a [`RealmRetriever`] (its titles and texts), labelled with its block ids."""
        ids = torch.as_tensor(np.asarray(retriever.block_ids, dtype=np.int64))
        return cls.from_blocks(retriever.get_blocks(ids), **kwargs)

    def __len__(self) -> int:
        return len(self.block_ids)

    def search(self, questions: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """
        `(block_ids, scores)`, each `(len(questions), k)`, best first; `-1` (score 0) where fewer than `k` blocks
        share a term with the question.
        """
        bm25s = require_bm25s()
        k_found = min(k, len(self))
        tokens = bm25s.tokenize(list(questions), stopwords=self.stopwords, show_progress=False)
        rows, scores = self.bm25.retrieve(tokens, k=k_found, show_progress=False, n_threads=1)
        ids = np.full((len(questions), k), -1, dtype=np.int64)
        out = np.zeros((len(questions), k), dtype=np.float32)
        matched = scores > 0  # BM25 0: no shared term, not a candidate
        ids[:, :k_found] = np.where(matched, self.block_ids[rows], -1)
        out[:, :k_found] = np.where(matched, scores, 0.0)
        return ids, out

    def save(self, directory: str) -> dict:
        """
        Write the index into `directory` (`bm25s`'s own `.npy` arrays, saved without pickle, and JSON vocabulary and
        parameters) with the block ids; returns `{relative path: {"size", "sha256"}}` of what was written.
        """
        os.makedirs(directory, exist_ok=True)
        self.bm25.save(directory, allow_pickle=False)
        np.save(os.path.join(directory, SPARSE_BLOCK_IDS_NAME), self.block_ids, allow_pickle=False)
        with open(os.path.join(directory, SPARSE_PARAMS_NAME), "w", encoding="utf-8") as f:
            json.dump({"stopwords": self.stopwords, "library": "bm25s", "hybrid": self.hybrid_settings}, f)
        return {
            name: {
                "size": os.path.getsize(os.path.join(directory, name)),
                "sha256": file_sha256(os.path.join(directory, name)),
            }
            for name in sorted(os.listdir(directory))
        }

    @classmethod
    def load(cls, directory: str, files: dict | None = None) -> BM25BlockIndex:
        """
        Read an index [`~BM25BlockIndex.save`] wrote (never unpickling); with `files` (what `save` returned), every
        file's size and sha256 is checked first.
        """
        bm25s = require_bm25s()
        for name, expected in (files or {}).items():
            path = os.path.join(directory, name)
            if not os.path.isfile(path) or file_sha256(path) != expected.get("sha256"):
                raise ValueError(
                    f"{path} is missing or differs from the file saved with this index: save the hybrid retriever again."
                )
        bm25 = bm25s.BM25.load(directory, allow_pickle=False)
        block_ids = np.load(os.path.join(directory, SPARSE_BLOCK_IDS_NAME), allow_pickle=False)
        with open(os.path.join(directory, SPARSE_PARAMS_NAME), encoding="utf-8") as f:
            params = json.load(f)
        index = cls(bm25, block_ids, params.get("stopwords"))
        index.hybrid_settings = dict(params.get("hybrid") or {})
        return index


def load_saved_sparse_index(path) -> BM25BlockIndex | None:
    """
    The BM25 index a retriever directory's manifest names (`sparse_index`), or `None` when it has none. Its files were
    checked with the directory's other files by [`RealmRetriever.from_pretrained`].
    """
    from ..constants import MANIFEST_NAME

    with open(os.path.join(os.fspath(path), MANIFEST_NAME), encoding="utf-8") as f:
        entry = json.load(f).get("sparse_index")
    if entry is None:
        return None
    parts = check_relative_name(entry.get("dir") if isinstance(entry, dict) else None, "sparse_index", MANIFEST_NAME)
    return BM25BlockIndex.load(os.path.join(os.fspath(path), *parts))


def attach_saved_sparse_index(dense, path):
    """
    `dense` as a [`HybridRealmRetriever`] when its saved directory `path` holds a BM25 index, else `dense` itself.
    Without `bm25s` installed, a warning says the model answers from the dense index alone.
    """
    try:
        sparse = load_saved_sparse_index(path)
    except ImportError as error:
        logger.warning("%s The retriever in %s is loaded without its BM25 index (dense search only).", error, path)
        return dense
    if sparse is None:
        return dense
    return HybridRealmRetriever(dense, sparse=sparse, **sparse.hybrid_settings)


def dense_queries(question_embeddings) -> np.ndarray:
    if isinstance(question_embeddings, torch.Tensor):
        return question_embeddings.detach().float().cpu().numpy()
    return np.asarray(question_embeddings, dtype=np.float32)


def reciprocal_rank_fusion(rankings: list[np.ndarray], k: int, constant: int = 60) -> np.ndarray:
    """
    Reciprocal-rank fusion (Cormack et al., 2009) of several rankings of block ids per question (`-1` ignored):
    score(z) = sum over rankings of 1 / (constant + rank(z)), rank from 1. Returns `(num_questions, k)` ids, `-1`
    padded.
    """
    out = np.full((len(rankings[0]), k), -1, dtype=np.int64)
    for row in range(len(rankings[0])):
        scores: dict[int, float] = {}
        for ranking in rankings:
            for rank, block_id in enumerate(ranking[row].tolist(), start=1):
                if block_id >= 0:
                    scores[block_id] = scores.get(block_id, 0.0) + 1.0 / (constant + rank)
        best = sorted(scores, key=lambda block_id: (-scores[block_id], block_id))[:k]
        out[row, : len(best)] = best
    return out


class HybridRealmRetriever:
    r"""
    A [`RealmRetriever`] with a BM25 index beside its dense one: `search` takes the question texts too and returns a
    [`RealmSearchOutput`] over the union of both candidate lists. Everything else (tokenizer, lookups, updates,
    refresh) is the dense retriever's; after `add_documents` / `remove_documents`, call [`~HybridRealmRetriever.sync`]
    (or search: a changed corpus is re-indexed first).

    Modes:
        - `"candidates"` (default): the dense top `k` plus the BM25 top `sparse_k`, ranked by the dense score q·e of
          their stored embeddings; the model's p(z|x) stays a softmax of dense scores, over more candidates.
        - `"rrf"`: the same candidates ordered by reciprocal-rank fusion of the dense and BM25 ranks; the scores
          returned are still the dense inner products (what [`RealmForOpenQA`] re-computes).

    Args:
        retriever ([`RealmRetriever`]): The dense retriever.
        sparse ([`BM25BlockIndex`], *optional*): Built from the retriever's blocks when not given.
        mode (`str`, *optional*, defaults to `"candidates"`): `"candidates"` or `"rrf"`.
        sparse_k (`int`, *optional*): BM25 candidates per question; defaults to `k`.
    """

    def __init__(self, retriever, sparse: BM25BlockIndex | None = None, mode: str = "candidates", sparse_k=None):
        if mode not in HYBRID_MODES:
            raise ValueError(f"`mode` must be one of {', '.join(map(repr, HYBRID_MODES))}, got {mode!r}.")
        if sparse_k is not None and (isinstance(sparse_k, bool) or not isinstance(sparse_k, int) or sparse_k < 1):
            raise ValueError(f"`sparse_k` must be None or a positive integer, got {sparse_k!r}.")
        self.dense = retriever
        self.sparse = sparse if sparse is not None else BM25BlockIndex.from_retriever(retriever)
        self.mode = mode
        self.sparse_k = sparse_k

    def __getattr__(self, name):
        # Everything but the search is the dense retriever's (called only for attributes not found on self).
        if name == "dense":
            raise AttributeError(name)
        return getattr(self.dense, name)

    def __len__(self) -> int:
        return len(self.dense)

    def sparse_index_for_save(self) -> BM25BlockIndex:
        """The BM25 index, brought up to date with the corpus: what a save writes beside the dense index."""
        self.sync()
        self.sparse.hybrid_settings = {"mode": self.mode, "sparse_k": self.sparse_k}
        return self.sparse

    def save_pretrained(self, save_directory, corpus_format: str = "arrow", max_shard_size="500MB") -> None:
        """
        [`RealmRetriever.save_pretrained`] with the BM25 index in `sparse_bm25/`: one all-or-nothing save, its files'
        sizes and sha256 recorded in the same manifest (`sparse_index` names the folder) and checked on load.
        """
        from .serialization import save_retriever

        save_retriever(self, save_directory, corpus_format, max_shard_size)

    @classmethod
    def from_pretrained(cls, path, mode: str | None = None, sparse_k=None, **kwargs) -> HybridRealmRetriever:
        """
        Load a hybrid retriever saved with [`~HybridRealmRetriever.save_pretrained`]: the dense retriever (every file,
        the BM25 ones included, checked against the manifest) and its BM25 index, with the saved `mode` and `sparse_k`
        unless given. A directory saved without one gets a BM25 index built from its corpus. `kwargs` go to
        [`RealmRetriever.from_pretrained`].
        """
        from .retriever import RealmRetriever

        dense = RealmRetriever.from_pretrained(path, **kwargs)
        sparse = load_saved_sparse_index(path)
        saved = sparse.hybrid_settings if sparse is not None else {}
        mode = mode if mode is not None else saved.get("mode", "candidates")
        return cls(
            dense, sparse=sparse, mode=mode, sparse_k=sparse_k if sparse_k is not None else saved.get("sparse_k")
        )

    def sync(self) -> bool:
        """Rebuild the BM25 index if the dense corpus's blocks changed (added or removed); returns whether it did."""
        if np.array_equal(np.asarray(self.dense.block_ids), self.sparse.block_ids):
            return False
        self.sparse = BM25BlockIndex.from_retriever(self.dense, stopwords=self.sparse.stopwords)
        return True

    def search(
        self,
        question_embeddings,
        k: int = 5,
        questions: list[str] | None = None,
        return_blocks: bool = True,
        return_embeddings: bool = False,
        **kwargs,
    ) -> RealmSearchOutput:
        """
        Dense search, plus BM25 candidates when `questions` (the texts) are given; without them, the dense search
        alone. Arguments and output as [`RealmRetriever.search`].
        """
        if questions is None:
            return self.dense.search(
                question_embeddings, k, return_blocks=return_blocks, return_embeddings=return_embeddings, **kwargs
            )
        self.sync()
        dense = self.dense.search(question_embeddings, k, return_blocks=False, **kwargs)
        sparse_ids, _ = self.sparse.search(questions, self.sparse_k or k)
        dense_ids = dense.block_ids.numpy()
        # Union per question, dense first; the width is the largest union, padded with -1.
        unions = [
            list(dict.fromkeys([i for i in row if i >= 0] + [i for i in srow if i >= 0]))
            for row, srow in zip(dense_ids.tolist(), sparse_ids.tolist())
        ]
        width = max(1, max(len(u) for u in unions))
        ids = torch.full((len(unions), width), -1, dtype=torch.long)
        for row, union in enumerate(unions):
            ids[row, : len(union)] = torch.tensor(union, dtype=torch.long)
        embeddings = self.dense.get_block_embeddings(ids)
        queries = torch.as_tensor(np.asarray(dense_queries(question_embeddings)), dtype=torch.float32)
        scores = torch.einsum("bd,bkd->bk", queries, embeddings).masked_fill(ids < 0, float("-inf"))
        if self.mode == "candidates":
            order = scores.argsort(dim=1, descending=True)
        else:
            fused = reciprocal_rank_fusion([dense_ids, sparse_ids], width)
            order = torch.zeros_like(ids)
            for row in range(len(unions)):
                position = {int(b): i for i, b in enumerate(ids[row].tolist())}
                places = [position[b] for b in fused[row].tolist() if b >= 0]
                rest = [i for i in range(width) if i not in set(places)]
                order[row] = torch.tensor(places + rest)
        if self.mode == "rrf":
            order = order[:, : min(k, width)]  # the fused top k
        ids, scores = ids.gather(1, order), scores.gather(1, order)
        embeddings = embeddings.gather(1, order.unsqueeze(-1).expand(-1, -1, embeddings.shape[-1]))
        # "candidates" keeps the whole union (up to k + sparse_k): cut to k, the dense top k would always win.
        return RealmSearchOutput(
            block_ids=ids,
            scores=scores,
            blocks=self.dense.get_blocks(ids) if return_blocks else None,
            block_embeddings=embeddings if return_embeddings else None,
        )
