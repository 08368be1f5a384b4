import json

import pytest

from realm_hf import RealmForOpenQA
from tests.support.cli import run
from tests.support.paths import LEGACY_OPENQA
from tests.support.tiny_model import build_tiny_model


@pytest.fixture(scope="module")
def legacy_model():
    """The tiny legacy fixture model (transformers 4.57.6's RealmForOpenQA) as loaded, in eval mode."""
    return RealmForOpenQA.from_pretrained(LEGACY_OPENQA, allow_pickle=True).eval()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The legacy fixture model converted by `realm-hf convert`, one per module."""
    output = tmp_path_factory.mktemp("convert") / "realm-openqa"
    assert run("convert", LEGACY_OPENQA, output, "--allow-pickle") == 0
    return output


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """The tiny open-QA model (tests/support/tiny_model.py) saved with its tokenizer, one per module."""
    path = tmp_path_factory.mktemp("tiny-cli") / "tiny"
    model, tokenizer = build_tiny_model(str(path.parent))
    model.save_pretrained(path, tokenizer=tokenizer)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def docs(tmp_path):
    """Two documents as JSON lines."""
    path = tmp_path / "docs.jsonl"
    path.write_text(
        json.dumps({"title": "Unix", "text": "Unix was written by Ken Thompson."})
        + "\n"
        + json.dumps({"title": "Python", "text": "Python was created by Guido van Rossum."})
        + "\n"
    )
    return path
