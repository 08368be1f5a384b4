"""
[`BlockStore`]: one immutable state of a retriever's knowledge (its block corpus, the index over it, the next block id,
the fingerprint of the embedder that filled it and, for hybrid retrieval, a BM25 index over the same blocks); its top
blocks for a batch of questions and its lookups by block id read one, changes make a new one.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ..logging_utils import get_logger
from .bm25 import BM25BlockIndex, hybrid_candidates
from .contract import RealmSearchOutput, check_query_shape
from .corpus import TOKEN_IDS_COLUMN, BlockCorpus, as_id_array, pad_token_ids
from .encoding import tokenize_block_texts
from .filters import row_mask
from .index import BlockIndex

logger = get_logger(__name__)

# How to fix a saved retriever whose parts disagree: said by every error of the store and of its loading.
REBUILD_HINT = (
    "Rebuild the retriever with `RealmRetriever.from_documents(...)` (or `realm-hf index`) and save it again with "
    "`save_pretrained`, or convert a legacy checkpoint with `convert_legacy_checkpoint`."
)

# Candidate vectors re-scored per step: bounds the `[questions, candidates, dim]` float32 buffer (16 MB at 128-d)
# however many questions and candidates one search has.
RERANK_ROWS = 32_768


@dataclasses.dataclass(frozen=True)
class BlockStore:
    """
    One state of a retriever's knowledge: the blocks ([`BlockCorpus`]), the index over their embeddings
    ([`BlockIndex`], ids are block ids), the id the next added block gets (ids are never reused) and the fingerprint of
    the embedder that embedded them. [`~BlockStore.appended`], [`~BlockStore.without`] and
    [`~BlockStore.with_embeddings`] return new stores, so a search that holds one sees ids, scores, blocks, embeddings
    and token ids of one state. One exception, for memory: `appended` and `without` reuse the index memory of a store
    that owns its index in RAM, so the store they are called on must not be searched afterwards (the retriever calls
    them on its live store under its lock, which its searches also hold). [`RealmRetriever`] holds the current store
    and swaps in the next under its lock.

    Args:
        corpus ([`BlockCorpus`]): The blocks and their stored embeddings.
        index ([`BlockIndex`]): One vector per block, labelled with its block id.
        next_block_id (`int`, defaults to 0): Raised to one past the largest block id.
        embedder_fingerprint (`str`, *optional*): [`fingerprint_module`] of the embedder that produced the embeddings.
        sparse ([`BM25BlockIndex`], *optional*): A BM25 index over the same blocks (hybrid retrieval, see
            [`~BlockStore.with_bm25`]): [`~BlockStore.top_blocks`] given the question texts adds its candidates;
            `appended` and `without` rebuild it with the corpus, so the dense and sparse indexes always cover the same
            blocks.
    """

    corpus: BlockCorpus
    index: BlockIndex
    next_block_id: int = 0
    embedder_fingerprint: str | None = None
    sparse: BM25BlockIndex | None = None

    def __post_init__(self):
        if len(self.corpus) == 0:
            raise ValueError("The corpus is empty: a retriever needs at least one block.")
        if self.index.ntotal != len(self.corpus):
            raise ValueError(
                f"The index holds {self.index.ntotal} vectors but the corpus has {len(self.corpus)} blocks. "
                f"{REBUILD_HINT}"
            )
        if self.corpus.dim is not None and self.corpus.dim != self.index.dim:
            raise ValueError(
                f"The corpus embeddings have dimension {self.corpus.dim} but the index has {self.index.dim}. "
                f"{REBUILD_HINT}"
            )
        if self.sparse is not None and not np.array_equal(self.sparse.block_ids, self.corpus.row_ids):
            raise ValueError("The BM25 index covers other blocks than the corpus: build it from this corpus.")
        next_id = max(int(self.next_block_id or 0), self.corpus.max_block_id + 1)
        object.__setattr__(self, "next_block_id", next_id)

    def __len__(self) -> int:
        return len(self.corpus)

    @property
    def dim(self) -> int:
        return self.index.dim

    @property
    def index_type(self) -> str:
        return self.index.index_type

    @property
    def block_ids(self) -> np.ndarray:
        """All block ids, in corpus row order (a copy: the store is never changed)."""
        return self.corpus.row_ids.copy()

    # -----------------------------------------------------------------------------------------------------------------
    # Top blocks and lookups
    # -----------------------------------------------------------------------------------------------------------------

    def top_blocks(
        self,
        queries: np.ndarray,
        k: int,
        rerank_factor: int = 1,
        params: dict | None = None,
        return_blocks: bool = True,
        return_embeddings: bool = False,
        tokenizer=None,
        questions: list[str] | None = None,
        filter=None,
    ) -> RealmSearchOutput:
        """
        The top `k` blocks of `queries` (a checked `(batch, dim)` float32 matrix, see `contract.as_query_matrix`),
        re-scored exactly for compressed indexes (`k * rerank_factor` candidates), with the blocks, stored embeddings
        and, given a `tokenizer`, the reader's token ids of the blocks (see [`~BlockStore.token_ids`]) on request.
        Given the question texts, a hybrid store (one with a `sparse` index) adds the BM25 candidates (see
        [`hybrid_candidates`]: more than `k` results per question in `"candidates"` mode). With a `filter` (see
        [`row_mask`]), only the blocks it lets through: the exact top `k` among them for a Flat index, the best the
        index's search reaches among them for an approximate one; `-1` after the last when fewer than `k` match.
        """
        check_query_shape(queries, k, self.dim, len(self))
        mask = row_mask(self.corpus, filter)
        if mask is not None and mask.all():
            mask = None  # a filter every block passes: the unfiltered search
        ids, scores = self._dense_top(queries, k, rerank_factor, params, mask)
        if questions is not None and self.sparse is not None:
            # A string goes whole to the check in `hybrid_candidates` (`list` split it into one question per letter).
            ids, scores = hybrid_candidates(
                self.sparse,
                queries,
                ids,
                questions if isinstance(questions, (str, bytes)) else list(questions),
                k,
                lambda ids: self.corpus.embeddings(ids, self.dim),
                mask,
            )
        return self._output(ids, scores, return_blocks, return_embeddings, tokenizer)

    def _dense_top(self, queries: np.ndarray, k: int, rerank_factor: int, params: dict | None, mask=None):
        """
        `(ids, scores)` of the dense index's top `k` (among the rows of `mask`, a [`row_mask`]), exact scores, `-1` /
        `-inf` where it found fewer.
        """
        exact = self.index.is_exact
        allowed = None if mask is None else self.corpus.row_ids[mask]
        expected = k if allowed is None else min(k, len(allowed))  # the results a complete search finds
        pool = len(self) if allowed is None else len(allowed)
        fetch = expected if exact else min(pool, k * max(1, int(rerank_factor)))
        if allowed is None:
            ids, scores = self.index.nearest(queries, fetch, params or {})
        elif fetch == 0:
            ids, scores, exact = np.empty((len(queries), 0), np.int64), np.empty((len(queries), 0), np.float32), True
        else:
            found = self.index.nearest_among(queries, fetch, params or {}, allowed)
            if found is None:  # an index that cannot restrict its search: every matching block scored, exactly
                found, exact = self._exhaustive_top(queries, np.flatnonzero(mask), expected), True
            ids, scores = found
        ids = ids.astype(np.int64, copy=False)
        if not exact:
            # Compressed codes give approximate scores: re-score with the stored float32 vectors.
            scores = self._rescore(queries, ids)
            scores[ids < 0] = -np.inf
            order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
            ids = np.take_along_axis(ids, order, axis=1)
            scores = np.take_along_axis(scores, order, axis=1)
        if ids.shape[1] < k:  # a filter let fewer than `k` blocks through
            ids = np.pad(ids, ((0, 0), (0, k - ids.shape[1])), constant_values=-1)
            scores = np.pad(scores, ((0, 0), (0, k - scores.shape[1])), constant_values=-np.inf)
        missing = ids < 0
        if missing[:, :expected].any():
            self.warn_missing_results(expected, int(missing[:, :expected].any(axis=1).sum()))
        if missing.any():
            scores = np.where(missing, -np.inf, scores)
        return ids, np.ascontiguousarray(scores, dtype=np.float32)

    def _exhaustive_top(self, queries: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The exact top `k` of `queries` among corpus `rows` (sorted), by inner product with their stored vectors."""
        ids = np.empty((len(queries), 0), dtype=np.int64)
        scores = np.empty((len(queries), 0), dtype=np.float32)
        for start in range(0, len(rows), RERANK_ROWS):
            part = rows[start : start + RERANK_ROWS]
            part_scores = queries @ self.corpus.embedding_rows(part).T
            ids = np.concatenate([ids, np.broadcast_to(self.corpus.row_ids[part], part_scores.shape)], axis=1)
            scores = np.concatenate([scores, part_scores.astype(np.float32)], axis=1)
            best = np.argsort(-scores, axis=1, kind="stable")[:, :k]
            ids, scores = np.take_along_axis(ids, best, axis=1), np.take_along_axis(scores, best, axis=1)
        return ids, scores

    def _output(self, ids, scores, return_blocks: bool, return_embeddings: bool, tokenizer) -> RealmSearchOutput:
        """The search output of `(ids, scores)`, with what was asked for looked up in this store."""
        scores = np.ascontiguousarray(scores, dtype=np.float32)
        blocks = None
        if return_blocks:
            blocks = self.corpus.blocks(ids)
            for row_blocks, row_scores in zip(blocks, scores.tolist()):
                for block, score in zip(row_blocks, row_scores):
                    block["score"] = score
        embeddings = None
        if return_embeddings:
            embeddings = torch.from_numpy(self.corpus.embeddings(ids, self.dim))
        tokens = lengths = None
        if tokenizer is not None:
            tokens, lengths = self.token_ids(ids, tokenizer)
        return RealmSearchOutput(
            block_ids=torch.from_numpy(ids),
            scores=torch.from_numpy(scores),
            blocks=blocks,
            block_embeddings=embeddings,
            block_token_ids=tokens,
            block_token_lengths=lengths,
        )

    def _rescore(self, queries: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """
        Exact inner products of `queries` `[batch, dim]` with the stored embeddings of their candidates `ids`
        `[batch, n]`, read from the corpus (memory-mapped: the OS pages the vectors in, the index keeps only codes) a
        few questions at a time.
        """
        scores = np.empty(ids.shape, dtype=np.float32)
        step = max(1, RERANK_ROWS // max(1, ids.shape[1]))
        for start in range(0, len(ids), step):
            part = slice(start, start + step)
            vectors = self.corpus.embeddings(ids[part], self.dim)
            scores[part] = np.einsum("bd,bkd->bk", queries[part], vectors)
        return scores

    def warn_missing_results(self, k: int, num_questions: int) -> None:
        """Say why an index returned fewer than `k` blocks; the nprobe/efSearch hint only where those are the cause."""
        tunable = [name for name in ("nprobe", "efSearch") if self.index.search_param(name) is not None]
        if tunable:
            cause = "The search visited too few candidates: raise " + " or ".join(f"`{n}`" for n in tunable) + "."
        else:
            # Exhaustive indexes score every stored vector: only non-finite stored vectors (refused since they were
            # written, but possible in an index saved by an older version or corrupted) drop results.
            cause = (
                "This index scores every stored vector, so its stored vectors must be NaN/inf or corrupt: rebuild it "
                "(`realm_hf.retrieval.embed_corpus(retriever, embedder)`) with an embedder whose outputs are finite."
            )
        logger.warning(
            "The %s index returned fewer than k=%d blocks for %d question(s); missing results have block id -1. %s",
            self.index_type,
            k,
            num_questions,
            cause,
        )

    def blocks(self, block_ids) -> list:
        """
        The blocks of `block_ids` as dicts (`block_id`, `title`, `text` and the metadata columns).

        Args:
            block_ids (`torch.LongTensor` of shape `(batch_size, k)` or `(k,)`): Block ids (`-1`: an empty block).

        Returns:
            `list[list[dict]]` for 2-D ids, `list[dict]` for 1-D ids.
        """
        return self.corpus.blocks(block_ids)

    def texts(self, block_ids) -> list:
        """Texts of `block_ids`: `list[list[str]]` for `(batch_size, k)` ids, `list[str]` for 1-D ids."""
        return self.corpus.texts(block_ids)

    def embeddings(self, block_ids) -> torch.FloatTensor:
        """
        The stored embeddings of `block_ids` (exactly the vectors the index was built from).

        Args:
            block_ids (`torch.LongTensor` of shape `(batch_size, k)`, or any shape): Block ids; `-1` gives zeros.

        Returns:
            `torch.FloatTensor` of shape `block_ids.shape + (dim,)`, on CPU.
        """
        return torch.from_numpy(self.corpus.embeddings(block_ids, self.dim))

    def token_ids(self, block_ids, tokenizer=None) -> tuple[torch.Tensor, torch.LongTensor]:
        """
        The wordpiece ids of the blocks' texts as the reader reads them ([`tokenize_block_texts`]: no title, no special
        tokens, untruncated), from the corpus's `text_token_ids` column, tokenized with `tokenizer` for blocks (or whole
        corpora, e.g. saved by older versions) stored without them.

        Args:
            block_ids (`torch.LongTensor` of any shape): Block ids; `-1` gives an empty row.
            tokenizer (*optional*): The blocks' tokenizer (the retriever's), needed only for blocks stored without
                token ids.

        Returns:
            `(ids, lengths)`: `ids` an int32 tensor of shape `block_ids.shape + (longest,)` padded with -1, and the
            number of ids of each block, shape `block_ids.shape`.
        """
        ids_array = as_id_array(block_ids)
        if self.corpus.has_token_ids:
            ids, lengths, missing = self.corpus.token_ids(ids_array)
        else:
            ids, lengths, missing = None, None, np.ones(ids_array.size, dtype=bool)
        if missing.any():
            if tokenizer is None:
                raise ValueError("This corpus stores no token ids and the retriever has no tokenizer: set one.")
            texts = self.corpus.texts(ids_array.reshape(-1)[missing])
            fresh, fresh_lengths = pad_token_ids(tokenize_block_texts(tokenizer, texts))
            if ids is None:
                ids, lengths = fresh, fresh_lengths
            else:
                width = max(ids.shape[1], fresh.shape[1])
                ids = np.pad(ids, ((0, 0), (0, width - ids.shape[1])), constant_values=-1)
                ids[np.flatnonzero(missing), : fresh.shape[1]] = fresh
                lengths[missing] = fresh_lengths
        shape = tuple(ids_array.shape)
        return torch.from_numpy(ids).view(*shape, ids.shape[1]), torch.from_numpy(lengths).view(shape)

    # -----------------------------------------------------------------------------------------------------------------
    # New states
    # -----------------------------------------------------------------------------------------------------------------

    def check_new_doc_ids(self, doc_ids: list) -> None:
        """Refuse documents whose `doc_id` the corpus already has: `remove_documents` would then remove both."""
        dataset = self.corpus.dataset
        if "doc_id" not in dataset.column_names or not doc_ids:
            return
        self.corpus.check_doc_ids(doc_ids)  # one doc_id type per corpus: never cast, so 3 and "3" never meet
        new = set(doc_ids)
        taken = new.intersection(dataset.with_format("numpy", columns=["doc_id"])[:]["doc_id"].tolist())
        if taken:
            raise ValueError(
                f"The corpus already has documents with doc_id {sorted(taken, key=str)[:10]}: doc_ids must be "
                "unique. Remove the old version first (`retriever.remove_documents(doc_ids)`), or give the new "
                "documents other ids."
            )

    def appended(self, columns: dict, embeddings: np.ndarray) -> BlockStore:
        """
        This store with new blocks (`columns` without `block_id`, and their embeddings) under fresh ids
        `next_block_id, next_block_id + 1, ...`. Reuses this store's index memory (see [`BlockIndex.added`]).
        """
        if embeddings.shape[1] != self.dim:
            raise ValueError(f"New embeddings have dimension {embeddings.shape[1]} but the corpus has {self.dim}.")
        if not self.corpus.has_token_ids:
            columns = {name: values for name, values in columns.items() if name != TOKEN_IDS_COLUMN}
        if columns.get("doc_id") is not None:
            self.check_new_doc_ids(list(dict.fromkeys(columns["doc_id"])))
        new_ids = np.arange(self.next_block_id, self.next_block_id + len(embeddings), dtype=np.int64)
        # Everything that can fail comes before the index (whose memory may be reused) changes.
        corpus = BlockCorpus(self.corpus.appended({"block_id": new_ids, **columns}, embeddings))
        sparse = self.sparse.rebuilt(corpus) if self.sparse is not None else None
        index = self.index.added(embeddings, new_ids)
        return dataclasses.replace(self, corpus=corpus, index=index, next_block_id=int(new_ids[-1]) + 1, sparse=sparse)

    def without(self, doc_ids=None, block_ids=None) -> BlockStore:
        """
        This store without the blocks of documents `doc_ids` and the blocks `block_ids` (this store itself when none
        of them is here). Reuses this store's index memory (see [`BlockIndex.removed`]).
        """
        remove = np.zeros(len(self), dtype=bool)
        if doc_ids is not None:
            remove |= self.corpus.doc_mask(doc_ids)
        if block_ids is not None:
            rows = self.corpus.rows(as_id_array(block_ids).reshape(-1))
            remove[rows[rows >= 0]] = True
        if not remove.any():
            return self
        if remove.all():
            raise ValueError("Removing these documents would leave the corpus empty; build a new retriever instead.")
        corpus = BlockCorpus(self.corpus.dataset.select(np.flatnonzero(~remove)))
        sparse = self.sparse.rebuilt(corpus) if self.sparse is not None else None
        index = self.index.removed(self.corpus.row_ids[remove], corpus)
        return dataclasses.replace(self, corpus=corpus, index=index, sparse=sparse)

    def with_embeddings(
        self, embeddings, embedder_fingerprint: str | None = None, train_size: int | None = None
    ) -> BlockStore:
        """
        This store's blocks with new embeddings (`[num_blocks, dim]` in corpus row order) and a new index of the same
        type over them, built without touching this store (safe in a background thread). Non-finite embeddings are
        refused by the index build.
        """
        if isinstance(embeddings, torch.Tensor):
            embeddings = embeddings.detach().to("cpu", torch.float32).numpy()
        embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
        if embeddings.ndim != 2 or len(embeddings) != len(self):
            raise ValueError(f"Got embeddings of shape {embeddings.shape} for a corpus of {len(self)} blocks.")
        if embeddings.shape[1] != self.dim:
            logger.warning(
                "The new embeddings have %d dimensions (the corpus had %d): the index is rebuilt for the new size.",
                embeddings.shape[1],
                self.dim,
            )
        index = BlockIndex.from_matrix(self.index_type, embeddings, self.corpus.row_ids, train_size)
        corpus = BlockCorpus(self.corpus.with_embeddings(embeddings))
        return dataclasses.replace(self, corpus=corpus, index=index, embedder_fingerprint=embedder_fingerprint)

    def rows(self, start: int, end: int, index_type: str | None = None, train_size: int | None = None) -> BlockStore:
        """A dense store over corpus rows `start:end` (same block ids), indexed from their stored embeddings."""
        rows = BlockCorpus(self.corpus.dataset.select(range(start, end)))
        index = BlockIndex.from_corpus(index_type or self.index_type, rows, train_size)
        return BlockStore(rows, index, embedder_fingerprint=self.embedder_fingerprint)

    def exported(self) -> BlockStore:
        """This store with a CPU copy of its index that shares no memory with it (to install in another retriever)."""
        return dataclasses.replace(self, index=self.index.copy())

    def with_bm25(self, mode: str | None = None, sparse_k: int | None = None) -> BlockStore:
        """
        This store with a BM25 index over its blocks (hybrid retrieval): the one it holds, searched with `mode` and
        `sparse_k` where given, else one built from its titles and texts (`"candidates"` mode unless given). Needs
        `bm25s` (`pip install 'realm-hf[hybrid]'`).
        """
        if self.sparse is not None:
            sparse = self.sparse.with_settings(mode, sparse_k)
        else:
            sparse = BM25BlockIndex.from_corpus(self.corpus, mode=mode or "candidates", sparse_k=sparse_k)
        return dataclasses.replace(self, sparse=sparse)

    def installed_over(self, live: BlockStore) -> BlockStore:
        """
        This store (a refresh of `live`'s blocks) as the next live one: refused if `live`'s blocks changed since it was
        built; placed like `live`'s index (GPU), never reusing a block id `live` gave out, and keeping `live`'s BM25
        index (the same blocks, so the same texts).
        """
        if not np.array_equal(self.corpus.row_ids, live.corpus.row_ids):
            raise ValueError(
                "The corpus changed (blocks added or removed) since this index state was built: rebuild it."
            )
        next_id = max(self.next_block_id, live.next_block_id)
        return dataclasses.replace(
            self, index=self.index.placed_like(live.index), next_block_id=next_id, sparse=live.sparse
        )

    def on_gpu(self, device: int = 0) -> BlockStore:
        return dataclasses.replace(self, index=self.index.on_gpu_device(device))

    def on_cpu(self) -> BlockStore:
        return dataclasses.replace(self, index=self.index.on_cpu())
