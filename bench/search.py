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
    python bench/search.py --quick                          # tiny sizes: checks that it runs
    python bench/search.py --blocks 13353718 --index-types "Flat;IVF4096,SQ8;HNSW32;IVF4096,PQ64x4fs rerank=4,50,100"

An entry of `--index-types` may carry its own settings after the factory string (`nprobe=64,128`, `efSearch=64`,
`rerank=50,100`, overriding `--nprobe`, `--ef-search`, `--rerank-factor`); each value gets a row from the same built
index. Compressed indexes (PQ, SQ) get a row as searched and one per re-rank factor F: the k*F best candidates by code,
re-scored exactly with the float32 vectors read from the memmap (page cache, not anonymous memory), as
`RealmRetriever.search(..., rerank_factor=F)` re-scores from the corpus's memory-mapped embeddings. A summary line
names the fastest row that fits `--memory-budget-mb` (1 GB) when scaled to 13,353,718 blocks at recall >= 0.99.

At 13,353,718 blocks: the memmap is 6.4 GiB on disk (`--workdir`), one index at a time is resident (Flat or IVF-Flat
6.9 GB, SQ8 1.8 GB, PQ32 or PQ64x4fs with ids ~0.7 GB), the legacy baseline is timed on 20 questions (each reads the
whole matrix), and the exact search of all queries gives the ground truth. HNSW32 (~10 GB, about half an hour to an
hour to build on 2 cores) is described instead of built above 5M blocks unless `--force-hnsw`.
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

from realm_hf.retrieval import faiss_build, faiss_ops

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


def build_measured(factory: str, blocks, args):
    """Build one index; returns `(index, build seconds, resident MB it added)` (anonymous memory, freed pages given back)."""
    release_freed_memory()
    before = rss_mb()
    start = time.perf_counter()
    index = faiss_build.build_index(
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
    return index, build_s, rss_mb() - before


def timed_search(index, factory: str, queries, k: int, params: dict):
    """`(seconds, ids)` of one batched search, as `RealmRetriever.search` runs it (per-call parameters, BLAS batches)."""
    with faiss_ops.search_parameters(index, params, factory), faiss_ops.blas_for_batches(len(queries)):
        index.search(queries[: min(10, len(queries))], k)  # warm-up
        start = time.perf_counter()
        _, ids = index.search(queries, k)
        elapsed = time.perf_counter() - start
    note_memory()
    return elapsed, ids


def rerank(blocks, queries, ids, k, chunk: int = 64):
    """
    Exact re-scoring of compressed-code candidates with the float32 vectors of the memmap (what `RealmRetriever.search`
    does with the corpus's memory-mapped `embeddings` column): the candidates' rows are read from the file's page
    cache, `chunk` questions at a time, so the only anonymous memory is a `[chunk, candidates, dim]` buffer.
    """
    start = time.perf_counter()
    out = np.empty((len(ids), k), dtype=np.int64)
    for lo in range(0, len(ids), chunk):
        part = ids[lo : lo + chunk]
        flat = part.reshape(-1)
        order = np.argsort(flat)
        gathered = np.zeros((len(flat), blocks.shape[1]), dtype=np.float32)
        valid = flat[order] >= 0
        gathered[order[valid]] = blocks[flat[order][valid]]  # sorted reads from the memmap
        scores = np.einsum("bd,bkd->bk", queries[lo : lo + chunk], gathered.reshape(*part.shape, -1))
        scores[part < 0] = -np.inf
        top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        out[lo : lo + chunk] = np.take_along_axis(part, top, axis=1)
    return out, time.perf_counter() - start


def ivf_breakdown(index) -> str | None:
    """
    Where an IVF index's bytes are: codes, ids (8 bytes per vector in the inverted lists: faiss's `idx_t`, stored
    once: IVF indexes take the block ids natively, without an `IndexIDMap` that would add another 8) and the coarse
    quantizer's centroids, with codes + ids extrapolated to the paper's corpus. What the resident memory holds beyond
    that is the lists' allocation slack and the PQ/SQ codebooks.
    """
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is None:
        return None
    mb = 2**20
    codes = ivf.ntotal * ivf.code_size
    ids = ivf.ntotal * 8
    quantizer = faiss.downcast_index(ivf.quantizer)
    coarse = quantizer.ntotal * quantizer.d * 4  # the centroids (a Flat quantizer)
    per_block = ivf.code_size + 8
    return (
        f"codes {codes / mb:.1f} MB ({ivf.code_size} B/block) + ids {ids / mb:.1f} MB (8 B/block) + coarse quantizer "
        f"{coarse / mb:.1f} MB; at {PAPER_BLOCKS:,} blocks codes + ids take {PAPER_BLOCKS * per_block / mb:.0f} MB"
    )


PAPER_BLOCKS = 13_353_718
# HNSW32 above this many blocks is described, not built, unless --force-hnsw: at the paper's 13.35M blocks it needs
# ~10 GB of RAM (float32 vectors + 64 links per vector) and roughly half an hour to an hour to build on 2 cores.
HNSW_MAX_BLOCKS = 5_000_000
HNSW_BUILD_S_PER_MILLION = 100  # measured: HNSW32 over 1M structured vectors in 94 s on 2 threads


def parse_ints(text: str, name: str) -> list[int]:
    try:
        values = [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        sys.exit(f"{name} takes positive integers separated by commas (e.g. 64,128), got {text!r}")
    return values


def parse_index_entry(entry: str, nprobes: list[int], ef_search: int, rerank_factors: list[int]):
    """
    `"IVF4096,PQ32 nprobe=64,128 rerank=50"` -> `(factory, nprobes, efSearch values, rerank factors)`: settings after
    the factory string override `--nprobe`, `--ef-search` and `--rerank-factor` for that index; `None` for "".
    """
    if not entry.split():
        return None
    factory, *options = entry.split()
    settings = {"nprobe": nprobes, "efSearch": [ef_search], "rerank": rerank_factors}
    for option in options:
        name, _, values = option.partition("=")
        name = {"ef_search": "efSearch", "rerank_factor": "rerank"}.get(name, name)
        if name not in settings or not values:
            sys.exit(f"--index-types: unknown setting {option!r} for {factory} (nprobe=, efSearch= or rerank=)")
        settings[name] = parse_ints(values, f"{name} of {factory}")
    return factory, settings["nprobe"], settings["efSearch"], settings["rerank"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=1_000_000, help="corpus size (REALM: 13353718)")
    parser.add_argument("--dim", type=int, default=128, help="embedding dimension (REALM: 128)")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument(
        "--index-types",
        default=DEFAULT_INDEX_TYPES,
        help="';'-separated FAISS factory strings (commas belong to the factory strings), each optionally followed by "
        "its own settings: 'IVF4096,PQ64x4fs nprobe=64,128 rerank=50,100'",
    )
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--nprobe", default="64", help="IVF lists probed per query; a comma list gives a row for each")
    parser.add_argument("--ef-search", type=int, default=128, help="HNSW efSearch")
    parser.add_argument(
        "--rerank-factor",
        default="4",
        help="compressed indexes (PQ, SQ): re-score k x F candidates exactly from the memmap; a comma list (e.g. "
        "4,20) gives a row for each F",
    )
    parser.add_argument(
        "--memory-budget-mb",
        type=float,
        default=1024,
        help=f"the summary names the fastest row whose resident memory, scaled to {PAPER_BLOCKS:,} blocks, stays "
        "within this, at recall >= --recall-goal",
    )
    parser.add_argument("--recall-goal", type=float, default=0.99)
    parser.add_argument(
        "--force-hnsw",
        action="store_true",
        help=f"build HNSW indexes above {HNSW_MAX_BLOCKS:,} blocks too (~10 GB and 0.5-1 h on 2 cores at 13.35M)",
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
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes to check that it runs (20,000 blocks, 50 queries, IVF64 indexes, 1 thread)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.blocks, args.queries, args.threads, args.chunk_size = 20_000, 50, 1, 8_192
        args.legacy_queries = 10 if args.legacy_queries is None else args.legacy_queries
        if args.index_types == DEFAULT_INDEX_TYPES:
            args.index_types = "Flat;HNSW32;IVF64,Flat;IVF64,SQ8;IVF64,PQ16"
        if args.nprobe == "64":
            args.nprobe = "8"
    nprobes = parse_ints(args.nprobe, "--nprobe")
    rerank_factors = parse_ints(args.rerank_factor, "--rerank-factor")

    faiss.omp_set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    entries = [parse_index_entry(e, nprobes, args.ef_search, rerank_factors) for e in args.index_types.split(";")]
    entries = [e for e in entries if e is not None]
    factories = [e[0] for e in entries]
    if args.legacy_queries is None:
        args.legacy_queries = min(args.queries, 200 if args.blocks <= 2_000_000 else 20)

    with tempfile.TemporaryDirectory(prefix="realm-bench-", dir=args.workdir) as workdir:
        blocks, queries = make_vectors(args, workdir)
        n, dim = blocks.shape
        print(
            f"{n:,} blocks x {dim}-d, {len(queries):,} queries, k={args.k}, {args.threads} threads, "
            f"nprobe={args.nprobe}, efSearch={args.ef_search}, rerank factors {args.rerank_factor}, "
            f"faiss {faiss.__version__}, torch {torch.__version__}",
            flush=True,
        )
        rows, notes = [], []
        legacy_qps = None
        if args.legacy_queries > 0:
            legacy_qps, legacy_ids = legacy_baseline(blocks, queries, args.k, args.legacy_queries)
            print(f"legacy einsum+topk: {legacy_qps:.2f} q/s over {args.legacy_queries} questions", flush=True)

        # Exact search first: its ids are the ground truth for every other index; then it is freed.
        index, build_s, memory = build_measured("Flat", blocks, args)
        search_s, truth = timed_search(index, "Flat", queries, args.k, {})
        del index
        release_freed_memory()
        if legacy_qps is not None:
            legacy_recall = recall_at_k(legacy_ids, truth[: args.legacy_queries])
            rows.append(("legacy einsum+topk (1 question/call)", 0.0, n * dim * 4 / 2**20, legacy_qps, legacy_recall))
        if "Flat" in factories:
            rows.append(("Flat", build_s, memory, len(queries) / search_s, 1.0))
        print(f"Flat: built in {build_s:.1f}s, {len(queries) / search_s:.1f} q/s", flush=True)

        for factory, entry_nprobes, entry_ef, entry_factors in entries:
            if factory == "Flat":
                continue
            if "HNSW" in factory and n > HNSW_MAX_BLOCKS and not args.force_hnsw:
                estimate = faiss_build.nbytes_estimate(n, dim, factory) / 2**30
                build_min = HNSW_BUILD_S_PER_MILLION * n / 1e6 * 2 / args.threads / 60
                reason = (
                    f"not measured: ~{estimate:.1f} GiB resident (float32 vectors + graph links), far over "
                    f"{args.memory_budget_mb:.0f} MB, and ~{build_min:.0f}+ min to build on {args.threads} threads "
                    "(--force-hnsw builds it)"
                )
                rows.append((factory, None, None, None, reason))
                print(f"{factory}: {reason}", flush=True)
                continue
            index, build_s, memory = build_measured(factory, blocks, args)
            exact_codes = faiss_ops.is_exact(index)
            breakdown = ivf_breakdown(index)
            if breakdown:
                notes.append(f"{factory}: resident {memory:.0f} MB = {breakdown}")
            if faiss_ops.get_search_param(index, "nprobe") is not None:
                settings = [{"nprobe": p} for p in entry_nprobes]
            elif faiss_ops.get_search_param(index, "efSearch") is not None:
                settings = [{"efSearch": e} for e in entry_ef]
            else:
                settings = [{}]
            for params in settings:
                label = factory + "".join(f" {k}={v}" for k, v in params.items())
                search_s, ids = timed_search(index, factory, queries, args.k, params)
                rows.append((label, build_s, memory, len(queries) / search_s, recall_at_k(ids, truth)))
                print(f"{label}: built in {build_s:.1f}s, {len(queries) / search_s:.1f} q/s", flush=True)
                if exact_codes:
                    continue
                for factor in entry_factors:
                    fetch = min(n, args.k * factor)
                    search_s, ids = timed_search(index, factory, queries, fetch, params)
                    reranked, rerank_s = rerank(blocks, queries, ids, args.k)
                    qps = len(queries) / (search_s + rerank_s)
                    rows.append(
                        (f"{label} +exact rerank x{factor}", build_s, memory, qps, recall_at_k(reranked, truth))
                    )
            del index
            release_freed_memory()

        header = (
            "index type",
            "build s",
            "memory MB",
            "B/block",
            "queries/s",
            "speedup vs legacy",
            f"recall@{args.k} vs exact",
        )
        table = [header]
        for label, build_s, memory, qps, recall in rows:
            if qps is None:
                table.append((label, "-", "-", "-", "-", "-", "-"))
                continue
            speedup = f"{qps / legacy_qps:.1f}x" if legacy_qps else "n/a"
            per_block = f"{memory * 2**20 / n:.0f}"
            table.append((label, f"{build_s:.1f}", f"{memory:.0f}", per_block, f"{qps:.1f}", speedup, f"{recall:.3f}"))
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        print()
        for i, row in enumerate(table):
            print(
                " | ".join(cell.ljust(w) if j == 0 else cell.rjust(w) for j, (cell, w) in enumerate(zip(row, widths)))
            )
            if i == 0:
                print("-+-".join("-" * w for w in widths))
        print()
        for label, _, _, _, reason in rows:
            if isinstance(reason, str):
                print(f"{label}: {reason}")
        for note in notes:
            print(note)
        # The budget is for the paper's corpus: a row fits when its resident memory, scaled to that many blocks, does.
        scale = PAPER_BLOCKS / n
        fits = [
            r
            for r in rows
            if r[3] is not None
            and not r[0].startswith("legacy")
            and r[2] * scale <= args.memory_budget_mb
            and r[4] >= args.recall_goal
        ]
        goal = f"{args.memory_budget_mb:.0f} MB at {PAPER_BLOCKS:,} blocks and recall@{args.k} >= {args.recall_goal}"
        if fits:
            best = max(fits, key=lambda r: r[3])
            speedup = f", {best[3] / legacy_qps:.0f}x legacy" if legacy_qps else ""
            print(
                f"fastest within {goal}: {best[0]} ({best[2] * scale:.0f} MB at that size, {best[3]:.0f} q/s{speedup}, "
                f"recall {best[4]:.3f})"
            )
        else:
            print(f"no row within {goal}")
        print(
            f"\nmemory MB: resident anonymous memory added by building the index (legacy: the [N, D] float32 matrix); "
            "re-ranking reads the float32 vectors from the memmap (page cache, not counted). "
            f"Peak anonymous memory {PEAK_ANON_MB:.0f} MB; peak RSS {peak_rss_mb():.0f} MB (includes the memmap's "
            "reclaimable page cache)."
        )
        return 0


if __name__ == "__main__":
    main()
