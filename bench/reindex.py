"""What index refresh costs end-to-end Open-QA fine-tuning: training throughput with and without `RealmReindexCallback`.

The setup is the one of `examples/finetune_openqa.py --train-document-embedder`: REALM's embedders and reader
initialised from all-MiniLM-L6-v2, a FOLDOC corpus of a few hundred blocks, FOLDOC link questions, and the document
embedder trained end to end (so the index goes stale and refreshes matter). Every mode trains the same number of
steps from the same weights on the same batches, in one process, one after the other:

- `no refresh`: the baseline;
- `background`: `RealmReindexCallback(background=True)`, a refresh every `--refresh-steps` steps in a worker thread
  while training goes on (the swap happens at the first step boundary after it is ready);
- `inline`: `RealmReindexCallback(background=False)`, training pauses for each refresh.

Each group of modes runs once per `--train-threads` value: `all` is torch's default (every core trains, so a
background refresh has no spare core and competes with training), `1` pins the process to one intra-op thread
(`torch.set_num_threads(1)`), which on a 2-core machine leaves the second core to the refresh. torch's thread count
is per process (the worker *thread* gets the same budget as training), so a thread can use a spare core only this
way; giving training and re-indexing separate budgets (say 15 + 1 cores) needs the re-embedding in another process.

No refresh is started at the last step (nothing trains after it); a refresh still running when the timed steps end
is waited for outside the timing, and its wait is reported. Ratios compare a mode with `no refresh` at the same
thread count. Timings on a shared machine are noisy: the load average is printed with each group.

    python bench/reindex.py            # ~5.5 minutes on 2 idle cores
    python bench/reindex.py --quick    # ~70 seconds: proves the bench runs, numbers are noise
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import platform
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import finetune_openqa as recipe  # noqa: E402  (the example's corpus, questions and model)


def log(message: str) -> None:
    print(f"[bench] {message}", flush=True)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="A ~70-second run that proves the bench works.")
    parser.add_argument("--init-from-bert", default=None, help="BERT-layout dir (default: all-MiniLM-L6-v2).")
    parser.add_argument("--entries", type=int, default=200, help="FOLDOC entries in the corpus.")
    parser.add_argument("--max-entry-chars", type=int, default=300)
    parser.add_argument("--max-block-length", type=int, default=64)
    parser.add_argument("--reader-seq-len", type=int, default=128)
    parser.add_argument("--searcher-beam-size", type=int, default=4)
    parser.add_argument("--reader-beam-size", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=24, help="Timed training steps per mode.")
    parser.add_argument("--refresh-steps", type=int, default=6)
    parser.add_argument("--reindex-batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument(
        "--train-threads",
        default="all,1",
        help="Comma-separated intra-op thread counts to run every mode with ('all' = torch's default).",
    )
    parser.add_argument(
        "--modes", default="none,background,inline", help="Comma-separated subset of none,background,inline."
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.entries, args.max_entry_chars, args.max_block_length = 60, 200, 48
        args.reader_seq_len, args.searcher_beam_size, args.reader_beam_size = 64, 3, 1
        args.batch_size, args.steps, args.refresh_steps = 1, 6, 2
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = set(args.modes) - {"none", "background", "inline"}
    if unknown or "none" not in args.modes:
        parser.error(f"--modes must include 'none' (the baseline) and only none/background/inline, got {args.modes}.")
    return args


def build(args):
    """Model, retriever and training batches via the fine-tuning example, end to end (document embedder trained)."""
    example_args = [
        "--train-document-embedder",
        "--entries",
        str(args.entries),
        "--max-entry-chars",
        str(args.max_entry_chars),
        "--max-block-length",
        str(args.max_block_length),
        "--reader-seq-len",
        str(args.reader_seq_len),
        "--searcher-beam-size",
        str(args.searcher_beam_size),
        "--reader-beam-size",
        str(args.reader_beam_size),
        "--seed",
        str(args.seed),
    ]
    if args.init_from_bert:
        example_args += ["--init-from-bert", args.init_from_bert]
    model, tokenizer, retriever, train_questions, _ = recipe.build_model_and_data(recipe.parse_args(example_args))

    from realm_hf.training.openqa import DataCollatorForOpenQA

    collator = DataCollatorForOpenQA(tokenizer)
    # One warm-up batch plus the timed ones, identical for every mode (cycling if there are few questions).
    needed = (args.steps + 1) * args.batch_size
    questions = (train_questions * (needed // len(train_questions) + 1))[:needed]
    batches = [collator(questions[i : i + args.batch_size]) for i in range(0, needed, args.batch_size)]
    return model, retriever, batches


def train_step(model, optimizer, batch) -> float:
    loss = model(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def run_mode(args, mode, threads, model, retriever, batches, initial_weights, initial_index) -> dict:
    """Train `args.steps` steps from the initial weights and index, with the given refresh mode; time them."""
    from realm_hf.training.callbacks import RealmReindexCallback

    torch.set_num_threads(threads)
    model.load_state_dict(initial_weights)
    retriever.swap_index_state(initial_index)
    torch.manual_seed(args.seed)  # same dropout masks in every mode
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.learning_rate)
    reindexer = None
    if mode != "none":
        reindexer = RealmReindexCallback(
            retriever,
            refresh_steps=args.refresh_steps,
            batch_size=args.reindex_batch_size,
            background=mode == "background",
        )
    train_step(model, optimizer, batches[0])  # warm-up (allocator, first-call costs): same in every mode
    load_before = os.getloadavg()[0]
    losses = []
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        losses.append(train_step(model, optimizer, batches[step]))
        if reindexer is not None and step < args.steps:
            reindexer.step(step, model)
    seconds = time.perf_counter() - started
    pending_wait = 0.0
    if reindexer is not None:
        # A refresh still running after the last step: finish it, untimed (wait() is a no-op otherwise).
        waited = time.perf_counter()
        if reindexer.wait(args.steps):
            pending_wait = time.perf_counter() - waited
        reindexer.close()
    history = [h for h in (reindexer.history if reindexer else []) if "reindex/refresh_seconds" in h]
    expected = len(range(args.refresh_steps, args.steps, args.refresh_steps)) if reindexer else 0
    return {
        "mode": mode,
        "threads": threads,
        "steps": args.steps,
        "seconds": seconds,
        "steps_per_s": args.steps / seconds,
        "refreshes": len(history),
        "failed": reindexer.failed_refreshes if reindexer else 0,
        "skipped": expected - len(reindexer.history) if reindexer else 0,
        "refresh_seconds": statistics.mean(h["reindex/refresh_seconds"] for h in history) if history else None,
        "staleness": statistics.mean(h["reindex/staleness"] for h in history) if history else None,
        "pending_wait": pending_wait,
        "mean_loss": statistics.mean(losses),
        "load": (load_before, os.getloadavg()[0]),
    }


def print_table(args, rows: list[dict], num_blocks: int) -> None:
    header = ["mode", "refresh every", "steps", "seconds", "steps/s", "ratio vs no refresh", "refreshes", "staleness"]
    baseline = {r["threads"]: r["steps_per_s"] for r in rows if r["mode"] == "none"}
    lines = []
    for r in rows:
        ratio = r["steps_per_s"] / baseline[r["threads"]]
        lines.append(
            [
                f"{'no refresh' if r['mode'] == 'none' else r['mode']} (train {r['threads']} thr)",
                "-" if r["mode"] == "none" else str(args.refresh_steps),
                str(r["steps"]),
                f"{r['seconds']:.1f}",
                f"{r['steps_per_s']:.3f}",
                f"{ratio:.2f}",
                "-" if r["mode"] == "none" else str(r["refreshes"]),
                "-" if r["staleness"] is None else f"{r['staleness']:.1f}",
            ]
        )
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    print()
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("-|-".join("-" * w for w in widths))
    for line in lines:
        print(" | ".join(cell.ljust(w) for cell, w in zip(line, widths)))
    print()
    print(f"corpus: {num_blocks} blocks; staleness = steps between a refresh's snapshot and its swap (mean)")
    for r in rows:
        detail = f"  {r['mode']:<10} train {r['threads']} thr: mean loss {r['mean_loss']:.3f}, load avg "
        detail += f"{r['load'][0]:.1f} -> {r['load'][1]:.1f}"
        if r["mode"] != "none":
            mean_s = "-" if r["refresh_seconds"] is None else f"{r['refresh_seconds']:.1f}s"
            detail += f"; refresh (snapshot to swap) mean {mean_s}, {r['skipped']} skipped, {r['failed']} failed"
            if r["pending_wait"]:
                detail += f"; waited {r['pending_wait']:.1f}s after the last step for a running refresh (untimed)"
        print(detail)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # A refresh still running at the next refresh step is skipped with a warning; the table counts those.
    logging.getLogger("realm_hf.training.callbacks").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*pin_memory.*")
    default_threads = torch.get_num_threads()
    thread_counts = []
    for value in args.train_threads.split(","):
        value = value.strip()
        thread_counts.append(default_threads if value == "all" else int(value))
    log(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{default_threads} intra-op threads by default; load average {os.getloadavg()[0]:.1f}"
    )
    started = time.perf_counter()
    model, retriever, batches = build(args)
    initial_weights = copy.deepcopy(model.state_dict())
    initial_index = retriever.export_index_state()
    log(
        f"{len(retriever)} blocks, batch {args.batch_size}, {args.steps} steps per mode, refresh every "
        f"{args.refresh_steps} steps; setup took {time.perf_counter() - started:.0f}s"
    )
    rows = []
    for threads in thread_counts:
        for mode in args.modes:
            row = run_mode(args, mode, threads, model, retriever, batches, initial_weights, initial_index)
            log(
                f"{mode:<10} train {threads} thr: {row['steps_per_s']:.3f} steps/s, {row['refreshes']} refreshes "
                f"({time.perf_counter() - started:.0f}s so far)"
            )
            rows.append(row)
    torch.set_num_threads(default_threads)
    print_table(args, rows, len(retriever))
    log(f"Done in {time.perf_counter() - started:.0f}s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
