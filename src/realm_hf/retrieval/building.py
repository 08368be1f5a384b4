"""Building a retriever (from documents, texts, embeddings, a saved folder, legacy blocks) and refreshing its index."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import datasets
import faiss
import numpy as np
import pyarrow as pa
import torch

from ..logging_utils import get_logger, warn
from .chunking import split_documents
from .corpus import TOKEN_IDS_COLUMN, BlockCorpus, _make_corpus, as_id_array, token_ids_array
from .encoding import _embedder_dim, embed_blocks, fingerprint_module, tokenize_block_texts
from .index import BlockIndex
from .integrity import _REBUILD_HINT
from .legacy import read_legacy_blocks
from .serialization import _resolve_pretrained_path, _try_load_tokenizer, load_retriever_parts

if TYPE_CHECKING:
    from .retriever import RealmRetriever

logger = get_logger(__name__)


@dataclass
class RealmIndexState:
    """
    Corpus embeddings and index built off the live retriever ([`RealmRetriever.build_index_state`]), installed
    atomically with [`RealmRetriever.swap_index_state`] (how the re-index callback refreshes during training).
    """

    block_ids: np.ndarray
    corpus: datasets.Dataset
    index: faiss.Index
    index_type: str
    embedder_fingerprint: str | None = None


def check_parts(corpus: BlockCorpus, index: BlockIndex) -> None:
    """Refuse a corpus and index that cannot make a [`RealmRetriever`]: no block, or not one vector per block."""
    if len(corpus) == 0:
        raise ValueError("The corpus is empty: a retriever needs at least one block.")
    if index.index.ntotal != len(corpus):
        raise ValueError(
            f"The index holds {index.index.ntotal} vectors but the corpus has {len(corpus)} blocks. {_REBUILD_HINT}"
        )
    if corpus.dim is not None and corpus.dim != index.index.d:
        raise ValueError(
            f"The corpus embeddings have dimension {corpus.dim} but the index has {index.index.d}. {_REBUILD_HINT}"
        )


def split_and_embed(
    documents, embedder, tokenizer, max_block_length, first_doc_id, empty_message, check=None, **embed_kwargs
):
    """
    Split documents into blocks and embed them: `(columns, [num_blocks, dim] float32 embeddings)`. `check`, if given,
    sees the block columns before the (costly) embedding and may refuse them.
    """
    columns = split_documents(documents, tokenizer, max_block_length, first_doc_id=first_doc_id)
    if not columns["text"]:
        raise ValueError(empty_message)
    if check is not None:
        check(columns)
    embeddings = embed_blocks(
        embedder, tokenizer, columns["title"], columns["text"], max_length=max_block_length, **embed_kwargs
    )
    return columns, embeddings.numpy()


# Blocks tokenized per call when storing token ids: the tokenizer's per-text encodings and Python id lists of a whole
# corpus at once took ~20 GB at 1M blocks; a chunk is turned into a compact Arrow array before the next one.
TOKENIZE_CHUNK_BLOCKS = 10_000


def with_token_ids(columns: dict, tokenizer) -> dict:
    """`columns` plus the reader's wordpiece ids of each block's text (`text_token_ids`), tokenized once here."""
    texts, vocab_size = columns["text"], len(tokenizer)
    column = token_ids_array([], vocab_size)  # the column's type, and the answer for an empty corpus
    chunks = []
    for start in range(0, len(texts), TOKENIZE_CHUNK_BLOCKS):
        ids = tokenize_block_texts(tokenizer, texts[start : start + TOKENIZE_CHUNK_BLOCKS])
        chunks.extend(token_ids_array(ids, vocab_size).chunks)
    if chunks:
        column = pa.chunked_array(chunks, type=column.type)
    return {**columns, TOKEN_IDS_COLUMN: column}


def build(
    cls: type[RealmRetriever],
    columns,
    embeddings: np.ndarray,
    tokenizer=None,
    index: str = "Flat",
    max_block_length: int | None = None,
    embedder_fingerprint: str | None = None,
    train_size: int | None = None,
    use_gpu: bool = False,
    store_token_ids: bool = True,
) -> RealmRetriever:
    """
    A `cls` retriever over block `columns` (with `block_id`) and their embeddings, indexed with `index`; with a
    tokenizer, the blocks' token ids are stored too (`store_token_ids`).
    """
    if store_token_ids and tokenizer is not None and TOKEN_IDS_COLUMN not in columns:
        columns = with_token_ids(columns, tokenizer)
    block_index = BlockIndex.from_matrix(index, embeddings, np.asarray(columns["block_id"], np.int64), train_size)
    retriever = cls(
        _make_corpus(columns, embeddings),
        block_index,
        tokenizer=tokenizer,
        max_block_length=max_block_length,
        embedder_fingerprint=embedder_fingerprint,
    )
    if use_gpu:
        retriever.to_gpu()
    return retriever


def from_documents(
    cls: type[RealmRetriever],
    documents,
    embedder: torch.nn.Module,
    tokenizer,
    max_block_length: int,
    index: str,
    batch_size: int,
    device: str | torch.device | None,
    dtype: str | torch.dtype | None,
    show_progress: bool,
    train_size: int | None,
    use_gpu: bool,
) -> RealmRetriever:
    """[`RealmRetriever.from_documents`]."""
    columns, embeddings = split_and_embed(
        documents,
        embedder,
        tokenizer,
        max_block_length,
        0,
        "No blocks to index: the documents are empty (no document has any text).",
        batch_size=batch_size,
        device=device,
        dtype=dtype,
        show_progress=show_progress,
    )
    columns = {"block_id": np.arange(len(columns["text"]), dtype=np.int64), **columns}
    return build(
        cls,
        columns,
        embeddings,
        tokenizer=tokenizer,
        index=index,
        max_block_length=max_block_length,
        embedder_fingerprint=fingerprint_module(embedder),
        train_size=train_size,
        use_gpu=use_gpu,
    )


def from_texts(
    cls: type[RealmRetriever], texts: Iterable[str], embedder, tokenizer, titles: Iterable[str] | None, **kwargs
) -> RealmRetriever:
    """[`RealmRetriever.from_texts`]."""
    texts = list(texts)
    titles = [""] * len(texts) if titles is None else list(titles)
    if len(titles) != len(texts):
        raise ValueError(f"Got {len(titles)} titles for {len(texts)} texts.")
    return cls.from_documents([{"title": t, "text": x} for t, x in zip(titles, texts)], embedder, tokenizer, **kwargs)


def from_embeddings(
    cls: type[RealmRetriever],
    embeddings,
    texts: Sequence[str],
    titles: Sequence[str] | None,
    tokenizer,
    index: str,
    block_ids,
    metadata: Mapping[str, Sequence] | None,
    embedder_fingerprint: str | None,
    train_size: int | None,
    use_gpu: bool,
) -> RealmRetriever:
    """[`RealmRetriever.from_embeddings`]."""
    if isinstance(embeddings, torch.Tensor):
        embeddings = embeddings.detach().to("cpu", torch.float32).numpy()
    embeddings = np.asarray(embeddings, dtype=np.float32)
    texts = list(texts)
    if embeddings.ndim != 2 or len(embeddings) != len(texts):
        raise ValueError(f"Got embeddings of shape {embeddings.shape} for {len(texts)} texts.")
    if not texts:
        raise ValueError("No blocks: the corpus is empty.")
    titles = [""] * len(texts) if titles is None else [t or "" for t in titles]
    block_ids = np.arange(len(texts), dtype=np.int64) if block_ids is None else as_id_array(block_ids)
    columns = {"block_id": block_ids, "title": titles, "text": texts}
    for name, values in (metadata or {}).items():
        if len(values) != len(texts):
            raise ValueError(f"Metadata column {name!r} has {len(values)} values for {len(texts)} blocks.")
        columns[name] = list(values)
    return build(
        cls,
        columns,
        embeddings,
        tokenizer=tokenizer,
        index=index,
        embedder_fingerprint=embedder_fingerprint,
        train_size=train_size,
        use_gpu=use_gpu,
    )


def load_pretrained(
    cls: type[RealmRetriever],
    pretrained_path_or_repo_id: str | os.PathLike,
    revision: str | None,
    embedder: torch.nn.Module | None,
    expected_dim: int | None,
    expected_num_blocks: int | None,
    mmap: bool,
    subfolder: str | None,
    repo_type: str | None,
    cache_dir: str | None,
    token: str | bool | None,
    verify_checksums: bool = True,
) -> RealmRetriever:
    """[`RealmRetriever.from_pretrained`] up to the embedder check and the move to GPU (which the caller does)."""
    path = _resolve_pretrained_path(
        os.fspath(pretrained_path_or_repo_id), revision, subfolder, repo_type, cache_dir, token
    )
    if expected_dim is None and embedder is not None:
        expected_dim = _embedder_dim(embedder)
    manifest, corpus, index, tokenizer = load_retriever_parts(
        path, expected_dim, expected_num_blocks, mmap, verify_checksums
    )
    return cls(
        corpus,
        index,
        tokenizer=tokenizer,
        max_block_length=manifest.get("max_block_length"),
        embedder_fingerprint=manifest.get("embedder_fingerprint"),
        next_block_id=manifest.get("next_block_id"),
    )


def from_legacy(
    cls: type[RealmRetriever],
    legacy_dir: str | os.PathLike,
    tokenizer,
    block_emb,
    allow_pickle: bool,
    index: str,
    embedder: torch.nn.Module | None,
    train_size: int | None,
    use_gpu: bool,
) -> RealmRetriever:
    """[`RealmRetriever.from_legacy`]: the legacy blocks read (`legacy.read_legacy_blocks`), then indexed."""
    legacy_dir = os.fspath(legacy_dir)
    columns, block_emb = read_legacy_blocks(legacy_dir, block_emb=block_emb, allow_pickle=allow_pickle)
    return from_legacy_blocks(cls, legacy_dir, columns, block_emb, tokenizer, index, embedder, train_size, use_gpu)


def from_legacy_blocks(
    cls: type[RealmRetriever],
    legacy_dir: str,
    columns,
    block_emb,
    tokenizer,
    index: str,
    embedder: torch.nn.Module | None,
    train_size: int | None,
    use_gpu: bool,
) -> RealmRetriever:
    """[`RealmRetriever.from_legacy`] once the legacy blocks are read (`legacy.read_legacy_blocks`)."""
    if tokenizer is None:
        tokenizer = _try_load_tokenizer(legacy_dir)
    return build(
        cls,
        columns,
        block_emb,
        tokenizer=tokenizer,
        index=index,
        # Unknown for legacy blocks: re-embedding then truncates at the tokenizer's limit, like the legacy model.
        max_block_length=None,
        embedder_fingerprint=fingerprint_module(embedder) if embedder is not None else None,
        train_size=train_size,
        use_gpu=use_gpu,
        # Legacy corpora are the paper's 13M blocks: their ids would be ~7.7 GB held in memory while converting.
        # Training on them tokenizes the searcher beam's texts on demand instead.
        store_token_ids=False,
    )


def embed_corpus(
    retriever: RealmRetriever,
    embedder: torch.nn.Module,
    batch_size: int,
    device: str | torch.device | None,
    dtype: str | torch.dtype | None,
    show_progress: bool,
    start: int | None,
    end: int | None,
    update_index: bool | None,
    chunk_size: int,
    train_size: int | None,
) -> torch.FloatTensor:
    """[`RealmRetriever.embed_corpus`]."""
    if retriever.tokenizer is None:
        raise ValueError("This retriever has no tokenizer: set `retriever.tokenizer` before re-embedding.")
    if update_index is None:
        update_index = start is None and end is None
    # One snapshot of the blocks for the whole call: documents added or removed meanwhile must not shift the rows
    # between chunks, or between embedding them and building the index (the swap then refuses the stale state).
    with retriever._lock:
        corpus = retriever._corpus
    start = 0 if start is None else int(start)
    end = len(corpus) if end is None else int(end)
    if not 0 <= start <= end <= len(corpus):
        raise ValueError(f"Rows {start}:{end} are out of range for a corpus of {len(corpus)} blocks.")
    if update_index and (start, end) != (0, len(corpus)):
        raise ValueError("update_index=True needs the whole corpus embedded (no start/end).")
    parts = []

    for chunk_start in range(start, end, chunk_size):
        rows = corpus.titles_and_texts(chunk_start, min(chunk_start + chunk_size, end))
        parts.append(
            embed_blocks(
                embedder,
                retriever.tokenizer,
                rows["title"],
                rows["text"],
                batch_size=batch_size,
                device=device,
                dtype=dtype,
                show_progress=show_progress,
                max_length=retriever.max_block_length,
            )
        )
    embeddings = torch.cat(parts) if parts else torch.empty(0, retriever.embedding_dim)
    if update_index:
        state = build_index_state(
            retriever, embeddings, fingerprint_module(embedder), train_size=train_size, corpus=corpus
        )
        retriever.swap_index_state(state)
    return embeddings


def build_index_state(
    retriever: RealmRetriever,
    embeddings,
    embedder_fingerprint: str | None,
    train_size: int | None,
    corpus: BlockCorpus | None = None,
) -> RealmIndexState:
    """
    [`RealmRetriever.build_index_state`]: only the snapshot of the live corpus is taken under the lock (or `corpus`,
    the snapshot the embeddings were computed from, is used). Non-finite embeddings are refused by the index build.
    """
    if isinstance(embeddings, torch.Tensor):
        embeddings = embeddings.detach().to("cpu", torch.float32).numpy()
    embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
    with retriever._lock:
        corpus, index_type = (corpus if corpus is not None else retriever._corpus), retriever.index_type
    if embeddings.ndim != 2 or len(embeddings) != len(corpus):
        raise ValueError(f"Got embeddings of shape {embeddings.shape} for a corpus of {len(corpus)} blocks.")
    if embeddings.shape[1] != retriever.embedding_dim:
        logger.warning(
            "The new embeddings have %d dimensions (the corpus had %d): the index is rebuilt for the new size.",
            embeddings.shape[1],
            retriever.embedding_dim,
        )
    new_index = BlockIndex.from_matrix(index_type, embeddings, corpus.row_ids, train_size)
    return RealmIndexState(
        block_ids=corpus.row_ids,
        corpus=corpus.with_embeddings(embeddings),
        index=new_index.index,
        index_type=new_index.index_type,
        embedder_fingerprint=embedder_fingerprint,
    )


def export_index_state(retriever: RealmRetriever) -> RealmIndexState:
    """[`RealmRetriever.export_index_state`], under the retriever's lock."""
    with retriever._lock:
        return RealmIndexState(
            block_ids=retriever._corpus.row_ids,
            corpus=retriever.corpus,
            index=retriever._index.owned_cpu_index(copy=True),
            index_type=retriever.index_type,
            embedder_fingerprint=retriever.embedder_fingerprint,
        )


def swap_index_state(retriever: RealmRetriever, state: RealmIndexState) -> None:
    """[`RealmRetriever.swap_index_state`]: check and install under the retriever's lock."""
    with retriever._lock:
        if not np.array_equal(state.block_ids, retriever._corpus.row_ids):
            raise ValueError(
                "The corpus changed (blocks added or removed) since this index state was built: rebuild it."
            )
        retriever._corpus = BlockCorpus(state.corpus)
        retriever._index = retriever._index.replaced_by(state.index, state.index_type)
        retriever.embedder_fingerprint = state.embedder_fingerprint


def is_stale(retriever: RealmRetriever, embedder: torch.nn.Module) -> bool | None:
    """[`RealmRetriever.is_stale`]."""
    if retriever.embedder_fingerprint is None:
        return None
    return fingerprint_module(embedder) != retriever.embedder_fingerprint


def check_embedder(retriever: RealmRetriever, embedder: torch.nn.Module) -> None:
    """[`RealmRetriever.check_embedder`]."""
    dim = _embedder_dim(embedder)
    if dim is not None and dim != retriever.embedding_dim:
        raise ValueError(
            f"The embedder projects to {dim} dimensions (config.retriever_proj_size) but this corpus was built with "
            f"an embedder of dimension {retriever.embedding_dim}. Re-embed the corpus with this embedder "
            "(`retriever.embed_corpus(embedder)`) or use the matching model."
        )
    stale = retriever.is_stale(embedder)
    if stale:
        message = (
            f"The corpus index is stale: it was embedded by an embedder with fingerprint {retriever.embedder_fingerprint}, "
            f"but the given embedder's weights have fingerprint {fingerprint_module(embedder)}. Retrieval still "
            "works, but scores no longer match what this embedder would produce; re-embed with "
            "`retriever.embed_corpus(embedder)` and save again."
        )
        # Past this function and the method: the frame the method's own warning named.
        warn(message, stacklevel=4)
    elif stale is None:
        logger.info("No embedder fingerprint recorded for this corpus: cannot tell whether the index is stale.")
