"""
[`BlockIndex`]: a FAISS inner-product index over block embeddings whose ids are block ids (add, remove, nearest,
save, load, and `write_streamed` for a corpus too large to hold twice), on CPU or GPU, memory-mapped or in RAM. The
one owner of a `faiss.Index` in realm-hf; it is built with `retrieval/faiss_build.py` and handled with
`retrieval/faiss_ops.py`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator

import faiss
import numpy as np

from ..logging_utils import get_logger
from .faiss_build import (
    add_embeddings,
    adjust_factory_for_size,
    build_index,
    build_index_from_matrix,
    flat_file_layout_matches,
    strip_idmap,
    write_flat_index,
)
from .faiss_ops import (
    blas_for_batches,
    can_relabel,
    get_search_param,
    index_to_cpu,
    index_to_gpu,
    is_exact,
    read_index_checked,
    relabel_in_place,
    relabeled_for_writing,
    search_parameters,
    selector_parameters,
    supports_remove,
)

logger = get_logger(__name__)


class BlockIndex:
    """
    A FAISS inner-product index whose ids are block ids, with where it lives: on CPU or GPU, and, when memory-mapped,
    the file it maps (a mapped index is read-only, so changes work on a private copy). The one owner of a
    `faiss.Index` in realm-hf: it adds, removes, finds the nearest vectors, saves and loads, and nothing else touches the raw index.

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

    def nearest(self, queries: np.ndarray, k: int, params: dict) -> tuple[np.ndarray, np.ndarray]:
        """
        `(block_ids, scores)` of the `k` nearest vectors of each query by inner product, best first (`-1` where the
        index found fewer), with search-time `params` set for this call only.
        """
        with self._search_lock:
            with search_parameters(self.index, params, self.index_type), blas_for_batches(len(queries)):
                scores, ids = self.index.search(queries, k)
        return ids, scores

    def nearest_among(
        self, queries: np.ndarray, k: int, params: dict, block_ids: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """
        As [`~BlockIndex.nearest`], among the vectors labelled `block_ids` only (a FAISS id selector: every one of
        them is scored by a Flat index, those an IVF index's probed lists or an HNSW graph's search reach otherwise),
        or `None` when this index cannot restrict a search (see [`selector_parameters`]).
        """
        with self._search_lock:
            with search_parameters(self.index, params, self.index_type), blas_for_batches(len(queries)):
                restricted = selector_parameters(self.index, block_ids)
                if restricted is None:
                    return None
                try:
                    scores, ids = self.index.search(queries, k, params=restricted)
                except RuntimeError as error:  # a wrapped index type whose search takes no selector
                    logger.debug("The %s index cannot restrict a search: %s", self.index_type, error)
                    return None
        return ids, scores

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
