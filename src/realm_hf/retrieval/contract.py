"""
The retriever contract: [`Retriever`], what a REALM model asks of its knowledge corpus (the `typing.Protocol` every
retriever satisfies), and what a search takes and gives: question texts (embedded) or embeddings, the checks of `k`,
and [`RealmSearchOutput`].
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from transformers.utils import ModelOutput

from ..text.user_text import check_positive_int
from .encoding import embed_questions


class Retriever(Protocol):
    """
    The knowledge corpus of a REALM model: [`RealmRetriever`] (one process) and [`ShardedRealmRetriever`] (a corpus
    split across processes) both satisfy it, and the models, the pipeline and the re-index callback use nothing else,
    so they never ask which kind they hold (refreshing one is `realm_hf.retrieval.refresh`'s, over this surface).

    A search returns everything the model reads about the retrieved blocks (ids, scores, blocks, stored embeddings,
    the reader's token ids) from one state of the corpus and index: nothing is looked up afterwards.
    """

    tokenizer: Any
    """The BERT WordPiece tokenizer the blocks were split with (`None` when unknown)."""
    max_block_length: int | None
    """Maximum wordpieces per block as the embedder saw it (`None`: the tokenizer's limit)."""
    question_embedder: Any
    """
    The [`RealmEmbedder`] that embeds question texts given to `search` (`None`: embeddings only). Attaching the
    retriever to a model (`model.set_retriever`) sets the model's question embedder; `RealmRetriever.from_documents`
    and `from_pretrained(..., embedder=)` set the embedder they are given.
    """
    collective: bool
    """
    Whether `search` and `save_pretrained` are collective calls that every process makes (a sharded corpus, whose
    `shards` are the [`RealmRetriever`]s this process holds).
    """

    @property
    def embedding_dim(self) -> int: ...

    @property
    def num_blocks(self) -> int: ...

    @property
    def is_main_process(self) -> bool:
        """Whether this process writes the files every process shares."""
        ...

    def __len__(self) -> int: ...

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
        Top-`k` blocks by inner product for a batch of questions, with everything asked for about them read from one
        state of the corpus and index (a change meanwhile never mixes two states).

        Args:
            queries (`str`, `list[str]`, or `torch.Tensor` / `np.ndarray` of shape `(batch_size, embedding_dim)`):
                Question texts, embedded with `question_embedder` as the model embeds its questions (and the texts
                of a hybrid search), or question embeddings (detached and moved to CPU float32; NaN/inf refused with
                a `ValueError`).
            k (`int`, defaults to 5): Blocks per question.
            return_blocks (`bool`, defaults to `True`): Also fetch the blocks' texts and metadata.
            rerank_factor (`int`, defaults to 1): For compressed indexes (PQ/SQ), fetch `k * rerank_factor`
                candidates and keep the best `k` by exact inner product with the stored embeddings (PQ recall
                plateaus without this). Ignored by exact-code indexes (Flat, HNSW, IVF-Flat).
            return_embeddings (`bool`, defaults to `False`): Also return the retrieved blocks' stored embeddings
                (`block_embeddings`).
            return_token_ids (`bool`, defaults to `False`): Also return the reader's wordpiece ids of the blocks'
                texts (`block_token_ids`, `block_token_lengths`; see [`BlockStore.token_ids`]).
            questions (`Sequence[str]`, *optional*): The question texts, one per embedding: a retriever with a BM25
                index ([`RealmRetriever.use_bm25`]) adds their BM25 candidates; a dense one ignores them.
            filter (`dict` or `callable`, *optional*): Only blocks whose metadata match (see
                `realm_hf.retrieval.filters.row_mask`): `{column: value}` on any corpus column (a value, a list of
                values, or a callable over the column's value), or a callable over a block's dict. A Flat index
                returns the exact top `k` among the matching blocks; an approximate one (IVF, HNSW) those its search
                reaches (IVF: in the probed lists; raise `nprobe` / `efSearch` when a narrow filter leaves results
                missing). Fewer than `k` matching blocks leave `-1` after the last. A `ShardedRealmRetriever`
                refuses it.
            search_params: Search-time parameters for this call only, restored afterwards: `nprobe` (IVF),
                `efSearch` (HNSW), `quantizer_efSearch` (IVF with an HNSW quantizer).

        Returns:
            [`RealmSearchOutput`] with `block_ids`, `scores` (`(batch_size, k)`), `blocks` and what else was asked
            for.
        """
        ...

    def swap_index_state(self, state) -> None:
        """Install a refreshed index state of the same blocks atomically (see `realm_hf.retrieval.refresh`)."""
        ...

    def export_index_state(self) -> Any:
        """The current index state with a private copy of the index (to restore it later or elsewhere)."""
        ...

    def save_pretrained(
        self, save_directory: str | os.PathLike, corpus_format: str = "arrow", max_shard_size: str | int = "500MB"
    ) -> None:
        """
        Save the corpus into `save_directory`, all or nothing (docs/saved-layout.md).

        Args:
            save_directory (`str` or `os.PathLike`): Target directory (created if needed).
            corpus_format (`str`, defaults to `"arrow"`): `"arrow"` (`Dataset.save_to_disk`: memory-mapped on load,
                the choice for large corpora) or `"parquet"` (`corpus/data-XXXXX-of-XXXXX.parquet` shards, compact and
                readable by any Parquet tool, for sharing on the Hub; converted to a memory-mapped Arrow cache on
                load).
            max_shard_size (`str` or `int`, defaults to `"500MB"`): Maximum size of a corpus shard.
        """
        ...


@dataclass
class RealmSearchOutput(ModelOutput):
    """
    Output of a retriever's `search` ([`RealmRetriever.search`], [`ShardedRealmRetriever.search`]): everything the
    model reads about the retrieved blocks, from one state of the corpus and index, so nothing is looked up afterwards.

    Args:
        block_ids (`torch.LongTensor` of shape `(batch_size, k)`):
            Corpus ids of the retrieved blocks, best first. `-1` where an approximate index found fewer than `k`
            blocks (raise `nprobe`/`efSearch`; the logged warning names the cause).
        scores (`torch.FloatTensor` of shape `(batch_size, k)`):
            Inner products question · block, descending (`-inf` for missing results). For compressed indexes
            (PQ, SQ) the candidates are re-scored with the stored float32 block embeddings, so the scores are
            always exact inner products, the numbers the model's own einsum reproduces.
        blocks (`list[list[dict]]`):
            For each question, the `k` blocks as dicts with `block_id`, `title`, `text`, `score` and the corpus's
            metadata columns (e.g. `doc_id`).
        block_embeddings (`torch.FloatTensor` of shape `(batch_size, k, dim)`, *optional*):
            The stored embeddings of the retrieved blocks (zeros for `-1`), from the same state of the corpus as
            `block_ids`, when asked for with `return_embeddings=True` (what the model re-scores them with).
        block_token_ids (`torch.Tensor` of shape `(batch_size, k, longest)`, *optional*):
            The wordpiece ids of each block's text as the reader reads it (int32, padded with -1), when asked for with
            `return_token_ids=True` (how training finds the answers in the searcher beam).
        block_token_lengths (`torch.LongTensor` of shape `(batch_size, k)`, *optional*):
            The number of ids of each block in `block_token_ids`.
    """

    block_ids: torch.LongTensor | None = None
    scores: torch.FloatTensor | None = None
    blocks: list[list[dict]] | None = None
    block_embeddings: torch.FloatTensor | None = None
    block_token_ids: torch.Tensor | None = None
    block_token_lengths: torch.LongTensor | None = None

    def reordered(self, order: torch.LongTensor) -> RealmSearchOutput:
        """
        This output with each question's results in a new order: `order[b]` lists, for each new place, the old place
        of question `b`'s result.
        """

        def gather(tensor):
            if tensor is None:
                return None
            index = order.to(tensor.device)
            while index.dim() < tensor.dim():
                index = index.unsqueeze(-1)
            return tensor.gather(1, index.expand(*order.shape, *tensor.shape[2:]))

        blocks = self.blocks
        if blocks is not None:
            blocks = [[row[i] for i in row_order] for row, row_order in zip(blocks, order.tolist())]
        return type(self)(
            block_ids=gather(self.block_ids),
            scores=gather(self.scores),
            blocks=blocks,
            block_embeddings=gather(self.block_embeddings),
            block_token_ids=gather(self.block_token_ids),
            block_token_lengths=gather(self.block_token_lengths),
        )


def question_texts(queries) -> list[str] | None:
    """The question texts a search was given (a string, or a non-empty list or tuple of strings), else `None`."""
    if isinstance(queries, str):
        return [queries]
    if isinstance(queries, (list, tuple)) and queries and any(isinstance(q, str) for q in queries):
        others = sorted({type(q).__name__ for q in queries if not isinstance(q, str)})
        if others:
            raise TypeError(
                f"A search takes question texts or question embeddings, not both in one list (got str and "
                f"{', '.join(others)}): pass a list of strings or a (batch_size, dim) tensor."
            )
        return list(queries)
    return None


def search_queries(queries, question_embedder, tokenizer, questions=None) -> tuple[np.ndarray, list[str] | None]:
    """
    What a search is asked, as a checked `(batch_size, dim)` float32 matrix and the question texts: texts (a string or
    a list of strings) are embedded with `question_embedder` and `tokenizer` ([`embed_questions`]) and are the texts
    of a hybrid search; embeddings are taken as they are (see [`as_query_matrix`]), with `questions` their texts.
    """
    texts = question_texts(queries)
    if texts is None:
        matrix = as_query_matrix(queries)
    else:
        if questions is not None:
            raise ValueError("The question texts were given twice (`queries` and `questions=`): give them once.")
        if question_embedder is None or tokenizer is None:
            missing = "question embedder" if question_embedder is None else "tokenizer"
            raise ValueError(
                f"This retriever has no {missing} to embed question texts with. Attach it to its model "
                "(`model.set_retriever(retriever)` makes the model's question embedder the retriever's), or set "
                "`retriever.question_embedder` (a `RealmEmbedder`) and `retriever.tokenizer`; or pass question "
                "embeddings."
            )
        matrix, questions = embed_questions(question_embedder, tokenizer, texts), texts
    check_finite_queries(matrix)
    return matrix, questions


def as_query_matrix(question_embeddings) -> np.ndarray:
    """Question embeddings as a contiguous `(batch_size, dim)` float32 CPU array (one vector becomes a batch of one)."""
    if isinstance(question_embeddings, torch.Tensor):
        question_embeddings = question_embeddings.detach().to("cpu", torch.float32).numpy()
    # `None` became a NaN vector (refused as a diverged embedder), an embedder's output (a dict) or text a numpy error.
    expected = (
        "A search takes question texts (a string or a list of strings) or question embeddings, a (batch_size, dim) "
        "tensor or array of numbers: the query embedder's `projected_score`"
    )
    if question_embeddings is None or isinstance(question_embeddings, (str, bytes, Mapping)):
        raise TypeError(f"{expected}, got {type(question_embeddings).__name__}.")
    try:
        queries = np.ascontiguousarray(np.asarray(question_embeddings, dtype=np.float32))
    except (TypeError, ValueError) as error:
        raise TypeError(f"{expected}, got {type(question_embeddings).__name__} ({error}).") from None
    if queries.ndim == 1:
        queries = queries[None]
    if queries.ndim != 2:
        raise ValueError(f"Question embeddings must have shape (batch_size, dim); got {queries.shape}.")
    return queries


def check_finite_queries(queries: np.ndarray) -> None:
    """Refuse NaN/inf question embeddings: FAISS would answer them with no block at all (ids -1)."""
    bad = ~np.isfinite(queries).all(axis=1)
    if bad.any():
        raise ValueError(
            f"{int(bad.sum())} of {len(queries)} question embeddings contain NaN or inf (rows "
            f"{np.flatnonzero(bad)[:10].tolist()}): the question embedder's weights have diverged (NaN/inf after "
            "training: lower the learning rate, resume from an earlier checkpoint) or its activations overflowed in "
            "fp16 (run it in fp32 or bf16)."
        )


def check_k(k) -> int:
    """`k` as an int, refused unless a positive integer."""
    return check_positive_int(k, "k")


def check_query_shape(queries: np.ndarray, k: int, dim: int, num_blocks: int) -> None:
    """Refuse question embeddings of another dimension than the corpus's `dim`, and a `k` above its `num_blocks`."""
    if queries.shape[1] != dim:
        raise ValueError(
            f"Question embeddings have dimension {queries.shape[1]}, but this corpus was built with an embedder "
            f"of projection size {dim} (retriever_proj_size={dim}). Use the "
            "embedder that built the corpus, or re-embed it with `realm_hf.retrieval.embed_corpus(retriever, embedder)`."
        )
    if k > num_blocks:
        raise ValueError(
            f"k={k} is larger than the number of blocks in the corpus ({num_blocks}): ask for at most {num_blocks}."
        )
