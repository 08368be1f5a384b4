"""Loading legacy (transformers 4.57.6) REALM checkpoints gives the legacy numbers.

The fixtures under tests/fixtures/legacy/ were written by scripts/make_legacy_fixtures.py running the legacy
`transformers.models.deprecated.realm` code: tiny random models of the five classes, saved with `save_pretrained`,
and their outputs on fixed inputs.
"""

import json
import os

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM, AutoModelForQuestionAnswering, AutoTokenizer

import realm_hf
from realm_hf import (
    RealmConfig,
    RealmEmbedder,
    RealmForOpenQA,
    RealmKnowledgeAugEncoder,
    RealmReader,
    RealmScorer,
    RealmTokenizer,
)
from tests.support.paths import LEGACY

ATOL = 1e-5


def fixture(name):
    path = os.path.join(LEGACY, name)
    tensors = load_file(os.path.join(path, "expected_outputs.safetensors"))
    with open(os.path.join(path, "expected_outputs.json")) as f:
        info = json.load(f)
    return path, tensors, info


def load_checked(cls, path):
    model, info = cls.from_pretrained(path, output_loading_info=True)
    assert info["missing_keys"] == set() or not info["missing_keys"], info["missing_keys"]
    assert not info["unexpected_keys"], info["unexpected_keys"]
    assert not info.get("mismatched_keys"), info["mismatched_keys"]
    return model.eval()


def assert_close(actual, expected, atol=ATOL):
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    torch.testing.assert_close(actual.float(), expected.float(), atol=atol, rtol=0)


@pytest.mark.parametrize(
    "name,cls",
    [
        ("embedder", RealmEmbedder),
        ("scorer", RealmScorer),
        ("encoder", RealmKnowledgeAugEncoder),
        ("reader", RealmReader),
        ("openqa", RealmForOpenQA),
    ],
)
def test_auto_classes_resolve_each_legacy_checkpoint(name, cls):
    path = os.path.join(LEGACY, name)
    config = AutoConfig.from_pretrained(path)
    assert isinstance(config, RealmConfig)
    model = AutoModel.from_pretrained(path)
    assert type(model) is cls
    # Every weight of the legacy state dict (except the corpus buffer and the shared scorer duplicate) is loaded.
    with open(os.path.join(path, "expected_outputs.json")) as f:
        legacy_keys = set(json.load(f)["state_dict_keys"])
    legacy_keys.discard("block_emb")
    legacy_keys = {k for k in legacy_keys if not k.startswith("query_embedder.")}
    ours = set(model.state_dict().keys())
    assert legacy_keys == ours, legacy_keys ^ ours


def test_task_auto_classes():
    assert type(AutoModelForMaskedLM.from_pretrained(os.path.join(LEGACY, "encoder"))) is RealmKnowledgeAugEncoder
    assert type(AutoModelForQuestionAnswering.from_pretrained(os.path.join(LEGACY, "reader"))) is RealmReader


def test_legacy_tokenizer_config_loads_and_encodes_identically():
    path, tensors, info = fixture("embedder")
    with open(os.path.join(path, "tokenizer_config.json")) as f:
        assert json.load(f)["tokenizer_class"] in ("RealmTokenizer", "RealmTokenizerFast")
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert isinstance(tokenizer, RealmTokenizer)
    encoded = tokenizer(info["texts"], padding=True, return_tensors="pt")
    assert torch.equal(encoded["input_ids"], tensors["input_ids"])
    assert torch.equal(encoded["token_type_ids"], tensors["token_type_ids"])


def test_embedder_matches_legacy():
    path, tensors, _ = fixture("embedder")
    for model in (load_checked(RealmEmbedder, path), AutoModel.from_pretrained(path).eval()):
        with torch.no_grad():
            out = model(
                input_ids=tensors["input_ids"],
                attention_mask=tensors["attention_mask"],
                token_type_ids=tensors["token_type_ids"],
                output_hidden_states=True,
            )
        assert_close(out.projected_score, tensors["projected_score"])
        assert_close(out.hidden_states[-1], tensors["hidden_states.2"])


def test_embedder_eager_and_sdpa_agree():
    path, tensors, _ = fixture("embedder")
    eager = RealmEmbedder.from_pretrained(path, attn_implementation="eager").eval()
    sdpa = RealmEmbedder.from_pretrained(path, attn_implementation="sdpa").eval()
    assert eager.realm.config._attn_implementation == "eager"
    assert sdpa.realm.config._attn_implementation == "sdpa"
    inputs = {k: tensors[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        assert_close(eager(**inputs).projected_score, tensors["projected_score"])
        assert_close(sdpa(**inputs).projected_score, tensors["projected_score"])


def test_scorer_matches_legacy():
    path, tensors, info = fixture("scorer")
    model = load_checked(RealmScorer, path)
    assert model.query_embedder is model.embedder
    tokenizer = AutoTokenizer.from_pretrained(path)
    candidates = tokenizer.batch_encode_candidates(
        json.loads(info["candidates"].replace("'", '"'))
        if isinstance(info["candidates"], str)
        else info["candidates"],
        return_tensors="pt",
        **info["batch_encode_candidates_kwargs"],
    )
    assert torch.equal(candidates["input_ids"], tensors["candidate_input_ids"])
    with torch.no_grad():
        out = model(
            input_ids=tensors["input_ids"],
            attention_mask=tensors["attention_mask"],
            token_type_ids=tensors["token_type_ids"],
            candidate_input_ids=tensors["candidate_input_ids"],
            candidate_attention_mask=tensors["candidate_attention_mask"],
            candidate_token_type_ids=tensors["candidate_token_type_ids"],
        )
    assert_close(out.relevance_score, tensors["relevance_score"])
    assert_close(out.query_score, tensors["query_score"])
    assert_close(out.candidate_score, tensors["candidate_score"])


def test_knowledge_aug_encoder_matches_legacy():
    path, tensors, _ = fixture("encoder")
    model = load_checked(RealmKnowledgeAugEncoder, path)
    # The MLM decoder is tied to the word embeddings, as in the legacy model.
    assert model.cls.predictions.decoder.weight.data_ptr() == model.realm.embeddings.word_embeddings.weight.data_ptr()
    inputs = {k: tensors[k] for k in ("input_ids", "attention_mask", "token_type_ids", "relevance_score", "labels")}
    with torch.no_grad():
        out = model(**inputs, mlm_mask=tensors["mlm_mask"])
        out_nomask = model(**inputs)
    assert_close(out.logits, tensors["logits"])
    assert_close(out.loss, tensors["loss"])
    assert_close(out_nomask.loss, tensors["loss_without_mlm_mask"])


def test_reader_matches_legacy():
    path, tensors, _ = fixture("reader")
    model = load_checked(RealmReader, path)
    kwargs = {
        "input_ids": tensors["input_ids"],
        "attention_mask": tensors["attention_mask"],
        "token_type_ids": tensors["token_type_ids"],
        "relevance_score": tensors["relevance_score"],
        "block_mask": tensors["block_mask"],
    }
    with torch.no_grad():
        out = model(
            **kwargs,
            has_answers=tensors["has_answers"],
            start_positions=tensors["start_positions"],
            end_positions=tensors["end_positions"],
        )
        nolabels = model(**kwargs)
    for key in ("loss", "retriever_loss", "reader_loss"):
        assert_close(getattr(out, key), tensors[key])
    for key in ("block_idx", "candidate", "start_pos", "end_pos"):
        assert torch.equal(getattr(out, key), tensors[key]), key
        assert torch.equal(getattr(nolabels, key), tensors[f"nolabels.{key}"]), key
    assert torch.equal(out.retriever_correct, tensors["retriever_correct"])
    assert torch.equal(out.reader_correct, tensors["reader_correct"])
    assert torch.equal(out.candidate_starts, tensors["candidate_starts"])
    # Raw span logits as the legacy reader's span head computed them (before it added the retrieval scores).
    span_logits = out.reader_logits - tensors["relevance_score"][: out.reader_logits.shape[0], None]
    valid = tensors["span_logits"] > -1e30
    assert torch.equal(out.reader_logits > -1e30, valid)
    assert_close(span_logits[valid], tensors["span_logits"][valid])


def test_reader_batched_layout_equals_single_question_calls():
    path, tensors, _ = fixture("reader")
    model = load_checked(RealmReader, path)
    single = {
        "input_ids": tensors["input_ids"],
        "attention_mask": tensors["attention_mask"],
        "token_type_ids": tensors["token_type_ids"],
        "relevance_score": tensors["relevance_score"],
        "block_mask": tensors["block_mask"],
        "has_answers": tensors["has_answers"],
        "start_positions": tensors["start_positions"],
        "end_positions": tensors["end_positions"],
    }
    # A batch of two questions: the fixture question, and the same one with its relevance scores reversed.
    other = dict(single, relevance_score=tensors["relevance_score"].flip(0))
    batched = {k: torch.stack([single[k], other[k]]) for k in single}
    with torch.no_grad():
        out_batch = model(**batched)
        out_a = model(**single)
        out_b = model(**other)
    for i, out in enumerate((out_a, out_b)):
        assert int(out_batch.block_idx[i]) == int(out.block_idx)
        assert int(out_batch.start_pos[i]) == int(out.start_pos)
        assert_close(out_batch.retriever_loss[i], out.retriever_loss)
        assert_close(out_batch.reader_loss[i], out.reader_loss)
    assert_close(out_batch.loss, (out_a.loss + out_b.loss) / 2)


def test_registration_is_idempotent():
    import importlib

    importlib.reload(realm_hf)
    assert (
        isinstance(AutoConfig.for_model("realm"), RealmConfig) or AutoConfig.for_model("realm").model_type == "realm"
    )
    assert type(AutoModel.from_pretrained(os.path.join(LEGACY, "embedder"))).__name__ == "RealmEmbedder"


def test_gradient_checkpointing_trains():
    path, tensors, _ = fixture("embedder")
    model = RealmEmbedder.from_pretrained(path)
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()
    model.train()
    out = model(input_ids=tensors["input_ids"], attention_mask=tensors["attention_mask"])
    out.projected_score.sum().backward()
    assert model.realm.encoder.layer[0].attention.self.query.weight.grad is not None


@pytest.mark.parametrize("cls", [RealmEmbedder, RealmForOpenQA, RealmConfig])
def test_checkpoint_of_another_model_type_is_a_clear_error(cls, tmp_path):
    from transformers import BertConfig, BertModel

    from realm_hf.models.initialization import init_from_bert

    config = BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37, vocab_size=99
    )
    BertModel(config).save_pretrained(tmp_path)
    # transformers itself only warns, then returns a REALM model with every weight random.
    with pytest.raises(ValueError, match="`bert`.*REALM.*init_from_bert"):
        cls.from_pretrained(tmp_path)
    # The suggested way works on the same directory.
    model = init_from_bert(RealmEmbedder, tmp_path, retriever_proj_size=8)
    torch.testing.assert_close(
        model.realm.embeddings.word_embeddings.weight,
        BertModel.from_pretrained(tmp_path).embeddings.word_embeddings.weight,
    )
