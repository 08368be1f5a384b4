"""
Maximum-inner-product search at REALM scale: FAISS index types vs the legacy brute-force search.

For each index type (FAISS factory strings, built with the same code as `RealmRetriever`) the table reports build
time, the index's resident memory, queries/s for batched search, speedup over the legacy way (one question at a time,
`torch.einsum` over the full `[num_blocks, dim]` matrix + `topk`, as the legacy `RealmForOpenQA` did) and recall@k
against exact search, all measured in one run.

Vectors are generated chunk by chunk into a float32 `np.memmap` (never the whole matrix in RAM twice), so the
paper-scale run (`--blocks 13353718`, 6.8 GB of embeddings) fits a 24 GB machine: indexes are built, measured and freed
one at a time, and only the ground-truth ids of the exact search are kept. The vectors are structured like real
retriever embeddings (topic clusters in a low-rank subspace plus noise, then LayerNorm-normalised as REALM's projection
is); `--vectors random` gives the unstructured worst case and `--vectors-file` takes real embeddings (`.npy`).

    python bench/search.py                                  # 1M blocks, 1000 queries
    python bench/search.py --blocks 200000 --queries 200    # quick check
    python bench/search.py --blocks 13353718 --index-types "Flat;IVF4096,Flat;IVF4096,SQ8;IVF4096,PQ32"

At 13,353,718 blocks: the memmap is 6.8 GB on disk (`--workdir`), one index at a time is resident (Flat or IVF-Flat
6.9 GB, HNSW32 ~10.5 GB and about an hour to build on 2 cores, SQ8 1.8 GB, PQ32 0.5 GB), the legacy baseline is timed
on 20 questions (each reads the whole matrix), and the exact search of all queries gives the ground truth.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import resource
import sys
import tempfile
import time

import faiss
import numpy as np
import torch

from realm_hf import faiss_utils

DEFAULT_INDEX_TYPES = "Flat;HNSW32;IVF1024,Flat;IVF1024,SQ8;IVF1024,PQ32"


def rss_mb(kind: str = "RssAnon") -> float:
    """Resident memory of this process in MB (anonymous memory by default: indexes, not page cache of the memmap)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(kind + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KB


PEAK_ANON_MB = 0.0


def note_memory() -> None:
    """Track the peak of anonymous memory (what must fit in RAM; memmap pages are reclaimable page cache)."""
    global PEAK_ANON_MB
    PEAK_ANON_MB = max(PEAK_ANON_MB, rss_mb())


class StructuredVectors:
    """Topic clusters in a low-rank subspace + isotropic noise, LayerNorm-normalised; deterministic per chunk."""

    def __init__(self, dim: int, num_clusters: int, rank: int = 32, noise: float = 0.6, seed: int = 0, random=False):
        rng = np.random.default_rng(seed)
        rank = min(rank, dim)
        basis = rng.normal(size=(rank, dim)) / math.sqrt(rank)
        spectrum = 1.0 / np.sqrt(np.arange(1, rank + 1))  # a few dominant directions, like trained embeddings
        self.centers = ((rng.normal(size=(num_clusters, rank)) * spectrum) @ basis).astype(np.float32)
        self.centers /= np.linalg.norm(self.centers, axis=1, keepdims=True)
        self.dim, self.noise, self.seed, self.random = dim, noise / math.sqrt(dim), seed, random

    def chunk(self, index: int, size: int, stream: int = 0) -> np.ndarray:
        rng = np.random.default_rng([self.seed, stream, index])
        if self.random:
            x = rng.standard_normal(size=(size, self.dim), dtype=np.float32)
        else:
            labels = rng.integers(0, len(self.centers), size)
            x = self.centers[labels] + self.noise * rng.standard_normal(size=(size, self.dim), dtype=np.float32)
        # REALM's projection ends in a LayerNorm: zero mean, unit variance per vector.
        x -= x.mean(axis=1, keepdims=True)
        x /= x.std(axis=1, keepdims=True) + 1e-6
        return x.astype(np.float32, copy=False)


def make_vectors(args, workdir: str):
    """The corpus embeddings as a float32 memmap (filled chunk by chunk) and the query embeddings."""
    if args.vectors_file:
        blocks = np.load(args.vectors_file, mmap_mode="r")
        if blocks.dtype != np.float32 or blocks.ndim != 2:
            sys.exit(f"--vectors-file must hold a float32 [N, D] array, got {blocks.dtype} {blocks.shape}")
        if args.queries_file:
            queries = np.load(args.queries_file).astype(np.float32)
        else:
            # Queries near corpus vectors: a random block plus noise.
            rng = np.random.default_rng(1)
            rows = np.sort(rng.choice(len(blocks), size=args.queries, replace=False))
            queries = np.asarray(blocks[rows]) + 0.3 * rng.standard_normal(
                (args.queries, blocks.shape[1]), dtype=np.float32
            )
        return blocks, np.ascontiguousarray(queries, dtype=np.float32)
    gen = StructuredVectors(
        args.dim, num_clusters=max(16, args.blocks // 500), seed=args.seed, random=args.vectors == "random"
    )
    path = os.path.join(workdir, "blocks.f32")
    blocks = np.memmap(path, dtype=np.float32, mode="w+", shape=(args.blocks, args.dim))
    start_time = time.perf_counter()
    for i, start in enumerate(range(0, args.blocks, args.chunk_size)):
        stop = min(start + args.chunk_size, args.blocks)
        blocks[start:stop] = gen.chunk(i, stop - start)
    blocks.flush()
    print(
        f"generated {args.blocks:,} x {args.dim} {args.vectors} vectors in {time.perf_counter() - start_time:.1f}s "
        f"({args.blocks * args.dim * 4 / 2**30:.2f} GiB memmap, chunks of {args.chunk_size:,})",
        flush=True,
    )
    queries = gen.chunk(0, args.queries, stream=1)
    return blocks, queries


def chunks_of(blocks: np.ndarray, chunk_size: int):
    """Chunks of the memmap with their ids (row numbers), as `RealmRetriever` adds block ids."""

    def gen():
        for start in range(0, len(blocks), chunk_size):
            stop = min(start + chunk_size, len(blocks))
            yield np.ascontiguousarray(blocks[start:stop]), np.arange(start, stop, dtype=np.int64)

    return gen


def train_sampler(blocks: np.ndarray):
    rng = np.random.default_rng(0)

    def sample(size: int) -> np.ndarray:
        return np.ascontiguousarray(blocks[np.sort(rng.choice(len(blocks), size=size, replace=False))])

    return sample


def recall_at_k(found: np.ndarray, truth: np.ndarray) -> float:
    k = truth.shape[1]
    return float(np.mean([len(set(f.tolist()) & set(t.tolist())) / k for f, t in zip(found, truth)]))


def legacy_baseline(blocks: np.ndarray, queries: np.ndarray, k: int, num_queries: int):
    """One question at a time: einsum over the full matrix + topk, as the legacy RealmForOpenQA searched."""
    block_emb = torch.from_numpy(np.asarray(blocks))  # the memmap, no copy (the legacy buffer was in RAM)
    qs = torch.from_numpy(queries[:num_queries])
    torch.topk(torch.einsum("BD,QD->QB", block_emb, qs[:1]), k=k, dim=-1)  # warm-up: page the matrix in
    ids = []
    start = time.perf_counter()
    for q in qs:
        scores = torch.einsum("BD,QD->QB", block_emb, q[None])
        ids.append(torch.topk(scores, k=k, dim=-1).indices[0].numpy())
    elapsed = time.perf_counter() - start
    return num_queries / elapsed, np.stack(ids)


def release_freed_memory() -> None:
    """Return freed heap pages to the OS, so the next index's resident-memory delta is its own size."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def measure_index(factory: str, blocks, queries, args, search_params: dict):
    release_freed_memory()
    before = rss_mb()
    start = time.perf_counter()
    index = faiss_utils.build_index(
        factory,
        blocks.shape[1],
        chunks_of(blocks, args.chunk_size),
        len(blocks),
        train_sample=train_sampler(blocks),
        train_size=args.train_size,
    )
    build_s = time.perf_counter() - start
    note_memory()
    release_freed_memory()  # the training sample is garbage now
    memory = rss_mb() - before
    params = {k: v for k, v in search_params.items() if faiss_utils.get_search_param(index, k) is not None}
    # As RealmRetriever.search: search parameters for the call, BLAS kernels for batches.
    with faiss_utils.search_parameters(index, params, factory), faiss_utils.blas_for_batches(len(queries)):
        index.search(queries[: min(10, len(queries))], args.k)  # warm-up
        start = time.perf_counter()
        scores, ids = index.search(queries, args.k * (args.rerank_factor if not faiss_utils.is_exact(index) else 1))
        search_s = time.perf_counter() - start
    note_memory()
    return index, build_s, memory, search_s, scores, ids, params


def rerank(blocks, queries, ids, k):
    """Exact re-scoring of compressed-code candidates with the stored vectors (what RealmRetriever.search does)."""
    start = time.perf_counter()
    flat = ids.reshape(-1)
    order = np.argsort(flat)
    gathered = np.empty((len(flat), blocks.shape[1]), dtype=np.float32)
    gathered[order] = blocks[flat[order]]  # sorted reads from the memmap
    scores = np.einsum("bd,bkd->bk", queries, gathered.reshape(*ids.shape, -1))
    top = np.argsort(-scores, axis=1)[:, :k]
    return np.take_along_axis(ids, top, axis=1), time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=1_000_000, help="corpus size (REALM: 13353718)")
    parser.add_argument("--dim", type=int, default=128, help="embedding dimension (REALM: 128)")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument(
        "--index-types",
        default=DEFAULT_INDEX_TYPES,
        help="';'-separated FAISS factory strings (commas belong to the factory strings)",
    )
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--nprobe", type=int, default=64, help="IVF lists probed per query")
    parser.add_argument("--ef-search", type=int, default=128, help="HNSW efSearch")
    parser.add_argument(
        "--rerank-factor", type=int, default=4, help="compressed indexes: candidates re-scored exactly = k x this"
    )
    parser.add_argument("--train-size", type=int, default=None, help="IVF/PQ training sample (default 256 x lists)")
    parser.add_argument("--chunk-size", type=int, default=1_000_000, help="vectors generated / added per chunk")
    parser.add_argument(
        "--legacy-queries",
        type=int,
        default=None,
        help="questions timed for the legacy baseline (default: min(queries, 200), 20 above 2M blocks; 0 skips it)",
    )
    parser.add_argument("--vectors", choices=["structured", "random"], default="structured")
    parser.add_argument("--vectors-file", help="real block embeddings, a float32 [N, D] .npy (memory-mapped)")
    parser.add_argument("--queries-file", help="real question embeddings, float32 [Q, D] .npy")
    parser.add_argument("--workdir", default=None, help="where the memmap goes (default: the temp dir)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    faiss.omp_set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    factories = [f.strip() for f in args.index_types.split(";") if f.strip()]
    if args.legacy_queries is None:
        args.legacy_queries = min(args.queries, 200 if args.blocks <= 2_000_000 else 20)
    search_params = {"nprobe": args.nprobe, "efSearch": args.ef_search}

    with tempfile.TemporaryDirectory(prefix="realm-bench-", dir=args.workdir) as workdir:
        blocks, queries = make_vectors(args, workdir)
        n, dim = blocks.shape
        print(
            f"{n:,} blocks x {dim}-d, {len(queries):,} queries, k={args.k}, {args.threads} threads, "
            f"nprobe={args.nprobe}, efSearch={args.ef_search}, faiss {faiss.__version__}, torch {torch.__version__}",
            flush=True,
        )
        rows = []
        legacy_qps = None
        if args.legacy_queries > 0:
            legacy_qps, legacy_ids = legacy_baseline(blocks, queries, args.k, args.legacy_queries)
            print(f"legacy einsum+topk: {legacy_qps:.2f} q/s over {args.legacy_queries} questions", flush=True)

        # Exact search first: its ids are the ground truth for every other index; then it is freed.
        index, build_s, memory, search_s, _, truth, _ = measure_index("Flat", blocks, queries, args, {})
        del index
        if legacy_qps is not None:
            legacy_recall = recall_at_k(legacy_ids, truth[: args.legacy_queries])
            rows.append(("legacy einsum+topk (1 question/call)", 0.0, n * dim * 4 / 2**20, legacy_qps, legacy_recall))
        if "Flat" in factories:
            rows.append(("Flat", build_s, memory, len(queries) / search_s, 1.0))
        print(f"Flat: built in {build_s:.1f}s, {len(queries) / search_s:.1f} q/s", flush=True)

        for factory in factories:
            if factory == "Flat":
                continue
            index, build_s, memory, search_s, _, ids, params = measure_index(
                factory, blocks, queries, args, search_params
            )
            label = factory + "".join(f" {k}={v}" for k, v in params.items())
            exact_codes = faiss_utils.is_exact(index)
            del index
            release_freed_memory()
            if exact_codes:
                rows.append((label, build_s, memory, len(queries) / search_s, recall_at_k(ids, truth)))
            else:
                rows.append((label, build_s, memory, len(queries) / search_s, recall_at_k(ids[:, : args.k], truth)))
                reranked, rerank_s = rerank(blocks, queries, ids, args.k)
                rows.append(
                    (
                        f"{label} +exact rerank x{args.rerank_factor}",
                        build_s,
                        memory,
                        len(queries) / (search_s + rerank_s),
                        recall_at_k(reranked, truth),
                    )
                )
            print(f"{label}: built in {build_s:.1f}s, {len(queries) / search_s:.1f} q/s", flush=True)

        header = ("index type", "build s", "memory MB", "queries/s", "speedup vs legacy", f"recall@{args.k} vs exact")
        table = [header]
        for label, build_s, memory, qps, recall in rows:
            speedup = f"{qps / legacy_qps:.1f}x" if legacy_qps else "n/a"
            table.append((label, f"{build_s:.1f}", f"{memory:.0f}", f"{qps:.1f}", speedup, f"{recall:.3f}"))
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        print()
        for i, row in enumerate(table):
            print(
                " | ".join(cell.ljust(w) if j == 0 else cell.rjust(w) for j, (cell, w) in enumerate(zip(row, widths)))
            )
            if i == 0:
                print("-+-".join("-" * w for w in widths))
        print(
            f"\nmemory MB: resident anonymous memory added by building the index (legacy: the [N, D] float32 matrix). "
            f"Peak anonymous memory {PEAK_ANON_MB:.0f} MB; peak RSS {peak_rss_mb():.0f} MB (includes the memmap's "
            "reclaimable page cache)."
        )


if __name__ == "__main__":
    main()
