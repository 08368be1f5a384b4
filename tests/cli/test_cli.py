"""The `realm-hf` entry point: the console script, `--help` without torch, versions, usage errors and exit statuses.

Commands run in-process through `main([...])` (fast: no interpreter start-up); subprocesses check the installed
console script and what a command imports. Each command has its own file beside this one (test_ask.py, test_train.py,
...); `push` and `convert <hub id>` run against the in-process Hub server of tests/support/hub_server.py.
"""

import json
import os
import subprocess
import sys

import pytest

from realm_hf.cli import main
from tests.support.paths import LEGACY_OPENQA, REPO


def test_console_script_help():
    script = os.path.join(os.path.dirname(sys.executable), "realm-hf")
    command = [script] if os.path.exists(script) else [sys.executable, "-m", "realm_hf.cli"]
    result = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for name in ("index", "ask", "train", "evaluate", "convert", "push"):
        assert name in result.stdout


def test_python_m_realm_hf_cli_still_works():
    # The old route through the package (slow: `import realm_hf` loads torch) runs the same parser.
    result = subprocess.run(
        [sys.executable, "-m", "realm_hf.cli", "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: realm-hf")


# The console script named in setup.cfg, run in a fresh interpreter the way `realm-hf` runs it: `--help` of the
# command and of every subcommand, `--version` and a usage error must not import realm_hf (whose `__init__` registers
# the Auto classes, loading torch and transformers) nor anything heavy. Deterministic, unlike a timing assertion;
# bench/cli_startup.py prints the times.
_ENTRY_POINT_PROBE = """
import contextlib, importlib, io, json, sys
module_name, function_name = sys.argv[1].split(":")
main = getattr(importlib.import_module(module_name), function_name)
statuses = []
for argv in (["--help"], ["index", "--help"], ["ask", "--help"], ["train", "--help"], ["evaluate", "--help"],
             ["convert", "--help"], ["push", "--help"], ["--version"], [], ["push", "some/dir"]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        statuses.append(main(argv))
heavy = ("realm_hf", "torch", "transformers", "datasets", "faiss", "numpy", "peft", "huggingface_hub", "yaml")
print(json.dumps({"statuses": statuses, "heavy": sorted(name for name in heavy if name in sys.modules)}))
"""


def console_script_entry_point() -> str:
    import configparser

    setup = configparser.ConfigParser()
    setup.read(os.path.join(REPO, "setup.cfg"))
    scripts = dict(
        line.split("=", 1) for line in setup["options.entry_points"]["console_scripts"].strip().splitlines()
    )
    return scripts["realm-hf "].strip()


def test_help_of_every_command_imports_neither_realm_hf_nor_torch():
    entry_point = console_script_entry_point()
    result = subprocess.run(
        [sys.executable, "-c", _ENTRY_POINT_PROBE, entry_point], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    probe = json.loads(result.stdout)
    assert probe["heavy"] == [], f"{entry_point} imports {probe['heavy']} before running a command"
    assert probe["statuses"] == [0] * 8 + [2, 2]


# Bad option values, answered by the console script before any command imports realm_hf or torch.
_EARLY_CHECK_PROBE = """
import contextlib, io, json, sys
from realm_hf_cli import main
model, documents = sys.argv[1], sys.argv[2]
results = []
for argv in (
    ["ask", "q", "--model", model, "--top-k", "0"],
    ["ask", "q", "--model", model, "--batch-size", "0"],
    ["serve", model, "--port", "99999"],
    ["serve", model, "--concurrency", "0"],
    ["evaluate", documents, "--model", model, "--ks", "5", "0"],
    ["evaluate", documents, "--model", model, "--limit", "0"],
    ["index", documents, "--model", model, "--output", model + "-x", "--text-column", "body"],
    ["index", documents, "--model", model, "--output", model + "-x", "--id-column", "uid"],
    ["index", documents, "--model", model, "--output", model + "-x", "--max-block-length", "4"],
):
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        results.append([main(argv), err.getvalue()])
heavy = ("realm_hf", "torch", "transformers", "datasets")
print(json.dumps({"results": results, "heavy": sorted(name for name in heavy if name in sys.modules)}))
"""


def test_bad_option_values_are_named_before_anything_heavy_is_imported(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    documents = tmp_path / "docs.jsonl"
    documents.write_text(json.dumps({"title": "T", "text": "some text", "id": 1}) + "\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, "src"), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run(
        [sys.executable, "-c", _EARLY_CHECK_PROBE, str(model), str(documents)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    probe = json.loads(result.stdout)
    assert probe["heavy"] == []
    expected = [
        "--top-k must be at least 1, got 0",
        "--batch-size must be at least 1, got 0",
        "--port must be from 0 to 65535, got 99999",
        "--concurrency must be at least 1, got 0",
        "--ks must be positive integers, got [5, 0]",
        "--limit must be at least 1, got 0",
        "The documents have no text column 'body' (",
        "The documents have no id column 'uid' (",
        "--max-block-length must be at least 8 wordpieces, got 4",
    ]
    for (status, err), message in zip(probe["results"], expected):
        assert status == 2 and err.startswith("error: ") and message in err, (message, err)
    assert "columns title, text, id); choose one with --text-column" in probe["results"][6][1]


@pytest.mark.parametrize("command", ["index", "ask", "train", "evaluate", "convert", "push"])
def test_subcommand_help_has_examples(command, capsys):
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: realm-hf " + command)
    assert "examples:" in out


def test_version_is_the_package_version(capsys):
    import realm_hf

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"realm-hf {realm_hf.__version__}"


def test_usage_errors_exit_2(capsys):
    assert main([]) == 2
    assert main(["push", "some/dir"]) == 2  # --repo-id missing
    assert "--repo-id" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------------ convert


# ---------------------------------------------------------------------------------------------------------- ask


# ----------------------------------------------------------------------------------------------------- evaluate


# -------------------------------------------------------------------------------------------------------- index


# -------------------------------------------------------------------------------------------------------- train


# --------------------------------------------------------------------------------------------------------- push


def test_the_console_script_and_the_commands_share_their_exit_statuses():
    import realm_hf_cli
    from realm_hf.cli import common

    assert (realm_hf_cli.EXIT_OK, realm_hf_cli.EXIT_ERROR) == (common.EXIT_OK, common.EXIT_ERROR)


def test_package_main_stays_the_entry_point_after_a_command_ran(tmp_path):
    # A submodule named `realm_hf.cli.main` replaced the package's `main` function once a command had run.
    import realm_hf.cli
    import realm_hf_cli

    assert realm_hf.cli.main(["-q", "evaluate", str(tmp_path / "missing.jsonl"), "--model", str(tmp_path)]) == 2
    assert realm_hf.cli.main is realm_hf_cli.main
    assert realm_hf.cli.main(["-q", "evaluate", str(tmp_path / "missing.jsonl"), "--model", str(tmp_path)]) == 2


def test_an_unknown_option_suggests_the_close_one(capsys):
    from realm_hf_cli import main

    assert main(["ask", "who?", "--model", LEGACY_OPENQA, "--top_k", "3"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --top_k" in err and "(did you mean --top-k?)" in err
    assert "usage: realm-hf ask" in err  # the command's usage, not the top-level one
    assert main(["evaluate", "qa.jsonl", "--model", LEGACY_OPENQA, "--answer-column", "a"]) == 2
    assert "(did you mean --answers-column?)" in capsys.readouterr().err


_NO_TORCH_PROBE = """
import sys
import realm_hf_cli
status = realm_hf_cli.main(sys.argv[1:])
print(status, "torch" in sys.modules)
"""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["ask", "who?", "--model", "does-not-exist/"], "Model 'does-not-exist/' does not exist."),
        (["evaluate", "missing.jsonl", "--model", "x"], "QA file 'missing.jsonl' does not exist."),
        (["ask", "who?", "--model", "nobody/no-such-model"], "HF_HUB_OFFLINE is set"),
        (["index", "missing.jsonl", "--model", "m", "--output", "o"], "Input 'missing.jsonl' does not exist."),
    ],
)
def test_a_missing_path_is_reported_before_torch_is_imported(tmp_path, argv, message):
    import realm_hf_cli

    # This checkout's script (PYTHONPATH may be relative, and the probe runs in tmp_path), an empty Hub cache.
    source = os.path.dirname(os.path.abspath(realm_hf_cli.__file__))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"), "PYTHONPATH": source}
    result = subprocess.run(
        [sys.executable, "-c", _NO_TORCH_PROBE, *argv], capture_output=True, text=True, env=env, cwd=tmp_path,
        timeout=300,
    )  # fmt: skip
    assert result.stdout.split() == ["2", "False"], result.stderr
    assert message in result.stderr
