"""
[`BM25BlockIndex`]: a sparse BM25 index (`bm25s`) over a corpus's blocks, held in a hybrid [`BlockStore`] beside the
dense index, and the hybrid candidate ranking: BM25 candidates added to the dense ones and ranked by the dense scorer
(or fused by reciprocal rank), so REALM's p(z|x) stays a softmax of dense scores. A retriever searches with it once
[`RealmRetriever.use_bm25`] put one in its store (or loaded one saved with it) and a search is given the question texts.
"""

from __future__ import annotations

import json
import os

import numpy as np

from ..io.checksums import file_sha256

SPARSE_PARAMS_NAME = "bm25_params.json"
SPARSE_BLOCK_IDS_NAME = "bm25_block_ids.npy"
HYBRID_MODES = ("candidates", "rrf")


def check_hybrid_settings(mode: str, sparse_k) -> None:
    """Refuse an unknown hybrid `mode` and a `sparse_k` that is not a positive integer (or `None`)."""
    if mode not in HYBRID_MODES:
        raise ValueError(f"`mode` must be one of {', '.join(map(repr, HYBRID_MODES))}, got {mode!r}.")
    if sparse_k is not None and (isinstance(sparse_k, bool) or not isinstance(sparse_k, int) or sparse_k < 1):
        raise ValueError(f"`sparse_k` must be None or a positive integer, got {sparse_k!r}.")


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
    A BM25 index over a corpus's blocks, labelled with their block ids (the same ids as the dense index), and how a
    hybrid search uses it (`mode`, `sparse_k`: saved with it, so a loaded model searches as it did). Never changed
    once built: a [`BlockStore`] holding one makes a new one when its blocks change.

    `bm25s` keeps no incremental update: after documents are added or removed, [`~BM25BlockIndex.rebuilt`] indexes the
    new corpus (tokenizing it once; BM25's document frequencies change with every block anyway).

    Args:
        bm25: A fitted `bm25s.BM25`.
        block_ids (`np.ndarray`): The block id of each of its documents, in order.
        stopwords (`str`, *optional*): The stopword list its texts were tokenized with (questions use the same).
        mode (`str`, *optional*, defaults to `"candidates"`): How a hybrid search ranks: `"candidates"` or `"rrf"`.
        sparse_k (`int`, *optional*): BM25 candidates per question; defaults to the search's `k`.
    """

    def __init__(self, bm25, block_ids, stopwords: str | None = "en", mode: str = "candidates", sparse_k=None):
        check_hybrid_settings(mode, sparse_k)
        self.bm25 = bm25
        self.block_ids = np.asarray(block_ids, dtype=np.int64)
        self.stopwords = stopwords
        self.mode = mode
        self.sparse_k = sparse_k

    @property
    def hybrid_settings(self) -> dict:
        """`{"mode", "sparse_k"}`, as saved with the index."""
        return {"mode": self.mode, "sparse_k": self.sparse_k}

    def with_settings(self, mode: str | None = None, sparse_k=None) -> BM25BlockIndex:
        """The same index (sharing its arrays) searched with another `mode` and/or `sparse_k`."""
        return BM25BlockIndex(
            self.bm25,
            self.block_ids,
            self.stopwords,
            self.mode if mode is None else mode,
            self.sparse_k if sparse_k is None else sparse_k,
        )

    @classmethod
    def from_corpus(cls, corpus, stopwords: str | None = "en", **kwargs) -> BM25BlockIndex:
        """Index every block of a [`BlockCorpus`] (its titles and texts), labelled with its block ids."""
        if len(corpus) == 0:
            raise ValueError("A BM25 index needs at least one block.")
        columns = corpus.titles_and_texts(0, len(corpus))
        blocks = [
            {"block_id": int(block_id), "title": title, "text": text}
            for block_id, title, text in zip(corpus.row_ids.tolist(), columns["title"], columns["text"])
        ]
        return cls.from_blocks(blocks, stopwords=stopwords, **kwargs)

    def rebuilt(self, corpus) -> BM25BlockIndex:
        """A new index, with this one's stopwords and settings, over the blocks of `corpus` (a [`BlockCorpus`])."""
        return BM25BlockIndex.from_corpus(corpus, self.stopwords, mode=self.mode, sparse_k=self.sparse_k)

    @classmethod
    def from_blocks(
        cls, blocks: list[dict], k1: float = 1.5, b: float = 0.75, stopwords: str | None = "en", **settings
    ) -> BM25BlockIndex:
        """Index blocks (dicts with `block_id`, `text` and optionally `title`, as `BlockStore.blocks` gives them)."""
        bm25s = require_bm25s()
        if not blocks:
            raise ValueError("A BM25 index needs at least one block.")
        texts = [block_search_text(block) for block in blocks]
        bm25 = bm25s.BM25(k1=k1, b=b)
        bm25.index(bm25s.tokenize(texts, stopwords=stopwords, show_progress=False), show_progress=False)
        return cls(bm25, [int(block["block_id"]) for block in blocks], stopwords, **settings)

    def __len__(self) -> int:
        return len(self.block_ids)

    def nearest(self, questions: list[str], k: int, mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """
        `(block_ids, scores)` of the `k` best blocks of each question by BM25, each `(len(questions), k)`, best first;
        `-1` (score 0) where fewer than `k` blocks share a term with the question (or pass `mask`, a boolean per
        block in `block_ids` order: a search filter's).
        """
        bm25s = require_bm25s()
        k_found = min(k, len(self))
        tokens = bm25s.tokenize(list(questions), stopwords=self.stopwords, show_progress=False)
        weights = None if mask is None else np.asarray(mask, dtype=np.float32)
        rows, scores = self.bm25.retrieve(tokens, k=k_found, show_progress=False, n_threads=1, weight_mask=weights)
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
        settings = params.get("hybrid") or {}
        return cls(
            bm25,
            block_ids,
            params.get("stopwords"),
            settings.get("mode") or "candidates",
            settings.get("sparse_k"),
        )


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


def hybrid_candidates(
    sparse: BM25BlockIndex,
    queries: np.ndarray,
    dense_ids: np.ndarray,
    questions: list[str],
    k: int,
    embeddings_of,
    mask: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """
    The hybrid ranking of each question's candidates: the dense top `k` (`dense_ids`, best first) plus the BM25 top
    `sparse.sparse_k` (or `k`), scored by the dense inner product of `queries` with their stored embeddings
    (`embeddings_of(ids)` gives them, zeros for `-1`). `"candidates"` keeps the whole union (up to `k + sparse_k`: cut
    to `k`, the dense top `k` would always win) ordered by that score; `"rrf"` the fused top `k` in reciprocal-rank
    order. `mask` (a search filter's rows) keeps BM25 to the blocks the dense search was kept to. Returns `(ids,
    scores)`, `-1` / `-inf` padded to the widest row.
    """
    # One string was read as one question per character, and a non-string failed inside bm25s on `.lower()`.
    if isinstance(questions, (str, bytes)):
        raise TypeError("`questions` must be a list of question texts, one per question embedding, not one string.")
    if len(questions) != len(queries):
        raise ValueError(f"Got {len(questions)} question texts for {len(queries)} question embeddings.")
    for position, question in enumerate(questions):
        if not isinstance(question, str):
            raise TypeError(
                f"Question text {position} is a {type(question).__name__}, not a string: BM25 searches the question "
                "texts (`questions=`), one string per question embedding."
            )
    sparse_ids, _ = sparse.nearest(questions, sparse.sparse_k or k, mask)
    # Union per question, dense first; the width is the largest union, padded with -1.
    unions = [
        list(dict.fromkeys([i for i in row if i >= 0] + [i for i in srow if i >= 0]))
        for row, srow in zip(dense_ids.tolist(), sparse_ids.tolist())
    ]
    width = max(1, max(len(u) for u in unions))
    ids = np.full((len(unions), width), -1, dtype=np.int64)
    for row, union in enumerate(unions):
        ids[row, : len(union)] = union
    scores = np.einsum("bd,bkd->bk", queries, embeddings_of(ids)).astype(np.float32)
    scores[ids < 0] = -np.inf
    if sparse.mode == "candidates":
        order = np.argsort(-scores, axis=1, kind="stable")
    else:
        fused = reciprocal_rank_fusion([dense_ids, sparse_ids], width)
        order = np.zeros_like(ids)
        for row in range(len(unions)):
            position = {int(b): i for i, b in enumerate(ids[row].tolist())}
            places = [position[b] for b in fused[row].tolist() if b >= 0]
            rest = [i for i in range(width) if i not in set(places)]
            order[row] = places + rest
        order = order[:, : min(k, width)]  # the fused top k
    return np.take_along_axis(ids, order, axis=1), np.take_along_axis(scores, order, axis=1)
