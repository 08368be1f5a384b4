"""
Building FAISS inner-product indexes (`faiss.METRIC_INNER_PRODUCT`, the relevance score of REALM) from a factory string
with stable ids: IVF lists sized to the corpus, training, the finiteness check of every vector that enters an index,
and a Flat index streamed into its file. What [`BlockIndex`] does with a built index: `retrieval/faiss_ops.py`.
"""

from __future__ import annotations

import io
import re
import struct
from collections.abc import Callable, Iterator

import faiss
import numpy as np

from ..logging_utils import get_logger
from .faiss_ops import faiss_message

logger = get_logger(__name__)

# k-means wants at least 39 training points per centroid (faiss warns below that).
MIN_POINTS_PER_CENTROID = 39


def strip_idmap(factory: str) -> str:
    return re.sub(r"^IDMap2?,", "", factory.strip())


def adjust_factory_for_size(factory: str, num_vectors: int) -> str:
    """
    Reduce the number of IVF lists when the corpus is too small to train them (fewer than 39 vectors per list),
    with a warning that says what was changed. Other factory strings are returned unchanged.
    """
    match = re.search(r"IVF(\d+)", factory)
    if match is None:
        return factory
    nlist = int(match.group(1))
    if num_vectors >= nlist * MIN_POINTS_PER_CENTROID:
        return factory
    new_nlist = max(1, num_vectors // MIN_POINTS_PER_CENTROID)
    if new_nlist == nlist:
        # Already as few lists as there can be (one): nothing to change, so nothing to say (this runs again on the
        # factory it returned, where a warning "using 'IVF1,Flat' instead of 'IVF1,Flat'" contradicted itself).
        return factory
    adjusted = factory[: match.start(1)] + str(new_nlist) + factory[match.end(1) :]
    logger.warning(
        "Index %r has %d inverted lists but only %d vectors to train them (k-means needs >= %d per list): using %r "
        "instead. For large corpora pick about 4*sqrt(num_blocks) to 16*sqrt(num_blocks) lists.",
        factory,
        nlist,
        num_vectors,
        MIN_POINTS_PER_CENTROID,
        adjusted,
    )
    return adjusted


class IndexFactoryError(ValueError):
    """A FAISS index factory string that FAISS cannot build (raised by [`new_index`])."""


def new_index(factory: str, dim: int) -> faiss.Index:
    """
    An empty inner-product index for `factory` that takes caller-chosen ids (`add_with_ids`).

    Ids must survive additions and removals (they are the corpus's `block_id`). IVF indexes store arbitrary ids
    natively and their `remove_ids` works on those ids, so they are used as they are (an `IndexIDMap` around an IVF
    index would even break on `remove_ids`: IVF does not renumber its internal ids, the id map assumes it does).
    Every other index (Flat, HNSW, PQ, SQ, ...) is wrapped in `IndexIDMap` (8 bytes per vector). `IndexIDMap2`
    would add `reconstruct(block_id)` at the cost of a reverse hash map (~50 bytes per vector, ~0.7 GB at 13M
    blocks); it is not needed because the exact vectors are stored in the corpus, which datasets' own
    `add_faiss_index` could not give us either: it uses row positions as ids, which shift when rows are removed.
    """
    inner_factory = strip_idmap(factory)
    try:
        base = faiss.index_factory(dim, inner_factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as err:
        raise IndexFactoryError(
            f"Invalid FAISS index factory string {factory!r} for dimension {dim}: {faiss_message(err)}. Examples: "
            "'Flat', 'HNSW32', 'IVF1024,Flat', 'IVF1024,SQ8', 'IVF1024,PQ32'."
        ) from None
    _disable_polysemous_training(base)
    if faiss.try_extract_index_ivf(base) is not None:
        return base
    return faiss.IndexIDMap(base)


def _disable_polysemous_training(index: faiss.Index) -> None:
    # The factory turns on polysemous training for PQ codes; it only serves Hamming pre-filtering
    # (`polysemous_ht`), which this package never enables, and it multiplies PQ training time (6x measured).
    inner = faiss.downcast_index(index)
    if isinstance(inner, faiss.IndexPreTransform):
        inner = faiss.downcast_index(inner.index)
    if hasattr(inner, "do_polysemous_training"):
        inner.do_polysemous_training = False


def needs_training(index: faiss.Index) -> bool:
    return not index.is_trained


def check_finite(embeddings: np.ndarray, ids: np.ndarray) -> None:
    """
    Refuse NaN/inf block embeddings with a `ValueError` naming the blocks. Every vector that enters an index passes
    here ([`add_embeddings`]): FAISS would store them, and then every search either skips those blocks or returns
    block id -1 for every question (NaN scores never rank).
    """
    finite = np.isfinite(embeddings).all(axis=1)
    if finite.all():
        return
    bad = np.asarray(ids)[~finite]
    raise ValueError(
        f"{len(bad)} of {len(embeddings)} block embeddings contain NaN or inf (block ids {bad[:10].tolist()}"
        f"{', ...' if len(bad) > 10 else ''}); they were not indexed. The embedder's outputs are not finite: its "
        "weights diverged in training (check the loss for NaN; lower the learning rate or resume from an earlier "
        "checkpoint), or its activations overflowed in fp16 (embed with dtype='bf16' or in fp32)."
    )


def add_embeddings(index: faiss.Index, embeddings: np.ndarray, ids: np.ndarray) -> None:
    """Add block embeddings with their block ids to `index`, after [`check_finite`]: the one way vectors enter an index."""
    embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    check_finite(embeddings, ids)
    index.add_with_ids(embeddings, ids)


def _raise_if_not_finite(chunks: Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]]) -> None:
    for emb, ids in chunks():
        check_finite(np.asarray(emb, dtype=np.float32), ids)


def build_index(
    factory: str,
    dim: int,
    chunks: Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]],
    num_vectors: int,
    train_sample: Callable[[int], np.ndarray] | None = None,
    train_size: int | None = None,
) -> faiss.Index:
    """
    Build a CPU index from embeddings given chunk by chunk, so that the full matrix never has to be in RAM twice.

    Args:
        factory (`str`): FAISS factory string (`"Flat"`, `"HNSW32"`, `"IVF1024,PQ32"`, ...).
        dim (`int`): Embedding dimension.
        chunks (`Callable`): Returns an iterator of `(embeddings [n, dim] float32, ids [n] int64)` chunks.
        num_vectors (`int`): Total number of vectors (to size IVF lists and the training sample).
        train_sample (`Callable[[int], np.ndarray]`, *optional*): Returns `size` embeddings to train on; defaults to
            the first chunks.
        train_size (`int`, *optional*): Training sample size; defaults to 256 vectors per IVF list (what faiss's
            k-means uses at most), at least 65,536 for PQ/SQ codebooks, capped at the corpus size.
    """
    factory = adjust_factory_for_size(factory, num_vectors)
    index = new_index(factory, dim)
    if needs_training(index):
        if train_size is None:
            match = re.search(r"IVF(\d+)", factory)
            train_size = max(65536, 256 * int(match.group(1))) if match else 65536
        train_size = min(int(train_size), num_vectors)
        if train_sample is not None:
            sample = train_sample(train_size)
        else:
            parts, have = [], 0
            for emb, _ in chunks():
                parts.append(emb[: train_size - have])
                have += len(parts[-1])
                if have >= train_size:
                    break
            sample = np.concatenate(parts)
        if not np.isfinite(sample).all():
            # Name the blocks (the sample has no ids) before k-means trains on NaNs.
            _raise_if_not_finite(chunks)
        logger.info("Training %s index on %d vectors.", factory, len(sample))
        try:
            index.train(np.ascontiguousarray(sample, dtype=np.float32))
        except RuntimeError as err:
            raise ValueError(
                f"Could not train index {factory!r} on {len(sample)} vectors: {faiss_message(err)}. Small corpora "
                "need a simpler index (e.g. 'Flat' or 'HNSW32') or fewer centroids/codes."
            ) from None
    for emb, ids in chunks():
        add_embeddings(index, emb, ids)
    return index


def chunked(
    embeddings: np.ndarray, ids: np.ndarray, chunk_size: int = 262144
) -> Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]]:
    """`build_index` chunks over an in-memory (or memory-mapped) matrix."""

    def gen():
        for start in range(0, len(embeddings), chunk_size):
            yield embeddings[start : start + chunk_size], ids[start : start + chunk_size]

    return gen


def nbytes_estimate(num_vectors: int, dim: int, factory: str) -> int:
    """Rough size of an index's codes (for messages and the benchmark's sanity checks)."""
    factory = strip_idmap(factory)
    if "PQ" in factory:
        m = int(re.search(r"PQ(\d+)", factory).group(1))
        return num_vectors * (m + 8)
    if "SQ8" in factory:
        return num_vectors * (dim + 8)
    if "HNSW" in factory:
        m = int(re.search(r"HNSW(\d+)", factory).group(1))
        return num_vectors * (4 * dim + 8 * m + 8)
    return num_vectors * (4 * dim + 8)


def build_index_from_matrix(factory: str, embeddings: np.ndarray, ids: np.ndarray, train_size: int | None):
    """Build an index over an in-memory matrix; returns `(index, factory)` (IVF lists adjusted to the corpus size)."""
    if len(embeddings) == 0:
        raise ValueError("No blocks to index: the corpus is empty.")
    factory = adjust_factory_for_size(factory, len(embeddings))
    rng = np.random.default_rng(0)

    def sample(size: int) -> np.ndarray:
        # A random (not leading) sample: documents arrive in order, and the first ones are rarely representative.
        return embeddings[np.sort(rng.choice(len(embeddings), size=size, replace=False))]

    index = build_index(
        factory,
        embeddings.shape[1],
        chunked(embeddings, ids),
        len(embeddings),
        train_sample=sample,
        train_size=train_size,
    )
    return index, factory


# -- A Flat index streamed into its file ------------------------------------------------------------------------------
# A converted legacy corpus (13M x 128 float32 at google/realm-orqa-nq-openqa) is written chunk by chunk in FAISS's own
# file format, so the 6.8 GB of codes are never held in memory beside the memory-mapped source.


def _index_header(fourcc: bytes, dim: int, ntotal: int) -> bytes:
    # faiss's `write_index_header`: d, ntotal, two unused 2**20, is_trained, metric (inner product = 0).
    return fourcc + struct.pack("<iqqq?i", dim, ntotal, 1 << 20, 1 << 20, True, faiss.METRIC_INNER_PRODUCT)


def write_flat_index(path: str, dim: int, ntotal: int, chunks) -> None:
    """
    Write the file `faiss.write_index` writes for a `Flat` inner-product index wrapped in `IndexIDMap` (realm-hf's
    `Flat`), from `(embeddings, ids)` chunks, without building the index in memory: the IDMap header, the flat index
    header, the float32 codes in order, then the ids. Every chunk passes the finiteness check of `add_embeddings`.
    """
    with open(path, "wb") as f:
        _write_flat(f, dim, ntotal, chunks)


def _write_flat(f, dim: int, ntotal: int, chunks) -> None:
    f.write(_index_header(b"IxMp", dim, ntotal) + _index_header(b"IxFI", dim, ntotal))
    f.write(struct.pack("<Q", ntotal * dim))
    ids, written = [], 0
    for emb, chunk_ids in chunks():
        emb = np.ascontiguousarray(emb, dtype=np.float32)
        check_finite(emb, chunk_ids)
        f.write(emb.tobytes())
        ids.append(np.asarray(chunk_ids, dtype=np.int64))
        written += len(emb)
    if written != ntotal:
        raise ValueError(f"Got {written} vectors for an index of {ntotal}.")
    f.write(struct.pack("<Q", ntotal))
    for part in ids:
        f.write(part.tobytes())


def flat_file_layout_matches(dim: int) -> bool:
    """Whether [`write_flat_index`] writes byte for byte what this faiss writes (checked on three vectors)."""
    vectors = np.arange(3 * dim, dtype=np.float32).reshape(3, dim)
    labels = np.array([0, 1, 2], dtype=np.int64)
    index = new_index("Flat", dim)
    index.add_with_ids(vectors, labels)
    probe = io.BytesIO()
    _write_flat(probe, dim, 3, lambda: iter([(vectors, labels)]))
    if probe.getvalue() == faiss.serialize_index(index).tobytes():
        return True
    logger.warning("This faiss writes Flat indexes differently: building the index in memory instead.")
    return False
