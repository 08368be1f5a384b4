"""What REALM pre-training buys, on FOLDOC, from a MiniLM start, on a CPU in at most ~30 minutes.

Pipeline (the one of `examples/pretrain_realm.py`): the best-linked short FOLDOC entries as the knowledge corpus;
REALM's embedders and encoder initialised from all-MiniLM-L6-v2; an Inverse Cloze Task warm start; then REALM
pre-training on FOLDOC sentences whose `{cross-reference}` is masked as a salient span, with the sentence's own entry
never retrieved and the index refreshed in the background by `RealmReindexCallback`.

Evaluated on held-out entries (none of their sentences is trained on; their blocks stay in the corpus), after each
stage, with an index freshly embedded by that stage's document embedder:

- recall@5: a block of the entry the masked term links to is among the top 5 retrieved (the source entry excluded);
- masked-span accuracy with retrieval: every wordpiece of the masked term right under the marginal
  sum_z p(z|x) p(y|z,x) over the null document and the retrieved blocks;
- the same with the null document only, p(y|null, x): the same encoder without retrieval.

Two pre-training runs start from the same ICT checkpoint with the same data order: the index refreshed every
`--refresh-steps` steps, and refreshed 30x less often (the paper's stale-index ablation: NQ EM 38.2 -> 28.7). The
first run stops at the `--realm-minutes` wall-clock budget; the second does the same number of steps.

    python bench/pretrain_foldoc.py            # ~30 minutes on 2 cores
    python bench/pretrain_foldoc.py --quick    # ~3 minutes: proves the pipeline, numbers are noise
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import platform
import random
import sys
import tempfile
import time
import warnings

import torch
from transformers import TrainerCallback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import pretrain_realm as recipe  # noqa: E402  (the example's data and training helpers)


def log(message: str) -> None:
    print(f"[bench] {message}", flush=True)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="A ~3-minute run that proves the pipeline works.")
    parser.add_argument("--foldoc", default=None, help="FOLDOC .jsonl(.gz), .dict.dz or directory (default: auto).")
    parser.add_argument("--bert", default=None, help="BERT-layout checkpoint dir (default: all-MiniLM-L6-v2).")
    parser.add_argument("--entries", type=int, default=600)
    parser.add_argument("--max-entry-chars", type=int, default=600)
    parser.add_argument("--held-out-entries", type=int, default=60)
    parser.add_argument("--eval-examples", type=int, default=128)
    parser.add_argument("--max-block-length", type=int, default=96)
    parser.add_argument("--max-input-length", type=int, default=48)
    parser.add_argument("--num-candidates", type=int, default=4, help="Null document included (paper: 8).")
    parser.add_argument("--retriever-proj-size", type=int, default=128)
    parser.add_argument("--shared-embedder", action="store_true")
    parser.add_argument("--ict-steps", type=int, default=60)
    parser.add_argument("--ict-batch-size", type=int, default=12)
    parser.add_argument("--ict-learning-rate", type=float, default=1e-4)
    parser.add_argument("--steps", type=int, default=100, help="REALM steps per run (capped by --realm-minutes).")
    parser.add_argument("--realm-minutes", type=float, default=9.0, help="Wall-clock budget of the fresh run.")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument(
        "--embedder-lr-ratio",
        type=float,
        default=0.1,
        help="Embedders' learning rate relative to the encoder's (1: one rate for all; see pretraining_optimizer).",
    )
    parser.add_argument("--refresh-steps", type=int, default=10, help="Refresh period of the fresh-index run.")
    parser.add_argument("--stale-factor", type=int, default=30, help="How much less often the stale run refreshes.")
    parser.add_argument("--inline-refresh", action="store_true", help="Refresh in the training thread.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None, help="Scratch directory (default: a temporary one).")
    args = parser.parse_args(argv)
    if args.quick:
        args.entries, args.held_out_entries, args.eval_examples = 100, 10, 8
        args.max_block_length, args.max_input_length = 64, 40
        args.ict_steps, args.ict_batch_size = 2, 8
        args.steps, args.realm_minutes, args.batch_size, args.refresh_steps = 4, 1.5, 2, 2
    return args


class TimeBudget(TrainerCallback):
    """Stops training once `seconds` of wall-clock time have passed since it began."""

    def __init__(self, seconds: float):
        self.seconds, self.started = seconds, None

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if time.perf_counter() - self.started > self.seconds:
            control.should_training_stop = True
        return control


@torch.no_grad()
def evaluate(model, tokenizer, examples: list[dict], args, batch_size: int = 8) -> dict:
    """
    On held-out masked inputs: recall@5 of the linked entry's block; whole-span and per-wordpiece accuracy with
    retrieval (the marginal over the null document and the retrieved blocks) and with the null document only; and
    the negative log-likelihood per masked wordpiece of both (what pre-training minimises: continuous, so it shows
    progress before whole terms come out right).
    """
    collator = recipe.pretraining_collator(tokenizer, args)
    was_training = model.training
    model.eval()
    hits = spans = spans_null = counted = 0
    tokens = tokens_right = tokens_right_null = 0
    nll = nll_null = 0.0
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        batch = collator([{k: e[k] for k in ("text", "salient_spans", "source_block_ids")} for e in chunk])
        out = model(**batch)
        query = model.query_embedder(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            token_type_ids=batch["token_type_ids"],
            return_dict=True,
        ).projected_score
        _, top5 = model.retrieve(query, 5, batch["source_block_ids"])
        masked_in_batch = int((batch["labels"] != -100).sum())
        if masked_in_batch:
            # The loss is the token mean of -log sum_z p(z|x) p(y|z,x) over the batch.
            nll += float(out.loss) * masked_in_batch
        for b, example in enumerate(chunk):
            masked = batch["labels"][b] != -100
            if not masked.any():
                continue
            counted += 1
            gold = batch["labels"][b][masked]
            right = out.marginal_predictions[b][masked] == gold
            right_null = out.null_predictions[b][masked] == gold
            spans += bool(right.all())
            spans_null += bool(right_null.all())
            tokens += int(masked.sum())
            tokens_right += int(right.sum())
            tokens_right_null += int(right_null.sum())
            # Candidate 0 is the null document; its value is the mean over this input's masked wordpieces.
            nll_null -= float(out.candidate_mlm_log_probs[b, 0]) * int(masked.sum())
            hits += any(str(block.get("doc_id")) == example["target_title"] for block in top5[b])
    model.train(was_training)
    n, t = max(counted, 1), max(tokens, 1)
    return {
        "recall@5": hits / n,
        "span_acc": spans / n,
        "span_acc_null": spans_null / n,
        "token_acc": tokens_right / t,
        "token_acc_null": tokens_right_null / t,
        "nll": nll / t,
        "nll_null": nll_null / t,
        "n": counted,
    }


def format_table(rows: list[dict]) -> str:
    columns = [
        "stage",
        "steps",
        "refreshes",
        "recall@5",
        "span acc (retrieval / null only)",
        "wordpiece acc (retrieval / null only)",
        "NLL per wordpiece (retrieval / null only)",
        "time",
    ]
    cells = [
        [
            row["stage"],
            str(row.get("steps", "-")),
            str(row.get("refreshes", "-")),
            f"{row['recall@5']:.3f}",
            f"{row['span_acc']:.3f} / {row['span_acc_null']:.3f}",
            f"{row['token_acc']:.3f} / {row['token_acc_null']:.3f}",
            f"{row['nll']:.2f} / {row['nll_null']:.2f}",
            f"{row['seconds']:.0f}s",
        ]
        for row in rows
    ]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    line = lambda values: "| " + " | ".join(v.ljust(w) for v, w in zip(values, widths)) + " |"  # noqa: E731
    return "\n".join([line(columns), line(["-" * w for w in widths]), *(line(r) for r in cells)])


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    # The collator warns once per example without a salient span; the filter below keeps those out anyway.
    warnings.filterwarnings("ignore", message="An example has no salient span")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    from realm_hf import RealmRetriever, RealmTokenizer
    from realm_hf.data.foldoc import load_foldoc
    from realm_hf.models.initialization import init_from_bert
    from realm_hf.models.modeling_pretraining import RealmForPreTraining
    from realm_hf.retrieval.chunking import split_documents
    from realm_hf.retrieval.refresh import embed_corpus
    from realm_hf.training import RealmForInverseClozeTask

    started = time.perf_counter()
    scratch = args.output or tempfile.mkdtemp(prefix="realm-pretrain-bench-")
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    bert = args.bert or recipe.minilm_dir()
    log(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads); scratch {scratch}"
    )

    # ---------------------------------------------------------------- data
    t = time.perf_counter()
    entries = recipe.select_entries(load_foldoc(args.foldoc), args.entries, args.max_entry_chars)
    tokenizer = RealmTokenizer.from_pretrained(bert)
    documents = recipe.foldoc_documents(entries)
    blocks = split_documents(documents, tokenizer, args.max_block_length)
    log(f"corpus: {len(entries)} FOLDOC entries, {len(blocks['text'])} blocks ({time.perf_counter() - t:.0f}s)")

    # ---------------------------------------------------------------- MiniLM start
    t = time.perf_counter()
    overrides = recipe.config_overrides(args)
    model = init_from_bert(RealmForPreTraining, bert, **overrides)
    retriever = RealmRetriever.from_documents(
        documents, model.embedder, tokenizer, max_block_length=args.max_block_length, show_progress=False
    )
    model.set_retriever(retriever)
    examples = recipe.masked_examples(entries, recipe.blocks_by_entry(retriever), tokenizer, args.max_input_length)
    # Held-out entries: among those with at least one masked input, so the evaluation has something to ask.
    with_examples = sorted({e["entry"] for e in examples})
    num_held_out = min(args.held_out_entries, len(with_examples) // 2)  # keep at least half for training
    held_out = set(random.Random(args.seed).sample(with_examples, num_held_out))
    train_examples = [e for e in examples if e["entry"] not in held_out]
    eval_examples = [e for e in examples if e["entry"] in held_out]
    eval_examples = random.Random(args.seed).sample(eval_examples, min(args.eval_examples, len(eval_examples)))
    ict_data = recipe.ict_examples(blocks, held_out)
    log(
        f"{len(train_examples)} training inputs, {len(eval_examples)} held-out inputs from {len(held_out)} entries, "
        f"{len(ict_data)} ICT blocks"
    )
    rows = [{"stage": "MiniLM init", **evaluate(model, tokenizer, eval_examples, args)}]
    rows[-1]["seconds"] = time.perf_counter() - t
    log(f"MiniLM init: {rows[-1]}")

    # ---------------------------------------------------------------- ICT warm start
    t = time.perf_counter()
    ict = init_from_bert(RealmForInverseClozeTask, bert, **overrides)
    ict_result = recipe.train_ict(ict, tokenizer, ict_data, args, scratch)
    model.load_ict_embedders(ict)
    del ict
    embed_corpus(retriever, model.embedder, show_progress=False)
    rows.append(
        {"stage": "+ ICT warm start", "steps": args.ict_steps, **evaluate(model, tokenizer, eval_examples, args)}
    )
    rows[-1]["seconds"] = time.perf_counter() - t
    log(f"ICT (loss {ict_result.training_loss:.3f}): {rows[-1]}")
    ict_weights = copy.deepcopy(model.state_dict())
    ict_index = retriever.export_index_state()

    # ---------------------------------------------------------------- REALM, fresh and stale index
    steps_done = None
    for label, refresh_steps in (
        (f"+ REALM, refresh every {args.refresh_steps}", args.refresh_steps),
        (
            f"+ REALM, refresh every {args.refresh_steps * args.stale_factor} (stale)",
            args.refresh_steps * args.stale_factor,
        ),
    ):
        t = time.perf_counter()
        model.load_state_dict(ict_weights)
        retriever.swap_index_state(ict_index)
        run_args = copy.copy(args)
        budget = []
        if steps_done is None:
            budget = [TimeBudget(args.realm_minutes * 60)]
        else:
            run_args.steps = steps_done  # the stale run does exactly as many steps as the fresh one
        result, reindexer = recipe.train_realm(
            model,
            tokenizer,
            retriever,
            train_examples,
            run_args,
            os.path.join(scratch, "realm"),
            refresh_steps,
            budget,
            refresh_at_end=False,  # counted refreshes are those during training; evaluation re-embeds below
        )
        steps_done = steps_done or result.global_step
        train_seconds = time.perf_counter() - t
        # Evaluate every model with an index embedded by its own final document embedder.
        embed_corpus(retriever, model.embedder, show_progress=False)
        row = {"stage": label, "steps": result.global_step, "refreshes": reindexer.refresh_count}
        row.update(evaluate(model, tokenizer, eval_examples, args))
        row["seconds"] = time.perf_counter() - t
        rows.append(row)
        log(f"{label}: loss {result.training_loss:.3f}, {train_seconds:.0f}s training; {row}")

    print()
    print(
        f"REALM pre-training on FOLDOC from all-MiniLM-L6-v2 ({'quick' if args.quick else 'full'} run): "
        f"{len(retriever)} blocks, {args.num_candidates} candidates incl. the null document, batch {args.batch_size}, "
        f"{len(eval_examples)} held-out masked inputs from {len(held_out)} held-out entries"
    )
    print(format_table(rows))
    print(f"total {time.perf_counter() - started:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
