"""`realm-hf evaluate`: exact match, F1 and retrieval recall@k, MRR@k and nDCG@k on a QA file; a TREC run file."""

from __future__ import annotations

import json
import os

from ..io.atomic import atomic_write_text
from .common import (
    EXIT_OK,
    CLIError,
    State,
    check_written_paths,
    info,
    load_openqa,
    logger,
    metrics_table,
    normalize_metric_names,
    same_path,
)
from .readers import load_qa


def _check_output_file(option: str, path: str | None) -> None:
    if not path:
        return
    if os.path.isdir(path):
        raise CLIError(
            f"{option} {path!r} is a directory: give a file name (e.g. {os.path.join(path, 'report.json')!r})."
        )
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise CLIError(f"{option} {path!r}: the folder {parent!r} does not exist; create it first.")


def _check_outputs(args) -> None:
    """Refuse outputs that would overwrite the QA file, the model or each other (before the evaluation, not after)."""
    outputs = (("--output", args.output), ("--predictions", args.predictions), ("--run-file", args.run_file))
    for option, path in outputs:
        _check_output_file(option, path)
    check_written_paths(outputs, [("the QA file being evaluated", args.qa_file), ("--model", args.model)])
    named = [(option, path) for option, path in outputs if path]
    for i, (option, path) in enumerate(named):
        for other, other_path in named[i + 1 :]:
            if same_path(path, other_path):
                raise CLIError(
                    f"{option} and {other} both name {path!r}: one would replace the other; give two files."
                )
    if args.run_tag is not None and (not args.run_tag or any(c.isspace() for c in args.run_tag)):
        raise CLIError(f"--run-tag must be one word (a TREC run's last column), got {args.run_tag!r}.")


def trec_run_lines(qids: list[str], retrieved: list[list[tuple[int, float]]], tag: str) -> list[str]:
    """
    A TREC run, one line per retrieved block: `qid Q0 block_id rank score tag`, ranks from 1, best first. trec_eval
    orders a question's blocks by score: when the scores do not fall with the rank (a hybrid retriever's fused order),
    the score written is 1/rank, so that the order read is the retriever's.
    """
    lines = []
    for qid, blocks in zip(qids, retrieved):
        scores = [score for _, score in blocks]
        in_order = all(a >= b for a, b in zip(scores, scores[1:]))
        for rank, (block_id, score) in enumerate(blocks, 1):
            lines.append(f"{qid} Q0 {block_id} {rank} {score if in_order else 1.0 / rank:.6f} {tag}")
    return lines


def run(args) -> int:
    from ..metrics import exact_match_score, f1_score
    from ..training.openqa import evaluate_openqa

    ks = sorted(set(args.ks))
    if any(k < 1 for k in ks):
        raise CLIError(f"--ks must be positive integers, got {args.ks}.")
    # Checked before the model loads: `--limit 0` evaluated every question, a negative one failed after the load.
    if args.limit is not None and args.limit < 1:
        raise CLIError(f"--limit must be at least 1 (the number of questions to evaluate), got {args.limit}.")
    if args.batch_size < 1:
        raise CLIError(f"--batch-size must be at least 1, got {args.batch_size}.")
    _check_outputs(args)
    dataset = load_qa(args.qa_file, args.question_column, args.answers_column, args.answers_separator, args.format)
    if args.limit is not None:
        dataset = dataset.select(range(min(args.limit, len(dataset))))
    model = load_openqa(args.model, args.allow_pickle, args.device)
    num_blocks = len(model.retriever)
    skipped = [k for k in ks if k > num_blocks]
    if skipped:
        logger.warning("Skipping recall@k for k > %d (the corpus size): %s.", num_blocks, skipped)
    info(f"Evaluating {args.model} on {len(dataset)} questions from {args.qa_file}.")
    metrics = evaluate_openqa(
        model,
        dataset,
        batch_size=args.batch_size,
        recall_ks=[k for k in ks if k <= num_blocks] or [1],
        show_progress=not State.quiet,
        return_predictions=True,
        return_retrieved=True,
    )
    predictions = metrics.pop("predictions")
    retrieved = metrics.pop("retrieved")
    metrics = normalize_metric_names(metrics)
    print(metrics_table(metrics))
    if args.output:
        report = dict(metrics, num_questions=len(dataset))
        atomic_write_text(args.output, json.dumps(report, indent=2) + "\n")
        info(f"Wrote {args.output}.")
    if args.run_file:
        ids = dataset["id"] if "id" in dataset.column_names else [None] * len(dataset)
        # The question's `id` when the QA file has one, else its number in the file (1 = first).
        qids = [str(i + 1) if qid is None else "_".join(qid.split()) for i, qid in enumerate(ids)]
        run_lines = trec_run_lines(qids, retrieved, args.run_tag or "realm-hf")
        atomic_write_text(args.run_file, "\n".join(run_lines) + "\n")
        info(f"Wrote {args.run_file} (a TREC run: {len(run_lines)} lines, block ids as document ids).")
    if args.predictions:
        lines = []
        for question, golds, prediction in zip(dataset["question"], dataset["answers"], predictions):
            record = {
                "question": question,
                "prediction": prediction,
                "answers": golds,
                "exact_match": exact_match_score(prediction, golds),
                "f1": f1_score(prediction, golds),
            }
            lines.append(json.dumps(record, ensure_ascii=False))
        atomic_write_text(args.predictions, "\n".join(lines) + "\n")
        info(f"Wrote {args.predictions}.")
    return EXIT_OK
