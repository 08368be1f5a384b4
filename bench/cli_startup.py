"""Start-up time of the `realm-hf` command: `--help` of the command and of each subcommand, in a fresh interpreter.

What it measures
----------------
Wall time of `python -m realm_hf_cli <args>` (what the `realm-hf` console script runs) for `--help`, each
subcommand's `--help`, `--version` and a usage error, each in a new process (so every import counts, as it does for
a user), best of `--rounds`. For comparison, the cost the parser avoids: `python -c "import realm_hf"` (the package
registers its Auto classes, which imports torch and transformers) and `python -m realm_hf.cli --help` (the same
parser reached through the package). The issue's target is under 1 s on 2 cores for every `--help` row.

Usage:

    python bench/cli_startup.py              # every row, 5 rounds (about a minute: the reference rows are slow)
    python bench/cli_startup.py --quick      # the `realm-hf` rows only, one round: a few seconds
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

COMMANDS = ("index", "ask", "train", "evaluate", "convert", "push")


def rows(quick: bool) -> list[tuple[str, list[str]]]:
    """(label, argv) of every timed process."""
    cli = [sys.executable, "-m", "realm_hf_cli"]
    timed = [("realm-hf --help", [*cli, "--help"])]
    timed += [(f"realm-hf {name} --help", [*cli, name, "--help"]) for name in COMMANDS]
    timed += [("realm-hf --version", [*cli, "--version"]), ("realm-hf (no command: usage)", cli)]
    if not quick:
        timed += [
            ("python -m realm_hf.cli --help (reference)", [sys.executable, "-m", "realm_hf.cli", "--help"]),
            ('python -c "import realm_hf" (reference)', [sys.executable, "-c", "import realm_hf"]),
        ]
    return timed


def time_process(argv: list[str]) -> tuple[float, int]:
    """Wall seconds and exit status of one run of `argv` (output discarded)."""
    start = time.perf_counter()
    result = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
    return time.perf_counter() - start, result.returncode


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the realm-hf rows only, one round")
    parser.add_argument("--rounds", type=int, default=5, help="runs per row; the best counts (default 5)")
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else max(1, args.rounds)
    timed = rows(args.quick)
    best = {label: float("inf") for label, _ in timed}
    status = {}
    # Rounds run every row in turn, so that a burst of load from elsewhere does not hit one row only.
    for _ in range(rounds):
        for label, command in timed:
            seconds, status[label] = time_process(command)
            best[label] = min(best[label], seconds)
    print(f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, best of {rounds} round(s), a new process each")
    print(f"| {'command':<44} | {'seconds':>7} | exit |")
    print(f"| {'-' * 44} | {'-' * 6}: | ---: |")
    results = []
    for label, _ in timed:
        print(f"| {label:<44} | {best[label]:>7.2f} | {status[label]:>4} |")
        results.append({"command": label, "seconds": best[label], "exit": status[label]})
    return results


if __name__ == "__main__":
    main()
