"""The retriever-training options of `bench/learning_foldoc.py --only options` on the Wikipedia main job, one row per option, every seed.

Each row fine-tunes the demo's warm-started model (`make demo` saves it: `demo_output/realm-wikipedia`) with
REALM's Open-QA fine-tuning (`openqa_trainer`: both of REALM's losses over the searcher beam) under one option of
the retriever toolbox, from the same start, with the same budget and seed, and evaluates it on both held-out sets
of the demo (generated questions about held-out articles, and the hand-written ones). The rows are those of
`bench/learning_foldoc.py --only options`:

- `realm`: REALM's recipe, end to end (document embedder trained), index refreshed every `--refresh-steps`;
- `query_side`: the document embedder and index fixed (what the paper's fine-tuning does);
- `emdr2`, `perplexity_distillation`, `attention_distillation`: `config.retriever_loss`, end to end;
- `stale`: end to end with the index refreshed `--stale-factor` times less often;
- `stale_rerank`: the same, over-retrieving `--rerank-factor` x the searcher beam from the stale index and
  re-scoring it with the current document embedder (`config.rerank_beam_size`).

Every end-to-end row ends with a refresh (`RealmReindexCallback(refresh_at_end=True)`), so each is evaluated with
the index of its own document embedder; evaluation searches REALM's dense index alone (the options train it; the
demo answers through dense + BM25). A refresh re-embeds the corpus (about 4.5 minutes for the demo's 12,347 blocks
on 2 cores), so `--corpus-articles` keeps every held-out article and a seeded sample of the others (training
questions only from those): a smaller, easier retrieval task than the demo's, said in the printed header.

    make demo                                            # the start: demo_output/realm-wikipedia
    python bench/options_wikipedia.py --corpus-articles 2500 --steps 30
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

import demo_wikipedia  # noqa: E402  (the demo's question records as datasets)
from learning_foldoc import OPTION_ROWS, option_table  # noqa: E402  (the same rows and table as the FOLDOC bench)


def log(message: str) -> None:
    print(f"[options] {message}", file=sys.stderr, flush=True)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--start",
        default=os.path.join("demo_output", "realm-wikipedia"),
        help="The warm-started model every row starts from (what `make demo` saves).",
    )
    parser.add_argument("--summaries", default=None, help="A summaries JSON (default: the installed package's).")
    parser.add_argument("--handwritten", default=None, help="Hand-written held-out questions (default: shipped).")
    parser.add_argument(
        "--task-seed", type=int, default=0, help="The demo's --seed: it splits the articles (must match --start)."
    )
    parser.add_argument("--eval-questions", type=int, default=200, help="Generated held-out questions evaluated.")
    parser.add_argument(
        "--corpus-articles",
        type=int,
        default=0,
        help="Articles in the corpus: every held-out one and a seeded sample of the others (0: all).",
    )
    parser.add_argument("--options", default=",".join(OPTION_ROWS), help=f"Rows, from {list(OPTION_ROWS)}.")
    parser.add_argument("--seeds", default="0,1", help="Seeds (each row, every seed).")
    parser.add_argument("--steps", type=int, default=30, help="Open-QA fine-tuning steps per row.")
    parser.add_argument("--batch-size", type=int, default=8, help="Questions per step.")
    parser.add_argument(
        "--learning-rate", type=float, default=3e-5, help="The reader's rate (the demo's Open-QA rate)."
    )
    parser.add_argument(
        "--embedder-lr-ratio", type=float, default=1.0, help="The embedders' rate as a multiple of the reader's."
    )
    parser.add_argument("--searcher-beam", type=int, default=16, help="Blocks per question in the retrieval loss.")
    parser.add_argument("--refresh-steps", type=int, default=15, help="REALM's refresh period (end-to-end rows).")
    parser.add_argument("--stale-factor", type=int, default=30, help="How many times less often `stale` refreshes.")
    parser.add_argument("--rerank-factor", type=int, default=4, help="`stale_rerank` over-retrieves this x the beam.")
    parser.add_argument("--embed-batch-size", type=int, default=64)
    parser.add_argument("--output", default=None, help="Scratch directory (default: a temporary one).")
    parser.add_argument("--json", default=None, help="Also write the results here.")
    return parser.parse_args(argv)


def build_task(args) -> dict:
    """The demo's task (same articles, split and questions), its corpus cut to `--corpus-articles` articles."""
    from realm_hf.data.wikipedia import load_handwritten_questions, load_vital_articles, make_wikipedia_qa_task

    articles = load_vital_articles(args.summaries)
    task = make_wikipedia_qa_task(
        articles, seed=args.task_seed, handwritten=load_handwritten_questions(args.handwritten)
    )
    documents = task["documents"]
    held_out = task["held_out"][: args.eval_questions]
    keep = None
    if args.corpus_articles and args.corpus_articles < len(documents):
        keep = set(task["held_out_doc_ids"]) | {q["doc_id"] for q in held_out + task["handwritten"] if "doc_id" in q}
        others = sorted({d["doc_id"] for d in documents} - keep)
        random.Random(args.task_seed).shuffle(others)
        keep |= set(others[: max(0, args.corpus_articles - len(keep))])
        documents = [d for d in documents if d["doc_id"] in keep]
    train = [q for q in task["train"] if keep is None or q["doc_id"] in keep]
    return {"documents": documents, "train": train, "held_out": held_out, "handwritten": task["handwritten"]}


def load_start(args, retriever=None):
    """The start model, fresh from disk (every row trains its own copy), with `retriever` attached."""
    from realm_hf import RealmForOpenQA

    model = RealmForOpenQA.from_pretrained(args.start, load_retriever=False, retriever=retriever)
    model.config.searcher_beam_size = args.searcher_beam
    return model


def run_row(option: str, args, ctx, seed: int) -> dict:
    """One option row from the start: fine-tune with the row's setting, evaluate both held-out sets."""
    from transformers import TrainingArguments

    from realm_hf.training import RealmReindexCallback, evaluate_openqa, two_rate_adamw
    from realm_hf.training.recipes import openqa_trainer

    started = time.perf_counter()
    setting, changes = OPTION_ROWS[option]
    changes = dict(changes)
    if changes.get("rerank_beam_size") == "factor":
        changes["rerank_beam_size"] = args.searcher_beam * args.rerank_factor
    retriever = ctx["retriever"]
    retriever.swap_index_state(ctx["start_index"])
    model = load_start(args, retriever)
    for key, value in changes.items():
        setattr(model.config, key, value)
    if changes.get("retriever_loss") == "attention_distillation":
        model.set_attn_implementation("eager")  # the loss reads the reader's attention probabilities
    reindex = None
    if setting == "query_side":
        model.freeze_document_embedder()
    else:
        model.document_embedder.requires_grad_(True)
        refresh = args.refresh_steps * (args.stale_factor if setting == "end_to_end_stale" else 1)
        reindex = RealmReindexCallback(
            retriever, refresh_steps=refresh, background=False, batch_size=args.embed_batch_size,
            save_with_checkpoints=False,
        )  # fmt: skip
    training_args = TrainingArguments(
        output_dir=os.path.join(ctx["scratch"], f"{option}-{seed}"),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        warmup_steps=max(1, args.steps // 10),
        weight_decay=0.01,
        logging_steps=max(1, args.steps // 3),
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
        train_sampling_strategy="group_by_length",
    )
    optimizer = two_rate_adamw(model, model.reader, args.learning_rate, args.embedder_lr_ratio)
    trainer = openqa_trainer(model, training_args, ctx["train_set"], reindex=reindex, optimizers=(optimizer, None))
    result = trainer.train()
    metrics = {
        name: evaluate_openqa(model, data, recall_ks=(1, 5, 20), batch_size=32, show_progress=False)
        for name, data in ctx["eval_sets"].items()
    }
    row = {
        **metrics,
        "refreshes": reindex.refresh_count if reindex else 0,
        "train_loss": result.training_loss,
        "seconds": time.perf_counter() - started,
    }
    log(f"{option} (seed {seed}): {json.dumps(row)}")
    return row


def main(argv=None) -> int:
    import tempfile

    import torch

    from realm_hf import RealmRetriever, RealmTokenizer
    from realm_hf.training import evaluate_openqa

    args = parse_args(argv)
    options = args.options.split(",")
    unknown = sorted(set(options) - set(OPTION_ROWS))
    if unknown:
        raise SystemExit(f"Unknown option row(s) {unknown}; choose from {list(OPTION_ROWS)}.")
    if not os.path.isfile(os.path.join(args.start, "config.json")):
        raise SystemExit(f"No saved model in {args.start!r}: run `make demo` first, or pass --start DIR.")
    seeds = [int(s) for s in args.seeds.split(",")]
    started = time.perf_counter()
    task = build_task(args)
    tokenizer = RealmTokenizer.from_pretrained(args.start)
    model = load_start(args)
    log(f"Embedding {len(task['documents'])} articles with the start's document embedder ...")
    retriever = RealmRetriever.from_documents(
        task["documents"],
        model.document_embedder,
        tokenizer,
        max_block_length=model.config.max_block_length,
        index="Flat",
        batch_size=args.embed_batch_size,
    )
    scratch = args.output or tempfile.mkdtemp(prefix="realm-options-")
    ctx = {
        "retriever": retriever,
        "start_index": retriever.export_index_state(),
        "train_set": demo_wikipedia.qa_dataset(task["train"]).shuffle(seed=args.task_seed),
        "eval_sets": {
            "generated": demo_wikipedia.qa_dataset(task["held_out"]),
            "hand-written": demo_wikipedia.qa_dataset(task["handwritten"]),
        },
        "scratch": scratch,
    }
    model.set_retriever(retriever)
    with torch.no_grad():
        start = {
            name: evaluate_openqa(model, data, recall_ks=(1, 5, 20), batch_size=32, show_progress=False)
            for name, data in ctx["eval_sets"].items()
        }
    log(f"start: {json.dumps(start)}")
    del model
    results = {option: {} for option in options}
    for seed in seeds:
        for option in options:
            results[option][seed] = run_row(option, args, ctx, seed)

    print(
        f"\nRetriever-training options on the Wikipedia main job: Open-QA fine-tuning from {args.start}, "
        f"{args.steps} steps of {args.batch_size} questions, searcher beam {args.searcher_beam}, refresh every "
        f"{args.refresh_steps} steps (stale: x{args.stale_factor}), seeds {seeds}; corpus {len(task['documents'])} "
        f"articles ({len(retriever)} blocks), {len(task['train'])} training questions; dense retrieval; "
        f"{time.perf_counter() - started:.0f}s in all"
    )
    for name in ctx["eval_sets"]:
        print(f"\n{name} held-out questions; start: EM {start[name]['exact_match']:.1f}, recall@5 "
              f"{start[name]['recall@5']:.3f}")  # fmt: skip
        per_set = {option: {seed: row[name] for seed, row in per_seed.items()} for option, per_seed in results.items()}
        print(option_table(per_set, seeds, len(ctx["eval_sets"][name])))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "start": start, "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
