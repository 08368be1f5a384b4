"""
`realm-hf`: the command-line interface of realm-hf.

Subcommands: `index` (build a corpus + FAISS index), `ask` (answer questions), `train` (Open-QA fine-tuning or
REALM pre-training from a config file), `evaluate` (EM, F1, recall@k), `convert` (legacy checkpoint to this format)
and `push` (publish to the Hub). `realm-hf <command> --help` shows each command's options and examples; the full
reference is docs/cli.md.

Errors in the input (a missing file, a bad column, a refused pickle, no Hub access) are reported as one line,
`error: ...`, with exit status 2; `--debug` prints the traceback too. Heavy imports (torch, transformers, faiss)
happen inside the commands.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import traceback
from collections.abc import Iterator, Sequence
from typing import Any

logger = logging.getLogger("realm_hf.cli")

EXIT_OK = 0
EXIT_ERROR = 2

_DOCUMENT_SUFFIXES = {
    ".jsonl": "json",
    ".json": "json",
    ".ndjson": "json",
    ".csv": "csv",
    ".tsv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
# Columns the retriever computes itself: a documents file must not bring its own.
_RESERVED_DOCUMENT_COLUMNS = ("block_id", "char_start", "char_end", "embeddings")


class CLIError(ValueError):
    """Bad input to a command: reported as `error: <message>` with exit status 2."""


# ------------------------------------------------------------------------------------------------------------------
# Small helpers
# ------------------------------------------------------------------------------------------------------------------


class _State:
    quiet = False


def _info(message: str) -> None:
    # Progress and status go to stderr so that stdout carries only results (e.g. `ask --json | jq`).
    if not _State.quiet:
        print(message, file=sys.stderr, flush=True)


def _progress(iterable, **kwargs):
    from tqdm.auto import tqdm

    disable = kwargs.pop("disable", False)
    return tqdm(iterable, disable=_State.quiet or disable, file=sys.stderr, **kwargs)


@contextlib.contextmanager
def _library_progress_bars(enabled: bool) -> Iterator[None]:
    """Silence datasets' and transformers' own progress bars for `--quiet`, restoring them afterwards."""
    if enabled:
        yield
        return
    import datasets
    from transformers.utils import logging as hf_logging

    datasets_were_on = datasets.is_progress_bar_enabled()
    transformers_were_on = hf_logging.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if datasets_were_on:
            datasets.enable_progress_bars()
        if transformers_were_on:
            hf_logging.enable_progress_bar()


def _default_device(device: str | None) -> str:
    if device:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _write_text_atomic(path: str, text: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.tmp-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp files are private; results are ordinary files
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def _atomic_output_dir(output: str, overwrite: bool = False) -> Iterator[str]:
    """
    Yield a temporary directory next to `output`; on success it replaces `output` in one rename, on failure it is
    removed. An existing non-empty `output` is refused unless `overwrite`, and is only removed after the new one is in
    place.
    """
    output = os.path.abspath(output)
    _check_output_dir(output, overwrite)
    parent, name = os.path.split(output)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
    # mkdtemp makes a private (0700) directory; the result should look like any directory the user creates.
    os.chmod(tmp, 0o777 & ~_umask())
    try:
        yield tmp
        _normalize_permissions(tmp)
        if os.path.exists(output):
            backup = tempfile.mkdtemp(prefix=f".{name}.old-", dir=parent)
            os.rmdir(backup)
            os.rename(output, backup)
            try:
                os.rename(tmp, output)
            except BaseException:
                os.rename(backup, output)
                raise
            shutil.rmtree(backup, ignore_errors=True)
        else:
            os.rename(tmp, output)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


def _normalize_permissions(root: str) -> None:
    # Libraries write through private (0600) temporary files; the output should get the user's usual permissions.
    mask = _umask()
    for directory, _dirs, files in os.walk(root):
        os.chmod(directory, 0o777 & ~mask)
        for name in files:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                os.chmod(path, 0o666 & ~mask)


def _check_output_dir(output: str, overwrite: bool) -> None:
    if os.path.exists(output):
        if not os.path.isdir(output):
            raise CLIError(f"{output} exists and is not a directory.")
        if os.listdir(output) and not overwrite:
            raise CLIError(f"{output} already exists and is not empty; pass --overwrite to replace it.")


def _read_json_file(path: str) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _config_of(model_dir: str) -> dict:
    path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(path):
        raise CLIError(f"{model_dir} has no config.json: not a model directory.")
    return _read_json_file(path)


def _architecture(config: dict) -> str:
    architectures = config.get("architectures") or []
    return architectures[0] if architectures else ""


def _is_hub_id(name: str) -> bool:
    # "owner/name" or "name": no path syntax. Anything else that does not exist is a missing local path.
    if name.startswith((".", "/", "~")) or os.sep in name.replace("/", "", 1) or name.count("/") > 1:
        return False
    return bool(name) and not name.endswith((".json", ".jsonl", ".csv", ".parquet"))


def _require_local_or_hub(path: str, what: str) -> None:
    if not os.path.exists(path) and not _is_hub_id(path):
        raise CLIError(f"{what} {path!r} does not exist.")


def _hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _load_tokenizer(*candidates: str):
    """The tokenizer of the first directory (or `retriever/tokenizer` subfolder) that has one."""
    from transformers import AutoTokenizer

    errors = []
    for candidate in candidates:
        if not candidate:
            continue
        for path in (
            candidate,
            os.path.join(candidate, "retriever", "tokenizer"),
            os.path.join(candidate, "tokenizer"),
        ):
            if os.path.isdir(path) and any(
                os.path.exists(os.path.join(path, name))
                for name in ("tokenizer_config.json", "vocab.txt", "tokenizer.json")
            ):
                try:
                    return AutoTokenizer.from_pretrained(path)
                except (OSError, ValueError) as err:
                    errors.append(f"{path}: {err}")
        if not os.path.isdir(candidate) and _is_hub_id(candidate):
            return AutoTokenizer.from_pretrained(candidate)
    detail = f" ({'; '.join(errors)})" if errors else ""
    raise CLIError(f"No tokenizer found in {', '.join(c for c in candidates if c)}{detail}.")


# ------------------------------------------------------------------------------------------------------------------
# Reading data files
# ------------------------------------------------------------------------------------------------------------------


def _file_format(path: str, fmt: str = "auto") -> str:
    if fmt != "auto":
        return fmt
    if os.path.isdir(path):
        return "dataset"
    suffix = os.path.splitext(path.lower().removesuffix(".gz"))[1]
    if suffix not in _DOCUMENT_SUFFIXES:
        raise CLIError(
            f"Cannot tell the format of {path!r} from its extension; use .jsonl, .csv or .parquet, a saved `datasets` "
            "directory, or pass --format."
        )
    return _DOCUMENT_SUFFIXES[suffix]


def _load_table(paths: Sequence[str], fmt: str = "auto", split: str = "train"):
    """A `datasets.Dataset` from JSONL/CSV/Parquet files (all of one format) or one `save_to_disk` directory."""
    import datasets

    for path in paths:
        if not os.path.exists(path):
            raise CLIError(f"Input {path!r} does not exist.")
    formats = {_file_format(path, fmt) for path in paths}
    if len(formats) > 1:
        raise CLIError(f"Input files mix formats ({', '.join(sorted(formats))}); give files of one format.")
    kind = formats.pop()
    if kind == "dataset":
        if len(paths) != 1:
            raise CLIError("Give a single saved dataset directory (or data files).")
        loaded = datasets.load_from_disk(paths[0])
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise CLIError(f"{paths[0]} holds splits {sorted(loaded)}; choose one with --split.")
            loaded = loaded[split]
        return loaded
    kwargs = {"sep": "\t"} if kind == "csv" and all(p.lower().endswith(".tsv") for p in paths) else {}
    try:
        return datasets.load_dataset(kind, data_files=list(paths), split="train", **kwargs)
    except datasets.exceptions.DatasetGenerationError as err:
        cause = err.__cause__ or err
        raise CLIError(f"Could not read {', '.join(paths)} as {kind}: {cause}") from err


def _load_documents(paths: Sequence[str], args):
    """Documents with `text`, `title` (and metadata) columns, renamed from the user's column names."""
    dataset = _load_table(paths, args.format, args.split)
    columns = dataset.column_names
    if args.text_column not in columns:
        raise CLIError(
            f"The documents have no text column {args.text_column!r} (columns: {', '.join(columns)}); "
            "choose one with --text-column."
        )
    title_column = args.title_column
    if title_column not in columns:
        if title_column != "title":
            raise CLIError(f"The documents have no title column {title_column!r} (columns: {', '.join(columns)}).")
        title_column = None
    if args.id_column and args.id_column not in columns:
        raise CLIError(f"The documents have no id column {args.id_column!r} (columns: {', '.join(columns)}).")
    renames = {args.text_column: "text"}
    if title_column:
        renames[title_column] = "title"
    if args.id_column:
        renames[args.id_column] = "doc_id"
    dropped = [c for c in columns if c not in renames and (c in renames.values() or c in _RESERVED_DOCUMENT_COLUMNS)]
    if dropped:
        logger.warning("Ignoring document column(s) %s: the corpus computes or renames them.", ", ".join(dropped))
        dataset = dataset.remove_columns(dropped)
    renames = {old: new for old, new in renames.items() if old != new}
    if renames:
        dataset = dataset.rename_columns(renames)
    if len(dataset) == 0:
        raise CLIError(f"No documents in {', '.join(paths)}.")
    return dataset


def _answers_list(value, separator: str | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                parsed = json.loads(text)
            except json.JSONDecodeError:
                parsed = None
            if isinstance(parsed, list):
                return [str(a) for a in parsed]
        if separator:
            return [part.strip() for part in value.split(separator) if part.strip()]
        return [value]
    if isinstance(value, dict) and "text" in value:  # SQuAD-style {"text": [...], "answer_start": [...]}
        return _answers_list(value["text"], separator)
    return [str(a) for a in value]


def _load_qa(path: str, question_column: str, answers_column: str | None, separator: str | None = "|", fmt="auto"):
    """A QA file as a `datasets.Dataset` with `question` and (when asked for) `answers` (a list of strings)."""
    import datasets

    if not os.path.exists(path):
        raise CLIError(f"QA file {path!r} does not exist.")
    kind = _file_format(path, fmt)
    if kind == "json":
        rows = []
        with open(path, encoding="utf-8") as f:
            text = f.read()
        stripped = text.lstrip()
        if stripped.startswith("["):  # a JSON array rather than JSON lines
            try:
                rows = json.loads(text)
            except json.JSONDecodeError as err:
                raise CLIError(f"{path}: invalid JSON: {err}") from err
        else:
            for number, line in enumerate(text.splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise CLIError(f"{path}, line {number}: invalid JSON: {err.msg}") from err
        for number, row in enumerate(rows, 1):
            if not isinstance(row, dict):
                raise CLIError(f"{path}, record {number}: expected a JSON object with {question_column!r}.")
        columns = sorted({key for row in rows for key in row})
        get = lambda column: [row.get(column) for row in rows]  # noqa: E731
    else:
        table = _load_table([path], kind)
        columns = table.column_names
        get = lambda column: table[column] if column in columns else [None] * len(table)  # noqa: E731
    if question_column not in columns:
        raise CLIError(f"{path} has no question column {question_column!r} (columns: {', '.join(columns)}).")
    questions = get(question_column)
    for number, question in enumerate(questions, 1):
        if not isinstance(question, str) or not question.strip():
            raise CLIError(f"{path}, record {number}: the question is empty.")
    data = {"question": list(questions)}
    if answers_column is not None:
        if answers_column not in columns:
            raise CLIError(f"{path} has no answers column {answers_column!r} (columns: {', '.join(columns)}).")
        answers = [_answers_list(value, separator) for value in get(answers_column)]
        for number, golds in enumerate(answers, 1):
            if not any(g.strip() for g in golds):
                raise CLIError(f"{path}, record {number}: no answer given for {data['question'][number - 1]!r}.")
        data["answers"] = answers
    if not data["question"]:
        raise CLIError(f"{path} holds no questions.")
    return datasets.Dataset.from_dict(data)


def _read_questions(args) -> list[str]:
    questions = list(args.questions or [])
    if args.file:
        if args.file == "-":
            text = sys.stdin.read()
            name = "<stdin>"
        else:
            if not os.path.isfile(args.file):
                raise CLIError(f"Question file {args.file!r} does not exist.")
            with open(args.file, encoding="utf-8") as f:
                text = f.read()
            name = args.file
        as_json = name.lower().endswith((".jsonl", ".json", ".ndjson"))
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line:
                continue
            if as_json or line.startswith("{"):
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise CLIError(f"{name}, line {number}: invalid JSON: {err.msg}") from err
                if isinstance(record, str):
                    questions.append(record)
                elif isinstance(record, dict) and isinstance(record.get("question"), str):
                    questions.append(record["question"])
                else:
                    raise CLIError(f"{name}, line {number}: expected a JSON object with a 'question' string.")
            else:
                questions.append(line)
    if not questions:
        raise CLIError("No questions: give them as arguments or with --file (one per line, or JSONL with 'question').")
    return questions


# ------------------------------------------------------------------------------------------------------------------
# Loading models
# ------------------------------------------------------------------------------------------------------------------


def _load_openqa(path: str, allow_pickle: bool = False, device: str | None = None, need_retriever: bool = True):
    from .modeling_realm import RealmForOpenQA

    _require_local_or_hub(path, "Model")
    if os.path.isdir(path):
        architecture = _architecture(_config_of(path))
        if architecture and architecture != "RealmForOpenQA":
            raise CLIError(f"{path} holds a {architecture}, not a RealmForOpenQA question-answering model.")
    model = RealmForOpenQA.from_pretrained(path, allow_pickle=allow_pickle)
    if need_retriever:
        model._require_retriever()  # says what to do (convert, allow_pickle, attach a corpus) when there is none
    model.to(_default_device(device))
    return model.eval()


# A stand-in passed as `retriever=` so that `from_pretrained` does not load (or unpickle) a corpus we do not need.
_NO_RETRIEVER = object()


def _embedder_from_dir(path: str):
    """The embedder that fills an index, from a REALM model directory: (embedder, description)."""
    from .modeling_realm import RealmEmbedder, RealmForOpenQA, RealmScorer

    architecture = _architecture(_config_of(path))
    if architecture == "RealmEmbedder" or not architecture:
        return RealmEmbedder.from_pretrained(path), "embedder"
    if architecture == "RealmScorer":
        return RealmScorer.from_pretrained(path).embedder, "scorer's embedder"
    if architecture == "RealmForOpenQA":
        model = RealmForOpenQA.from_pretrained(path, retriever=_NO_RETRIEVER)
        model.retriever = None
        if model.document_embedder is not None:
            return model.document_embedder, "document embedder"
        return model.embedder, "question embedder"
    if architecture == "RealmForPreTraining":
        from .modeling_pretraining import RealmForPreTraining

        return RealmForPreTraining.from_pretrained(
            path, retriever=_NO_RETRIEVER
        ).document_embedder, "document embedder"
    if architecture == "RealmForInverseClozeTask":
        from .training.ict import RealmForInverseClozeTask

        return RealmForInverseClozeTask.from_pretrained(path).document_embedder, "ICT document embedder"
    raise CLIError(f"{path} holds a {architecture}, which has no embedder to build an index with.")


# ------------------------------------------------------------------------------------------------------------------
# index
# ------------------------------------------------------------------------------------------------------------------


def cmd_index(args) -> int:
    from .retrieval_realm import RealmRetriever

    if not args.output and not args.attach_to:
        raise CLIError("Say where the corpus goes: --output DIR and/or --attach-to MODEL_DIR.")
    model_dir = args.model or args.attach_to
    if not model_dir:
        raise CLIError("Give the model whose embedder builds the index: --model DIR (or --document-embedder DIR).")
    embedder_dir = args.document_embedder or model_dir
    for path, what in ((model_dir, "Model directory"), (embedder_dir, "Embedder directory")):
        if not os.path.isdir(path):
            raise CLIError(f"{what} {path!r} does not exist.")
    if args.output:
        _check_output_dir(os.path.abspath(args.output), args.overwrite)
    attach_dir = None
    if args.attach_to:
        attach_config = _config_of(args.attach_to)
        if _architecture(attach_config) not in ("RealmForOpenQA", "RealmForPreTraining", ""):
            raise CLIError(f"--attach-to {args.attach_to}: a {_architecture(attach_config)} has no retriever.")
        attach_dir = os.path.join(args.attach_to, "retriever")
        if os.path.isdir(attach_dir) and os.listdir(attach_dir) and not args.overwrite:
            raise CLIError(f"{args.attach_to} already has a retriever/; pass --overwrite to replace it.")
    if args.max_block_length < 8:
        raise CLIError(f"--max-block-length must be at least 8 wordpieces, got {args.max_block_length}.")

    documents = _load_documents(args.documents, args)
    _info(f"Read {len(documents)} documents from {', '.join(args.documents)}.")
    embedder, description = _embedder_from_dir(embedder_dir)
    tokenizer = _load_tokenizer(embedder_dir, model_dir)
    max_positions = getattr(embedder.config, "max_position_embeddings", None)
    if max_positions and args.max_block_length > max_positions:
        raise CLIError(
            f"--max-block-length {args.max_block_length} exceeds the embedder's max_position_embeddings "
            f"({max_positions})."
        )
    if args.attach_to:
        expected = _config_of(args.attach_to).get("retriever_proj_size")
        if expected is not None and expected != embedder.config.retriever_proj_size:
            raise CLIError(
                f"The embedder makes {embedder.config.retriever_proj_size}-d vectors but {args.attach_to} expects "
                f"{expected}-d (retriever_proj_size): use that model's embedder."
            )
    device = _default_device(args.device)
    _info(f"Embedding with the {description} of {embedder_dir} on {device}, index {args.index}.")
    retriever = RealmRetriever.from_documents(
        documents,
        embedder.to(device).eval(),
        tokenizer,
        max_block_length=args.max_block_length,
        index=args.index,
        batch_size=args.batch_size,
        device=device,
        dtype=args.dtype,
        show_progress=not _State.quiet,
        train_size=args.train_size,
    )
    _info(f"Indexed {len(retriever)} blocks ({retriever.embedding_dim}-d, {args.index}).")
    if args.output:
        with _atomic_output_dir(args.output, overwrite=args.overwrite) as tmp:
            retriever.save_pretrained(tmp, corpus_format=args.corpus_format)
        _info(f"Saved the corpus and index to {args.output}.")
    if attach_dir:
        # save_pretrained swaps each entry in atomically, so a model directory never holds a half-written corpus.
        retriever.save_pretrained(attach_dir, corpus_format=args.corpus_format)
        _info(f"Attached the corpus to {args.attach_to} (retriever/).")
    return EXIT_OK


# ------------------------------------------------------------------------------------------------------------------
# ask
# ------------------------------------------------------------------------------------------------------------------


def _answer_questions(model, questions: list[str], args) -> list[list[dict]]:
    from .pipeline_realm import RealmQuestionAnsweringPipeline

    # Without a retriever (answering from --context) the tokenizer comes from the model directory.
    tokenizer = None if model.retriever is not None else _load_tokenizer(args.model)
    qa = RealmQuestionAnsweringPipeline(
        model=model, tokenizer=tokenizer, device=model.device, batch_size=args.batch_size
    )
    call_kwargs = {"top_k": args.top_k}
    if args.num_blocks is not None:
        call_kwargs["num_blocks"] = args.num_blocks
    if args.max_answer_len is not None:
        call_kwargs["max_answer_len"] = args.max_answer_len
    results = []
    chunks = range(0, len(questions), args.batch_size)
    # The pipeline validates all questions of a call first, so one bad line fails before any model work.
    for start in _progress(chunks, desc="Answering", unit="batch", disable=len(chunks) < 2, leave=False):
        chunk = questions[start : start + args.batch_size]
        kwargs = dict(call_kwargs)
        if args.context is not None:
            kwargs["context"] = args.context
        out = qa(chunk, **kwargs)
        for answers in out:
            answers = answers if isinstance(answers, list) else [answers]
            results.append([a for a in answers if a.get("answer")] or answers[:1])
    return results


def cmd_ask(args) -> int:
    questions = _read_questions(args)
    if args.top_k < 1:
        raise CLIError(f"--top-k must be at least 1, got {args.top_k}.")
    if args.batch_size < 1:
        raise CLIError(f"--batch-size must be at least 1, got {args.batch_size}.")
    model = _load_openqa(args.model, args.allow_pickle, args.device, need_retriever=args.context is None)
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
                if block:
                    title = f'"{block["title"]}" ' if block.get("title") else ""
                    source = f"  [source: {title}(block {block.get('id')})]"
                else:
                    source = "  [source: the given context]"
                out.write(f"{prefix} {answer['answer']}  (score {answer['score']:.3f}){source}\n")
            out.write("\n")
    out.flush()
    return EXIT_OK


# ------------------------------------------------------------------------------------------------------------------
# evaluate
# ------------------------------------------------------------------------------------------------------------------


def _normalize_metric_names(metrics: dict[str, float]) -> dict[str, float]:
    # Retrieval recall may come back as "answer_recall@k" (or prefixed twice); report it as "recall@k" everywhere.
    normalized = {}
    for name, value in metrics.items():
        match = re.match(r"^(.*?)(?:answer_)?recall@.*?(\d+)$", name)
        normalized[f"{match.group(1)}recall@{match.group(2)}" if match else name] = value
    return normalized


def _metrics_table(metrics: dict[str, float]) -> str:
    def fmt(name: str, value: float) -> str:
        if name.removeprefix("eval_") in ("exact_match", "f1"):
            return f"{value:.2f}"
        if float(value).is_integer():
            return str(int(value))
        return f"{value:.4f}"

    rows = [(name, fmt(name, value)) for name, value in metrics.items()]
    width = max(len("metric"), *(len(name) for name, _ in rows))
    value_width = max(len("value"), *(len(value) for _, value in rows))
    lines = [f"{'metric':<{width}}  {'value':>{value_width}}", f"{'-' * width}  {'-' * value_width}"]
    lines += [f"{name:<{width}}  {value:>{value_width}}" for name, value in rows]
    return "\n".join(lines)


def cmd_evaluate(args) -> int:
    from .metrics import exact_match_score, f1_score
    from .training.openqa import evaluate_openqa

    ks = sorted(set(args.ks))
    if any(k < 1 for k in ks):
        raise CLIError(f"--ks must be positive integers, got {args.ks}.")
    dataset = _load_qa(args.qa_file, args.question_column, args.answers_column, args.answers_separator, args.format)
    if args.limit:
        dataset = dataset.select(range(min(args.limit, len(dataset))))
    model = _load_openqa(args.model, args.allow_pickle, args.device)
    num_blocks = len(model.retriever)
    skipped = [k for k in ks if k > num_blocks]
    if skipped:
        logger.warning("Skipping recall@k for k > %d (the corpus size): %s.", num_blocks, skipped)
    _info(f"Evaluating {args.model} on {len(dataset)} questions from {args.qa_file}.")
    metrics = evaluate_openqa(
        model,
        dataset,
        batch_size=args.batch_size,
        recall_ks=[k for k in ks if k <= num_blocks] or [1],
        show_progress=not _State.quiet,
        return_predictions=True,
    )
    predictions = metrics.pop("predictions")
    metrics = _normalize_metric_names(metrics)
    print(_metrics_table(metrics))
    if args.output:
        report = dict(metrics, num_questions=len(dataset))
        _write_text_atomic(args.output, json.dumps(report, indent=2) + "\n")
        _info(f"Wrote {args.output}.")
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
        _write_text_atomic(args.predictions, "\n".join(lines) + "\n")
        _info(f"Wrote {args.predictions}.")
    return EXIT_OK


# ------------------------------------------------------------------------------------------------------------------
# convert
# ------------------------------------------------------------------------------------------------------------------

_PICKLE_REFUSAL = (
    "{records} is a pickled numpy array: loading it runs Python's pickle, which can execute arbitrary code if the "
    "file was tampered with. realm-hf never unpickles by default. If you trust this checkpoint (e.g. an official "
    "google/realm-* download), re-run with --allow-pickle: the output is pickle-free (safetensors weights, "
    "Arrow/Parquet corpus, FAISS index) and safe to share."
)


def _resolve_source(source: str, revision: str | None) -> str:
    if os.path.isdir(source):
        return source
    if not _is_hub_id(source):
        raise CLIError(f"Checkpoint {source!r} is not a directory (nor a Hub repo id).")
    if _hub_offline():
        raise CLIError(
            f"{source!r} is not a local directory and the Hub cannot be reached (HF_HUB_OFFLINE is set): download "
            "the checkpoint where the Hub is reachable and pass its local directory."
        )
    from huggingface_hub import snapshot_download

    _info(f"Downloading {source} from the Hub ...")
    try:
        return snapshot_download(source, revision=revision)
    except Exception as err:  # network errors come in many types (requests, httpx, hub errors)
        raise CLIError(
            f"Cannot download {source!r} from the Hub ({type(err).__name__}: {err}). If the Hub is unreachable from "
            "here, download the checkpoint elsewhere and pass its local directory."
        ) from err


def cmd_convert(args) -> int:
    from transformers import AutoModel

    source = _resolve_source(args.source, args.revision)
    output = os.path.abspath(args.output)
    if os.path.abspath(source) == output:
        raise CLIError("The output directory must differ from the checkpoint directory.")
    config = _config_of(source)
    architecture = _architecture(config)
    records = os.path.join(source, "block_records.npy")
    has_records = os.path.isfile(records)
    # Refuse before anything is written or loaded.
    if has_records and not args.allow_pickle:
        raise CLIError(_PICKLE_REFUSAL.format(records=records))
    _check_output_dir(output, args.overwrite)
    tokenizer = _load_tokenizer(source)

    with _atomic_output_dir(output, overwrite=args.overwrite) as tmp:
        if architecture == "RealmForOpenQA" or has_records:
            from .modeling_realm import RealmForOpenQA
            from .retrieval_realm import RealmRetriever

            retriever = None
            if has_records:
                # The conversion proper: pickled block texts + the `block_emb` buffer -> Arrow corpus + FAISS index.
                retriever = RealmRetriever.from_legacy(
                    source, tokenizer=tokenizer, allow_pickle=True, index=args.index
                )
            elif os.path.isdir(os.path.join(source, "retriever")):
                # Already in this format (e.g. re-saving as safetensors): keep its corpus.
                retriever = RealmRetriever.from_pretrained(os.path.join(source, "retriever"))
            model = RealmForOpenQA.from_pretrained(
                source, retriever=retriever if retriever is not None else _NO_RETRIEVER
            )
            if retriever is None:
                model.retriever = None
                logger.warning(
                    "%s has no block_records.npy: converting the weights only; build a corpus with `realm-hf index`.",
                    source,
                )
            _info(f"Loaded {source}; writing safetensors weights ...")
            model.save_pretrained(tmp, save_retriever=False)
            if retriever is not None:
                _info(f"Writing the corpus ({len(retriever)} blocks) and its {args.index} index ...")
                retriever.save_pretrained(os.path.join(tmp, "retriever"), corpus_format=args.corpus_format)
        else:
            if not architecture:
                raise CLIError(f"{source}/config.json names no architecture: cannot tell which REALM model it is.")
            model = AutoModel.from_pretrained(source)
            _info(f"Loaded {source} ({type(model).__name__}); writing safetensors weights ...")
            model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _write_conversion_card(tmp, model, args.source)
    _info(f"Converted {args.source} ({architecture or 'RealmForOpenQA'}) to {output}.")
    return EXIT_OK


def _write_conversion_card(directory: str, model, source: str) -> None:
    if type(model).__name__ != "RealmForOpenQA":
        return
    try:
        from .modelcard import write_model_card

        write_model_card(
            directory,
            model=model,
            base_model=source if _is_hub_id(source) and not os.path.isdir(source) else None,
            description=f"REALM Open-QA model converted from the legacy checkpoint `{source}` with `realm-hf convert`.",
        )
    except Exception as err:  # the card is a courtesy: never fail a conversion over it
        logger.warning("Could not write a model card: %s", err)


# ------------------------------------------------------------------------------------------------------------------
# push
# ------------------------------------------------------------------------------------------------------------------


def cmd_push(args) -> int:
    if not os.path.isdir(args.model_dir):
        raise CLIError(f"Model directory {args.model_dir!r} does not exist.")
    architecture = _architecture(_config_of(args.model_dir))
    if _hub_offline():
        raise CLIError(
            "Cannot push: HF_HUB_OFFLINE is set, so the Hub cannot be reached. Unset it (and log in with "
            "`hf auth login` or pass --token) to push."
        )
    if args.corpus_repo_id and architecture != "RealmForOpenQA":
        raise CLIError("--corpus-repo-id needs a RealmForOpenQA model directory (with a retriever/).")
    from . import hub

    def hub_call(what: str, fn, *a, **kw):
        try:
            return fn(*a, **kw)
        except (CLIError, KeyboardInterrupt):
            raise
        except Exception as err:  # connection, auth and repo errors from huggingface_hub
            endpoint = args.endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
            raise CLIError(f"Could not {what} ({endpoint}): {type(err).__name__}: {err}") from err

    common = dict(private=args.private, token=args.token, revision=args.revision, endpoint=args.endpoint)
    if architecture == "RealmForOpenQA":
        model = _load_openqa(args.model_dir, need_retriever=False, device="cpu")
        tokenizer = _load_tokenizer(args.model_dir) if model.retriever is None else None
        save_retriever = model.retriever is not None and not args.no_corpus
        if args.corpus_repo_id:
            if model.retriever is None:
                raise CLIError(f"{args.model_dir} has no retriever/ to push as a corpus.")
            info = hub_call(
                f"push the corpus to {args.corpus_repo_id}",
                hub.push_corpus_to_hub,
                model.retriever,
                args.corpus_repo_id,
                commit_message=args.commit_message,
                **common,
            )
            # Pin the commit so that the model always loads the index it was pushed with.
            revision = getattr(info, "oid", None) or args.revision
            hub.set_retriever_reference(model.config, args.corpus_repo_id, revision=revision, repo_type="dataset")
            save_retriever = False
            _info(f"Pushed the corpus to dataset repo {args.corpus_repo_id}.")
        info = hub_call(
            f"push to {args.repo_id}",
            hub.push_to_hub,
            model,
            args.repo_id,
            tokenizer=tokenizer,
            commit_message=args.commit_message,
            save_retriever=save_retriever,
            **common,
        )
    else:
        from huggingface_hub import HfApi

        api = HfApi(endpoint=args.endpoint, token=args.token)
        repo_id = hub_call(
            f"create {args.repo_id}", api.create_repo, args.repo_id, private=args.private, exist_ok=True
        ).repo_id
        if args.revision:
            hub_call(f"create branch {args.revision}", api.create_branch, repo_id, branch=args.revision, exist_ok=True)
        info = hub_call(
            f"upload to {repo_id}",
            api.upload_folder,
            repo_id=repo_id,
            folder_path=args.model_dir,
            revision=args.revision,
            commit_message=args.commit_message or f"Upload {architecture or 'REALM model'}",
        )
    url = getattr(info, "commit_url", None) or getattr(info, "repo_url", None) or args.repo_id
    _info(f"Pushed {args.model_dir} to {url}.")
    return EXIT_OK


# ------------------------------------------------------------------------------------------------------------------
# train
# ------------------------------------------------------------------------------------------------------------------

# Top-level keys of a training config; values that are paths are resolved against the config file's directory.
_TRAIN_KEYS = {
    "task": "finetune (Open-QA, default) or pretrain (REALM masked-LM pre-training)",
    "model": "REALM model directory to start from (RealmForOpenQA for finetune, RealmForPreTraining for pretrain)",
    "init_from_bert": "BERT-layout checkpoint directory to initialise a new model from (instead of `model`)",
    "model_config": "RealmConfig overrides when initialising from BERT (e.g. retriever_proj_size, reader_beam_size)",
    "legacy_embedder": "pretrain: legacy RealmEmbedder/RealmScorer directory (with legacy_encoder)",
    "legacy_encoder": "pretrain: legacy RealmKnowledgeAugEncoder directory",
    "allow_pickle": "allow unpickling a legacy block_records.npy (trusted files only)",
    "corpus": "saved corpus + index directory (RealmRetriever.save_pretrained / realm-hf index)",
    "documents": "documents file(s) (JSONL/CSV/Parquet with title/text) to build the corpus from",
    "text_column": "text column of `documents` (default text)",
    "title_column": "title column of `documents` (default title)",
    "index": "FAISS factory string when building the corpus (default Flat)",
    "max_block_length": "wordpieces per block when building the corpus (default 288)",
    "train_file": "finetune: QA JSONL/CSV/Parquet (question, answers); pretrain: texts (text[, block_id])",
    "eval_file": "held-out file in the same format",
    "train_from_corpus": "pretrain: use the corpus blocks themselves as training texts",
    "question_column": "question column of the QA files (default question)",
    "answers_column": "answers column of the QA files (default answers)",
    "output_dir": "where checkpoints and the final model (with its retriever) go",
    "training_args": "transformers TrainingArguments fields (learning_rate, max_steps, ...)",
    "refresh_steps": "re-index the corpus every N steps with the document embedder (RealmReindexCallback)",
    "reindex_background": "refresh in a background thread while training goes on (default true)",
    "reindex_batch_size": "blocks per embedding batch when re-indexing (default 128)",
    "train_document_embedder": "finetune: train a document embedder too (end-to-end retriever training)",
    "recall_ks": "finetune: recall@k cut-offs for evaluation (default [1, 5])",
    "lora": "finetune: LoRA settings ({r, alpha, dropout, targets, target_modules}); saves adapter/ and merges",
    "masking": "pretrain: DataCollatorForSalientSpanMasking options (max_length, mask_rate, seed, ...)",
    "export_components": "pretrain: also write embedder/, encoder/ (legacy layouts) into the output",
    "seed": "random seed, set before the model is built (default: training_args.seed or 42)",
}
_MODEL_KEYS = ("model", "init_from_bert", "legacy_embedder", "legacy_encoder")
_PATH_KEYS = (
    "model",
    "init_from_bert",
    "legacy_embedder",
    "legacy_encoder",
    "corpus",
    "documents",
    "train_file",
    "eval_file",
    "output_dir",
)


def load_train_config(path: str, overrides: Sequence[str] = ()) -> dict:
    """
    Read a `realm-hf train` config (JSON, or YAML for `.yaml`/`.yml`), resolve its relative paths against the config
    file's directory, apply `--set KEY=VALUE` overrides (values parsed as YAML; dotted keys reach into
    `training_args`, `lora`, ...) and check the keys.
    """
    import yaml

    if not os.path.isfile(path):
        raise CLIError(f"Config file {path!r} does not exist.")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        if path.lower().endswith((".yaml", ".yml")):
            config = yaml.safe_load(text)
        else:
            config = json.loads(text)
    except (yaml.YAMLError, json.JSONDecodeError) as err:
        raise CLIError(f"{path}: cannot parse the config: {err}") from err
    if not isinstance(config, dict):
        raise CLIError(f"{path}: the config must be a mapping of keys to values.")
    base = os.path.dirname(os.path.abspath(path))

    def resolve(value, may_be_hub_id: bool):
        if isinstance(value, list):
            return [resolve(v, may_be_hub_id) for v in value]
        if not isinstance(value, str) or not value:
            return value
        if value.startswith("~") or os.path.isabs(value):
            return os.path.expanduser(value)
        candidate = os.path.normpath(os.path.join(base, value))
        # A model may be a Hub id ("google/realm-..."): kept as is unless a local path of that name exists.
        if may_be_hub_id and not os.path.exists(candidate) and _is_hub_id(value):
            return value
        return candidate

    for key in _PATH_KEYS:
        if config.get(key) is not None:
            config[key] = resolve(config[key], may_be_hub_id=key in _MODEL_KEYS)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise CLIError(f"--set expects KEY=VALUE, got {item!r}.")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        if isinstance(value, bool) and raw.strip().lower() not in ("true", "false"):
            value = raw  # YAML 1.1 reads `no`/`yes`/`on`/`off` as booleans: save_strategy=no means "no"
        target = config
        parts = key.split(".")
        for part in parts[:-1]:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                raise CLIError(f"--set {key}: {part} is not a mapping.")
        target[parts[-1]] = value
    unknown = sorted(set(config) - set(_TRAIN_KEYS))
    if unknown:
        raise CLIError(
            f"{path}: unknown config key(s) {', '.join(unknown)}; known keys: {', '.join(sorted(_TRAIN_KEYS))}."
        )
    task = config.setdefault("task", "finetune")
    if task not in ("finetune", "pretrain"):
        raise CLIError(f"{path}: task must be 'finetune' or 'pretrain', got {task!r}.")
    if not config.get("output_dir"):
        raise CLIError(f"{path}: output_dir is required.")
    return config


def _resolve_seed(config: dict) -> int:
    """The run's seed: `seed`, else `training_args.seed`, else 42 (TrainingArguments' default)."""
    training_seed = (config.get("training_args") or {}).get("seed")
    seed = config.get("seed")
    seed = seed if seed is not None else training_seed if training_seed is not None else 42
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise CLIError(f"seed must be an integer, got {seed!r}.")
    return seed


def _seed_run(config: dict) -> int:
    """
    Seed python, numpy and torch before any model is built (and record the seed in `config`). The Trainer seeds only
    once created, after `init_from_bert` drew the fresh heads and LoRA its adapters: runs of one config diverged.
    """
    from transformers import enable_full_determinism, set_seed

    seed = _resolve_seed(config)
    training_seed = (config.get("training_args") or {}).get("seed")
    if training_seed is not None and training_seed != seed:
        logger.warning("seed %s overrides training_args.seed %s.", seed, training_seed)
    config["seed"] = seed
    if (config.get("training_args") or {}).get("full_determinism"):
        enable_full_determinism(seed)
    else:
        set_seed(seed)
    return seed


def _training_arguments(config: dict):
    from transformers import TrainingArguments

    values = dict(config.get("training_args") or {})
    # No experiment trackers unless asked for (they would try to reach the network), and no tqdm in quiet mode.
    values.setdefault("report_to", "none")
    values.setdefault("disable_tqdm", _State.quiet)
    # The Trainer reseeds with this (before training, and its data order): the same seed the model was built with.
    values["seed"] = _resolve_seed(config)
    values["output_dir"] = config["output_dir"]
    try:
        return TrainingArguments(**values)
    except TypeError as err:
        raise CLIError(f"Invalid training_args: {err}") from err


def _attach_corpus(model, config: dict, embedder, tokenizer) -> None:
    from .retrieval_realm import RealmRetriever

    if config.get("corpus") and config.get("documents"):
        raise CLIError("Give either `corpus` (a saved corpus) or `documents` (to build one), not both.")
    if config.get("corpus"):
        if not os.path.isdir(config["corpus"]):
            raise CLIError(f"corpus {config['corpus']!r} is not a directory.")
        model.set_retriever(RealmRetriever.from_pretrained(config["corpus"], embedder=embedder))
    elif config.get("documents"):
        paths = config["documents"] if isinstance(config["documents"], list) else [config["documents"]]
        doc_args = argparse.Namespace(
            format="auto",
            split="train",
            text_column=config.get("text_column", "text"),
            title_column=config.get("title_column", "title"),
            id_column=None,
        )
        documents = _load_documents(paths, doc_args)
        _info(f"Building the corpus from {len(documents)} documents ...")
        model.set_retriever(
            RealmRetriever.from_documents(
                documents,
                embedder,
                tokenizer,
                max_block_length=int(config.get("max_block_length", 288)),
                index=config.get("index", "Flat"),
                show_progress=not _State.quiet,
            )
        )
    if getattr(model, "retriever", None) is None:
        raise CLIError("No corpus: give `corpus` or `documents` in the config, or a `model` saved with a retriever/.")


def _reindex_callbacks(model, config: dict) -> list:
    refresh_steps = config.get("refresh_steps")
    if not refresh_steps:
        return []
    from .training.callbacks import RealmReindexCallback

    return [
        RealmReindexCallback(
            model.retriever,
            refresh_steps=int(refresh_steps),
            batch_size=int(config.get("reindex_batch_size", 128)),
            background=bool(config.get("reindex_background", True)),
        )
    ]


def _evaluations(trainer) -> list[dict]:
    """
    Every evaluation the Trainer logged (`eval_on_start`, `eval_strategy`, the final one), in step order: the metrics
    before the first step are otherwise only printed.
    """
    return [
        {"step": entry.get("step"), **{k: v for k, v in entry.items() if k.startswith("eval_")}}
        for entry in trainer.state.log_history
        if any(k.startswith("eval_") for k in entry)
    ]


def _train_finetune(config: dict, args) -> dict:
    from .modeling_realm import RealmForOpenQA
    from .training.openqa import RealmOpenQATrainer

    if bool(config.get("model")) == bool(config.get("init_from_bert")):
        raise CLIError("Give exactly one of `model` (a REALM directory) and `init_from_bert` (a BERT directory).")
    if config.get("refresh_steps") and not config.get("train_document_embedder"):
        raise CLIError(
            "refresh_steps re-embeds the corpus with the document embedder, which only changes when it trains: set "
            "train_document_embedder: true (or drop refresh_steps; REALM fine-tuning keeps the index fixed)."
        )
    if config.get("model"):
        _require_local_or_hub(config["model"], "model")
        model = RealmForOpenQA.from_pretrained(config["model"], allow_pickle=bool(config.get("allow_pickle")))
        tokenizer = None
    else:
        from .initialization import init_from_bert

        model = init_from_bert(RealmForOpenQA, config["init_from_bert"], **(config.get("model_config") or {}))
        tokenizer = _load_tokenizer(config["init_from_bert"])
    if config.get("corpus") or config.get("documents"):
        if tokenizer is None:
            tokenizer = model.retriever.tokenizer if model.retriever is not None else _load_tokenizer(config["model"])
        embedder = model.document_embedder if model.document_embedder is not None else model.embedder
        _attach_corpus(model, config, embedder, tokenizer)
    elif model.retriever is None:
        model._require_retriever()
    if config.get("train_document_embedder") and model.document_embedder is None:
        model.add_document_embedder()

    question_column = config.get("question_column", "question")
    answers_column = config.get("answers_column", "answers")
    if not config.get("train_file"):
        raise CLIError("finetune needs a train_file (JSONL/CSV/Parquet with question and answers).")
    train_dataset = _load_qa(config["train_file"], question_column, answers_column)
    eval_dataset = _load_qa(config["eval_file"], question_column, answers_column) if config.get("eval_file") else None

    training_model = model
    lora = config.get("lora")
    if lora:
        from .peft_utils import add_lora

        if not isinstance(lora, dict):
            lora = {}
        unknown = sorted(set(lora) - {"r", "alpha", "dropout", "targets", "target_modules"})
        if unknown:
            raise CLIError(f"Unknown lora option(s): {', '.join(unknown)}.")
        if config.get("train_document_embedder") and "document_embedder" not in (lora.get("targets") or ()):
            logger.warning(
                "With LoRA only the adapted components train: the document embedder stays frozen unless "
                "lora.targets includes 'document_embedder'."
            )
        training_model = add_lora(model, **lora)
    training_args = _training_arguments(config)
    trainer = RealmOpenQATrainer(
        model=training_model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        recall_ks=tuple(config.get("recall_ks") or (1, 5)),
        callbacks=_reindex_callbacks(model, config),
    )
    _info(f"Fine-tuning on {len(train_dataset)} questions; output in {config['output_dir']}.")
    result = trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    metrics = {"train_loss": float(result.training_loss), "global_step": int(result.global_step)}
    if eval_dataset is not None:
        metrics.update(_normalize_metric_names(trainer.evaluate()))
        metrics["evaluations"] = [_normalize_metric_names(entry) for entry in _evaluations(trainer)]

    output_dir = config["output_dir"]
    final_model = model
    if lora:
        from .peft_utils import merge_adapter, save_adapter

        save_adapter(training_model, os.path.join(output_dir, "adapter"))
        final_model = merge_adapter(training_model)
    final_model.save_pretrained(output_dir)
    model.retriever.tokenizer.save_pretrained(output_dir)
    _write_training_card(output_dir, final_model, metrics, training_args, config)
    return metrics


def _train_pretrain(config: dict, args) -> dict:
    try:
        from .modeling_pretraining import RealmForPreTraining
        from .training.masking import DataCollatorForSalientSpanMasking
    except ImportError as err:
        raise CLIError(f"REALM pre-training is not available in this installation ({err}).") from err
    from transformers import Trainer

    from .training.callbacks import place_reindex_callbacks_first

    sources = [k for k in ("model", "init_from_bert", "legacy_embedder") if config.get(k)]
    if len(sources) != 1:
        raise CLIError("Give exactly one of `model`, `init_from_bert`, or `legacy_embedder` + `legacy_encoder`.")
    overrides = config.get("model_config") or {}
    if config.get("model"):
        model = RealmForPreTraining.from_pretrained(config["model"])
        tokenizer = _load_tokenizer(config["model"])
    elif config.get("init_from_bert"):
        from .initialization import init_from_bert

        model = init_from_bert(RealmForPreTraining, config["init_from_bert"], **overrides)
        tokenizer = _load_tokenizer(config["init_from_bert"])
    else:
        if not config.get("legacy_encoder"):
            raise CLIError("`legacy_embedder` needs `legacy_encoder` too.")
        model = RealmForPreTraining.from_legacy_checkpoints(
            config["legacy_embedder"], config["legacy_encoder"], **overrides
        )
        tokenizer = _load_tokenizer(config["legacy_embedder"], config["legacy_encoder"])
    if config.get("corpus") or config.get("documents"):
        _attach_corpus(model, config, model.document_embedder, tokenizer)
    elif model.retriever is None:
        raise CLIError("pretrain needs a corpus: give `corpus` or `documents` in the config.")
    model.tokenizer = tokenizer

    def texts_from(path):
        import datasets

        table = _load_table([path])
        if "text" not in table.column_names:
            raise CLIError(f"{path} has no 'text' column (columns: {', '.join(table.column_names)}).")
        keep = [c for c in ("text", "block_id", "salient_spans") if c in table.column_names]
        return table.select_columns(keep) if isinstance(table, datasets.Dataset) else table

    if config.get("train_from_corpus"):
        train_dataset = model.retriever.corpus.select_columns(["text", "block_id"])
    elif config.get("train_file"):
        train_dataset = texts_from(config["train_file"])
    else:
        raise CLIError("pretrain needs a train_file of texts, or train_from_corpus: true.")
    eval_dataset = texts_from(config["eval_file"]) if config.get("eval_file") else None

    masking = dict(config.get("masking") or {})
    masking.setdefault("max_length", int(getattr(model.config, "max_position_embeddings", 512)) // 2)
    # Without a seed the collator's generator draws one from the OS: other masks, other losses on every run.
    masking.setdefault("seed", _resolve_seed(config))
    try:
        collator = DataCollatorForSalientSpanMasking(tokenizer, **masking)
    except TypeError as err:
        raise CLIError(f"Invalid masking options: {err}") from err
    training_args = _training_arguments(
        dict(config, training_args={"remove_unused_columns": False, **(config.get("training_args") or {})})
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=collator,
        callbacks=_reindex_callbacks(model, config),
    )
    place_reindex_callbacks_first(trainer)  # so report_to integrations receive the refresh metrics
    _info(f"Pre-training on {len(train_dataset)} texts; output in {config['output_dir']}.")
    result = trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    metrics = {"train_loss": float(result.training_loss), "global_step": int(result.global_step)}
    if eval_dataset is not None:
        metrics.update(trainer.evaluate())
        metrics["evaluations"] = _evaluations(trainer)
    model.save_pretrained(config["output_dir"])
    tokenizer.save_pretrained(config["output_dir"])
    if config.get("export_components"):
        model.export_components(config["output_dir"])
    return metrics


def _write_training_card(output_dir: str, model, metrics: dict, training_args, config: dict) -> None:
    try:
        from .modelcard import write_model_card

        base = config.get("model") or config.get("init_from_bert")
        write_model_card(
            output_dir,
            model=model,
            eval_results={k: v for k, v in metrics.items() if k.startswith("eval_")} or None,
            training_args=training_args,
            base_model=base if base and _is_hub_id(base) and not os.path.exists(base) else None,
        )
    except Exception as err:  # the card is a courtesy: the trained model is already saved
        logger.warning("Could not write a model card: %s", err)


def cmd_train(args) -> int:
    config = load_train_config(args.config, args.set or [])
    if args.output_dir:
        config["output_dir"] = args.output_dir
    # Fail on a missing file before spending minutes loading models.
    for key in (
        "train_file",
        "eval_file",
        "corpus",
        "documents",
        "init_from_bert",
        "legacy_embedder",
        "legacy_encoder",
    ):
        values = config.get(key)
        for value in values if isinstance(values, list) else [values]:
            if value and not os.path.exists(value):
                raise CLIError(f"{key} {value!r} does not exist.")
    if config.get("model"):
        _require_local_or_hub(config["model"], "model")
    # Before anything random: fresh heads, LoRA adapters, the masking collator.
    _seed_run(config)
    if config["task"] == "pretrain":
        metrics = _train_pretrain(config, args)
    else:
        metrics = _train_finetune(config, args)
    metrics_path = os.path.join(config["output_dir"], "train_results.json")
    _write_text_atomic(metrics_path, json.dumps(metrics, indent=2) + "\n")
    printable = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
    print(_metrics_table({k: float(v) for k, v in printable.items()}))
    _info(f"Saved the model and its retriever to {config['output_dir']}.")
    return EXIT_OK


# ------------------------------------------------------------------------------------------------------------------
# Parser
# ------------------------------------------------------------------------------------------------------------------

_EPILOGS = {
    "index": """examples:
  realm-hf index docs.jsonl --model my-realm-model --output my-corpus
  realm-hf index docs.csv --text-column body --title-column headline --model my-realm-model \\
      --index HNSW32 --output my-corpus
  realm-hf index saved_dataset_dir --model my-realm-model --attach-to my-realm-model --overwrite
  realm-hf index docs.parquet --model qa-model --document-embedder pretrained-embedder --output corpus""",
    "ask": """examples:
  realm-hf ask "who designed the torre alba lighthouse?" --model my-realm-model
  realm-hf ask --file questions.txt --model my-realm-model --top-k 3 --json > answers.jsonl
  realm-hf ask "who wrote it?" --context "Unix was written by Ken Thompson." --model my-realm-model""",
    "train": """examples:
  realm-hf train examples/train_config_example.json
  realm-hf train config.yaml --set training_args.max_steps=100 --set lora.r=16 --output-dir runs/lora16

config keys (JSON or YAML; relative paths are relative to the config file):
"""
    + "\n".join(f"  {key:<24}{help_}" for key, help_ in _TRAIN_KEYS.items()),
    "evaluate": """examples:
  realm-hf evaluate dev.jsonl --model my-realm-model --ks 1 5 20 --output metrics.json
  realm-hf evaluate dev.csv --answers-column golds --answers-separator ";" --model my-realm-model

QA files: JSONL (or a JSON array), CSV or Parquet with a question column and an answers column holding a list of
strings, one string, a JSON list or SQuAD's {"text": [...]}.""",
    "convert": """examples:
  realm-hf convert path/to/realm-orqa-nq-openqa realm-orqa-nq --allow-pickle
  realm-hf convert google/realm-orqa-nq-openqa realm-orqa-nq --allow-pickle --index HNSW32
  realm-hf convert path/to/realm-cc-news-pretrained-embedder embedder-converted

Legacy RealmForOpenQA checkpoints keep their block texts in a pickled block_records.npy; unpickling can run
arbitrary code, so it needs --allow-pickle (for files you trust). The output holds no pickle: safetensors
weights, the tokenizer, and retriever/ (Arrow corpus, FAISS index, manifest).""",
    "push": """examples:
  realm-hf push my-realm-model --repo-id me/realm-foldoc
  realm-hf push my-realm-model --repo-id me/realm-foldoc --corpus-repo-id me/foldoc-corpus --private""",
}


def _add_common(parser: argparse.ArgumentParser, top_level: bool) -> None:
    # On subcommands the defaults are suppressed so that `realm-hf --debug ask ...` is not reset by the subparser.
    default = False if top_level else argparse.SUPPRESS
    parser.add_argument("--debug", action="store_true", default=default, help="show tracebacks on errors")
    parser.add_argument(
        "-q", "--quiet", action="store_true", default=default, help="no progress bars or status messages"
    )


def build_parser() -> argparse.ArgumentParser:
    """The `realm-hf` argument parser (one subparser per command)."""
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="realm-hf",
        description="REALM (retrieval-augmented language models) for the Hugging Face ecosystem.",
        epilog="Run `realm-hf <command> --help` for a command's options and examples.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"realm-hf {__version__}")
    _add_common(parser, top_level=True)
    commands = parser.add_subparsers(dest="command", metavar="<command>")

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name,
            help=help_,
            description=help_,
            epilog=_EPILOGS.get(name),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        _add_common(sub, top_level=False)
        return sub

    # index
    p = add("index", "Build a corpus and FAISS index from documents (JSONL/CSV/Parquet or a saved dataset).")
    p.add_argument("documents", nargs="+", help="documents file(s), or one `datasets.save_to_disk` directory")
    p.add_argument("--model", help="REALM model directory whose embedder builds the index (default: --attach-to)")
    p.add_argument("--document-embedder", help="embed with this RealmEmbedder (or scorer/model) directory instead")
    p.add_argument("--output", help="directory to save the corpus + index in")
    p.add_argument("--attach-to", metavar="MODEL_DIR", help="also save it as MODEL_DIR/retriever/")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output or retriever/")
    p.add_argument("--text-column", default="text", help="column with the document text (default: text)")
    p.add_argument("--title-column", default="title", help="column with the title (default: title; optional)")
    p.add_argument("--id-column", help="column with a document id (kept as doc_id, for remove_documents)")
    p.add_argument("--format", default="auto", choices=["auto", "json", "csv", "parquet", "dataset"])
    p.add_argument("--split", default="train", help="split of a saved DatasetDict (default: train)")
    p.add_argument(
        "--index", default="Flat", help="FAISS factory string: Flat, HNSW32, IVF1024,Flat, ... (default: Flat)"
    )
    p.add_argument(
        "--max-block-length", type=int, default=288, help="wordpieces per block, title included (default: 288)"
    )
    p.add_argument("--batch-size", type=int, default=64, help="blocks per embedding batch (default: 64)")
    p.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: cuda if available)")
    p.add_argument("--dtype", help="autocast dtype for embedding on GPU: float16 or bfloat16")
    p.add_argument("--train-size", type=int, help="vectors to train IVF/PQ indexes on (default: all)")
    p.add_argument(
        "--corpus-format", default="arrow", choices=["arrow", "parquet"], help="corpus storage (default: arrow)"
    )
    p.set_defaults(func=cmd_index)

    # ask
    p = add("ask", "Answer questions with a REALM model (retrieval from its corpus, then the reader).")
    p.add_argument("questions", nargs="*", metavar="QUESTION", help="question(s) to answer")
    p.add_argument("--model", required=True, help="RealmForOpenQA directory (with retriever/) or Hub id")
    p.add_argument("--file", help="questions file: one per line, or JSONL with 'question'; '-' reads stdin")
    p.add_argument("--top-k", type=int, default=1, help="answers per question (default: 1)")
    p.add_argument("--num-blocks", type=int, help="blocks retrieved and read per question (default: reader_beam_size)")
    p.add_argument("--max-answer-len", type=int, help="longest answer in wordpieces (default: max_span_width)")
    p.add_argument("--context", help="answer from this passage instead of retrieving")
    p.add_argument("--json", action="store_true", help="JSON lines: question, rank, answer, score, start, end, block")
    p.add_argument("--batch-size", type=int, default=8, help="questions per forward pass (default: 8)")
    p.add_argument("--device", help="cpu, cuda, ... (default: cuda if available)")
    p.add_argument("--allow-pickle", action="store_true", help="allow a legacy block_records.npy (trusted files only)")
    p.set_defaults(func=cmd_ask)

    # train
    p = add("train", "Fine-tune (Open-QA) or pre-train (REALM) a model from a JSON/YAML config file.")
    p.add_argument("config", help="config file (.json, .yaml or .yml)")
    p.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="override a config value (dotted keys, YAML values)"
    )
    p.add_argument("--output-dir", help="override output_dir")
    p.add_argument("--resume-from-checkpoint", help="checkpoint directory to resume from")
    p.set_defaults(func=cmd_train)

    # evaluate
    p = add("evaluate", "Exact match, F1 and retrieval recall@k of a REALM model on a QA file.")
    p.add_argument("qa_file", help="JSONL/CSV/Parquet file with questions and gold answers")
    p.add_argument("--model", required=True, help="RealmForOpenQA directory (with retriever/) or Hub id")
    p.add_argument("--ks", type=int, nargs="+", default=[1, 5, 20], help="recall@k cut-offs (default: 1 5 20)")
    p.add_argument("--output", help="write the metrics as JSON here")
    p.add_argument("--predictions", help="write per-question predictions (JSONL) here")
    p.add_argument("--question-column", default="question")
    p.add_argument("--answers-column", default="answers")
    p.add_argument("--answers-separator", default="|", help="separator of answers in a CSV text cell (default: |)")
    p.add_argument("--format", default="auto", choices=["auto", "json", "csv", "parquet", "dataset"])
    p.add_argument("--limit", type=int, help="evaluate the first N questions only")
    p.add_argument("--batch-size", type=int, default=16, help="questions per forward pass (default: 16)")
    p.add_argument("--device", help="cpu, cuda, ... (default: cuda if available)")
    p.add_argument("--allow-pickle", action="store_true", help="allow a legacy block_records.npy (trusted files only)")
    p.set_defaults(func=cmd_evaluate)

    # convert
    p = add("convert", "Convert a legacy REALM checkpoint (google/realm-* layout) to safetensors + Arrow + FAISS.")
    p.add_argument("source", help="legacy checkpoint directory (or Hub id, downloaded when the Hub is reachable)")
    p.add_argument("output", help="output directory (written atomically)")
    p.add_argument("--allow-pickle", action="store_true", help="unpickle block_records.npy (trusted files only)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing, non-empty output directory")
    p.add_argument("--index", default="Flat", help="FAISS factory string for the corpus (default: Flat, exact)")
    p.add_argument(
        "--corpus-format", default="arrow", choices=["arrow", "parquet"], help="corpus storage (default: arrow)"
    )
    p.add_argument("--revision", help="Hub revision when SOURCE is a repo id")
    p.set_defaults(func=cmd_convert)

    # push
    p = add("push", "Push a model directory (weights, tokenizer, retriever/, model card) to the Hugging Face Hub.")
    p.add_argument("model_dir", help="model directory to push")
    p.add_argument("--repo-id", required=True, help="target model repo, e.g. me/realm-foldoc")
    p.add_argument("--private", action="store_true", default=None, help="create the repo as private")
    p.add_argument("--revision", help="branch to push to (created if needed)")
    p.add_argument("--corpus-repo-id", help="push the corpus + index as this dataset repo and reference it")
    p.add_argument("--no-corpus", action="store_true", help="push the model without its corpus")
    p.add_argument("--commit-message")
    p.add_argument("--token", help="Hub token (default: the logged-in token)")
    p.add_argument("--endpoint", help="Hub endpoint (default: HF_ENDPOINT or huggingface.co)")
    p.set_defaults(func=cmd_push)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `realm-hf`. Returns the exit status (0 on success, 2 on bad input)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help, --version and argparse's own usage errors
        return int(exit_.code or 0) if not isinstance(exit_.code, str) else EXIT_ERROR
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    _State.quiet = bool(args.quiet)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s", stream=sys.stderr)
    try:
        with _library_progress_bars(enabled=not _State.quiet):
            return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, KeyError, ImportError) as err:
        if args.debug:
            traceback.print_exc()
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"error: {message}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
