"""JSON lines: the records of a JSON-lines text with their line numbers, and errors that name the file and line."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def text_lines(text: str) -> list[str]:
    """
    The lines of a text, split at line breaks only (`\\n`, `\\r\\n`, a lone `\\r`), as reading a file line by line
    does: `str.splitlines` also splits at form feeds, vertical tabs, U+0085, U+2028 and U+2029, which a valid JSON
    string or one question may hold (one record became two, with the line numbers of the rest shifted).
    """
    lines = _LINE_BREAK.split(text)
    return lines[:-1] if lines and lines[-1] == "" else lines


def json_lines(lines: Iterable[str], name: str, error: type[Exception] = ValueError) -> Iterator[tuple[int, object]]:
    """
    The records of a JSON-lines text, each with its line number (from 1); blank lines are skipped. A line that is not
    JSON raises `error` naming `name` and the line (`json`'s own message names neither).

    Args:
        lines (`Iterable[str]`): The lines (an open text file, [`text_lines`] of a text; not `str.splitlines`).
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


__all__ = ["json_lines", "text_lines"]
