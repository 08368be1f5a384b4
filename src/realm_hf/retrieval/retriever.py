"""[`RealmRetriever`]: REALM's knowledge corpus, one [`BlockStore`] at a time behind a lock, and the tokenizer."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Self

import datasets
import faiss
import numpy as np
import torch

from ..io.staged_saves import staged_save
from ..logging_utils import get_logger, warn
from . import building
from .building import BuildOptions
from .collectives import gather_rows, row_bounds
from .contract import RealmSearchOutput, as_query_matrix, check_finite_queries, check_k
from .corpus import BlockCorpus
from .encoding import check_embedder_module, embedder_dim, fingerprint_module
from .index import BlockIndex, normalize_search_params
from .legacy import check_constructor_arguments, legacy_reader_call, read_legacy_blocks
from .serialization import (
    build_manifest,
    check_corpus_format,
    load_retriever_parts,
    resolve_pretrained_path,
    saved_store,
    stage_retriever_entries,
    try_load_tokenizer,
    write_store,
)
from .store import BlockStore

logger = get_logger(__name__)

# A refreshed index is a store over the same blocks (the name earlier releases gave it).
RealmIndexState = BlockStore


class _LiveStore:
    """
    The current [`BlockStore`] of a retriever and the lock that serialises its changes (each reads the live store and
    installs the next) and the searches that may run on an index a change reuses the memory of. A
    [`HybridRealmRetriever`] built over a retriever shares that retriever's, so the two never diverge.
    """

    __slots__ = ("lock", "store")

    def __init__(self, store: BlockStore):
        self.store = store
        self.lock = threading.RLock()


class RealmRetriever:
    r"""
    The knowledge corpus of REALM: text blocks in a `datasets.Dataset`, a FAISS maximum-inner-product index over
    their embeddings, and the tokenizer the blocks were split with.

    A coordinator over one immutable [`BlockStore`] (corpus, index, next block id, embedder fingerprint): a search
    reads the current store, so ids, scores, blocks, stored embeddings and token ids come from one state; a change
    (documents added or removed, a refreshed index swapped in) builds the next store and installs it under one lock.
    `RealmForOpenQA` calls [`~RealmRetriever.search`] with a batch of question embeddings and reads everything it
    needs from the result (see [`Retriever`], the contract shared with [`ShardedRealmRetriever`]).

    Build one with [`~RealmRetriever.from_documents`], [`~RealmRetriever.from_embeddings`] or
    [`~RealmRetriever.from_legacy`]; save and load it with [`~RealmRetriever.save_pretrained`] /
    [`~RealmRetriever.from_pretrained`]; change the knowledge with [`~RealmRetriever.add_documents`] /
    [`~RealmRetriever.remove_documents`] (no retraining needed).

    Args:
        corpus (`datasets.Dataset`):
            One row per block: `block_id` (int64, unique, stable), `title`, `text`, optional metadata (`doc_id`,
            `source`, ...) and `embeddings` (float32, dimension `D`) the index was built from.
        index (`faiss.Index`):
            Inner-product index over the embeddings whose ids are the `block_id`s.
        tokenizer (*optional*):
            BERT WordPiece tokenizer used to split documents (and by the model to build reader inputs).
        index_type (`str`, defaults to `"Flat"`):
            The FAISS factory string the index was built from.
        max_block_length (`int`, *optional*):
            Maximum wordpieces per block (title and special tokens included) used when splitting.
        embedder_fingerprint (`str`, *optional*):
            [`fingerprint_module`] of the embedder that produced the embeddings.

    Example:

    ```python
    >>> from realm_hf import RealmEmbedder, RealmTokenizer
    >>> from realm_hf.retrieval.retriever import RealmRetriever

    >>> embedder = RealmEmbedder.from_pretrained("path/to/realm-cc-news-pretrained-embedder")
    >>> tokenizer = RealmTokenizer.from_pretrained("path/to/realm-cc-news-pretrained-embedder")
    >>> documents = [{"title": "Velmora", "text": "Velmora is a volcanic island ...", "doc_id": "velmora"}]
    >>> retriever = RealmRetriever.from_documents(documents, embedder, tokenizer, index="HNSW32")
    >>> question = embedder(**tokenizer(["where is velmora?"], return_tensors="pt")).projected_score
    >>> retriever.search(question, k=5, efSearch=128).blocks[0][0]["title"]
    >>> retriever.save_pretrained("my-corpus")
    >>> retriever = RealmRetriever.from_pretrained("my-corpus", embedder=embedder)
    ```"""

    def __init__(
        self,
        corpus: datasets.Dataset | BlockCorpus | None = None,
        index: faiss.Index | BlockIndex | None = None,
        tokenizer=None,
        index_type: str = "Flat",
        max_block_length: int | None = None,
        embedder_fingerprint: str | None = None,
        next_block_id: int | None = None,
        **legacy_arguments,
    ):
        # `**legacy_arguments` only catches transformers 4's `block_records=` to say what replaces it.
        check_constructor_arguments(corpus, index, legacy_arguments)
        corpus = corpus if isinstance(corpus, BlockCorpus) else BlockCorpus(corpus)
        index = index if isinstance(index, BlockIndex) else BlockIndex(index, index_type)
        self._live = _LiveStore(BlockStore(corpus, index, next_block_id or 0, embedder_fingerprint))
        self.tokenizer = tokenizer
        self.max_block_length = max_block_length

    @classmethod
    def from_store(cls, store: BlockStore, tokenizer=None, max_block_length: int | None = None) -> Self:
        """A retriever over `store` (see [`BlockStore`]), splitting new documents with `tokenizer`."""
        retriever = cls.__new__(cls)
        retriever._live, retriever.tokenizer, retriever.max_block_length = (
            _LiveStore(store),
            tokenizer,
            max_block_length,
        )
        return retriever

    @property
    def _store(self) -> BlockStore:
        return self._live.store

    @_store.setter
    def _store(self, store: BlockStore) -> None:
        self._live.store = store

    @property
    def _lock(self) -> threading.RLock:
        return self._live.lock

    @property
    def store(self) -> BlockStore:
        """The current state of the knowledge (never changed; a change installs a new one)."""
        return self._store

    @property
    def corpus(self) -> datasets.Dataset:
        """The block table (`block_id`, `title`, `text`, metadata, `embeddings`)."""
        return self._store.corpus.dataset

    @property
    def index(self) -> faiss.Index:
        """The FAISS index (ids are block ids; on GPU after [`~RealmRetriever.to_gpu`]), e.g. for datasets' own API."""
        return self._store.index.index

    @property
    def index_type(self) -> str:
        """The FAISS factory string the index was built from."""
        return self._store.index_type

    @property
    def embedder_fingerprint(self) -> str | None:
        """[`fingerprint_module`] of the embedder that produced the stored embeddings (`None`: unknown)."""
        return self._store.embedder_fingerprint

    @property
    def num_blocks(self) -> int:
        """Number of blocks in the corpus (and vectors in the index)."""
        return len(self._store)

    def __len__(self) -> int:
        return self.num_blocks

    @property
    def embedding_dim(self) -> int:
        """Dimension of the block embeddings (the embedder's projection size, 128 for REALM)."""
        return self._store.dim

    @property
    def block_ids(self) -> np.ndarray:
        """All block ids, in corpus row order."""
        return self._store.block_ids.copy()

    @property
    def next_block_id(self) -> int:
        """The id the next added block gets (ids are never reused, even after removals)."""
        return self._store.next_block_id

    collective = False  # a search or save by one process alone (see [`Retriever.collective`])
    is_main_process = True  # this process writes the files shared by all processes

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_blocks={self.num_blocks}, embedding_dim={self.embedding_dim}, "
            f"index_type={self.index_type!r}, columns={self.corpus.column_names})"
        )

    # ---------------------------------------------------------------------------------------------------------------
    # Building
    # ---------------------------------------------------------------------------------------------------------------

    @classmethod
    def from_documents(cls, documents, embedder: torch.nn.Module, tokenizer, **options) -> Self:
        """
        Split documents into blocks, embed them and index them.

        Args:
            documents: Iterable of dicts with `text` and optionally `title`, `doc_id` (kept, used by
                [`~RealmRetriever.remove_documents`]) and metadata fields; or a `datasets.Dataset` / dict of columns.
            embedder (`torch.nn.Module`): A [`RealmEmbedder`] (see [`embed_blocks`]).
            tokenizer: Its BERT WordPiece tokenizer; saved with the corpus.
            options: The fields of [`BuildOptions`]: `max_block_length` (288), `index` (`"Flat"`), `batch_size`,
                `device`, `dtype`, `show_progress`, `train_size`, `use_gpu`.
        """
        options = BuildOptions(**options)
        store = building.store_from_documents(documents, embedder, tokenizer, options)
        return cls.from_store(store, tokenizer, options.max_block_length)

    @classmethod
    def from_texts(
        cls, texts: Iterable[str], embedder, tokenizer, titles: Iterable[str] | None = None, **options
    ) -> Self:
        """[`~RealmRetriever.from_documents`] for plain texts (and optional titles)."""
        texts = list(texts)
        titles = [""] * len(texts) if titles is None else list(titles)
        if len(titles) != len(texts):
            raise ValueError(f"Got {len(titles)} titles for {len(texts)} texts.")
        documents = [{"title": t, "text": x} for t, x in zip(titles, texts)]
        return cls.from_documents(documents, embedder, tokenizer, **options)

    @classmethod
    def from_embeddings(
        cls,
        embeddings,
        texts: Sequence[str],
        titles: Sequence[str] | None = None,
        tokenizer=None,
        index: str = "Flat",
        block_ids=None,
        metadata: Mapping[str, Sequence] | None = None,
        embedder_fingerprint: str | None = None,
        train_size: int | None = None,
        use_gpu: bool = False,
    ) -> Self:
        """
        A retriever over given block embeddings (e.g. an exact in-memory searcher with `index="Flat"`).

        Args:
            embeddings (`torch.Tensor` or `np.ndarray` of shape `(num_blocks, dim)`): Block embeddings.
            texts (`Sequence[str]`): Block texts.
            titles (`Sequence[str]`, *optional*): Block titles (empty by default).
            tokenizer (*optional*): Tokenizer saved with the corpus.
            index (`str`, defaults to `"Flat"`): FAISS factory string.
            block_ids (*optional*): Block ids (default `0..num_blocks-1`).
            metadata (`Mapping[str, Sequence]`, *optional*): Extra columns (e.g. `doc_id`).
        """
        store = building.store_from_embeddings(
            embeddings, texts, titles, tokenizer, index, block_ids, metadata, embedder_fingerprint, train_size
        )
        retriever = cls.from_store(store, tokenizer)
        return retriever.to_gpu() if use_gpu else retriever

    @classmethod
    def from_legacy(
        cls,
        legacy_dir: str | os.PathLike,
        tokenizer=None,
        block_emb=None,
        allow_pickle: bool = False,
        index: str = "Flat",
        embedder: torch.nn.Module | None = None,
        train_size: int | None = None,
        use_gpu: bool = False,
    ) -> Self:
        """
        Build a retriever from a legacy `RealmForOpenQA` checkpoint directory (e.g. google/realm-orqa-nq-openqa):
        block texts from `block_records.npy`, block embeddings from the `block_emb` buffer in its weights.

        Block ids are the legacy row indices and the embeddings are the exact legacy vectors, so with `index="Flat"`
        search returns what the legacy brute-force einsum + topk returned. Titles are empty (legacy blocks had none).

        `block_records.npy` is a *pickled* numpy object array: unpickling runs code from the file. It is refused
        unless `allow_pickle=True` or the environment sets `REALM_HF_ALLOW_PICKLE=1`; convert once
        ([`convert_legacy_checkpoint`]) and share the converted, pickle-free retriever instead.

        Args:
            legacy_dir (`str`): The checkpoint directory.
            tokenizer (*optional*): Its tokenizer (loaded from `legacy_dir` with `AutoTokenizer` if not given).
            block_emb (`torch.Tensor` or `np.ndarray`, *optional*): The `[num_block_records, dim]` embeddings, if
                already loaded; otherwise read from `model.safetensors` or `pytorch_model.bin` (`weights_only=True`,
                memory-mapped).
            allow_pickle (`bool`, defaults to `False`): Allow unpickling `block_records.npy` (only for trusted files).
            index (`str`, defaults to `"Flat"`): FAISS factory string (Flat reproduces the legacy exact search).
            embedder (*optional*): The checkpoint's embedder, to record its fingerprint in the manifest.
        """
        legacy_dir = os.fspath(legacy_dir)
        columns, block_emb = read_legacy_blocks(legacy_dir, block_emb=block_emb, allow_pickle=allow_pickle)
        if tokenizer is None:
            tokenizer = try_load_tokenizer(legacy_dir)
        store = building.store_from_legacy_blocks(columns, block_emb, tokenizer, index, embedder, train_size)
        # max_block_length is unknown for legacy blocks: re-embedding truncates at the tokenizer's limit, as they were.
        retriever = cls.from_store(store, tokenizer)
        return retriever.to_gpu() if use_gpu else retriever

    # ---------------------------------------------------------------------------------------------------------------
    # Lookup and search
    # ---------------------------------------------------------------------------------------------------------------

    def get_block_embeddings(self, block_ids) -> torch.FloatTensor:
        """
        The stored embeddings of `block_ids` (exactly the vectors the index was built from).

        Args:
            block_ids (`torch.LongTensor` of shape `(batch_size, k)`, or any shape): Block ids; `-1` gives zeros.

        Returns:
            `torch.FloatTensor` of shape `block_ids.shape + (embedding_dim,)`, on CPU.
        """
        return torch.from_numpy(self._store.corpus.embeddings(block_ids, self.embedding_dim))

    def get_blocks(self, block_ids) -> list:
        """
        The blocks of `block_ids` as dicts (`block_id`, `title`, `text` and the metadata columns).

        Args:
            block_ids (`torch.LongTensor` of shape `(batch_size, k)` or `(k,)`): Block ids (`-1`: an empty block).

        Returns:
            `list[list[dict]]` for 2-D ids, `list[dict]` for 1-D ids.
        """
        return self._store.corpus.blocks(block_ids)

    def get_block_texts(self, block_ids) -> list:
        """Texts of `block_ids`: `list[list[str]]` for `(batch_size, k)` ids, `list[str]` for 1-D ids."""
        return self._store.corpus.texts(block_ids)

    def get_block_token_ids(self, block_ids) -> tuple[torch.Tensor, torch.LongTensor]:
        """
        The wordpiece ids of the blocks' texts as the reader reads them ([`tokenize_block_texts`]: no title, no special
        tokens, untruncated), from the corpus's `text_token_ids` column, tokenized here for blocks (or whole corpora,
        e.g. saved by older versions) stored without them.

        Args:
            block_ids (`torch.LongTensor` of any shape): Block ids; `-1` gives an empty row.

        Returns:
            `(ids, lengths)`: `ids` an int32 tensor of shape `block_ids.shape + (longest,)` padded with -1, and the
            number of ids of each block, shape `block_ids.shape`.
        """
        return self._store.token_ids(block_ids, self.tokenizer)

    def search(
        self,
        question_embeddings,
        k: int = 5,
        return_blocks: bool = True,
        rerank_factor: int = 1,
        return_embeddings: bool = False,
        return_token_ids: bool = False,
        questions: Sequence[str] | None = None,
        **search_params,
    ) -> RealmSearchOutput:
        """
        Top-`k` blocks by inner product for a batch of question embeddings, in one FAISS call, with everything asked
        for about them read from the same state of the corpus and index (documents added or the index swapped
        meanwhile never mix two states). With a BM25 index (a [`HybridRealmRetriever`]) and the question texts, BM25
        candidates are added (see [`HybridRealmRetriever`]).

        Args:
            question_embeddings (`torch.Tensor` or `np.ndarray` of shape `(batch_size, embedding_dim)`):
                Question embeddings (detached and moved to CPU float32 here).
            k (`int`, defaults to 5): Blocks per question.
            return_blocks (`bool`, defaults to `True`): Also fetch the blocks' texts and metadata.
            rerank_factor (`int`, defaults to 1): For compressed indexes (PQ/SQ), fetch `k * rerank_factor`
                candidates and keep the best `k` by exact inner product with the stored embeddings (PQ recall
                plateaus without this). Ignored by exact-code indexes (Flat, HNSW, IVF-Flat).
            return_embeddings (`bool`, defaults to `False`): Also return the retrieved blocks' stored embeddings
                (`block_embeddings`).
            return_token_ids (`bool`, defaults to `False`): Also return the reader's wordpiece ids of the blocks'
                texts (`block_token_ids`, `block_token_lengths`; see [`~RealmRetriever.get_block_token_ids`]).
            questions (`Sequence[str]`, *optional*): The question texts, one per embedding: a hybrid retriever adds
                their BM25 candidates; a dense one ignores them.
            search_params: Search-time parameters for this call only, restored afterwards: `nprobe` (IVF),
                `efSearch` (HNSW), `quantizer_efSearch` (IVF with an HNSW quantizer).

        Returns:
            [`RealmSearchOutput`] with `block_ids`, `scores` (`(batch_size, k)`), `blocks` and what else was asked
            for. NaN/inf question embeddings are refused with a `ValueError`.
        """
        queries = as_query_matrix(question_embeddings)
        check_finite_queries(queries)
        k = check_k(k)
        params = normalize_search_params(search_params)
        with self._lock:
            return self._store.search(
                queries,
                k,
                rerank_factor,
                params,
                return_blocks,
                return_embeddings,
                tokenizer=self.tokenizer if return_token_ids else None,
                questions=questions,
            )

    def __call__(self, retrieved_block_ids, question_input_ids, answer_ids, max_length=None, return_tensors="pt"):
        """
        The legacy `RealmRetriever.__call__`, for code ported from transformers 4: pair one question with its
        retrieved blocks and locate the answers in them.

        Args:
            retrieved_block_ids: Ids of the question's retrieved blocks (1-D).
            question_input_ids: The tokenized question, shape `(1, seq_len)` (decoded, as the legacy code did).
            answer_ids (`list[list[int]]`, *optional*): Gold answers as wordpiece ids.
            max_length (`int`, *optional*): Truncation length of a (question, block) pair.
            return_tensors (`str`, defaults to `"pt"`): Tensor type of the returned inputs.

        Returns:
            `(has_answers, start_pos, end_pos, concat_inputs)`: per block whether an answer occurs and the token
            positions of every occurrence (padded with -1); the first three are `None` without `answer_ids`.
            New code should use [`~RealmRetriever.search`] and `realm_hf.build_reader_inputs`.
        """
        return legacy_reader_call(
            self, retrieved_block_ids, question_input_ids, answer_ids, max_length, return_tensors
        )

    # ---------------------------------------------------------------------------------------------------------------
    # Updating
    # ---------------------------------------------------------------------------------------------------------------

    def add_documents(
        self,
        documents,
        embedder: torch.nn.Module,
        batch_size: int = 64,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        show_progress: bool = True,
    ) -> list[int]:
        """
        Split, embed and add documents to the corpus and the index, without retraining anything.

        Blocks get fresh ids (never reused). Use the embedder that built the corpus: embeddings from different
        embedders are not comparable (a warning is logged when the fingerprints differ).

        Returns:
            `list[int]`: the new block ids.
        """
        if self.tokenizer is None:
            raise ValueError("This retriever has no tokenizer to split documents with: set `retriever.tokenizer`.")
        check_embedder_module(embedder)  # before fingerprinting it (`None` failed there on `.state_dict`)
        fingerprint = fingerprint_module(embedder)
        if self.embedder_fingerprint is not None and fingerprint != self.embedder_fingerprint:
            warn(
                "Adding documents embedded by a different embedder than the one that built this corpus: their scores "
                "are not comparable. Re-embed the whole corpus with `retriever.embed_corpus(embedder)`.",
                stacklevel=2,
            )
        before = self._store
        columns, embeddings = building.split_and_embed(
            documents,
            embedder,
            self.tokenizer,
            self.max_block_length or 288,
            before.corpus.next_doc_id(fallback=before.next_block_id),
            "No blocks to add: the documents are empty.",
            # Before the embedding work; `appended` checks again under the lock.
            check=lambda columns: before.check_new_doc_ids(list(dict.fromkeys(columns["doc_id"]))),
            batch_size=batch_size,
            device=device,
            dtype=dtype,
            show_progress=show_progress,
        )
        if before.corpus.has_token_ids:
            columns = building.with_token_ids(columns, self.tokenizer)  # outside the lock
        with self._lock:
            live = self._store
            self._store = live.appended(columns, embeddings)
            return list(range(live.next_block_id, self._store.next_block_id))

    def remove_documents(self, doc_ids=None, *, block_ids=None) -> list[int]:
        """
        Remove documents (all their blocks, by `doc_id`) and/or individual blocks (by `block_id`) from the corpus and
        the index. HNSW graphs cannot delete nodes in FAISS, so an HNSW index is rebuilt from the stored embeddings.

        Returns:
            `list[int]`: the removed block ids.
        """
        if doc_ids is None and block_ids is None:
            raise ValueError("Pass `doc_ids` and/or `block_ids` to remove.")
        # The rows to remove are found under the lock: blocks added meanwhile would shift them.
        with self._lock:
            live = self._store
            self._store = live.without(doc_ids, block_ids)
            kept = np.isin(live.block_ids, self._store.block_ids)
        return live.block_ids[~kept].tolist()

    def remove_blocks(self, block_ids) -> list[int]:
        """Remove individual blocks by id (see [`~RealmRetriever.remove_documents`])."""
        return self.remove_documents(block_ids=block_ids)

    # ---------------------------------------------------------------------------------------------------------------
    # Re-embedding and index states
    # ---------------------------------------------------------------------------------------------------------------

    def embed_corpus(
        self,
        embedder: torch.nn.Module,
        batch_size: int = 64,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        show_progress: bool = True,
        start: int | None = None,
        end: int | None = None,
        update_index: bool | None = None,
        chunk_size: int = 100_000,
        train_size: int | None = None,
    ) -> torch.FloatTensor:
        """
        Re-embed the corpus's blocks with `embedder` (e.g. after training it: REALM refreshes its index during
        pre-training), as [`embed_blocks`] does, with this corpus's titles, texts and `max_block_length`.

        Args:
            embedder (`torch.nn.Module`): The (document) embedder.
            batch_size, device, dtype, show_progress: See [`embed_blocks`].
            start (`int`, *optional*), end (`int`, *optional*): Embed only corpus rows `start:end` (e.g. one
                process's share in distributed re-indexing).
            update_index (`bool`, *optional*): Replace the stored embeddings and rebuild the index with the new
                ones (and record the embedder's fingerprint). Defaults to `True` when the whole corpus is embedded
                (`start`/`end` not given), `False` otherwise; to swap in a refresh built elsewhere use
                [`~RealmRetriever.build_index_state`] and [`~RealmRetriever.swap_index_state`].
            chunk_size (`int`): Rows tokenized at a time (bounds memory on large corpora).
            train_size (`int`, *optional*): Training sample size when the index is rebuilt.

        Returns:
            `torch.FloatTensor` of shape `(end - start, dim)`: the new embeddings of those rows, in row order.
        """
        if self.tokenizer is None:
            raise ValueError("This retriever has no tokenizer: set `retriever.tokenizer` before re-embedding.")
        if update_index is None:
            update_index = start is None and end is None
        # One snapshot of the blocks for the whole call: documents added or removed meanwhile must not shift the rows
        # between chunks, or between embedding them and building the index (the swap then refuses the stale state).
        store = self._store
        start = 0 if start is None else int(start)
        end = len(store) if end is None else int(end)
        if update_index and (start, end) != (0, len(store)):
            raise ValueError("update_index=True needs the whole corpus embedded (no start/end).")
        embeddings = building.embed_rows(
            store,
            embedder,
            self.tokenizer,
            self.max_block_length,
            start,
            end,
            batch_size,
            device,
            dtype,
            show_progress,
            chunk_size,
        )
        if update_index:
            self.swap_index_state(store.with_embeddings(embeddings, fingerprint_module(embedder), train_size))
        return embeddings

    def build_index_state(
        self, embeddings, embedder_fingerprint: str | None = None, train_size: int | None = None
    ) -> BlockStore:
        """
        Build, without touching the live retriever, the store of the current blocks with new embeddings
        (`[num_blocks, dim]` in corpus row order, e.g. from [`~RealmRetriever.embed_corpus`]) and a new index over
        them. Safe to run in a background thread while the retriever keeps serving searches; install the result with
        [`~RealmRetriever.swap_index_state`].
        """
        return self._store.with_embeddings(embeddings, embedder_fingerprint, train_size)

    def refresh_index_state(
        self,
        embedder: torch.nn.Module,
        batch_size: int = 64,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        show_progress: bool = False,
        train_size: int | None = None,
        group=None,
    ) -> BlockStore:
        """
        Re-embed the corpus with `embedder` and build the new store, without touching the live one (safe in a
        background thread); install it with [`~RealmRetriever.swap_index_state`]. Given a gloo `group` of
        `torch.distributed` whose every process holds this corpus, each process embeds a contiguous share of the rows
        and the shares are gathered (a collective call over `group`); otherwise this process embeds every row.
        """
        store = self._store  # the blocks this refresh embeds; the swap refuses it if they changed meanwhile
        rank, world_size = (0, 1) if group is None else (group.rank(), group.size())
        bounds = row_bounds(len(store), world_size)
        embeddings = building.embed_rows(
            store,
            embedder,
            self.tokenizer,
            self.max_block_length,
            bounds[rank],
            bounds[rank + 1],
            batch_size,
            device,
            dtype,
            show_progress and rank == 0,
        )
        if world_size > 1:
            embeddings = gather_rows(embeddings, bounds, group)
        return store.with_embeddings(embeddings, fingerprint_module(embedder), train_size)

    def export_index_state(self) -> BlockStore:
        """The current store with a private copy of its index (e.g. to restore into another retriever)."""
        with self._lock:
            return self._store.exported()

    def swap_index_state(self, state: BlockStore) -> None:
        """
        Atomically install a store of the same blocks with new embeddings and index (from
        [`~RealmRetriever.build_index_state`], [`~RealmRetriever.refresh_index_state`] or
        [`~RealmRetriever.export_index_state`]): searches see either the old or the new index, never a mix. Refused if
        the corpus's blocks changed since the state was built.
        """
        with self._lock:
            self._store = state.installed_over(self._store)

    def saved_index_state(self, path: str | os.PathLike) -> BlockStore:
        """The index state saved in retriever directory `path` (to swap in: how a training checkpoint is resumed)."""
        return type(self).from_pretrained(path).export_index_state()

    def to_gpu(self, device: int = 0) -> Self:
        """
        Move the index to GPU `device` (faiss-gpu only: `pip install realm-hf[gpu]`). Falls back to the CPU index with
        a logged warning when faiss has no GPU support, no GPU is visible, or the index type has no GPU version.
        """
        with self._lock:
            self._store = self._store.on_gpu(device)
        return self

    def to_cpu(self) -> Self:
        """Bring a GPU index back to CPU memory."""
        with self._lock:
            self._store = self._store.on_cpu()
        return self

    # ---------------------------------------------------------------------------------------------------------------
    # Staleness
    # ---------------------------------------------------------------------------------------------------------------

    def is_stale(self, embedder: torch.nn.Module) -> bool | None:
        """Whether `embedder`'s weights differ from those that embedded the corpus (`None` if no fingerprint)."""
        if self.embedder_fingerprint is None:
            return None
        return fingerprint_module(embedder) != self.embedder_fingerprint

    def check_embedder(self, embedder: torch.nn.Module) -> None:
        """Refuse an embedder of another dimension; warn if its weights differ from the corpus's embedder."""
        dim = embedder_dim(embedder)
        if dim is not None and dim != self.embedding_dim:
            raise ValueError(
                f"The embedder projects to {dim} dimensions (config.retriever_proj_size) but this corpus was built "
                f"with an embedder of dimension {self.embedding_dim}. Re-embed the corpus with this embedder "
                "(`retriever.embed_corpus(embedder)`) or use the matching model."
            )
        stale = self.is_stale(embedder)
        if stale:
            warn(
                f"The corpus index is stale: it was embedded by an embedder with fingerprint "
                f"{self.embedder_fingerprint}, but the given embedder's weights have fingerprint "
                f"{fingerprint_module(embedder)}. Retrieval still works, but scores no longer match what this "
                "embedder would produce; re-embed with `retriever.embed_corpus(embedder)` and save again.",
                stacklevel=2,
            )
        elif stale is None:
            logger.info("No embedder fingerprint recorded for this corpus: cannot tell whether the index is stale.")

    # ---------------------------------------------------------------------------------------------------------------
    # Saving and loading
    # ---------------------------------------------------------------------------------------------------------------

    def manifest(self) -> dict:
        """The manifest `save_pretrained` writes (without file sizes)."""
        return build_manifest(self._store, self.tokenizer, self.max_block_length)

    def write(
        self,
        directory: str | os.PathLike,
        corpus_format: str = "arrow",
        max_shard_size: str | int = "500MB",
        model_files: dict | None = None,
    ) -> BlockStore:
        """
        Write the current store, tokenizer and manifest into `directory`, a new or empty folder (the staging folder of
        a save: [`~RealmRetriever.save_pretrained`] or a model's). Returns the store written, for
        [`~RealmRetriever.follow_save`] once the files are in place.

        Written under the retriever's lock, so a save is consistent while other threads add or remove documents.
        """
        # An add or remove reuses the index memory of the store it replaces (`BlockIndex.added`): writing that store
        # outside the lock could save vectors of another state than its corpus and manifest.
        with self._lock:
            store = self._store
            write_store(
                store,
                os.fspath(directory),
                self.tokenizer,
                self.max_block_length,
                corpus_format,
                max_shard_size,
                model_files,
            )
        return store

    def follow_save(self, store: BlockStore, directory: str | os.PathLike) -> None:
        """After `store` (from [`~RealmRetriever.write`]) was swapped into `directory`: a memory-mapped index follows it."""
        with self._lock:
            if self._store is store:
                self._store = saved_store(store, os.fspath(directory))

    def save_pretrained(
        self, save_directory: str | os.PathLike, corpus_format: str = "arrow", max_shard_size: str | int = "500MB"
    ) -> None:
        """
        Save the corpus, index, tokenizer and manifest into `save_directory` (see the module docstring for the
        layout). Only the retriever's own entries (`corpus/`, `index.faiss`, `tokenizer/`, `retriever_manifest.json`)
        are touched, so a model's files in the same directory are kept.

        The save is all-or-nothing, even if the process is killed: everything is first written (and flushed to
        disk) in a temporary folder inside `save_directory`, then swapped in under a journal, so the directory holds
        exactly the previous save or exactly this one; an interrupted swap is completed by the next load or save
        (see [`realm_hf.io.staged_saves.staged_save`]). The manifest records the size and sha256 of every file, checked
        on load.

        Args:
            save_directory (`str` or `os.PathLike`): Target directory (created if needed).
            corpus_format (`str`, defaults to `"arrow"`): `"arrow"` (`Dataset.save_to_disk`: memory-mapped on load,
                the choice for large corpora) or `"parquet"` (`corpus/data-XXXXX-of-XXXXX.parquet` shards, compact
                and readable by any Parquet tool, for sharing on the Hub; converted to a memory-mapped Arrow cache on
                load).
            max_shard_size (`str` or `int`, defaults to `"500MB"`): Maximum size of a corpus shard.
        """
        check_corpus_format(corpus_format)
        save_directory = os.fspath(save_directory)
        # One locked step: no change lands between writing the files and a memory-mapped index following the new one.
        with self._lock:
            with staged_save(save_directory) as save:
                store = self.write(save.staging, corpus_format, max_shard_size)
                stage_retriever_entries(save, save.staging)
            self.follow_save(store, save_directory)

    @classmethod
    def from_pretrained(
        cls,
        pretrained_path_or_repo_id: str | os.PathLike,
        revision: str | None = None,
        embedder: torch.nn.Module | None = None,
        expected_dim: int | None = None,
        expected_num_blocks: int | None = None,
        mmap: bool = True,
        use_gpu: bool = False,
        subfolder: str | None = None,
        repo_type: str | None = None,
        cache_dir: str | None = None,
        token: str | bool | None = None,
        verify_checksums: bool = True,
    ) -> Self:
        """
        Load a retriever saved with [`~RealmRetriever.save_pretrained`] from a local directory or a Hub repository.

        The manifest is checked against the files and the model: a missing/corrupt manifest, index, corpus or
        tokenizer, a file whose size or sha256 differs from the one recorded at save time, a path leading outside
        the directory, or a dimension/block-count mismatch raises an error that says what is wrong and how to fix
        it; an embedder whose weights differ from the corpus's (a stale index) gives a warning.

        Args:
            pretrained_path_or_repo_id (`str` or `os.PathLike`): Local directory, or a Hub repo id (model or dataset
                repo; downloaded with `huggingface_hub.snapshot_download`, which honours `HF_HUB_OFFLINE`).
            revision (`str`, *optional*): Hub revision.
            embedder (`torch.nn.Module`, *optional*): The model's embedder: its projection size
                (`config.retriever_proj_size`) must match the index; a different weight fingerprint warns.
            expected_dim (`int`, *optional*): Required embedding dimension.
            expected_num_blocks (`int`, *optional*): Required number of blocks.
            mmap (`bool`, defaults to `True`): Memory-map the Arrow corpus and the index's flat codes instead of
                reading them into RAM (a 13M-block corpus then costs page cache, not process memory). IVF lists are
                always read into RAM.
            use_gpu (`bool`, defaults to `False`): Move the index to GPU (see [`~RealmRetriever.to_gpu`]).
            subfolder (`str`, *optional*): Folder inside the directory/repo (e.g. `"retriever"`).
            repo_type (`str`, *optional*): `"model"` or `"dataset"`; both are tried when not given.
            cache_dir, token: Passed to `snapshot_download`.
            verify_checksums (`bool`, defaults to `True`): Hash every file of the directory and compare it with the
                sha256 the manifest recorded (streaming, about 1 s per GB on a 2-core AMD EPYC with SHA extensions,
                files in the page cache). `False` checks only the file sizes: for trusted local files, when loading
                time matters. Manifests of older saves record no checksums and are not verified.
        """
        path = resolve_pretrained_path(
            os.fspath(pretrained_path_or_repo_id), revision, subfolder, repo_type, cache_dir, token
        )
        if expected_dim is None and embedder is not None:
            expected_dim = embedder_dim(embedder)
        manifest, store, tokenizer = load_retriever_parts(
            path, expected_dim, expected_num_blocks, mmap, verify_checksums
        )
        retriever = cls.from_store(store, tokenizer, manifest.get("max_block_length"))
        if embedder is not None:
            retriever.check_embedder(embedder)
        return retriever.to_gpu() if use_gpu else retriever
