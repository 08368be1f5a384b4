"""Building a RealmRetriever and its index: the `from_documents` / `from_texts` / `from_embeddings` constructors, re-embedding, index states, GPU placement."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Self

import torch

from . import building
from .building import RealmIndexState


class RealmRetrieverBuildingMixin:
    """The building half of [`RealmRetriever`]'s public API (a mixin; see [`RealmRetriever`]): constructors, re-embedding the corpus, index states and GPU placement."""

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
    ) -> Self:
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
    ) -> Self:
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

    def to_gpu(self, device: int = 0) -> Self:
        """
        Move the index to GPU `device` (faiss-gpu only: `pip install realm-hf[gpu]`). Falls back to the CPU index with
        a logged warning when faiss has no GPU support, no GPU is visible, or the index type has no GPU version.
        """
        with self._lock:
            self._index.to_gpu(device)
        return self

    def to_cpu(self) -> Self:
        """Bring a GPU index back to CPU memory."""
        with self._lock:
            self._index.to_cpu()
        return self
