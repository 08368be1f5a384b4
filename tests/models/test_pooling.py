"""`retriever_pooling`: REALM's [CLS] pooler (legacy) or the masked mean of sentence encoders, chosen from a
sentence-transformers checkpoint by `realm_config_from_bert`."""

import json
import logging

import pytest
import torch
from transformers import BertConfig, BertModel

from realm_hf import RealmConfig, RealmEmbedder
from realm_hf.models.initialization import init_from_bert, realm_config_from_bert, sentence_transformers_pooling

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37, vocab_size=99)


def _tiny_embedder(pooling):
    torch.manual_seed(0)
    model = RealmEmbedder(RealmConfig(retriever_proj_size=8, retriever_pooling=pooling, **TINY))
    return model.eval()


def test_unknown_pooling_is_a_clear_error():
    with pytest.raises(ValueError, match="retriever_pooling.*'cls', 'mean'.*'max'"):
        RealmConfig(retriever_pooling="max", **TINY)


def test_default_pooling_is_the_legacy_cls_pooler():
    model = _tiny_embedder("cls")
    assert RealmConfig(**TINY).retriever_pooling == "cls"
    ids = torch.tensor([[2, 5, 6, 7, 3]])
    with torch.no_grad():
        out = model.realm(ids)
        expected = model.cls(out.pooler_output)
        assert torch.allclose(model(ids).projected_score, expected)


def test_mean_pooling_is_the_masked_mean_of_the_last_hidden_states():
    model = _tiny_embedder("mean")
    ids = torch.tensor([[2, 5, 6, 7, 3], [2, 9, 3, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    with torch.no_grad():
        hidden = model.realm(ids, attention_mask=mask).last_hidden_state
        means = torch.stack([hidden[0].mean(0), hidden[1, :3].mean(0)])
        assert torch.allclose(model(ids, attention_mask=mask).projected_score, model.cls(means), atol=1e-6)
        # Padding does not move a text's vector; the [CLS] pooling would give another one.
        alone = model(ids[1:, :3], attention_mask=mask[1:, :3]).projected_score
        assert torch.allclose(alone[0], model(ids, attention_mask=mask).projected_score[1], atol=1e-5)
        assert not torch.allclose(alone, _tiny_embedder("cls")(ids[1:, :3]).projected_score, atol=1e-3)


def test_pooling_survives_save_and_load(tmp_path):
    model = _tiny_embedder("mean")
    model.save_pretrained(tmp_path)
    loaded = RealmEmbedder.from_pretrained(tmp_path).eval()
    assert loaded.config.retriever_pooling == "mean"
    ids = torch.tensor([[2, 5, 6, 3]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).projected_score, model(ids).projected_score)


def _bert_dir(path, pooling=None):
    BertModel(BertConfig(**TINY)).save_pretrained(path)
    if pooling is not None:
        (path / "modules.json").write_text(
            json.dumps(
                [
                    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                ]
            )
        )
        (path / "1_Pooling").mkdir()
        modes = {f"pooling_mode_{m}": m == pooling for m in ("cls_token", "mean_tokens", "max_tokens")}
        (path / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **modes}))
    return path


@pytest.mark.parametrize(
    "pooling, expected", [(None, "cls"), ("mean_tokens", "mean"), ("cls_token", "cls"), ("max_tokens", "cls")]
)
def test_config_from_a_sentence_encoder_pools_as_it_was_trained(tmp_path, caplog, pooling, expected):
    bert = _bert_dir(tmp_path, pooling)
    with caplog.at_level(logging.WARNING, logger="realm_hf"):
        config = realm_config_from_bert(bert, retriever_proj_size=8)
    assert config.retriever_pooling == expected
    # Max pooling has no REALM equivalent: said, not silently dropped.
    assert ("max_tokens pooling" in caplog.text) == (pooling == "max_tokens")
    # An explicit choice wins.
    assert realm_config_from_bert(bert, retriever_pooling="cls").retriever_pooling == "cls"
    model = init_from_bert(RealmEmbedder, bert, retriever_proj_size=8)
    assert model.config.retriever_pooling == expected


def test_unreadable_pooling_config_keeps_cls_with_a_warning(tmp_path, caplog):
    bert = _bert_dir(tmp_path, "mean_tokens")
    (tmp_path / "1_Pooling" / "config.json").write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="realm_hf"):
        assert sentence_transformers_pooling(bert) is None
    assert "no readable Pooling config" in caplog.text
