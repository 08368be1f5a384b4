import pytest

from realm_hf import RealmForOpenQA
from tests.support.cli import run
from tests.support.paths import LEGACY_OPENQA


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
