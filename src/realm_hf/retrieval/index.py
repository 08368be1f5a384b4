"""FAISS inner-product indexes over block embeddings: build from a factory string with stable ids, search, GPU, read,
write (a Flat index streamed into its file).

All indexes are maximum-inner-product indexes (`faiss.METRIC_INNER_PRODUCT`), the relevance score of REALM.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import struct
import threading
from collections.abc import Callable, Iterator

import faiss
import numpy as np

from ..logging_utils import get_logger

logger = get_logger(__name__)

# Search-time parameters that can be set per call and are restored afterwards.
SEARCH_PARAMS = ("nprobe", "efSearch", "quantizer_efSearch")
_PARAM_ALIASES = {"ef_search": "efSearch", "n_probe": "nprobe", "quantizer_ef_search": "quantizer_efSearch"}

# k-means wants at least 39 training points per centroid (faiss warns below that).
MIN_POINTS_PER_CENTROID = 39

# Index classes whose stored codes are the raw float32 vectors: their scores are exact inner products.
_EXACT_CODE_CLASSES = (
    "IndexFlat",
    "IndexFlatIP",
    "IndexHNSWFlat",
    "IndexIVFFlat",
    "IndexNSGFlat",
    "GpuIndexFlat",
    "GpuIndexFlatIP",
    "GpuIndexIVFFlat",
)


def normalize_search_params(search_params: dict) -> dict:
    """Map accepted spellings (`ef_search`) to FAISS names (`efSearch`) and refuse unknown parameters."""
    params = {}
    for name, value in search_params.items():
        if value is None:
            continue
        name = _PARAM_ALIASES.get(name, name)
        if name not in SEARCH_PARAMS:
            raise ValueError(f"Unknown search parameter {name!r}; supported: {', '.join(SEARCH_PARAMS)}.")
        params[name] = int(value)
    return params


def faiss_gpu_available() -> bool:
    """Whether this faiss build has GPU support and sees at least one GPU (checked lazily, never at import)."""
    if not hasattr(faiss, "StandardGpuResources"):
        return False
    try:
        return faiss.get_num_gpus() > 0
    except Exception:  # noqa: BLE001 - a broken CUDA install reads as "no GPU"
        return False


def warn_no_gpu(reason: str = "") -> None:
    logger.warning(
        "A GPU index was requested but %s; using a CPU index instead. For GPU search install the `gpu` extra "
        "(`pip install realm-hf[gpu]`, which provides faiss-gpu-cu12 in place of faiss-cpu) on a machine with a CUDA GPU.",
        reason or "this faiss build has no GPU support (faiss-cpu) or no GPU is visible",
    )


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
            f"Invalid FAISS index factory string {factory!r} for dimension {dim}: {_faiss_message(err)}. Examples: "
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


def _faiss_message(err: Exception) -> str:
    """The informative last line of a FAISS C++ exception (drop the file/line/function preamble)."""
    text = str(err).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    last = lines[-1] if lines else text
    return last.split("Error: ", 1)[-1] if "Error: " in last else last


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
                f"Could not train index {factory!r} on {len(sample)} vectors: {_faiss_message(err)}. Small corpora "
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


def is_exact(index: faiss.Index) -> bool:
    """Whether the index stores uncompressed float32 vectors, i.e. its scores are exact inner products."""
    inner = unwrap(index)
    return type(inner).__name__ in _EXACT_CODE_CLASSES


def unwrap(index: faiss.Index) -> faiss.Index:
    """The index inside `IndexIDMap`/`IndexIDMap2` wrappers, downcast to its concrete class."""
    index = faiss.downcast_index(index)
    while isinstance(index, (faiss.IndexIDMap, faiss.IndexIDMap2)):
        index = faiss.downcast_index(index.index)
    return index


def supports_remove(index: faiss.Index) -> bool:
    # FAISS's HNSW graphs cannot delete nodes (remove_ids raises "not implemented").
    return "HNSW" not in type(unwrap(index)).__name__


def _param_holder(index: faiss.Index, name: str):
    """(object, attribute) holding search parameter `name` in `index`, or None if the index has no such parameter."""
    inner = unwrap(index)
    if name == "nprobe":
        ivf = faiss.try_extract_index_ivf(inner) if not type(inner).__name__.startswith("Gpu") else inner
        if ivf is not None and hasattr(ivf, "nprobe"):
            return ivf, "nprobe"
    elif name == "efSearch":
        if hasattr(inner, "hnsw"):
            return inner.hnsw, "efSearch"
    elif name == "quantizer_efSearch":
        ivf = faiss.try_extract_index_ivf(inner)
        if ivf is not None:
            quantizer = faiss.downcast_index(ivf.quantizer)
            if hasattr(quantizer, "hnsw"):
                return quantizer.hnsw, "efSearch"
    return None


def get_search_param(index: faiss.Index, name: str):
    holder = _param_holder(index, name)
    return None if holder is None else getattr(*holder)


@contextlib.contextmanager
def search_parameters(index: faiss.Index, params: dict, index_type: str = ""):
    """
    Set search-time parameters (`nprobe`, `efSearch`, `quantizer_efSearch`) for the duration of a `with` block and
    restore the previous values afterwards, so one call's settings never leak into the next.
    """
    saved = []
    try:
        for name, value in params.items():
            holder = _param_holder(index, name)
            if holder is None:
                raise ValueError(
                    f"Search parameter {name!r} does not apply to this index ({index_type or type(unwrap(index)).__name__}): "
                    "`nprobe` is for IVF indexes, `efSearch` for HNSW, `quantizer_efSearch` for IVF with an HNSW "
                    "quantizer."
                )
            obj, attr = holder
            saved.append((obj, attr, getattr(obj, attr)))
            setattr(obj, attr, value)
        yield
    finally:
        for obj, attr, value in reversed(saved):
            setattr(obj, attr, value)


# Batches of at least this many queries take FAISS's BLAS (matrix-multiply) path for exhaustive inner products.
BLAS_MIN_QUERIES = 20


@contextlib.contextmanager
def blas_for_batches(num_queries: int):
    """
    Use FAISS's BLAS kernels for exhaustive (Flat, IVF coarse-quantizer) search of a batch of queries.

    faiss-cpu 1.15 ships `distance_compute_blas_threshold = 128000`, so batches below that many queries take a
    per-query SIMD loop; measured on 300k x 128 with 1 thread, the BLAS path was 6.6x faster for 32 queries and 15x
    for 128 (and equal at 1000). The global is changed only for the call and restored; other threads using FAISS
    meanwhile only see a different (exact) code path.
    """
    if num_queries < BLAS_MIN_QUERIES or not hasattr(faiss, "cvar"):
        yield
        return
    previous = faiss.cvar.distance_compute_blas_threshold
    faiss.cvar.distance_compute_blas_threshold = min(previous, BLAS_MIN_QUERIES)
    try:
        yield
    finally:
        faiss.cvar.distance_compute_blas_threshold = previous


def index_to_gpu(index: faiss.Index, device: int = 0):
    """
    Copy a CPU index to GPU `device`. Returns `(gpu_index, resources)` or `(index, None)` with a warning when the
    faiss build has no GPU support, no GPU is visible, or the index type has no GPU implementation (e.g. HNSW).
    """
    if not faiss_gpu_available():
        warn_no_gpu()
        return index, None
    resources = faiss.StandardGpuResources()
    try:
        return faiss.index_cpu_to_gpu(resources, device, index), resources
    except RuntimeError as err:
        warn_no_gpu(f"this index type has no GPU implementation ({_faiss_message(err)})")
        return index, None


def index_to_cpu(index: faiss.Index) -> faiss.Index:
    """The CPU version of `index` (GPU indexes must be copied back to CPU before saving or removing ids)."""
    if hasattr(faiss, "index_gpu_to_cpu") and "Gpu" in type(unwrap(index)).__name__:
        return faiss.index_gpu_to_cpu(index)
    return index


# Every top-level index FAISS writes starts with a four-character code beginning with "I" ("IxM2", "IwFl", "IxPT",
# ...; index_write.cpp). Checking it first turns "random bytes" into a clear message instead of a C++ error.
_FOURCC_PREFIX = b"I"


def read_index_checked(path: str, mmap: bool = True, how_to_fix: str = "") -> tuple[faiss.Index, bool]:
    """
    Read a FAISS index file, turning FAISS's C++ errors into an `OSError`/`ValueError` that names the file, what is
    wrong and how to fix it.

    With `mmap=True` flat codes (Flat, and the storage of HNSW/PQ/SQ indexes) are memory-mapped
    (`faiss.IO_FLAG_MMAP_IFC`): the OS pages them in on demand and may drop them under memory pressure, so a
    13M x 128 Flat index does not take 6.8 GB of anonymous RAM. IVF inverted lists are read into RAM (FAISS can
    only map them from its separate on-disk format). A memory-mapped index is read-only; [`RealmRetriever`] reads a
    private copy before modifying it.

    Returns:
        `(index, mmapped)`.
    """
    hint = f" {how_to_fix}" if how_to_fix else ""
    if not os.path.isfile(path):
        raise OSError(f"FAISS index file {path} not found.{hint}")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(4)
    if size < 8 or not head.startswith(_FOURCC_PREFIX):
        raise ValueError(
            f"{path} is not a FAISS index file (size {size} bytes, header {head!r}); it may be corrupt or "
            f"truncated.{hint}"
        )
    flags = faiss.IO_FLAG_MMAP_IFC if mmap and hasattr(faiss, "IO_FLAG_MMAP_IFC") else 0
    try:
        return faiss.read_index(path, flags), bool(flags)
    except RuntimeError as err:
        raise ValueError(f"{path} could not be read as a FAISS index: {_faiss_message(err)}.{hint}") from None
    except MemoryError:
        raise ValueError(f"{path} could not be read as a FAISS index (corrupt size fields?).{hint}") from None


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


class BlockIndex:
    """
    A FAISS inner-product index whose ids are block ids, with where it lives: on CPU or GPU, and, when memory-mapped,
    the file it maps (a mapped index is read-only, so changes work on a private copy). The one owner of a
    `faiss.Index` in realm-hf: it adds, removes, searches, saves and loads, and nothing else touches the raw index.

    Changes return a new `BlockIndex` (on GPU again if this one was) and leave this one as it was, except that
    [`~BlockIndex.added`] and [`~BlockIndex.removed`] reuse the memory of an index this object owns in RAM (copying a
    13M-block index per change would double its memory): call them on the live index of a retriever, under its lock.

    Args:
        index (`faiss.Index`): The index.
        index_type (`str`): The factory string it was built from.
        source (`str`, *optional*): The file a memory-mapped index was read from.
        source_labels (`np.ndarray`, *optional*): When that file's labels are corpus rows (saves since format 2),
            the block id of each row, to relabel a copy re-read from it.
    """

    def __init__(
        self, index: faiss.Index, index_type: str, source: str | None = None, source_labels: np.ndarray | None = None
    ):
        self.index = index
        self.index_type = index_type
        self._gpu_resources = None
        # Setting search parameters for one call changes the index: one search at a time per index.
        self._search_lock = threading.Lock()
        self.source: tuple[str, int, float] | None = None  # (path, inode, mtime) of a memory-mapped index
        self._source_labels = None
        if source is not None:
            self._track_file(source, source_labels)

    @classmethod
    def from_matrix(cls, factory: str, embeddings: np.ndarray, ids: np.ndarray, train_size: int | None = None):
        """An index over an in-memory matrix (IVF lists adjusted to its size)."""
        index, factory = build_index_from_matrix(factory, embeddings, ids, train_size)
        return cls(index, factory)

    @classmethod
    def from_corpus(cls, factory: str, corpus, train_size: int | None = None) -> BlockIndex:
        """
        An index of type `factory` over the stored embeddings of a [`BlockCorpus`], read chunk by chunk (a memory-mapped
        corpus is never held in RAM whole).
        """
        logger.info("Building the %s index over %d blocks from the stored embeddings.", factory, len(corpus))
        factory = adjust_factory_for_size(factory, len(corpus))
        rng = np.random.default_rng(0)

        def sample(size: int) -> np.ndarray:
            return corpus.embedding_rows(np.sort(rng.choice(len(corpus), size=size, replace=False)))

        dim = corpus.dim if corpus.dim is not None else int(corpus.embedding_rows(slice(0, 1)).shape[1])
        chunks = corpus.iter_embeddings()
        return cls(build_index(factory, dim, chunks, len(corpus), sample, train_size), factory)

    @classmethod
    def from_chunks(
        cls,
        factory: str,
        dim: int,
        chunks: Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]],
        num_vectors: int,
        train_sample: Callable[[int], np.ndarray] | None = None,
        train_size: int | None = None,
    ) -> BlockIndex:
        """
        An index of type `factory` filled from `(embeddings, ids)` chunks (IVF lists adjusted to `num_vectors`), so
        that the vectors never have to be in RAM twice: see [`build_index`] for the arguments.
        """
        factory = adjust_factory_for_size(factory, num_vectors)
        return cls(build_index(factory, dim, chunks, num_vectors, train_sample, train_size), factory)

    # -- What it is -----------------------------------------------------------------------------------------------

    @property
    def dim(self) -> int:
        return int(self.index.d)

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    @property
    def on_gpu(self) -> bool:
        return self._gpu_resources is not None

    @property
    def is_exact(self) -> bool:
        """Whether its scores are exact inner products (uncompressed float32 codes)."""
        return is_exact(self.index)

    def search_param(self, name: str):
        """The current value of search parameter `name` (`nprobe`, `efSearch`, ...), `None` if it has none."""
        return get_search_param(self.index, name)

    def ids(self) -> np.ndarray | None:
        """The block ids of an IDMap index (in its storage order), `None` for other index types."""
        inner = faiss.downcast_index(self.index)
        if isinstance(inner, (faiss.IndexIDMap, faiss.IndexIDMap2)):
            return faiss.vector_to_array(inner.id_map)
        return None

    # -- Search ---------------------------------------------------------------------------------------------------

    def search(self, queries: np.ndarray, k: int, params: dict) -> tuple[np.ndarray, np.ndarray]:
        """`(scores, ids)` of the top `k`, with search-time `params` set for this call only."""
        with self._search_lock:
            with search_parameters(self.index, params, self.index_type), blas_for_batches(len(queries)):
                return self.index.search(queries, k)

    # -- Changes (new objects) ----------------------------------------------------------------------------------------

    def added(self, embeddings: np.ndarray, ids: np.ndarray) -> BlockIndex:
        """This index with `embeddings` added under block `ids` (refused if not finite, see [`add_embeddings`])."""
        index = self._owned_cpu_index()
        add_embeddings(index, embeddings, ids)
        return self._replaced_by(index)

    def removed(self, ids: np.ndarray, remaining) -> BlockIndex:
        """
        This index without block `ids`; `remaining` (the [`BlockCorpus`] left) rebuilds it for index types FAISS cannot
        remove from (HNSW graphs cannot delete nodes).
        """
        if supports_remove(self.index):
            index = self._owned_cpu_index()
            index.remove_ids(np.ascontiguousarray(ids, dtype=np.int64))
            new = self._replaced_by(index)
        else:
            logger.info("FAISS cannot remove ids from an %s index: rebuilding it without them.", self.index_type)
            new = self._replaced_by(BlockIndex.from_corpus(self.index_type, remaining).index)
        if new.ntotal != len(remaining):
            raise RuntimeError(f"Index ({new.ntotal}) and corpus ({len(remaining)}) disagree after removal.")
        return new

    def copy(self) -> BlockIndex:
        """A CPU copy that shares no memory with this index."""
        return BlockIndex(self._owned_cpu_index(copy=True), self.index_type)

    def placed_like(self, other: BlockIndex) -> BlockIndex:
        """This index on GPU if `other` is (a refresh swapped in keeps the live index's place)."""
        return self.on_gpu_device() if other.on_gpu and not self.on_gpu else self

    def on_gpu_device(self, device: int = 0) -> BlockIndex:
        """This index on GPU `device` (falls back to CPU with a warning, see [`index_to_gpu`])."""
        if self.on_gpu:
            return self
        new = BlockIndex(self.index, self.index_type)
        new.index, new._gpu_resources = index_to_gpu(self.index, device)
        if new._gpu_resources is None:
            return self
        return new

    def on_cpu(self) -> BlockIndex:
        if not self.on_gpu:
            return self
        return BlockIndex(index_to_cpu(self.index), self.index_type)

    def _owned_cpu_index(self, copy: bool = False) -> faiss.Index:
        """
        A CPU index that owns its memory. Memory-mapped indexes are read-only (modifying one aborts the process
        inside FAISS), so they are re-read privately: from their file if it is unchanged, else by serialization.
        With `copy=True` the result never aliases `self.index`.
        """
        index = index_to_cpu(self.index)
        if index is not self.index:
            return index  # a fresh copy from the GPU
        if self.source is not None:
            path, inode, mtime = self.source
            try:
                stat = os.stat(path)
                same_file = (stat.st_ino, stat.st_mtime) == (inode, mtime)
            except OSError:
                same_file = False
            if same_file:
                private = faiss.read_index(path)
                if self._source_labels is not None:
                    labels = self._source_labels
                    relabel_in_place(private, lambda rows: labels[rows])
                return private
            return faiss.deserialize_index(faiss.serialize_index(index))
        return faiss.clone_index(index) if copy else index

    def _replaced_by(self, index: faiss.Index) -> BlockIndex:
        return BlockIndex(index, self.index_type).placed_like(self)

    def _track_file(self, path: str, labels: np.ndarray | None = None) -> None:
        stat = os.stat(path)
        self.source = (path, stat.st_ino, stat.st_mtime)
        self._source_labels = labels

    # -- Saving and loading ---------------------------------------------------------------------------------------

    def save(self, path: str, rows: Callable[[np.ndarray], np.ndarray] | None) -> str:
        """
        Write the index to `path` with labels = corpus rows (`rows(block_ids)`), so that datasets' own FAISS API
        (`load_from_disk` + `load_faiss_index` + `get_nearest_examples`) finds the right rows. Returns the manifest's
        `index_labels`: `"row"`, or `"block_id"` for an index type that cannot be relabelled (written as it is).
        `rows=None` says the block ids are the corpus rows already (a converted legacy corpus): the index is written as
        it is, without a relabelled copy.
        """
        index = index_to_cpu(self.index)
        if rows is None:
            faiss.write_index(index, path)
            return "row" if can_relabel(index) else "block_id"
        if not can_relabel(index):
            logger.warning(
                "The %s index cannot be relabelled with corpus rows: %s keeps block ids as labels (`index_labels: "
                "block_id` in the manifest), so datasets' `get_nearest_examples` would not return the right rows "
                "from it.",
                type(index).__name__,
                os.path.basename(path),
            )
            faiss.write_index(index, path)
            return "block_id"
        faiss.write_index(relabeled_for_writing(index, rows), path)
        return "row"

    @classmethod
    def write_streamed(
        cls,
        path: str,
        factory: str,
        dim: int,
        chunks: Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]],
        num_vectors: int,
        train_sample: Callable[[int], np.ndarray] | None = None,
        train_size: int | None = None,
    ) -> tuple[str, str]:
        """
        Write an index of type `factory` over `(embeddings, ids)` chunks whose ids are their corpus rows straight to
        `path`, as [`~BlockIndex.save`] writes it, for a corpus too large to hold twice (`realm-hf convert`). A `Flat`
        index is streamed into the file chunk by chunk ([`write_flat_index`]: never held in memory); other types are
        built with [`~BlockIndex.from_chunks`], then saved.

        Returns:
            `(index_type, index_labels)`: the factory string used (IVF lists adjusted to `num_vectors`) and the
            manifest's `index_labels`.
        """
        if strip_idmap(factory) == "Flat" and flat_file_layout_matches(dim):
            write_flat_index(path, dim, num_vectors, chunks)
            return factory, "row"
        index = cls.from_chunks(factory, dim, chunks, num_vectors, train_sample=train_sample, train_size=train_size)
        return index.index_type, index.save(path, rows=None)

    def following_file(self, path: str, row_ids: np.ndarray | None) -> BlockIndex:
        """
        After a save to `path`: a memory-mapped index follows that file (the save may have replaced the one it
        mapped), `row_ids` mapping the file's row labels back to block ids (`None` when it holds block ids).
        """
        if self.source is None:
            return self
        new = BlockIndex(self.index, self.index_type)
        new._gpu_resources = self._gpu_resources
        new._track_file(path, row_ids)
        return new

    @classmethod
    def load(
        cls,
        path: str,
        index_type: str,
        labels: str,
        row_ids: np.ndarray,
        dim: int,
        mmap: bool = True,
        how_to_fix: str = "",
    ) -> BlockIndex:
        """
        Read a saved index (see [`read_index_checked`]), check it holds one `dim`-d vector per corpus row (the
        manifest's numbers), and map its labels back to block ids: `labels` is the manifest's `index_labels` (`"row"`:
        corpus rows, whose block ids are `row_ids`; `"block_id"`: saves before format 2). IDMap indexes must hold
        exactly the corpus's ids.
        """
        index, mmapped = read_index_checked(path, mmap=mmap, how_to_fix=how_to_fix)
        hint = f" {how_to_fix}" if how_to_fix else ""
        if index.d != dim:
            raise ValueError(
                f"{path} is a {index.d}-d index but the manifest says {dim}: the index belongs to another corpus or "
                f"embedder.{hint}"
            )
        if index.ntotal != len(row_ids):
            raise ValueError(f"{path} holds {index.ntotal} vectors but the manifest says {len(row_ids)} blocks.{hint}")
        if index.metric_type != faiss.METRIC_INNER_PRODUCT:
            raise ValueError(f"{path} is not an inner-product index (metric {index.metric_type}).{hint}")
        file_labels = None
        if labels == "row":

            def to_block_ids(rows: np.ndarray) -> np.ndarray:
                if rows.size and (rows.min() < 0 or rows.max() >= len(row_ids)):
                    raise ValueError(
                        f"{path} has labels outside the corpus rows 0..{len(row_ids) - 1}: the index belongs to "
                        f"another corpus.{hint}"
                    )
                return row_ids[rows]

            if not can_relabel(index):
                raise ValueError(
                    f"{path} is a {type(index).__name__} index, but the manifest says its labels are corpus rows, "
                    f"which only IDMap and IVF indexes are saved with.{hint}"
                )
            relabel_in_place(index, to_block_ids)
            file_labels = row_ids
        elif labels != "block_id":
            raise ValueError(f"{path}: unknown index_labels {labels!r} in the manifest.{hint}")
        loaded = cls(index, index_type, source=path if mmapped else None, source_labels=file_labels)
        index_ids = loaded.ids()
        if index_ids is not None and not np.array_equal(np.sort(index_ids), np.sort(row_ids)):
            raise ValueError(f"The ids in {path} do not match the corpus's block ids.{hint}")
        return loaded


# -- Labels ------------------------------------------------------------------------------------------------------------
# In memory the labels are block ids (stable under additions and removals). A saved index labels its vectors with
# their row in the saved corpus instead, so that datasets' own FAISS API (`load_faiss_index` + `get_nearest_examples`,
# which reads labels as row positions) returns the right rows; loading maps rows back to block ids. IDMap wrappers keep
# labels in their `id_map`, IVF indexes in their inverted lists; other index types cannot be relabelled here.


def _array_lists(index: faiss.Index):
    """
    The in-memory inverted lists of an IVF index (also behind `IndexPreTransform`): `ArrayInvertedLists`, or the
    `BlockInvertedLists` of fast-scan (`...x4fs`) indexes, whose ids are stored the same way; else `None`.
    """
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is None:
        return None, None
    lists = faiss.downcast_InvertedLists(ivf.invlists)
    in_memory = (faiss.ArrayInvertedLists, faiss.BlockInvertedLists)
    return (ivf, lists) if isinstance(lists, in_memory) else (ivf, None)


def can_relabel(index: faiss.Index) -> bool:
    """Whether [`relabel_in_place`] / [`relabeled_for_writing`] handle this (CPU) index type."""
    inner = faiss.downcast_index(index)
    return isinstance(inner, (faiss.IndexIDMap, faiss.IndexIDMap2)) or _array_lists(inner)[1] is not None


def relabel_in_place(index: faiss.Index, new_labels: Callable[[np.ndarray], np.ndarray]) -> None:
    """Replace every label `l` stored in `index` (a CPU index this process owns) by `new_labels(l)`."""
    inner = faiss.downcast_index(index)
    if isinstance(inner, (faiss.IndexIDMap, faiss.IndexIDMap2)):
        labels = new_labels(faiss.vector_to_array(inner.id_map))
        faiss.copy_array_to_vector(np.ascontiguousarray(labels, dtype=np.int64), inner.id_map)
        if isinstance(inner, faiss.IndexIDMap2):
            inner.construct_rev_map()
        return
    ivf, lists = _array_lists(inner)
    if lists is None:
        raise ValueError(f"Cannot relabel a {type(unwrap(index)).__name__} index (IDMap or IVF indexes only).")
    for list_no in range(lists.nlist):
        size = lists.list_size(list_no)
        if size:
            ids = faiss.rev_swig_ptr(lists.get_ids(list_no), size)  # a writable view of the list's ids
            ids[:] = new_labels(ids.copy())
    if ivf.direct_map.type != faiss.DirectMap.NoMap:
        kind = ivf.direct_map.type  # rebuilt from the lists' new ids
        ivf.set_direct_map_type(faiss.DirectMap.NoMap)
        ivf.set_direct_map_type(kind)


def relabeled_for_writing(index: faiss.Index, new_labels: Callable[[np.ndarray], np.ndarray]) -> faiss.Index:
    """
    An index to write in place of `index` whose labels are `new_labels(label)`; `index` itself is not changed. An
    IDMap gets a new wrapper over the same sub-index (its codes are not copied, only the 8-byte labels); an IVF index
    is cloned (its lists hold the labels next to the codes).
    """
    inner = faiss.downcast_index(index)
    if isinstance(inner, (faiss.IndexIDMap, faiss.IndexIDMap2)):
        # FAISS's IDMap constructor refuses a non-empty sub-index: wrap an empty one, then point at the real one.
        wrapper = type(inner)(faiss.IndexFlat(inner.d, inner.metric_type))
        wrapper.index = inner.index  # not owned: deleting the wrapper leaves it alone
        wrapper.ntotal, wrapper.is_trained = inner.ntotal, inner.is_trained
        labels = new_labels(faiss.vector_to_array(inner.id_map))
        faiss.copy_array_to_vector(np.ascontiguousarray(labels, dtype=np.int64), wrapper.id_map)
        wrapper.referenced_objects = [inner]  # keep the sub-index's owner alive while the wrapper lives
        return wrapper
    copy = faiss.clone_index(index)
    relabel_in_place(copy, new_labels)
    return copy
