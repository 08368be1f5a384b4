"""
The `realm-hf` console script: the entry point that parses the arguments (with [`realm_hf_cli_parser`]) and runs a
command once they parse.

This module lives outside the `realm_hf` package on purpose. `import realm_hf` registers the `realm` model type with
transformers' Auto classes, which needs the model classes and so torch and transformers (about 6 s to import on 2
cores); Python runs a package's `__init__` before any of its modules, so a parser inside `realm_hf` could not print
`--help` without them. Here nothing heavy is imported until a command runs: `realm-hf <command> --help`, `--version`
and usage errors answer at once. The commands themselves live in [`realm_hf.cli`] (`realm_hf/cli/common.py` runs
them); `python -m realm_hf.cli` and `realm_hf.cli.main(argv)` call this same parser.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Sequence

from realm_hf_cli_parser import (  # noqa: F401 - EXIT_OK, TRAIN_KEYS, is_hub_id re-exported: importable from here
    EXIT_ERROR,
    EXIT_OK,
    TRAIN_KEYS,
    build_parser,
    is_hub_id,
)

# The arguments that name files or directories, per command: (attribute, what, may be a Hub id).
_PATH_ARGUMENTS = {
    "index": [("documents", "Input", False), ("model", "Model directory", False),
              ("document_embedder", "Embedder directory", False), ("attach_to", "--attach-to model directory", False)],
    "ask": [("model", "Model", True), ("file", "Question file", False)],
    "evaluate": [("qa_file", "QA file", False), ("model", "Model", True)],
    "train": [("config", "Config file", False)],
    "convert": [("source", "Legacy checkpoint", True)],
    "push": [("model_dir", "Model directory", False)],
}  # fmt: skip


def missing_path(args: argparse.Namespace) -> str | None:
    """
    The error for the first path argument of `args` that does not exist, or `None`: checked before the command imports
    torch (5-8 s), so that a mistyped path is reported at once. A Hub repo id is left to the command (it may download),
    except when `HF_HUB_OFFLINE` is set and the repo is not in the local cache.
    """
    for attribute, what, hub in _PATH_ARGUMENTS.get(args.command, []):
        values = getattr(args, attribute, None)
        for value in values if isinstance(values, list) else [values]:
            if value is None or value == "-" or os.path.exists(value):
                continue
            if not (hub and is_hub_id(value)):
                return f"{what} {value!r} does not exist."
            if _offline() and not _in_hub_cache(value):
                return (
                    f"{what} {value!r} is not a local path, and HF_HUB_OFFLINE is set while the Hub repo {value!r} is "
                    "not in the local cache: give a local directory, or unset HF_HUB_OFFLINE to download it."
                )
    return None


# Option values a command would refuse after importing torch (seconds): checked right after parsing instead.
# command -> {option attribute: smallest value}
_MINIMUMS = {
    "ask": {"top_k": 1, "batch_size": 1, "num_blocks": 1, "max_answer_len": 1},
    "evaluate": {"limit": 1, "batch_size": 1},
    "index": {"max_block_length": 8, "batch_size": 1, "train_size": 1},
    "serve": {"top_k": 1, "num_blocks": 1, "concurrency": 1},
}
_UNITS = {"max_block_length": " wordpieces"}


def option_problem(args: argparse.Namespace) -> str | None:
    """
    The error for the first option value of `args` that its command would refuse (a count below its minimum, a port
    out of range, a `--text-column` the documents do not have), or `None`: checked before the command imports torch,
    so that `ask --top-k 0` or `serve --port 99999` is reported at once. The commands check again when called
    directly.
    """
    for attribute, minimum in _MINIMUMS.get(args.command, {}).items():
        value = getattr(args, attribute, None)
        if value is not None and value < minimum:
            option = "--" + attribute.replace("_", "-")
            return f"{option} must be at least {minimum}{_UNITS.get(attribute, '')}, got {value}."
    if args.command == "serve" and not 0 <= args.port <= 65535:
        return f"--port must be from 0 to 65535, got {args.port}."
    if args.command == "evaluate" and any(k < 1 for k in args.ks):
        return f"--ks must be positive integers, got {args.ks}."
    if args.command == "index":
        return _document_columns_problem(args)
    return None


def _document_columns_problem(args: argparse.Namespace) -> str | None:
    """A `--text-column` (or a `--title-column` / `--id-column` given) that a documents file lacks, read from its
    first record, header or schema; `None` when all are there or a file cannot be read cheaply (the command says)."""
    wanted = [("text", args.text_column)]
    if args.title_column != "title":  # the default title column may be missing (blocks get no title)
        wanted.append(("title", args.title_column))
    if args.id_column:
        wanted.append(("id", args.id_column))
    for path in args.documents:
        columns = _peek_columns(path, args.format, args.split)
        if columns is None:
            continue
        for role, column in wanted:
            if column not in columns:
                fix = f"choose one with --{role}-column" if role == "text" else f"check --{role}-column"
                return f"The documents have no {role} column {column!r} ({path}: columns {', '.join(columns)}); {fix}."
    return None


def _peek_columns(path: str, fmt: str, split: str) -> list[str] | None:
    """The column names of a documents file (first JSON line, CSV header, Parquet schema, saved dataset's info)."""
    import csv
    import gzip
    import json

    lower = path.lower().removesuffix(".gz")
    kind = fmt if fmt != "auto" else "dataset" if os.path.isdir(path) else os.path.splitext(lower)[1].lstrip(".")
    try:
        if kind in ("json", "jsonl", "ndjson"):
            with (gzip.open if path.lower().endswith(".gz") else open)(path, "rt", encoding="utf-8-sig") as f:
                line = next((line for line in f if line.strip()), "")
            record = json.loads(line) if line.lstrip().startswith("{") else None  # a JSON array: left to the command
            return list(record) if isinstance(record, dict) else None
        if kind in ("csv", "tsv"):
            with (gzip.open if path.lower().endswith(".gz") else open)(path, "rt", encoding="utf-8-sig") as f:
                header = next(csv.reader(f, delimiter="\t" if lower.endswith(".tsv") else ","), None)
            return header or None
        if kind in ("parquet", "pq"):
            import pyarrow.parquet as pq  # light next to torch

            return list(pq.read_schema(path).names)
        if kind == "dataset":
            if os.path.isfile(os.path.join(path, "dataset_dict.json")):
                path = os.path.join(path, split)
            with open(os.path.join(path, "dataset_info.json"), encoding="utf-8") as f:
                return list(json.load(f)["features"])
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError, ImportError):
        return None  # unreadable here: the command reads it and names what is wrong
    return None


def _offline() -> bool:
    # huggingface_hub's own reading of HF_HUB_OFFLINE (light next to torch; needed only for a repo id).
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _in_hub_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache  # light next to torch; needed only offline, for a repo id

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except ValueError:  # not a valid repo id
        return False


def unknown_option_hint(parser: argparse.ArgumentParser, unknown: Sequence[str]) -> str:
    """` (did you mean --top-k?)` for the first unknown option close to one of `parser`'s, else `""`."""
    options = [option for action in parser._actions for option in action.option_strings]
    for token in unknown:
        if not token.startswith("-"):
            continue
        name = token.split("=", 1)[0]
        dashed = name.replace("_", "-")
        close = [dashed] if dashed in options else difflib.get_close_matches(name, options, n=1, cutoff=0.6)
        if close:
            return f" (did you mean {close[0]}?)"
    return ""


def _subparser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `realm-hf`: parse the arguments, then run the command. Returns the exit status (0 or 2)."""
    parser = build_parser()
    try:
        args, unknown = parser.parse_known_args(argv)
        if unknown:
            # argparse would print its generic "unrecognized arguments"; name the option meant (`--top_k`: `--top-k`).
            command = _subparser(parser, getattr(args, "command", None))
            command.error(f"unrecognized arguments: {' '.join(unknown)}{unknown_option_hint(command, unknown)}")
    except SystemExit as exit_:  # --help, --version and argparse's own usage errors
        return int(exit_.code or 0) if not isinstance(exit_.code, str) else EXIT_ERROR
    if getattr(args, "command", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    # With --debug the command itself reports the path, with its traceback.
    problem = None if getattr(args, "debug", False) else missing_path(args) or option_problem(args)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_ERROR
    # Deferred until a command runs: importing realm_hf loads torch and transformers (see the module docstring).
    from realm_hf.cli.common import run_command

    return run_command(args)


if __name__ == "__main__":
    sys.exit(main())
