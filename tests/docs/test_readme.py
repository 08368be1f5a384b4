"""
README.md as a newcomer reads it: at most 15 KB, its sections in order, and every Python block and every `realm-hf`
line runs as written, on the tiny legacy checkpoint of tests/fixtures instead of a real model and on tiny data (the
only changes: the model path, the step count, blocks short enough for the tiny model, and a free port for `serve`). docs/usage.md's block runs too.
"""

import contextlib
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request

import pytest

from tests.support.paths import LEGACY_OPENQA
from tests.support.paths import REPO as ROOT

README = os.path.join(ROOT, "README.md")
SECTIONS = [
    "Two commands",
    "The main job: open-domain QA over Wikipedia",
    "Quickstart: answer questions over your own corpus, with sources",
    "Quickstart: load a converted `google/realm-*` checkpoint",
    "Quickstart: fine-tune on your own question-answer pairs",
    "Command line",
    "Share it on the Hub",
    "Serve it",
    "What it guarantees",
    "Known limits",
    "Documentation",
]
QA_PAIRS = [
    {"question": "who developed unix?", "answers": ["Bell Labs"]},
    {"question": "what translates a program?", "answers": ["A compiler", "compiler"]},
]
DOCUMENTS = [
    {"title": "Fortran", "text": "Fortran is a programming language first developed at IBM for scientific computing."}
]


def read(path=README) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def blocks(text: str, language: str) -> list[str]:
    return [textwrap.dedent(block) for block in re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)]


def block_after(text: str, heading: str, language: str = "python") -> str:
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    (block,) = blocks(section, language)
    return block


def cli_lines(text: str) -> list[str]:
    """Every `realm-hf ...` command of the README's shell blocks, comments and `pip install ... &&` dropped."""
    lines = []
    for block in blocks(text, "bash"):
        for line in block.splitlines():
            line = line.split("  #", 1)[0].strip()
            for part in line.split("&&"):
                if part.strip().startswith("realm-hf "):
                    lines.append(part.strip())
    return lines


def run_cli(line: str) -> int:
    from realm_hf.cli import main

    return main(["-q", *shlex.split(line)[1:]])


def test_readme_is_short_and_in_order():
    text = read()
    assert len(text.encode("utf-8")) <= 15_000, "README.md is for a five-minute read: move details to docs/"
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    assert headings == SECTIONS


def test_the_two_commands_are_the_makefile_targets_ci_runs():
    commands = blocks(read(), "bash")[0].splitlines()
    assert [c.split("#")[0].strip() for c in commands] == ["make demo", "make test"]
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        assert f.read().rstrip().splitlines()[-1] == "make test"
    with open(os.path.join(ROOT, "Makefile")) as f:
        makefile = f.read()
    assert re.search(r"^demo:.*\n\t.*examples/demo_wikipedia\.py", makefile, flags=re.M)
    assert re.search(r"^test:.*\n\t.*pytest", makefile, flags=re.M)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder holding what the README's commands expect, the first quickstart run in it (it saves `my-realm`)."""
    path = tmp_path_factory.mktemp("readme")
    for name, records in (("train.jsonl", QA_PAIRS), ("dev.jsonl", QA_PAIRS), ("docs.jsonl", DOCUMENTS)):
        (path / name).write_text("".join(json.dumps(r) + "\n" for r in records))
    (path / "finetune.yaml").write_text(
        "model: my-realm\ntrain_file: train.jsonl\neval_file: dev.jsonl\noutput_dir: my-realm-finetuned\n"
        "training_args: {max_steps: 2, per_device_train_batch_size: 2, learning_rate: 1.0e-4}\n"
    )
    before = os.getcwd()
    os.chdir(path)
    try:
        namespace = {}
        # The model `make quickstart` trains (tests/examples/test_examples.py runs its script): here the tiny one.
        code = block_after(read(), SECTIONS[2]).replace('"demo_output/realm-quickstart"', repr(LEGACY_OPENQA))
        with contextlib.redirect_stdout(open(os.devnull, "w")):
            exec(compile(code, "README.md: own corpus", "exec"), namespace)
        yield path, namespace
    finally:
        os.chdir(before)


def test_own_corpus_quickstart_answers_with_a_source(workdir):
    path, namespace = workdir
    assert (path / "my-realm" / "retriever").is_dir() and (path / "my-realm" / "README.md").is_file()
    # Its search line: a question text, kept by the filter to the one block of its topic.
    assert [block["title"] for block in namespace["hits"].blocks[0]] == ["Compiler"]
    answer = namespace["answer"]
    assert answer["block"]["title"] in ("Compiler", "Unix") and answer["answer"] in answer["block"]["text"]
    assert 0.0 < answer["score"] <= 1.0


def test_the_quickstart_starts_from_the_model_make_quickstart_trains():
    section = read().split(f"## {SECTIONS[2]}\n", 1)[1].split("\n## ", 1)[0]
    assert "make quickstart" in section[: section.index("```")]
    assert 'RealmForOpenQA.from_pretrained("demo_output/realm-quickstart")' in block_after(read(), SECTIONS[2])
    with open(os.path.join(ROOT, "Makefile")) as f:
        assert re.search(r"^quickstart:.*\n\t.*examples/quickstart_model\.py", f.read(), flags=re.M)
    with open(os.path.join(ROOT, "examples", "quickstart_model.py")) as f:
        assert 'os.path.join("demo_output", "realm-quickstart")' in f.read()


def test_converted_checkpoint_quickstart(workdir, capsys):
    path, _ = workdir
    text = read()
    section = text.split(f"## {SECTIONS[3]}\n", 1)[1].split("\n## ", 1)[0]
    (convert,) = cli_lines(section)
    assert run_cli(convert.replace("google/realm-orqa-nq-openqa", LEGACY_OPENQA)) == 0
    assert not list((path / "realm-orqa-nq").rglob("*.npy"))  # no pickle left
    code = block_after(text, SECTIONS[3])
    exec(compile(code, "README.md: converted checkpoint", "exec"), {})
    assert capsys.readouterr().out.strip()  # it printed an answer


def test_fine_tuning_quickstart(workdir):
    path, _ = workdir
    code = block_after(read(), SECTIONS[4])
    assert "max_steps=1000" in code
    namespace = {}
    exec(compile(code.replace("max_steps=1000", "max_steps=2"), "README.md: fine-tuning", "exec"), namespace)
    assert namespace["trainer"].state.global_step == 2
    from realm_hf import RealmForOpenQA

    assert RealmForOpenQA.from_pretrained(path / "my-realm-tuned").retriever is not None


def test_every_command_line_runs(workdir):
    text = read()
    lines = cli_lines(text)
    assert {shlex.split(line)[1] for line in lines} >= {"index", "ask", "evaluate", "train", "convert", "serve"}
    for line in lines:
        command = shlex.split(line)[1]
        if command in ("convert", "serve"):  # run above with the fixture, and below as a server
            continue
        if command == "index":  # blocks of REALM's 288 wordpieces do not fit the tiny model's 64 positions
            line += " --max-block-length 48"
        assert run_cli(line) == 0, line
    assert (workdir[0] / "my-realm-finetuned" / "config.json").is_file()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_line_serves_the_page(workdir):
    pytest.importorskip("gradio")
    (line,) = [line for line in cli_lines(read()) if shlex.split(line)[1] == "serve"]
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "src"), os.environ.get("PYTHONPATH", "")])}
    server = subprocess.Popen(
        [sys.executable, "-m", "realm_hf.cli", *shlex.split(line)[1:], "--port", str(port)],
        cwd=workdir[0],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, "realm-hf serve exited"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as response:
                    assert response.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline, "realm-hf serve did not answer within 3 minutes"
                time.sleep(1)
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_hub_block_pushes_and_loads_back(workdir, monkeypatch, tmp_path):
    from tests.support import hub_server

    code = block_after(read(), SECTIONS[6])
    with hub_server.LocalHub() as hub:
        hub_server.point_clients_at(monkeypatch, hub.url, str(tmp_path / "hf-cache"))
        monkeypatch.setenv("HF_TOKEN", hub_server.TOKEN)
        namespace = {"model": workdir[1]["model"], "realm_hf": workdir[1]["realm_hf"]}
        exec(compile(code, "README.md: Hub", "exec"), namespace)
        answer = namespace["qa"]("who developed unix?")
        assert answer["block"]["title"] in ("Compiler", "Unix")
        assert ("model", "your-username/my-realm") in hub.repos


def test_usage_doc_block_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (code,) = blocks(read(os.path.join(ROOT, "docs", "usage.md")), "python")
    namespace = {}
    exec(compile(code.replace('"path/to/realm-model"', repr(LEGACY_OPENQA)), "docs/usage.md", "exec"), namespace)
    answer = namespace["qa"](question="who developed unix?", context="Unix was written by Ken Thompson.")
    assert answer["answer"] in "Unix was written by Ken Thompson."


@pytest.mark.parametrize(
    "doc", ["docs/training.md", "docs/pipeline.md", "docs/cli.md", "docs/usage.md", "docs/retrieval.md"]
)
def test_docs_python_blocks_compile(doc):
    for i, block in enumerate(blocks(read(os.path.join(ROOT, doc)), "python")):
        compile(block, f"{doc} block {i}", "exec")
