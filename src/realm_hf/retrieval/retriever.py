"""[`RealmRetriever`]: REALM's knowledge corpus, a block corpus and a FAISS index kept in step behind one lock."""

from __future__ import annotations

import threading

import datasets
import faiss
import numpy as np
import torch

from . import building, mutation, searching
from .building import RealmIndexState  # noqa: F401 - re-exported: importable from here
from .corpus import BlockCorpus
from .index import BlockIndex
from .legacy import check_constructor_arguments, legacy_reader_call
from .retriever_building import RealmRetrieverBuildingMixin
from .retriever_persistence import RealmRetrieverPersistenceMixin
from .searching import RealmSearchOutput


class RealmRetriever(RealmRetrieverBuildingMixin, RealmRetrieverPersistenceMixin):
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
        check_constructor_arguments(corpus, index)
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
