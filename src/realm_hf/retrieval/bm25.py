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
# The files `bm25s` saves an index in (`BM25.save`'s names), and what its parameters file may hold.
_LIBRARY_PARAMS, _VOCABULARY, _NONOCCURRENCE = "params.index.json", "vocab.index.json", "nonoccurrence_array.index.npy"
_DATA, _INDICES, _INDPTR = "data.csc.index.npy", "indices.csc.index.npy", "indptr.csc.index.npy"
_BM25_METHODS = ("robertson", "lucene", "atire", "bm25l", "bm25+")
_LIBRARY_CHOICES = {
    "method": _BM25_METHODS,
    "idf_method": (*_BM25_METHODS, None),
    "backend": ("numpy", "numba", "auto"),
    "csc_backend": ("numpy", "scipy"),
    "auto_compile": (True, False),
}
_RESAVE_HINT = (
    "Restore the file from the original save, or build and save the hybrid retriever again (`retriever.use_bm25()`, "
    "or `realm-hf index ... --index Flat+bm25`)."
)


def check_hybrid_settings(mode: str, sparse_k) -> None:
    """
    Refuse an unknown hybrid `mode` and a `sparse_k` that is not a positive integer (or `None`). A `sparse_k` above
    the number of blocks is allowed: a search takes at most every block (see [`BM25BlockIndex.nearest`]).
    """
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
        sparse_k (`int`, *optional*): BM25 candidates per question; defaults to the search's `k`. Above the number of
            blocks it means every block that shares a term with the question (nothing is sized by it).
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
        `(block_ids, scores)` of the `k` best blocks of each question by BM25, best first, each of shape
        `(len(questions), min(k, len(self)))`: a `k` above the number of blocks (a `sparse_k` of 10**9) takes every
        block, and sizes nothing. `-1` (score 0) where fewer blocks share a term with the question (or pass `mask`, a
        boolean per block in `block_ids` order: a search filter's).
        """
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"`k` must be a positive integer, got {k!r}.")
        bm25s = require_bm25s()
        width = min(int(k), len(self))
        tokens = bm25s.tokenize(list(questions), stopwords=self.stopwords, show_progress=False)
        weights = None if mask is None else np.asarray(mask, dtype=np.float32)
        rows, scores = self.bm25.retrieve(tokens, k=width, show_progress=False, n_threads=1, weight_mask=weights)
        matched = scores > 0  # BM25 0: no shared term, not a candidate
        ids = np.where(matched, self.block_ids[rows], -1).astype(np.int64)
        return ids, np.where(matched, scores, 0.0).astype(np.float32)

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
        file's size and sha256 is checked first. Every file is checked before `bm25s` reads it (its JSON, the shape
        and length of each array against the file's size, and the arrays against each other), so a damaged file is
        refused with a `ValueError` naming it, and no size read from a file is allocated before it is checked.
        """
        bm25s = require_bm25s()
        for name, expected in (files or {}).items():
            path = os.path.join(directory, name)
            if not os.path.isfile(path) or file_sha256(path) != expected.get("sha256"):
                raise ValueError(
                    f"{path} is missing or differs from the file saved with this index: save the hybrid retriever again."
                )
        params_path = os.path.join(directory, SPARSE_PARAMS_NAME)
        params = _json_object(params_path)
        stopwords, settings = params.get("stopwords"), params.get("hybrid") or {}
        try:
            if isinstance(stopwords, bool) or not isinstance(stopwords, (str, list, type(None))):
                raise ValueError("not a list's name")
            bm25s.tokenize(["a question"], stopwords=stopwords, show_progress=False)
        except (ValueError, TypeError, AttributeError):
            raise _damaged(
                params_path, f"`stopwords` must name a stopword list of bm25s or be null, got {stopwords!r}"
            ) from None
        if not isinstance(settings, dict):
            raise _damaged(params_path, f"`hybrid` must be a JSON object, got {settings!r}")
        mode, sparse_k = settings.get("mode") or "candidates", settings.get("sparse_k")
        try:
            check_hybrid_settings(mode, sparse_k)
        except ValueError as err:
            raise _damaged(params_path, str(err).rstrip(".")) from None
        num_blocks, _ = _checked_npy(os.path.join(directory, SPARSE_BLOCK_IDS_NAME), "iu")
        bm25 = _load_library_index(bm25s, directory, num_blocks)
        return cls(
            bm25,
            np.load(os.path.join(directory, SPARSE_BLOCK_IDS_NAME), allow_pickle=False),
            stopwords,
            mode,
            sparse_k,
        )


def _damaged(path: str, reason: str) -> ValueError:
    return ValueError(f"{path} is damaged: {reason}. {_RESAVE_HINT}")


def _json_object(path: str) -> dict:
    """The JSON object in `path`, else a `ValueError` naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (ValueError, UnicodeDecodeError) as err:
        raise _damaged(path, f"not valid JSON ({err})") from None
    if not isinstance(value, dict):
        raise _damaged(path, f"a JSON object expected, got a {type(value).__name__}")
    return value


def _checked_npy(path: str, kinds: str) -> tuple[int, np.dtype]:
    """
    The length and dtype of the 1-D `.npy` array in `path` from its header, checked against the file's size (a header
    cannot make a small file allocate a huge array), refused naming the file unless its dtype kind is in `kinds`.
    """
    from numpy.lib import format as npy_format

    with open(path, "rb") as f:
        try:
            version = npy_format.read_magic(f)
            read_header = {(1, 0): npy_format.read_array_header_1_0, (2, 0): npy_format.read_array_header_2_0}
            if version not in read_header:
                raise ValueError(f".npy format version {version}")
            shape, _fortran, dtype = read_header[version](f)
        except ValueError as err:
            raise _damaged(path, f"not a .npy array file ({err})") from None
        data_bytes = os.fstat(f.fileno()).st_size - f.tell()
    if dtype.hasobject or dtype.kind not in kinds or dtype.shape or len(shape) != 1:
        raise _damaged(path, f"it holds a {dtype} array of shape {shape}, not a 1-D array of numbers")
    if shape[0] * dtype.itemsize != data_bytes:
        raise _damaged(
            path, f"its header announces {shape[0]} items ({shape[0] * dtype.itemsize} bytes) in {data_bytes} bytes"
        )
    return shape[0], dtype


def _check_library_params(params: dict, path: str, num_docs: int, has_nonoccurrence: bool) -> None:
    """Refuse `bm25s` parameters (`params.index.json`) that realm-hf's saves never hold, or for another corpus size."""
    known = {"k1", "b", "delta", "dtype", "int_dtype", "version", "num_docs", *_LIBRARY_CHOICES}
    unknown = sorted(set(params) - known)
    if unknown:
        raise _damaged(path, f"unknown parameters {unknown}")
    count = params.get("num_docs")
    if isinstance(count, bool) or not isinstance(count, int) or count != num_docs:
        raise _damaged(path, f"`num_docs` is {count!r}, but {SPARSE_BLOCK_IDS_NAME} labels {num_docs} blocks")
    for key in ("k1", "b", "delta"):
        value = params.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
            raise _damaged(path, f"`{key}` must be a number, got {value!r}")
    for key, kinds in (("dtype", "f"), ("int_dtype", "iu")):
        try:
            ok = np.dtype(params.get(key, "float32" if kinds == "f" else "int32")).kind in kinds
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise _damaged(path, f"`{key}` must name a numeric dtype, got {params.get(key)!r}")
    for key, choices in _LIBRARY_CHOICES.items():
        if key in params and params[key] not in choices:
            raise _damaged(path, f"`{key}` must be one of {choices}, got {params[key]!r}")
    if params.get("method") in ("bm25l", "bm25+") and not has_nonoccurrence:
        raise _damaged(path, f"method {params['method']!r} needs {_NONOCCURRENCE}, which is missing")


def _load_library_index(bm25s, directory: str, num_docs: int):
    """The `bm25s.BM25` saved in `directory`, each of its files checked before and after `bm25s` reads it."""
    path = {name: os.path.join(directory, name) for name in (_LIBRARY_PARAMS, _VOCABULARY, _DATA, _INDICES, _INDPTR)}
    nonoccurrence = os.path.join(directory, _NONOCCURRENCE)
    _check_library_params(
        _json_object(path[_LIBRARY_PARAMS]), path[_LIBRARY_PARAMS], num_docs, os.path.isfile(nonoccurrence)
    )
    vocabulary = _json_object(path[_VOCABULARY])
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in vocabulary.values()):
        raise _damaged(path[_VOCABULARY], "its token ids must be integers")
    lengths = {
        name: _checked_npy(path[name], kinds)[0] for name, kinds in ((_DATA, "f"), (_INDICES, "iu"), (_INDPTR, "iu"))
    }
    if os.path.isfile(nonoccurrence):
        lengths[_NONOCCURRENCE] = _checked_npy(nonoccurrence, "f")[0]
    bm25 = bm25s.BM25.load(directory, allow_pickle=False, show_progress=False)
    data, indices, indptr = (np.asarray(bm25.scores[key]) for key in ("data", "indices", "indptr"))
    if len(indices) != len(data):
        raise _damaged(path[_INDICES], f"it holds {len(indices)} entries, but {_DATA} {len(data)} scores")
    if len(indptr) < 1 or indptr[0] != 0 or indptr[-1] != len(data) or (np.diff(indptr) < 0).any():
        raise _damaged(path[_INDPTR], f"it is not the offsets of each term's scores in {_DATA} ({len(data)} scores)")
    if len(indices) and (indices.min() < 0 or indices.max() >= num_docs):
        raise _damaged(path[_INDICES], f"it names blocks outside the {num_docs} the index holds")
    if not np.isfinite(data).all():
        raise _damaged(path[_DATA], "it holds scores that are not finite numbers")
    terms = len(indptr) - 1
    # bm25s may give the empty token (for questions with no known term) the id after the last term's.
    if any(not 0 <= v < terms + (token == "") for token, v in vocabulary.items()):
        raise _damaged(path[_VOCABULARY], f"its token ids must be below the {terms} terms of {_INDPTR}")
    if lengths.get(_NONOCCURRENCE, terms) != terms:
        raise _damaged(nonoccurrence, f"it holds {lengths[_NONOCCURRENCE]} scores for the {terms} terms of {_INDPTR}")
    return bm25


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
