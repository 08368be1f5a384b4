"""What every REALM model shares (`realm_hf.models.modeling_base`): inputs whose shapes would broadcast in silence are
refused naming the argument and the shape expected, a part is not loaded at random from a whole model's directory,
and a save onto a file says so."""

import json
import resource

import pytest
import torch

from realm_hf import RealmConfig, RealmEmbedder, RealmForOpenQA, RealmKnowledgeAugEncoder, RealmReader, RealmScorer
from tests.support.legacy_model import load_legacy_model
from tests.support.tiny_model import build_tiny_model, tiny_openqa_config


def tiny_config():
    return tiny_openqa_config(50)


def reader_inputs():
    torch.manual_seed(0)
    return torch.randint(5, 50, (2, 3, 12)), torch.ones(2, 4, 12, dtype=torch.bool), torch.randn(2, 4)


def test_reader_refuses_inputs_that_broadcast_in_silence():
    reader = RealmReader(tiny_config()).eval()
    ids, block_mask, scores = reader_inputs()
    # Before: one score per question was added to all three of its blocks; a batch of one to both questions.
    with pytest.raises(ValueError, match=r"`relevance_score`.*\(2, 1\).*\(2, >= 3\)"):
        reader(input_ids=ids, relevance_score=scores[:, :1], block_mask=block_mask)
    with pytest.raises(ValueError, match=r"`relevance_score`.*\(1, 4\)"):
        reader(input_ids=ids, relevance_score=scores[:1], block_mask=block_mask)
    # Before: an attention mask shorter than the inputs was read as it was.
    with pytest.raises(ValueError, match=r"`attention_mask`.*\(2, 3, 10\).*\(2, 3, 12\)"):
        reader(input_ids=ids, attention_mask=torch.ones(2, 3, 10), relevance_score=scores, block_mask=block_mask)
    # Before: torch's "The size of tensor a (6) must match the size of tensor b (5)".
    with pytest.raises(ValueError, match=r"`block_mask`.*\(2, 4, 10\)"):
        reader(input_ids=ids, relevance_score=scores, block_mask=block_mask[..., :10])
    # Before: "not enough values to unpack (expected 3, got 1)".
    with pytest.raises(ValueError, match=r"`input_ids`.*\(12,\)"):
        reader(input_ids=ids[0, 0], relevance_score=scores[0], block_mask=block_mask[0])
    assert reader(input_ids=ids, relevance_score=scores, block_mask=block_mask).block_idx.shape == (2,)


def test_embedder_and_scorer_name_wrong_token_inputs():
    config = tiny_config()
    embedder, scorer = RealmEmbedder(config).eval(), RealmScorer(config).eval()
    ids = torch.randint(5, 50, (2, 3, 12))
    # Before: BERT's "not enough values to unpack", torch's "Expected tensor for argument #1 'indices'", and "The
    # expanded size of the tensor (100) must match the existing size (64)".
    with pytest.raises(ValueError, match=r"`input_ids`.*\(12,\).*input_ids\[None\]"):
        embedder(input_ids=ids[0, 0])
    with pytest.raises(TypeError, match="integer wordpiece ids"):
        embedder(input_ids=ids[0].float())
    with pytest.raises(ValueError, match="max_position_embeddings=64"):
        embedder(input_ids=torch.randint(5, 50, (1, 100)))
    # Before: one query's candidates scored against every query of the batch in silence.
    with pytest.raises(ValueError, match=r"`candidate_input_ids`.*\(1, 3, 12\).*\(2, any, any\)"):
        scorer(input_ids=ids[:, 0], candidate_input_ids=ids[:1])


def test_knowledge_augmented_encoder_checks_its_loss_inputs():
    encoder = RealmKnowledgeAugEncoder(tiny_config()).eval()
    ids = torch.randint(5, 50, (2, 3, 12))
    labels = torch.randint(5, 50, (2, 12))
    # Before: a 1-D relevance score broadcast over the batch in silence.
    with pytest.raises(ValueError, match=r"`relevance_score`.*\(3,\).*\(2, 3\)"):
        encoder(input_ids=ids, relevance_score=torch.randn(3), labels=labels)
    # Before: torch's "Expected input batch_size (72) to match target batch_size (78)".
    with pytest.raises(ValueError, match=r"`labels`.*\(2, 13\).*\(2, 12\)"):
        encoder(input_ids=ids, relevance_score=torch.randn(2, 3), labels=torch.randint(5, 50, (2, 13)))
    assert encoder(input_ids=ids, relevance_score=torch.randn(2, 3), labels=labels).loss.isfinite()


@pytest.mark.parametrize("part, attribute", [(RealmReader, "reader"), (RealmEmbedder, "embedder")])
def test_a_part_of_an_openqa_directory_is_not_loaded_random(tiny, part, attribute):
    # Before: every weight MISSING, a randomly initialised part returned with only a load report.
    with pytest.raises(ValueError, match=rf"RealmForOpenQA.from_pretrained\(path\)\.{attribute}`"):
        part.from_pretrained(tiny[2])


def test_save_pretrained_onto_a_file_says_so(tmp_path):
    target = tmp_path / "model.bin"
    target.write_bytes(b"not a directory")
    with pytest.raises(FileExistsError, match="is a file.*not a directory"):
        load_legacy_model().save_pretrained(target)
    assert target.read_bytes() == b"not a directory"


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
