"""[`RealmRetriever`]: REALM's knowledge corpus, a block corpus and a FAISS index kept in step behind one lock."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping, Sequence

import datasets
import faiss
import numpy as np
import torch

from . import building, mutation, searching
from .building import RealmIndexState
from .corpus import BlockCorpus
from .index import BlockIndex
from .legacy import legacy_reader_call
from .searching import RealmSearchOutput
from .serialization import build_manifest, save_retriever


class RealmRetriever:
    r"""
    The knowledge corpus of REALM: text blocks in a `datasets.Dataset`, a FAISS maximum-inner-product index over
    their embeddings, and the tokenizer the blocks were split with.

    `RealmForOpenQA` calls [`~RealmRetriever.search`] with a batch of question embeddings, then
    [`~RealmRetriever.get_block_embeddings`] to re-score the retrieved blocks with gradients and
    [`~RealmRetriever.get_block_texts`] to build reader inputs.

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
    >>> from realm_hf.retrieval_realm import RealmRetriever

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
        corpus: datasets.Dataset | BlockCorpus,
        index: faiss.Index | BlockIndex,
        tokenizer=None,
        index_type: str = "Flat",
        max_block_length: int | None = None,
        embedder_fingerprint: str | None = None,
        next_block_id: int | None = None,
    ):
        corpus = corpus if isinstance(corpus, BlockCorpus) else BlockCorpus(corpus)
        index = index if isinstance(index, BlockIndex) else BlockIndex(index, index_type)
        building.check_parts(corpus, index)
        self._corpus, self._index = corpus, index
        self.tokenizer = tokenizer
        self.max_block_length = max_block_length
        self.embedder_fingerprint = embedder_fingerprint
        # One lock for corpus and index together: a search never sees one changed without the other.
        self._lock = threading.RLock()
        self._next_block_id = max(int(next_block_id or 0), corpus.max_block_id + 1)

    @property
    def corpus(self) -> datasets.Dataset:
        """The block table (`block_id`, `title`, `text`, metadata, `embeddings`)."""
        return self._corpus.dataset

    @property
    def index(self) -> faiss.Index:
        """The FAISS index (ids are block ids); on GPU after [`~RealmRetriever.to_gpu`]."""
        return self._index.index

    @property
    def index_type(self) -> str:
        """The FAISS factory string the index was built from."""
        return self._index.index_type

    @property
    def _index_source(self) -> tuple[str, int, float] | None:
        return self._index.source

    @property
    def num_blocks(self) -> int:
        """Number of blocks in the corpus (and vectors in the index)."""
        return len(self._corpus)

    def __len__(self) -> int:
        return self.num_blocks

    @property
    def embedding_dim(self) -> int:
        """Dimension of the block embeddings (the embedder's projection size, 128 for REALM)."""
        return int(self.index.d)

    @property
    def block_ids(self) -> np.ndarray:
        """All block ids, in corpus row order."""
        return self._corpus.row_ids.copy()

    @property
    def next_block_id(self) -> int:
        """The id the next added block gets (ids are never reused, even after removals)."""
        return self._next_block_id

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_blocks={self.num_blocks}, embedding_dim={self.embedding_dim}, "
            f"index_type={self.index_type!r}, columns={self.corpus.column_names})"
        )

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
        return torch.from_numpy(self._corpus.embeddings(block_ids, self.embedding_dim))

    def get_blocks(self, block_ids) -> list:
        """
        The blocks of `block_ids` as dicts (`block_id`, `title`, `text` and the metadata columns).

        Args:
            block_ids (`torch.LongTensor` of shape `(batch_size, k)` or `(k,)`): Block ids (`-1`: an empty block).

        Returns:
            `list[list[dict]]` for 2-D ids, `list[dict]` for 1-D ids.
        """
        return self._corpus.blocks(block_ids)

    def get_block_texts(self, block_ids) -> list:
        """Texts of `block_ids`: `list[list[str]]` for `(batch_size, k)` ids, `list[str]` for 1-D ids."""
        return self._corpus.texts(block_ids)

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
        return searching.block_token_ids(self, block_ids)

    def search(
        self,
        question_embeddings,
        k: int = 5,
        return_blocks: bool = True,
        rerank_factor: int = 1,
        return_embeddings: bool = False,
        **search_params,
    ) -> RealmSearchOutput:
        """
        Top-`k` blocks by inner product for a batch of question embeddings, in one FAISS call.

        Args:
            question_embeddings (`torch.Tensor` or `np.ndarray` of shape `(batch_size, embedding_dim)`):
                Question embeddings (detached and moved to CPU float32 here).
            k (`int`, defaults to 5): Blocks per question.
            return_blocks (`bool`, defaults to `True`): Also fetch the blocks' texts and metadata.
            rerank_factor (`int`, defaults to 1): For compressed indexes (PQ/SQ), fetch `k * rerank_factor`
                candidates and keep the best `k` by exact inner product with the stored embeddings (PQ recall
                plateaus without this). Ignored by exact-code indexes (Flat, HNSW, IVF-Flat).
            return_embeddings (`bool`, defaults to `False`): Also return the retrieved blocks' stored embeddings
                (`block_embeddings`), looked up in the same locked step as the search: with documents added or
                the index swapped meanwhile, ids, scores, blocks and embeddings still come from one state (a later
                [`~RealmRetriever.get_block_embeddings`] call could see another).
            search_params: Search-time parameters for this call only, restored afterwards: `nprobe` (IVF),
                `efSearch` (HNSW), `quantizer_efSearch` (IVF with an HNSW quantizer).

        Returns:
            [`RealmSearchOutput`] with `block_ids`, `scores` (`(batch_size, k)`), `blocks` and `block_embeddings`.
            NaN/inf question embeddings are refused with a `ValueError`.
        """
        return searching.search(
            self, question_embeddings, k, return_blocks, rerank_factor, search_params, return_embeddings
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
    # Building
    # ---------------------------------------------------------------------------------------------------------------

    @classmethod
    def from_documents(
        cls,
        documents,
        embedder: torch.nn.Module,
        tokenizer,
        max_block_length: int = 288,
        index: str = "Flat",
        batch_size: int = 64,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        show_progress: bool = True,
        train_size: int | None = None,
        use_gpu: bool = False,
    ) -> RealmRetriever:
        """
        Split documents into blocks, embed them and index them.

        Args:
            documents: Iterable of dicts with `text` and optionally `title`, `doc_id` (kept, used by
                [`~RealmRetriever.remove_documents`]) and metadata fields; or a `datasets.Dataset` / dict of columns.
            embedder (`torch.nn.Module`): A [`RealmEmbedder`] (see [`embed_blocks`]).
            tokenizer: Its BERT WordPiece tokenizer; saved with the corpus.
            max_block_length (`int`, defaults to 288): Maximum wordpieces per block as the embedder sees it,
                `[CLS] title [SEP] text [SEP]` included (REALM used 288).
            index (`str`, defaults to `"Flat"`): FAISS factory string: `"Flat"` (exact), `"HNSW32"`,
                `"IVF4096,Flat"`, `"IVF4096,SQ8"`, `"IVF4096,PQ32"`, ... (always inner product).
            batch_size, device, dtype, show_progress: See [`embed_blocks`].
            train_size (`int`, *optional*): Vectors to train IVF/PQ/SQ indexes on (a random sample).
            use_gpu (`bool`, defaults to `False`): Put the index on GPU (needs faiss-gpu: `pip install realm-hf[gpu]`;
                falls back to CPU with a warning).
        """
        return building.from_documents(
            cls,
            documents,
            embedder,
            tokenizer,
            max_block_length,
            index,
            batch_size,
            device,
            dtype,
            show_progress,
            train_size,
            use_gpu,
        )

    @classmethod
    def from_texts(
        cls, texts: Iterable[str], embedder, tokenizer, titles: Iterable[str] | None = None, **kwargs
    ) -> RealmRetriever:
        """[`~RealmRetriever.from_documents`] for plain texts (and optional titles)."""
        return building.from_texts(cls, texts, embedder, tokenizer, titles, **kwargs)

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
    ) -> RealmRetriever:
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
        return building.from_embeddings(
            cls,
            embeddings,
            texts,
            titles,
            tokenizer,
            index,
            block_ids,
            metadata,
            embedder_fingerprint,
            train_size,
            use_gpu,
        )

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
        return building.embed_corpus(
            self, embedder, batch_size, device, dtype, show_progress, start, end, update_index, chunk_size, train_size
        )

    def build_index_state(
        self, embeddings, embedder_fingerprint: str | None = None, train_size: int | None = None
    ) -> RealmIndexState:
        """
        Build, without touching the live retriever, the corpus embeddings and index for new block embeddings
        (`[num_blocks, dim]` in corpus row order, e.g. from [`~RealmRetriever.embed_corpus`]). Safe to run in a
        background thread while the retriever keeps serving searches; install the result with
        [`~RealmRetriever.swap_index_state`].
        """
        return building.build_index_state(self, embeddings, embedder_fingerprint, train_size)

    def export_index_state(self) -> RealmIndexState:
        """The current corpus embeddings and index as a [`RealmIndexState`] (e.g. to restore into another retriever)."""
        return building.export_index_state(self)

    def swap_index_state(self, state: RealmIndexState) -> None:
        """
        Atomically install a [`RealmIndexState`] (new embeddings + index): searches see either the old or the new
        index, never a mix. Refused if the corpus's blocks changed since the state was built.
        """
        building.swap_index_state(self, state)

    def to_gpu(self, device: int = 0) -> RealmRetriever:
        """
        Move the index to GPU `device` (faiss-gpu only: `pip install realm-hf[gpu]`). Falls back to the CPU index with
        a logged warning when faiss has no GPU support, no GPU is visible, or the index type has no GPU version.
        """
        with self._lock:
            self._index.to_gpu(device)
        return self

    def to_cpu(self) -> RealmRetriever:
        """Bring a GPU index back to CPU memory."""
        with self._lock:
            self._index.to_cpu()
        return self

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
        return mutation.add_documents(self, documents, embedder, batch_size, device, dtype, show_progress)

    def remove_documents(self, doc_ids=None, *, block_ids=None) -> list[int]:
        """
        Remove documents (all their blocks, by `doc_id`) and/or individual blocks (by `block_id`) from the corpus and
        the index. HNSW graphs cannot delete nodes in FAISS, so an HNSW index is rebuilt from the stored embeddings.

        Returns:
            `list[int]`: the removed block ids.
        """
        return mutation.remove_documents(self, doc_ids, block_ids)

    def remove_blocks(self, block_ids) -> list[int]:
        """Remove individual blocks by id (see [`~RealmRetriever.remove_documents`])."""
        return self.remove_documents(block_ids=block_ids)

    # ---------------------------------------------------------------------------------------------------------------
    # Staleness
    # ---------------------------------------------------------------------------------------------------------------

    def is_stale(self, embedder: torch.nn.Module) -> bool | None:
        """Whether `embedder`'s weights differ from those that embedded the corpus (`None` if no fingerprint)."""
        return building.is_stale(self, embedder)

    def check_embedder(self, embedder: torch.nn.Module) -> None:
        """Refuse an embedder of another dimension; warn if its weights differ from the corpus's embedder."""
        building.check_embedder(self, embedder)

    # ---------------------------------------------------------------------------------------------------------------
    # Saving and loading
    # ---------------------------------------------------------------------------------------------------------------

    def manifest(self) -> dict:
        """The manifest `save_pretrained` writes (without file sizes)."""
        return build_manifest(self)

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
        (see [`realm_hf.file_utils.staged_save`]). The manifest records the size and sha256 of every file, checked
        on load.

        Args:
            save_directory (`str` or `os.PathLike`): Target directory (created if needed).
            corpus_format (`str`, defaults to `"arrow"`): `"arrow"` (`Dataset.save_to_disk`: memory-mapped on load,
                the choice for large corpora) or `"parquet"` (`corpus/data-XXXXX-of-XXXXX.parquet` shards, compact
                and readable by any Parquet tool, for sharing on the Hub; converted to a memory-mapped Arrow cache on
                load).
            max_shard_size (`str` or `int`, defaults to `"500MB"`): Maximum size of a corpus shard.
        """
        save_retriever(self, save_directory, corpus_format, max_shard_size)

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
    ) -> RealmRetriever:
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
        retriever = building.load_pretrained(
            cls,
            pretrained_path_or_repo_id,
            revision,
            embedder,
            expected_dim,
            expected_num_blocks,
            mmap,
            subfolder,
            repo_type,
            cache_dir,
            token,
            verify_checksums,
        )
        # Checked here, so that a stale-index warning names the caller of `from_pretrained`.
        if embedder is not None:
            retriever.check_embedder(embedder)
        if use_gpu:
            retriever.to_gpu()
        return retriever

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
    ) -> RealmRetriever:
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
        return building.from_legacy(
            cls, legacy_dir, tokenizer, block_emb, allow_pickle, index, embedder, train_size, use_gpu
        )
