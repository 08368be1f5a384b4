"""JSON lines: the records of a JSON-lines text with their line numbers, and errors that name the file and line."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator


def json_lines(lines: Iterable[str], name: str, error: type[Exception] = ValueError) -> Iterator[tuple[int, object]]:
    """
    The records of a JSON-lines text, each with its line number (from 1); blank lines are skipped. A line that is not
    JSON raises `error` naming `name` and the line (`json`'s own message names neither).

    Args:
        lines (`Iterable[str]`): The lines (an open text file, `text.splitlines()`, ...).
        name (`str`): What the lines come from, for errors (a path).
        error (`type`, *optional*, defaults to `ValueError`): The exception raised (the CLI passes its `CLIError`).
    """
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise error(f"{name}, line {number}: invalid JSON: {err.msg}") from None
        yield number, record


__all__ = ["json_lines"]
