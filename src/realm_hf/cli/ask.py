"""`realm-hf ask`: answer questions, as text or JSON lines with provenance."""

from __future__ import annotations

import json
import sys

from .common import (
    EXIT_ERROR,
    EXIT_OK,
    CLIError,
    check_dtype_option,
    check_int8_device,
    load_openqa,
    load_tokenizer,
    progress,
)
from .readers import read_questions

# The pipeline's default limit, passed explicitly so that the up-front check and the pipeline agree.
MAX_QUESTION_LENGTH = 64


def _pipeline(model, args):
    from ..pipelines.question_answering import RealmQuestionAnsweringPipeline

    # Without a retriever (answering from --context) the tokenizer comes from the model directory.
    tokenizer = None if model.retriever is not None else load_tokenizer(args.model)
    return RealmQuestionAnsweringPipeline(
        model=model, tokenizer=tokenizer, device=model.device, batch_size=args.batch_size
    )


def metadata_filter(conditions: list[tuple[str, str]], features) -> dict:
    """
    The `filter` of `--filter COLUMN=VALUE` options over a corpus with these `features` (`datasets.Features`): one
    value per column, or the list of a repeated column's. A value is text in a column of text (`title=1984`), and
    read as JSON in any other column (`year=1999`, `draft=true`); a column the corpus lacks is left to the filter to
    name.
    """
    import json

    values: dict[str, list] = {}
    for column, text in conditions:
        value = text
        feature = features.get(column)
        if feature is not None and getattr(feature, "dtype", None) not in ("string", "large_string"):
            try:
                value = json.loads(text)
            except ValueError:
                pass  # the filter names the column's type against the text given
        values.setdefault(column, []).append(value)
    return {column: found[0] if len(found) == 1 else found for column, found in values.items()}


def _answer_batches(qa, questions: list[str], args, filter=None):
    """Yield the answers of each batch of `questions` (a list per question) as soon as the batch is read."""
    call_kwargs = {"top_k": args.top_k, "max_question_length": MAX_QUESTION_LENGTH, "dtype": args.dtype}
    if args.num_blocks is not None:
        call_kwargs["num_blocks"] = args.num_blocks
    if filter is not None:
        call_kwargs["filter"] = filter
    if args.max_answer_len is not None:
        call_kwargs["max_answer_len"] = args.max_answer_len
    if args.context is not None:
        call_kwargs["context"] = args.context
    if args.no_answer_threshold is not None:
        call_kwargs["no_answer_threshold"] = args.no_answer_threshold
    chunks = range(0, len(questions), args.batch_size)
    for start in progress(chunks, desc="Answering", unit="batch", disable=len(chunks) < 2, leave=False):
        results = []
        for answers in qa(questions[start : start + args.batch_size], **call_kwargs):
            answers = answers if isinstance(answers, list) else [answers]
            results.append([a for a in answers if a.get("answer")] or answers[:1])
        yield results


def _write(out, question: str, answers: list[dict], as_json: bool, threshold: float | None = None) -> None:
    if as_json:
        for rank, answer in enumerate(answers, 1):
            record = {"question": question, "rank": rank}
            record.update(answer)
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
        return
    out.write(f"Q: {question}\n")
    for rank, answer in enumerate(answers, 1):
        if not answer.get("answer"):
            if threshold is not None and answer.get("score", 0.0) > 0.0:
                # Say why: a declined span, not a question nothing was read for.
                out.write(
                    f"   (no answer: the best span's probability {answer['score']:.3f} is under the threshold "
                    f"{threshold:g})\n"
                )
            else:
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


def run(args) -> int:
    from ..text.user_text import check_context, question_problems

    items = read_questions(args.questions, args.file)
    if args.top_k < 1:
        raise CLIError(f"--top-k must be at least 1, got {args.top_k}.")
    if args.batch_size < 1:
        raise CLIError(f"--batch-size must be at least 1, got {args.batch_size}.")
    dtype = check_dtype_option(args.dtype)  # a bad --dtype fails before the model loads
    if args.context is not None:
        try:
            check_context(args.context)
        except ValueError as err:
            raise CLIError(f"--context: {err}") from None
    if args.filter and args.context is not None:
        raise CLIError("--filter narrows retrieval, but --context answers from the given passage: give one of them.")
    model = load_openqa(args.model, args.allow_pickle, args.device, need_retriever=args.context is None)
    check_int8_device(dtype, model)
    # A sharded corpus has no one table of features; its search refuses a filter by name.
    features = getattr(getattr(model.retriever, "corpus", None), "features", None) or {}
    filter = metadata_filter(args.filter, features) if args.filter else None
    qa = _pipeline(model, args)
    from ..models.openqa_answers import resolve_no_answer_threshold

    threshold = resolve_no_answer_threshold(model.config, args.no_answer_threshold)
    # Bad lines are reported, with where they are, and the others answered: one bad line never costs the rest.
    problems = {i: problem for i, (_, _, problem) in enumerate(items) if problem is not None}
    readable = [i for i in range(len(items)) if i not in problems]
    for j, problem in question_problems([items[i][1] for i in readable], qa.tokenizer, MAX_QUESTION_LENGTH):
        problems[readable[j]] = problem
    for i in sorted(problems):
        print(f"error: {items[i][0]}: {problems[i].rstrip('.')}.", file=sys.stderr)
    good = [i for i in readable if i not in problems]
    out = sys.stdout
    done = 0
    # Written batch by batch: answers already computed are printed even if a later batch fails.
    for results in _answer_batches(qa, [items[i][1] for i in good], args, filter) if good else ():
        for answers in results:
            _write(out, items[good[done]][1], answers, args.json, threshold)
            done += 1
        out.flush()
    if problems:
        where = "; ".join(items[i][0] for i in sorted(problems)[:5]) + ("; ..." if len(problems) > 5 else "")
        print(f"error: {len(problems)} of {len(items)} questions not answered ({where}); see above.", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK
