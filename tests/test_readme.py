"""The README's quickstart runs as written (on the tiny legacy fixture instead of a real model directory)."""

import os
import re
import textwrap

import pytest

HERE = os.path.dirname(__file__)
README = os.path.join(HERE, "..", "README.md")
LEGACY_OPENQA = os.path.join(HERE, "fixtures", "legacy", "openqa")


def python_blocks(text):
    # Blocks inside list items are indented as a whole.
    return [textwrap.dedent(block) for block in re.findall(r"```python\n(.*?)```", text, flags=re.S)]


def test_quickstart_runs(tmp_path, monkeypatch):
    with open(README) as f:
        blocks = python_blocks(f.read())
    quickstart = next(block for block in blocks if "RealmRetriever.from_documents" in block)
    # The model `make quickstart` trains (tests/test_examples.py runs its script); here the tiny legacy fixture.
    assert '"demo_output/realm-quickstart"' in quickstart
    code = quickstart.replace('"demo_output/realm-quickstart"', repr(os.path.abspath(LEGACY_OPENQA)))
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(code, "README.md quickstart", "exec"), namespace)
    # It saved a complete model directory and the pipeline answered from it with provenance.
    assert (tmp_path / "my-realm" / "retriever").is_dir()
    # Its search lines: a text retrieves as the model does, a filter keeps to the one block of its topic.
    retriever = namespace["retriever"]
    assert (
        retriever.search("who developed unix?", k=1, filter={"topic": "languages"}).blocks[0][0]["title"] == "Compiler"
    )
    qa = namespace["qa"]
    answers = qa("who developed unix?", top_k=3)
    assert 1 <= len(answers) <= 3
    assert all(answer["block"]["title"] in ("Compiler", "Unix") for answer in answers)
    context_answer = qa(question="who developed unix?", context="Unix was written by Ken Thompson and Dennis Ritchie.")
    assert context_answer["answer"] in "Unix was written by Ken Thompson and Dennis Ritchie."


def test_the_quickstart_starts_with_the_model_make_quickstart_trains():
    with open(README) as f:
        text = f.read()
    section = text[text.index("## Quickstart") :]
    first = python_blocks(section)[0]
    assert "make quickstart" in section[: section.index("```")]
    assert 'model="demo_output/realm-quickstart"' in first
    with open(os.path.join(HERE, "..", "Makefile")) as f:
        assert "examples/quickstart_model.py" in f.read()
    with open(os.path.join(HERE, "..", "examples", "quickstart_model.py")) as f:
        assert 'os.path.join("demo_output", "realm-quickstart")' in f.read()


@pytest.mark.parametrize("doc", ["docs/training.md", "docs/pipeline.md", "docs/cli.md", "docs/retrieval.md"])
def test_docs_python_blocks_compile(doc):
    with open(os.path.join(HERE, "..", doc)) as f:
        for i, block in enumerate(python_blocks(f.read())):
            compile(block, f"{doc} block {i}", "exec")
