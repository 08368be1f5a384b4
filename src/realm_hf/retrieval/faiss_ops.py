"""
What [`BlockIndex`] does with a built FAISS index: search parameters set for one call (`nprobe`, `efSearch`), id
selectors that keep a search to given blocks, the BLAS path for batches, whether its scores are exact, GPU copies,
reading an index file checked, and relabelling its vectors between block ids (in memory) and corpus rows (in a saved
file). Building indexes: `retrieval/faiss_build.py`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

import faiss
import numpy as np

from ..logging_utils import get_logger

logger = get_logger(__name__)

# Search-time parameters that can be set per call and are restored afterwards.
SEARCH_PARAMS = ("nprobe", "efSearch", "quantizer_efSearch")
_PARAM_ALIASES = {"ef_search": "efSearch", "n_probe": "nprobe", "quantizer_ef_search": "quantizer_efSearch"}

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


def faiss_message(err: Exception) -> str:
    """The informative last line of a FAISS C++ exception (drop the file/line/function preamble)."""
    text = str(err).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    last = lines[-1] if lines else text
    return last.split("Error: ", 1)[-1] if "Error: " in last else last


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


def selector_parameters(index: faiss.Index, block_ids: np.ndarray) -> faiss.SearchParameters | None:
    """
    Search parameters that restrict a search of `index` to the vectors labelled `block_ids` (a FAISS id selector),
    carrying its current `nprobe` / `efSearch` (a parameters object replaces the index's own for the call), or `None`
    for an index whose search takes no selector (GPU indexes, flat PQ). Read inside [`search_parameters`], so the
    values of the call are the ones carried.
    """
    inner = unwrap(index)
    if type(inner).__name__.startswith("Gpu") or isinstance(inner, faiss.IndexPQ):
        return None
    selector = faiss.IDSelectorBatch(np.ascontiguousarray(block_ids, dtype=np.int64))
    ivf = faiss.try_extract_index_ivf(inner)
    if ivf is not None:
        params = faiss.SearchParametersIVF(sel=selector, nprobe=ivf.nprobe, max_codes=ivf.max_codes)
    elif hasattr(inner, "hnsw"):
        params = faiss.SearchParametersHNSW(sel=selector, efSearch=inner.hnsw.efSearch)
    else:
        params = faiss.SearchParameters(sel=selector)
    params.selector = selector  # the parameters hold a raw pointer: keep the selector alive with them
    return params


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
        warn_no_gpu(f"this index type has no GPU implementation ({faiss_message(err)})")
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
        raise ValueError(f"{path} could not be read as a FAISS index: {faiss_message(err)}.{hint}") from None
    except MemoryError:
        raise ValueError(f"{path} could not be read as a FAISS index (corrupt size fields?).{hint}") from None


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
