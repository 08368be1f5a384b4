"""Start-up time of the `realm-hf` command: `--help` of the command and of each subcommand, in a fresh interpreter.

What it measures
----------------
Wall time of `python -m realm_hf_cli <args>` (what the `realm-hf` console script runs) for `--help`, each
subcommand's `--help`, `--version`, a usage error and a bad option value (`ask --top-k 0`, refused before any heavy
import), each in a new process (so every import counts, as it does for a user), best of `--rounds`. For comparison,
the cost the parser avoids: `python -c "import realm_hf"` (the package registers its Auto classes, which imports
torch, transformers and the model classes; the retrieval stack, faiss and datasets, loads on first use), its floor
`import torch, transformers` with the BERT model classes, and `python -m realm_hf.cli --help` (the same parser
reached through the package). `--src DIR` adds an `import realm_hf` row for another source tree (e.g. a checkout of
an earlier commit), timed in the same rounds: a before/after on one machine at one time.

Usage:

    python bench/cli_startup.py              # every row, 5 rounds (about a minute: the reference rows are slow)
    python bench/cli_startup.py --quick      # the `realm-hf` rows only, one round: a few seconds
    python bench/cli_startup.py --src /tmp/realm-hf-before/src   # and `import realm_hf` from that tree
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

COMMANDS = ("index", "ask", "train", "evaluate", "convert", "push")


# The floor of `import realm_hf`: what registering REALM's model classes with the Auto classes cannot avoid.
FLOOR = "import torch, transformers; from transformers import BertModel, PreTrainedModel"


def rows(quick: bool, sources: tuple[str, ...] = ()) -> list[tuple[str, list[str], dict | None]]:
    """(label, argv, environment or None) of every timed process."""
    cli = [sys.executable, "-m", "realm_hf_cli"]
    timed = [("realm-hf --help", [*cli, "--help"], None)]
    timed += [(f"realm-hf {name} --help", [*cli, name, "--help"], None) for name in COMMANDS]
    timed += [("realm-hf --version", [*cli, "--version"], None), ("realm-hf (no command: usage)", cli, None)]
    here = os.path.dirname(os.path.abspath(__file__))
    timed += [
        ("realm-hf ask q --model . --top-k 0 (refused)", [*cli, "ask", "q", "--model", here, "--top-k", "0"], None)
    ]
    if not quick:
        timed += [
            ("python -m realm_hf.cli --help (reference)", [sys.executable, "-m", "realm_hf.cli", "--help"], None),
            ('python -c "import realm_hf" (reference)', [sys.executable, "-c", "import realm_hf"], None),
            ("import torch, transformers, BertModel (floor)", [sys.executable, "-c", FLOOR], None),
        ]
        for source in sources:
            env = dict(os.environ, PYTHONPATH=os.path.abspath(source))
            timed.append((f"import realm_hf from {source}", [sys.executable, "-c", "import realm_hf"], env))
    return timed


def time_process(argv: list[str], env: dict | None = None) -> tuple[float, int]:
    """Wall seconds and exit status of one run of `argv` (output discarded)."""
    start = time.perf_counter()
    result = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300, env=env)
    return time.perf_counter() - start, result.returncode


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the realm-hf rows only, one round")
    parser.add_argument("--rounds", type=int, default=5, help="runs per row; the best counts (default 5)")
    parser.add_argument(
        "--src", action="append", default=[], metavar="DIR", help="also time `import realm_hf` from this source tree"
    )
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else max(1, args.rounds)
    timed = rows(args.quick, tuple(args.src))
    best = {label: float("inf") for label, _, _ in timed}
    status = {}
    # Rounds run every row in turn, so that a burst of load from elsewhere does not hit one row only.
    for _ in range(rounds):
        for label, command, env in timed:
            seconds, status[label] = time_process(command, env)
            best[label] = min(best[label], seconds)
    width = max(44, *(len(label) for label, _, _ in timed))
    print(f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, best of {rounds} round(s), a new process each")
    print(f"| {'command':<{width}} | {'seconds':>7} | exit |")
    print(f"| {'-' * width} | {'-' * 6}: | ---: |")
    results = []
    for label, _, _ in timed:
        print(f"| {label:<{width}} | {best[label]:>7.2f} | {status[label]:>4} |")
        results.append({"command": label, "seconds": best[label], "exit": status[label]})
    return results


if __name__ == "__main__":
    main()
