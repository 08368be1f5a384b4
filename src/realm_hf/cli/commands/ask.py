"""`realm-hf ask`: answer questions, as text or JSON lines with provenance."""

from __future__ import annotations

import json
import sys

from ..common import EXIT_OK, CLIError, load_tokenizer, progress
from ..models import load_openqa
from ..readers import read_questions


def _answer_questions(model, questions: list[str], args) -> list[list[dict]]:
    from ...pipeline_realm import RealmQuestionAnsweringPipeline

    # Without a retriever (answering from --context) the tokenizer comes from the model directory.
    tokenizer = None if model.retriever is not None else load_tokenizer(args.model)
    qa = RealmQuestionAnsweringPipeline(
        model=model, tokenizer=tokenizer, device=model.device, batch_size=args.batch_size
    )
    call_kwargs = {"top_k": args.top_k, "dtype": args.dtype}
    if args.num_blocks is not None:
        call_kwargs["num_blocks"] = args.num_blocks
    if args.max_answer_len is not None:
        call_kwargs["max_answer_len"] = args.max_answer_len
    results = []
    chunks = range(0, len(questions), args.batch_size)
    # The pipeline validates all questions of a call first, so one bad line fails before any model work.
    for start in progress(chunks, desc="Answering", unit="batch", disable=len(chunks) < 2, leave=False):
        chunk = questions[start : start + args.batch_size]
        kwargs = dict(call_kwargs)
        if args.context is not None:
            kwargs["context"] = args.context
        out = qa(chunk, **kwargs)
        for answers in out:
            answers = answers if isinstance(answers, list) else [answers]
            results.append([a for a in answers if a.get("answer")] or answers[:1])
    return results


def run(args) -> int:
    questions = read_questions(args.questions, args.file)
    if args.top_k < 1:
        raise CLIError(f"--top-k must be at least 1, got {args.top_k}.")
    if args.batch_size < 1:
        raise CLIError(f"--batch-size must be at least 1, got {args.batch_size}.")
    from ...precision import parse_dtype  # deferred: it imports torch

    try:
        parse_dtype(args.dtype)  # a bad --dtype fails before the model loads
    except ValueError:
        raise CLIError(f"--dtype must be fp32, bf16, auto or fp16 (GPUs only), got {args.dtype!r}.") from None
    model = load_openqa(args.model, args.allow_pickle, args.device, need_retriever=args.context is None)
    results = _answer_questions(model, questions, args)
    out = sys.stdout
    for question, answers in zip(questions, results):
        if args.json:
            for rank, answer in enumerate(answers, 1):
                record = {"question": question, "rank": rank}
                record.update(answer)
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
        else:
            out.write(f"Q: {question}\n")
            for rank, answer in enumerate(answers, 1):
                if not answer.get("answer"):
                    out.write("   (no answer)\n")
                    continue
                prefix = "A:" if len(answers) == 1 else f"{rank:>2}."
                block = answer.get("block")
                # A `context=` answer carries the context as its block, with no block id.
                if block and block.get("block_id") is not None:
                    title = f'"{block["title"]}" ' if block.get("title") else ""
                    source = f"  [source: {title}(block {block['block_id']})]"
                else:
                    source = "  [source: the given context]"
                out.write(f"{prefix} {answer['answer']}  (score {answer['score']:.3f}){source}\n")
            out.write("\n")
    out.flush()
    return EXIT_OK
