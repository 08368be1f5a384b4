"""
The product speaks of itself, not of how it was made: no work periods, rounds, ticket numbers or who did what in the
README, the docs, the code (comments, docstrings, messages), the benchmarks and examples, the tests (names and text)
or the names of files. A measurement names its date, machine and commit instead (docs/results.md).
"""

import os
import re
import subprocess

import pytest

from tests.architecture.source_imports import ROOT

# Each pattern: what it catches, and the words of the project's work log it stands for.
WORK_LOG = {
    "a work session": re.compile(r"\bsessions?\b", re.I),
    "a numbered round": re.compile(r"\bround[ -]?\d+\b(?!/)|_round\d", re.I),
    "a ticket number": re.compile(r"\bissues?[ -]?#?\d+|(?:^|[\s(\[])#\d{2,}\b", re.I),
    "a helper's name": re.compile(r"\bhelper-\d+", re.I),
    "a work period": re.compile(r"\bwork(?:ing)? periods?\b", re.I),
    "a papercut list": re.compile(r"papercuts?", re.I),
}

# Files read whole: what people read, and code whose comments, docstrings and messages they read.
TEXT_SUFFIXES = (".md", ".py", ".cfg", ".toml", ".yaml", ".yml", ".json", ".sh")
TEXT_NAMES = ("Makefile", "run")
# Data, not prose: the question sets and vocabularies hold the world's words ("the 2004 session of parliament").
SKIPPED_SUFFIXES = (".jsonl", ".txt", ".gz", ".safetensors", ".bin", ".npy", ".png", ".arrow", ".faiss")
SKIPPED_FOLDERS = ("tests/fixtures/",)
THIS_FILE = "tests/architecture/test_no_work_log.py"


def tracked_files() -> list[str]:
    """The repository's files as git knows them (tracked, and untracked but not ignored)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted({line for line in out.splitlines() if line and os.path.exists(os.path.join(ROOT, line))})


def is_text(path: str) -> bool:
    name = os.path.basename(path)
    if path.endswith(SKIPPED_SUFFIXES) or path.startswith(SKIPPED_FOLDERS):
        return False
    return path.endswith(TEXT_SUFFIXES) or name in TEXT_NAMES


def work_log_hits(text: str) -> list[tuple[int, str, str]]:
    """(line number, what, the line) for every line of `text` that speaks of the work log."""
    hits = []
    for number, line in enumerate(text.splitlines(), start=1):
        for what, pattern in WORK_LOG.items():
            if pattern.search(line):
                hits.append((number, what, line.strip()[:160]))
    return hits


@pytest.mark.parametrize(
    "line, what",
    [
        ("Measured in session 28 on the EPYC.", "a work session"),
        ("the third reliability round 3 found", "a numbered round"),
        ("def test_inputs_round4(): ...", "a numbered round"),
        ("(issue 25) a swap was completed", "a ticket number"),
        ("see #27 for the list", "a ticket number"),
        ("as helper-2 measured", "a helper's name"),
        ("Papercuts an experienced user hit", "a papercut list"),
        ("written in the third work period", "a work period"),
    ],
)
def test_the_patterns_catch_the_work_log(line, what):
    assert [hit[1] for hit in work_log_hits(line)] == [what]


@pytest.mark.parametrize(
    "line",
    [
        "round 1/3 done (121 s)",  # bench/embed.py's timing rounds
        "test_save_and_load_round_trip(tmp_path)",
        "background:#ffe066;color:#000;padding:0 2px",
        "tokens 19 ##71 .",
        "a user's Python process",
        "https://github.com/huggingface/transformers/pull/12345",
    ],
)
def test_the_patterns_leave_the_product_alone(line):
    assert work_log_hits(line) == []


def test_no_work_log_in_files():
    found = []
    for path in tracked_files():
        if not is_text(path) or path == THIS_FILE:  # this file names the words it looks for
            continue
        with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as f:
            text = f.read()
        found += [f"{path}:{number}: {what}: {line}" for number, what, line in work_log_hits(text)]
    assert not found, (
        "The work log leaks into the product (say what the code does, date a measurement):\n" + "\n".join(found)
    )


def test_no_work_log_in_file_names():
    found = [
        f"{path}: {what}"
        for path in tracked_files()
        for what, pattern in WORK_LOG.items()
        if pattern.search(os.path.basename(path))
    ]
    assert not found, "File names that carry the work log (name them by what they test or hold):\n" + "\n".join(found)
