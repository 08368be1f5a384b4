"""
Building a retriever's [`BlockStore`]: from documents (split, embedded, indexed), from given embeddings, from legacy
blocks, and re-embedding a store's rows; the options of a build ([`BuildOptions`]).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import torch

from ..logging_utils import warn
from ..text.user_text import check_positive_int
from .chunking import split_documents
from .corpus import TOKEN_IDS_COLUMN, BlockCorpus, as_id_array, make_corpus, token_ids_array
from .encoding import check_embedder_module, embed_blocks, fingerprint_module, tokenize_block_texts
from .faiss_build import new_index
from .index import BlockIndex
from .store import BlockStore


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    """
    How [`RealmRetriever.from_documents`] (and [`ShardedRealmRetriever.from_documents`]) split, embed and index
    documents.

    Args:
        max_block_length (`int`, defaults to 288): Maximum wordpieces per block as the embedder sees it,
            `[CLS] title [SEP] text [SEP]` included (REALM used 288).
        index (`str`, defaults to `"Flat"`): FAISS factory string: `"Flat"` (exact), `"HNSW32"`, `"IVF4096,Flat"`,
            `"IVF4096,SQ8"`, `"IVF4096,PQ32"`, ... (always inner product).
        batch_size (`int`, defaults to 64), device, dtype, show_progress (`bool`, defaults to `True`): See
            [`embed_blocks`].
        train_size (`int`, *optional*): Vectors to train IVF/PQ/SQ indexes on (a random sample).
        use_gpu (`bool`, defaults to `False`): Put the index on GPU (needs faiss-gpu: `pip install realm-hf[gpu]`;
            falls back to CPU with a warning).
    """

    max_block_length: int = 288
    index: str = "Flat"
    batch_size: int = 64
    device: str | torch.device | None = None
    dtype: str | torch.dtype | None = None
    show_progress: bool = True
    train_size: int | None = None
    use_gpu: bool = False

    def __post_init__(self):
        # Checked before any document is split or embedded: a wrong type failed after minutes of embedding, inside
        # numpy ("negative dimensions are not allowed") or a comparison ("'<' not supported between str and int").
        check_positive_int(self.max_block_length, "max_block_length", minimum=8)
        check_positive_int(self.batch_size, "batch_size")
        if self.train_size is not None:
            check_positive_int(self.train_size, "train_size")
        if not isinstance(self.index, str) or not self.index.strip():
            raise ValueError(f"`index` must be a FAISS factory string such as 'Flat' or 'HNSW32', got {self.index!r}.")

    def embed_kwargs(self) -> dict:
        return {"batch_size": self.batch_size, "device": self.device, "dtype": self.dtype}


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


def blocks_to_add(store: BlockStore, documents, embedder, tokenizer, max_block_length: int | None, **embed_kwargs):
    """
    The blocks of `documents` to add to `store` (see [`BlockStore.appended`]): split, refused before the costly
    embedding when a `doc_id` is already in the store (checked again when appended), embedded, and with the reader's
    token ids when the store keeps them. Returns `(columns, [num_blocks, dim] float32 embeddings)`. Warns (at the
    caller of `add_documents`) when `embedder` is not the one that embedded the store.
    """
    check_embedder_module(embedder)  # before fingerprinting it (`None` failed there on `.state_dict`)
    recorded = store.embedder_fingerprint
    if recorded is not None and fingerprint_module(embedder) != recorded:
        warn(
            "Adding documents embedded by a different embedder than the one that built this corpus: their scores "
            "are not comparable. Re-embed the whole corpus with `realm_hf.retrieval.embed_corpus(retriever, embedder)`.",
            stacklevel=3,
        )
    columns, embeddings = split_and_embed(
        documents,
        embedder,
        tokenizer,
        max_block_length or 288,
        store.corpus.next_doc_id(fallback=store.next_block_id),
        "No blocks to add: the documents are empty.",
        check=lambda columns: store.check_new_doc_ids(list(dict.fromkeys(columns["doc_id"]))),
        **embed_kwargs,
    )
    if store.corpus.has_token_ids:
        columns = with_token_ids(columns, tokenizer)
    return columns, embeddings


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


def build_store(
    columns,
    embeddings: np.ndarray,
    tokenizer=None,
    index: str = "Flat",
    embedder_fingerprint: str | None = None,
    train_size: int | None = None,
    store_token_ids: bool = True,
) -> BlockStore:
    """
    A store over block `columns` (with `block_id`) and their embeddings, indexed with `index`; with a tokenizer, the
    blocks' token ids are stored too (`store_token_ids`).
    """
    if store_token_ids and tokenizer is not None and TOKEN_IDS_COLUMN not in columns:
        columns = with_token_ids(columns, tokenizer)
    block_index = BlockIndex.from_matrix(index, embeddings, np.asarray(columns["block_id"], np.int64), train_size)
    corpus = BlockCorpus(make_corpus(columns, embeddings))
    return BlockStore(corpus, block_index, embedder_fingerprint=embedder_fingerprint)


def store_from_documents(
    documents, embedder: torch.nn.Module, tokenizer, options: BuildOptions, first_block_id: int = 0, first_doc_id=0
) -> BlockStore:
    """Split `documents` into blocks numbered from `first_block_id`, embed them and index them (see [`BuildOptions`])."""
    dim = getattr(getattr(embedder, "config", None), "retriever_proj_size", None)
    if dim:
        # The factory string tried on an empty index first: a typo fails now, not after the corpus is embedded.
        new_index(options.index, int(dim))
    columns, embeddings = split_and_embed(
        documents,
        embedder,
        tokenizer,
        options.max_block_length,
        first_doc_id,
        "No blocks to index: the documents are empty (no document has any text).",
        show_progress=options.show_progress,
        **options.embed_kwargs(),
    )
    block_ids = np.arange(first_block_id, first_block_id + len(columns["text"]), dtype=np.int64)
    store = build_store(
        {"block_id": block_ids, **columns},
        embeddings,
        tokenizer=tokenizer,
        index=options.index,
        embedder_fingerprint=fingerprint_module(embedder),
        train_size=options.train_size,
    )
    return store.on_gpu() if options.use_gpu else store


def store_from_embeddings(
    embeddings,
    texts: Sequence[str],
    titles: Sequence[str] | None = None,
    tokenizer=None,
    index: str = "Flat",
    block_ids=None,
    metadata: Mapping[str, Sequence] | None = None,
    embedder_fingerprint: str | None = None,
    train_size: int | None = None,
) -> BlockStore:
    """A store over given block embeddings and texts (see [`RealmRetriever.from_embeddings`])."""
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
    return build_store(
        columns,
        embeddings,
        tokenizer=tokenizer,
        index=index,
        embedder_fingerprint=embedder_fingerprint,
        train_size=train_size,
    )


def store_from_legacy_blocks(
    columns, block_emb, tokenizer, index: str, embedder: torch.nn.Module | None, train_size: int | None
) -> BlockStore:
    """A store over legacy blocks (`legacy.read_legacy_blocks`): their exact vectors, their row indices as ids."""
    return build_store(
        columns,
        block_emb,
        tokenizer=tokenizer,
        index=index,
        embedder_fingerprint=fingerprint_module(embedder) if embedder is not None else None,
        train_size=train_size,
        # Legacy corpora are the paper's 13M blocks: their ids would be ~7.7 GB held in memory while converting.
        # Training on them tokenizes the searcher beam's texts on demand instead.
        store_token_ids=False,
    )


def embed_rows(
    store: BlockStore,
    embedder: torch.nn.Module,
    tokenizer,
    max_block_length: int | None,
    start: int,
    end: int,
    batch_size: int = 64,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    show_progress: bool = True,
    chunk_size: int = 100_000,
) -> torch.FloatTensor:
    """New embeddings `(end - start, dim)` of `store`'s corpus rows `start:end`, embedded `chunk_size` rows at a time."""
    corpus: BlockCorpus = store.corpus
    if not 0 <= start <= end <= len(corpus):
        raise ValueError(f"Rows {start}:{end} are out of range for a corpus of {len(corpus)} blocks.")
    parts = []
    for chunk_start in range(start, end, chunk_size):
        rows = corpus.titles_and_texts(chunk_start, min(chunk_start + chunk_size, end))
        parts.append(
            embed_blocks(
                embedder,
                tokenizer,
                rows["title"],
                rows["text"],
                batch_size=batch_size,
                device=device,
                dtype=dtype,
                show_progress=show_progress,
                max_length=max_block_length,
            )
        )
    return torch.cat(parts) if parts else torch.empty(0, store.dim)


def documents_share(documents, lo: int, hi: int):
    """Documents `lo:hi` of a sequence, a `datasets.Dataset` or a dict of columns."""
    if isinstance(documents, dict):
        return {name: list(values[lo:hi]) for name, values in documents.items()}
    if hasattr(documents, "select"):
        return documents.select(range(lo, hi))
    return documents[lo:hi]
