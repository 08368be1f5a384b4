"""
Loading a REALM model directory (`realm_hf.models.modeling_base`, `realm_hf.models.configuration_realm`): a
config.json whose sizes are wrong is refused naming the field, before any weight is allocated.
"""

import json
import resource

import pytest
from test_pipeline import build_tiny_model

from realm_hf import RealmConfig, RealmForOpenQA


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sizes")
    model, _ = build_tiny_model(str(tmp))
    model.save_pretrained(tmp / "model", model_card=False)
    return tmp / "model"


def _with_config(saved, tmp_path, **changes):
    import shutil

    target = tmp_path / "edited"
    shutil.copytree(saved, target)
    config = json.loads((target / "config.json").read_text())
    config.update(changes)
    (target / "config.json").write_text(json.dumps(config))
    return target


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("hidden_size", "32", "`hidden_size` must be an integer of at least 1"),
        ("num_attention_heads", 0, "`num_attention_heads` must be an integer of at least 1"),
        ("intermediate_size", -1, "`intermediate_size` must be an integer of at least 1"),
        ("vocab_size", 2.5, "`vocab_size` must be an integer"),
        ("num_hidden_layers", None, "`num_hidden_layers` must be an integer"),
    ],
)
def test_config_errors_name_the_field(saved, tmp_path, field, value, message):
    """They came from deep inside torch or transformers (ZeroDivisionError, "empty(): argument 'size' ...")."""
    with pytest.raises(ValueError, match=message):
        RealmForOpenQA.from_pretrained(_with_config(saved, tmp_path, **{field: value}), load_retriever=False)
    with pytest.raises(ValueError, match=message):
        RealmConfig(**{**RealmConfig(hidden_size=32, num_attention_heads=2).to_dict(), field: value})


def test_heads_that_do_not_divide_the_hidden_size_are_named(saved, tmp_path):
    with pytest.raises(
        ValueError, match=r"hidden size \(32\) is not a multiple of the number of attention heads \(3\)"
    ):
        RealmForOpenQA.from_pretrained(_with_config(saved, tmp_path, num_attention_heads=3), load_retriever=False)


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("vocab_size", 200_000_000, "vocab_size=200000000"),
        ("max_position_embeddings", 200_000_000, "max_position_embeddings=200000000"),
        ("num_hidden_layers", 200_000, "num_hidden_layers=200000"),
    ],
)
def test_sizes_the_weights_do_not_have_are_refused_before_allocating(saved, tmp_path, field, value, named):
    """A few bytes of config.json made transformers allocate gigabytes before it reported the mismatch."""
    target = _with_config(saved, tmp_path, **{field: value})
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ValueError, match=f"config.json .*{named}"):
        RealmForOpenQA.from_pretrained(target, load_retriever=False)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 1024  # the model asked for is 25 GB or more


def test_a_model_of_its_own_sizes_still_loads(saved):
    assert (
        RealmForOpenQA.from_pretrained(saved).config.vocab_size
        == RealmForOpenQA.from_pretrained(saved).embedder.config.vocab_size
    )
