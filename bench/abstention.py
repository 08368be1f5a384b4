"""What a "no answer" threshold costs and gains: the share of questions answered against the exact match of those answered.

What it measures
----------------
A REALM model answers every question with its best span; with a threshold (`no_answer_threshold`, the pipeline's
`handle_impossible_answer`, `realm-hf ask --no-answer-threshold`, `realm-hf serve`) it answers "no answer" when the
best span's probability (the answer's `score`) is under it. For each threshold this prints, on the Wikipedia main
job's two held-out sets (the generated questions about held-out articles and the hand-written ones of
`realm_hf.data`, as `examples/demo_wikipedia.py` makes them), the share of questions answered, the exact match of the
answered ones, and the right answers among all questions. Each question is answered once; a threshold keeps the
answers whose `score` is at least the threshold, which is what answering with that threshold returns.

Usage:

    python bench/abstention.py --model demo_output/realm-wikipedia              # the main job's saved model
    python bench/abstention.py --model DIR --thresholds 0 0.1 0.2 0.3 0.5
    python bench/abstention.py --quick --summaries S.json --handwritten H.jsonl  # a tiny random model (smoke test)

`--summaries`, `--handwritten`, `--seed` and `--eval-questions` must be the demo's (its defaults are) for the held-out
sets to be the ones the model never trained on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

DEFAULT_THRESHOLDS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="A saved RealmForOpenQA (the main job's: demo_output/realm-wikipedia).")
    parser.add_argument("--quick", action="store_true", help="a tiny random model over --summaries (smoke test)")
    parser.add_argument("--summaries", default=None, help="A summaries JSON (default: the installed package's).")
    parser.add_argument("--handwritten", default=None, help="Hand-written questions (default: realm-hf's own).")
    parser.add_argument("--seed", type=int, default=0, help="The task's seed (the demo's: 0).")
    parser.add_argument("--eval-questions", type=int, default=200, help="Generated held-out questions (the demo's).")
    parser.add_argument("--thresholds", type=float, nargs="+", default=list(DEFAULT_THRESHOLDS))
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--json", help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    if bool(args.model) == bool(args.quick):
        parser.error("give --model DIR (a saved model) or --quick (a tiny random model)")
    if any(not 0.0 <= t <= 1.0 for t in args.thresholds):
        parser.error(f"--thresholds are span probabilities from 0 to 1, got {args.thresholds}")
    return args


def held_out_sets(args) -> tuple[dict[str, list[dict]], list[dict]]:
    """The demo's two held-out sets ({"generated": [...], "hand-written": [...]} of `{"question", "answers"}`), and the
    articles they were made from."""
    from realm_hf.data.wikipedia import load_handwritten_questions, load_vital_articles, make_wikipedia_qa_task

    articles = load_vital_articles(args.summaries)
    task = make_wikipedia_qa_task(articles, seed=args.seed, handwritten=load_handwritten_questions(args.handwritten))
    return {"generated": task["held_out"][: args.eval_questions], "hand-written": task["handwritten"]}, articles


def tiny_model(articles, directory: str):
    """A tiny random RealmForOpenQA (hidden 32, 2 layers) over `articles`, with a vocabulary of their words."""
    import re

    import torch

    from realm_hf import RealmConfig, RealmForOpenQA, RealmRetriever, RealmTokenizer

    words = set()
    for article in articles:
        words.update(re.findall(r"\w+|[^\w\s]", f"{article['title']} {article['text']}".lower()))
    vocab = os.path.join(directory, "vocab.txt")
    with open(vocab, "w", encoding="utf-8") as f:
        f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *sorted(words)]) + "\n")
    tokenizer = RealmTokenizer(vocab=vocab)
    torch.manual_seed(0)
    config = RealmConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        retriever_proj_size=16,
        span_hidden_size=16,
        max_span_width=4,
        reader_beam_size=2,
        reader_seq_len=64,
        max_position_embeddings=128,
        initializer_range=0.5,
    )
    model = RealmForOpenQA(config).eval()
    documents = [{"title": a["title"], "text": a["text"], "doc_id": a["doc_id"]} for a in articles]
    retriever = RealmRetriever.from_documents(documents, model.embedder, tokenizer, max_block_length=48)
    model.set_retriever(retriever)
    return model


def answered_rows(answers: list[dict], golds: list[list[str]], thresholds) -> list[dict]:
    """One row per threshold: questions answered (share), exact match of the answered ones, right among all."""
    from realm_hf.metrics import exact_match_score

    right = [exact_match_score(a["answer"], g) for a, g in zip(answers, golds)]
    rows = []
    for threshold in thresholds:
        kept = [r for a, r in zip(answers, right) if a["answer"] and a["score"] >= threshold]
        rows.append(
            {
                "threshold": threshold,
                "answered": len(kept) / len(answers) if answers else 0.0,
                "em_answered": 100.0 * sum(kept) / len(kept) if kept else float("nan"),
                "right_of_all": 100.0 * sum(kept) / len(answers) if answers else 0.0,
            }
        )
    return rows


def format_rows(name: str, count: int, rows: list[dict]) -> str:
    lines = [f"{name} ({count} questions)", f"{'threshold':>10} {'answered':>9} {'EM answered':>12} {'right/all':>10}"]
    for row in rows:
        em = "-" if row["em_answered"] != row["em_answered"] else f"{row['em_answered']:.1f}"  # NaN: none answered
        lines.append(f"{row['threshold']:>10.2f} {100 * row['answered']:>8.1f}% {em:>12} {row['right_of_all']:>10.1f}")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    from transformers.utils import logging as hf_logging

    from realm_hf import RealmForOpenQA

    hf_logging.set_verbosity_error()
    sets, articles = held_out_sets(args)
    with tempfile.TemporaryDirectory() as scratch:
        model = tiny_model(articles, scratch) if args.quick else RealmForOpenQA.from_pretrained(args.model).eval()
        results = []
        for name, questions in sets.items():
            if not questions:
                continue
            answers = model.answer([q["question"] for q in questions], batch_size=args.batch_size)
            rows = answered_rows(answers, [list(q["answers"]) for q in questions], args.thresholds)
            print(format_rows(name, len(questions), rows) + "\n")
            results.append({"set": name, "questions": len(questions), "rows": rows})
    where = "a tiny random model (--quick)" if args.quick else args.model
    print(f"Model: {where}. answered: best span's probability >= threshold; EM of those; right/all: EM over all.")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    main()
    sys.exit(0)
