"""[`RealmRetriever`]: REALM's knowledge corpus, one [`BlockStore`] at a time behind a lock, and the tokenizer."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Self

import datasets
import faiss
import numpy as np
import torch

from ..io.staged_saves import staged_save
from . import building
from .bm25 import check_hybrid_settings
from .building import BuildOptions
from .contract import RealmSearchOutput, check_k, search_queries
from .corpus import BlockCorpus
from .encoding import embedder_dim
from .faiss_ops import normalize_search_params
from .index import BlockIndex
from .legacy import check_constructor_arguments, read_legacy_blocks
from .refresh import check_embedder
from .serialization import (
    check_corpus_format,
    load_retriever_parts,
    resolve_pretrained_path,
    saved_store,
    stage_retriever_entries,
    try_load_tokenizer,
    write_store,
)
from .store import BlockStore


class RealmRetriever:
    r"""
    The knowledge corpus of REALM: text blocks in a `datasets.Dataset`, a FAISS maximum-inner-product index over
    their embeddings, and the tokenizer the blocks were split with.

    A coordinator over one immutable [`BlockStore`] (corpus, index, next block id, embedder fingerprint, the BM25 index
    of hybrid retrieval): a search reads the current store, so ids, scores, blocks, stored embeddings and token ids
    come from one state; a change (documents added or removed, a refreshed index swapped in, a move to GPU) builds the
    next store and installs it under one lock. Models use it through [`Retriever`], the contract it shares with
    [`ShardedRealmRetriever`]. Lookups by block id are the store's (`retriever.store.blocks(ids)`, `texts`,
    `embeddings`, `token_ids`); refreshing and staleness are `realm_hf.retrieval.refresh`'s.

    Args:
        corpus (`datasets.Dataset`): One row per block: `block_id` (int64, unique, stable), `title`, `text`, optional
            metadata (`doc_id`, `source`, ...) and `embeddings` (float32, dimension `D`) the index was built from.
        index (`faiss.Index`): Inner-product index over the embeddings whose ids are the `block_id`s.
        tokenizer (*optional*): BERT WordPiece tokenizer that splits documents (and builds the reader's inputs).
        index_type (`str`, defaults to `"Flat"`): The FAISS factory string the index was built from.
        max_block_length (`int`, *optional*): Maximum wordpieces per block (title and special tokens included).
        embedder_fingerprint (`str`, *optional*): [`fingerprint_module`] of the embedder that made the embeddings.

    Example:

    ```python
    >>> from realm_hf import RealmEmbedder, RealmRetriever, RealmTokenizer

    >>> embedder = RealmEmbedder.from_pretrained("path/to/realm-cc-news-pretrained-embedder")
    >>> tokenizer = RealmTokenizer.from_pretrained("path/to/realm-cc-news-pretrained-embedder")
    >>> documents = [{"title": "Velmora", "text": "Velmora is a volcanic island ...", "doc_id": "velmora"}]
    >>> retriever = RealmRetriever.from_documents(documents, embedder, tokenizer, index="HNSW32")
    >>> retriever.search("where is velmora?", k=5, efSearch=128).blocks[0][0]["title"]  # embedded with `embedder`
    >>> retriever.search(["where is velmora?"], k=1, filter={"doc_id": "velmora"}).block_ids
    >>> retriever.save_pretrained("my-corpus")
    >>> retriever = RealmRetriever.from_pretrained("my-corpus", embedder=embedder)
    ```"""

    collective = False  # a search or save by one process alone (see [`Retriever.collective`])
    question_embedder = None  # embeds question texts given to `search` (see [`Retriever.question_embedder`])
    is_main_process = True  # this process writes the files shared by all processes

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
        self._store = BlockStore(corpus, index, next_block_id or 0, embedder_fingerprint)
        # Serialises the changes (each reads the live store and installs the next) and the searches, which may run
        # on an index a change reuses the memory of.
        self._lock = threading.RLock()
        self.tokenizer = tokenizer
        self.max_block_length = max_block_length

    @classmethod
    def from_store(cls, store: BlockStore, tokenizer=None, max_block_length: int | None = None) -> Self:
        """A retriever over `store` (see [`BlockStore`]), splitting new documents with `tokenizer`."""
        retriever = cls.__new__(cls)
        retriever._store, retriever._lock = store, threading.RLock()
        retriever.tokenizer, retriever.max_block_length = tokenizer, max_block_length
        return retriever

    @property
    def store(self) -> BlockStore:
        """The current state of the knowledge (never changed; a change installs a new one)."""
        return self._store

    @property
    def corpus(self) -> datasets.Dataset:
        """The block table (`block_id`, `title`, `text`, metadata, `embeddings`)."""
        return self._store.corpus.dataset

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

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_blocks={self.num_blocks}, embedding_dim={self.embedding_dim}, "
            f"index_type={self._store.index_type!r}, columns={self.corpus.column_names})"
        )

    # -- Building ------------------------------------------------------------------------------------------------------

    @classmethod
    def from_documents(cls, documents, embedder: torch.nn.Module, tokenizer, **options) -> Self:
        """
        Split documents into blocks, embed them and index them.

        Args:
            documents: Dicts with `text` and optionally `title`, `doc_id` (what [`~RealmRetriever.remove_documents`]
                takes) and metadata fields; or a `datasets.Dataset` / dict of columns.
            embedder (`torch.nn.Module`): A [`RealmEmbedder`] (see [`embed_blocks`]); it embeds question texts too.
            tokenizer: Its BERT WordPiece tokenizer; saved with the corpus.
            options: The fields of [`BuildOptions`] (`max_block_length`, `index`, `batch_size`, `device`, ...).
        """
        options = BuildOptions(**options)
        retriever = cls.from_store(building.store_from_documents(documents, embedder, tokenizer, options), tokenizer)
        retriever.max_block_length, retriever.question_embedder = options.max_block_length, embedder
        return retriever

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
        A retriever over given block embeddings (`(num_blocks, dim)`, a tensor or array) of `texts` (and `titles`,
        empty by default), e.g. an exact in-memory searcher with `index="Flat"`; `block_ids` default to
        `0..num_blocks-1`, `metadata` adds columns (e.g. `doc_id`).
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
        A retriever from a legacy `RealmForOpenQA` checkpoint directory (e.g. google/realm-orqa-nq-openqa): block texts
        from `block_records.npy`, embeddings from the `block_emb` buffer of its weights (or `block_emb` given), block
        ids the legacy rows, titles empty; with `index="Flat"` search returns what the legacy einsum + topk returned.

        `block_records.npy` is a *pickled* numpy object array (unpickling runs code from the file): refused unless
        `allow_pickle=True` or `REALM_HF_ALLOW_PICKLE=1`. Convert once ([`convert_legacy_checkpoint`]) and share the
        pickle-free retriever instead. The `tokenizer` defaults to the checkpoint's; `embedder` records its
        fingerprint.
        """
        legacy_dir = os.fspath(legacy_dir)
        columns, block_emb = read_legacy_blocks(legacy_dir, block_emb=block_emb, allow_pickle=allow_pickle)
        if tokenizer is None:
            tokenizer = try_load_tokenizer(legacy_dir)
        store = building.store_from_legacy_blocks(columns, block_emb, tokenizer, index, embedder, train_size)
        # max_block_length is unknown for legacy blocks: re-embedding truncates at the tokenizer's limit, as they were.
        retriever = cls.from_store(store, tokenizer)
        return retriever.to_gpu() if use_gpu else retriever

    # -- Search --------------------------------------------------------------------------------------------------------

    def search(
        self,
        queries,
        k: int = 5,
        return_blocks: bool = True,
        rerank_factor: int = 1,
        return_embeddings: bool = False,
        return_token_ids: bool = False,
        questions: Sequence[str] | None = None,
        filter=None,
        **search_params,
    ) -> RealmSearchOutput:
        """
        Top-`k` blocks by inner product for question texts (embedded with `question_embedder`) or embeddings, in one
        FAISS call under the lock, read from one store: arguments and output as [`Retriever.search`]. Given the texts,
        a store with a BM25 index ([`~RealmRetriever.use_bm25`]) adds their BM25 candidates; `filter={"topic": ...}`
        (any corpus column) or a callable over a block keeps to the blocks it matches (exact top `k` on Flat).
        """
        queries, questions = search_queries(queries, self.question_embedder, self.tokenizer, questions)
        k = check_k(k)
        params = normalize_search_params(search_params)
        with self._lock:
            return self._store.top_blocks(
                queries, k, rerank_factor, params, return_blocks, return_embeddings,
                tokenizer=self.tokenizer if return_token_ids else None, questions=questions, filter=filter,
            )  # fmt: skip

    def use_bm25(self, mode: str | None = None, sparse_k: int | None = None) -> Self:
        """
        Hybrid retrieval, in place: a BM25 index (`bm25s`, `pip install 'realm-hf[hybrid]'`) beside the dense one in
        the store, built from the blocks' titles and texts unless the store holds one. Searches given the question
        texts (the model, the pipeline and evaluation pass them) add BM25 candidates; document changes rebuild it in
        the same step; a save writes it and its settings under the same manifest, and loading brings it back.

        Args:
            mode (`str`, *optional*): `"candidates"` (default): the dense top `k` plus the BM25 top `sparse_k`, ranked
                by the dense score q·e of their stored embeddings (p(z|x) stays a softmax of dense scores); `"rrf"`:
                the fused top `k` by reciprocal-rank fusion of both ranks (scores still dense). `None` keeps the held
                index's mode.
            sparse_k (`int`, *optional*): BM25 candidates per question (`None`: the held index's, else `k`); above the
                number of blocks, every block that shares a term with the question.
        """
        check_hybrid_settings(mode or "candidates", sparse_k)
        with self._lock:
            self._store = self._store.with_bm25(mode, sparse_k)
        return self

    # -- Updating ------------------------------------------------------------------------------------------------------

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
        Split, embed and add documents to the corpus and the index, without retraining anything; returns the new
        block ids (fresh: ids are never reused). Use the embedder that built the corpus: embeddings from different
        embedders are not comparable (a warning says so when the fingerprints differ).
        """
        if self.tokenizer is None:
            raise ValueError("This retriever has no tokenizer to split documents with: set `retriever.tokenizer`.")
        # Split, embedded and tokenized outside the lock: searches go on meanwhile.
        columns, embeddings = building.blocks_to_add(
            self._store, documents, embedder, self.tokenizer, self.max_block_length, batch_size=batch_size,
            device=device, dtype=dtype, show_progress=show_progress,
        )  # fmt: skip
        with self._lock:
            live = self._store
            self._store = live.appended(columns, embeddings)
            return list(range(live.next_block_id, self._store.next_block_id))

    def remove_documents(self, doc_ids=None, *, block_ids=None) -> list[int]:
        """
        Remove documents (all their blocks, by `doc_id`) and/or individual blocks (by `block_id`) from the corpus and
        the index; returns the removed block ids. FAISS's HNSW graphs cannot delete nodes: an HNSW index is rebuilt.
        """
        if doc_ids is None and block_ids is None:
            raise ValueError("Pass `doc_ids` and/or `block_ids` to remove.")
        # The rows to remove are found under the lock: blocks added meanwhile would shift them.
        with self._lock:
            live = self._store
            self._store = live.without(doc_ids, block_ids)
            kept = np.isin(live.corpus.row_ids, self._store.corpus.row_ids)
        return live.corpus.row_ids[~kept].tolist()

    # -- Index states and placement ------------------------------------------------------------------------------------

    def swap_index_state(self, state: BlockStore) -> None:
        """
        Atomically install a store of the same blocks with new embeddings and index (a refresh, see
        `realm_hf.retrieval.refresh`, or an exported state): searches see the old or the new index, never a mix.
        Refused if the corpus's blocks changed since the state was built.
        """
        with self._lock:
            self._store = state.installed_over(self._store)

    def export_index_state(self) -> BlockStore:
        """The current store with a private copy of its index (e.g. to restore into another retriever)."""
        with self._lock:
            return self._store.exported()

    def to_gpu(self, device: int = 0) -> Self:
        """
        Move the index to GPU `device` (faiss-gpu: `pip install realm-hf[gpu]`); the CPU index, with a warning, when
        faiss has no GPU support, no GPU is visible, or the index type has no GPU version.
        """
        with self._lock:
            self._store = self._store.on_gpu(device)
        return self

    def to_cpu(self) -> Self:
        """Bring a GPU index back to CPU memory."""
        with self._lock:
            self._store = self._store.on_cpu()
        return self

    # -- Saving and loading --------------------------------------------------------------------------------------------

    def write(
        self,
        directory: str | os.PathLike,
        corpus_format: str = "arrow",
        max_shard_size: str | int = "500MB",
        model_files: dict | None = None,
    ) -> BlockStore:
        """
        Write the current store, tokenizer and manifest into `directory`, a new or empty folder (the staging folder of
        a save: [`~RealmRetriever.save_pretrained`] or a model's); returns the store written, for `follow_save`.

        Written under the retriever's lock, so a save is consistent while other threads add or remove documents.
        """
        # An add or remove reuses the index memory of the store it replaces (`BlockIndex.added`): writing that store
        # outside the lock could save vectors of another state than its corpus and manifest.
        with self._lock:
            store = self._store
            write_store(
                store, os.fspath(directory), self.tokenizer, self.max_block_length, corpus_format, max_shard_size,
                model_files,
            )  # fmt: skip
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
        Save the corpus, index (and BM25 index), tokenizer and manifest into `save_directory` (arguments as
        [`Retriever.save_pretrained`]), all or nothing even if the process is killed (staged, then swapped in under a
        journal: [`realm_hf.io.staged_saves.staged_save`]); only the retriever's own entries are replaced, so a model's
        files there are kept. The manifest records the size and sha256 of every file, checked on load.
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
        Load a retriever saved with [`~RealmRetriever.save_pretrained`] (with its BM25 index and settings, if saved
        with one) from a local directory or a Hub repository. Everything is checked against the manifest and the
        model: a missing or corrupt file, a size or sha256 other than the one recorded, a path leading outside the
        directory or a dimension/block-count mismatch raises an error saying what to do; a stale index warns.

        Args:
            pretrained_path_or_repo_id (`str` or `os.PathLike`): Local directory, or a Hub repo id (model or dataset
                repo; downloaded with `huggingface_hub.snapshot_download`, which honours `HF_HUB_OFFLINE`).
            revision (`str`, *optional*): Hub revision.
            embedder (`torch.nn.Module`, *optional*): The model's embedder: its projection size must match the index;
                a different weight fingerprint warns. It embeds question texts too (`question_embedder`).
            expected_dim (`int`, *optional*), expected_num_blocks (`int`, *optional*): Required dimension and size.
            mmap (`bool`, defaults to `True`): Memory-map the Arrow corpus and the index's flat codes (page cache,
                not process memory); IVF lists are always read into RAM.
            use_gpu (`bool`, defaults to `False`): Move the index to GPU (see [`~RealmRetriever.to_gpu`]).
            subfolder (`str`, *optional*): Folder inside the directory/repo (e.g. `"retriever"`).
            repo_type (`str`, *optional*): `"model"` or `"dataset"`; both are tried when not given.
            cache_dir, token: Passed to `snapshot_download`.
            verify_checksums (`bool`, defaults to `True`): Hash every file against the manifest's sha256 (about 1 s
                per GB); `False` checks only the sizes, for trusted local files.
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
            check_embedder(retriever, embedder)
            retriever.question_embedder = embedder
        return retriever.to_gpu() if use_gpu else retriever
