"""The transformers 4 retriever (`realm_hf.retrieval.legacy`): conversion of legacy checkpoints, the legacy call that
builds the reader's inputs, transformers' own retriever tests, the constructor it replaces, and the pickle opt-in."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from realm_hf.retrieval.conversion import convert_legacy_checkpoint
from realm_hf.retrieval.legacy import legacy_retriever_call, pickle_allowed
from realm_hf.retrieval.retriever import RealmRetriever
from tests.support.paths import LEGACY_OPENQA
from tests.support.retrieval import PROJ


def make_legacy_dir(path, tokenizer, n=30, dim=PROJ, safetensors=False):
    rng = np.random.default_rng(5)
    texts = [f"Legacy block number {i}: the Torre Alba is {i} metres tall. Café ünïcode {i}." for i in range(n)]
    records = np.array([t.encode("utf-8") for t in texts], dtype=object)
    np.save(path / "block_records.npy", records, allow_pickle=True)
    block_emb = torch.from_numpy(rng.normal(size=(n, dim)).astype(np.float32))
    state = {"block_emb": block_emb, "embedder.cls.dense.weight": torch.zeros(dim, 4)}
    if safetensors:
        save_file(state, str(path / "model.safetensors"))
    else:
        torch.save(state, path / "pytorch_model.bin")
    tokenizer.save_pretrained(path)
    return texts, block_emb


@pytest.mark.parametrize("safetensors", [False, True])
def test_legacy_conversion_reproduces_brute_force(tokenizer, tmp_path, monkeypatch, safetensors):
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    texts, block_emb = make_legacy_dir(legacy, tokenizer, safetensors=safetensors)
    monkeypatch.delenv("REALM_HF_ALLOW_PICKLE", raising=False)
    with pytest.raises(ValueError, match="allow_pickle=True.*REALM_HF_ALLOW_PICKLE=1"):
        RealmRetriever.from_legacy(legacy)
    with pytest.raises(ValueError, match="allow_pickle"):
        convert_legacy_checkpoint(legacy, tmp_path / "out")
    assert not (tmp_path / "out").exists()

    out_dir = tmp_path / "out"
    converted = convert_legacy_checkpoint(legacy, out_dir, allow_pickle=True)
    assert not [f for f in os.listdir(out_dir) if f.endswith((".npy", ".pkl", ".bin"))]
    loaded = RealmRetriever.from_pretrained(out_dir)  # no pickle needed any more
    questions = torch.from_numpy(np.random.default_rng(9).normal(size=(4, PROJ)).astype(np.float32))
    for retriever in (converted, loaded):
        ids = torch.arange(len(texts)).view(1, -1)
        assert torch.equal(retriever.store.embeddings(ids)[0], block_emb)  # exact legacy vectors
        assert retriever.store.texts(ids)[0] == texts
        for q in questions:  # the legacy way: one question at a time, einsum over the full matrix + topk
            scores = torch.einsum("BD,QD->QB", block_emb, q[None])
            legacy_scores, legacy_ids = torch.topk(scores, k=5, dim=-1)
            out = retriever.search(q[None], k=5)
            assert out.block_ids.tolist() == legacy_ids.tolist()
            torch.testing.assert_close(out.scores, legacy_scores, atol=1e-5, rtol=1e-5)
    assert loaded.tokenizer is not None
    assert loaded.store.blocks([0])[0]["title"] == ""

    monkeypatch.setenv("REALM_HF_ALLOW_PICKLE", "1")
    assert len(RealmRetriever.from_legacy(legacy)) == len(texts)


def test_legacy_fixture_matches_recorded_legacy_outputs():
    if not os.path.isdir(LEGACY_OPENQA):
        pytest.skip("legacy fixtures not present")
    tensors = load_file(os.path.join(LEGACY_OPENQA, "expected_outputs.safetensors"))
    retriever = RealmRetriever.from_legacy(LEGACY_OPENQA, allow_pickle=True)
    ids = torch.arange(len(retriever)).view(1, -1)
    assert torch.equal(retriever.store.embeddings(ids)[0], tensors["block_emb"])
    for qi in range(4):
        out = retriever.search(tensors[f"q{qi}.question_projection"], k=len(tensors[f"q{qi}.retrieved_block_ids"]))
        assert out.block_ids[0].tolist() == tensors[f"q{qi}.retrieved_block_ids"].tolist()
        torch.testing.assert_close(out.scores[0], tensors[f"q{qi}.retrieved_scores"], atol=1e-5, rtol=0)


def test_legacy_call_builds_the_legacy_reader_inputs():
    if not os.path.isdir(LEGACY_OPENQA):
        pytest.skip("legacy fixtures not present")
    tensors = load_file(os.path.join(LEGACY_OPENQA, "expected_outputs.safetensors"))
    retriever = RealmRetriever.from_legacy(LEGACY_OPENQA, allow_pickle=True)
    for qi in range(4):
        p = f"q{qi}."
        answers = [[t for t in row if t >= 0] for row in tensors[p + "answer_ids"].tolist()]
        has_answers, start_pos, end_pos, inputs = legacy_retriever_call(
            retriever, tensors[p + "retrieved_block_ids"], tensors[p + "input_ids"], answers, max_length=48
        )
        assert torch.equal(inputs["input_ids"], tensors[p + "reader_input_ids"])
        assert torch.equal(inputs["token_type_ids"], tensors[p + "reader_token_type_ids"])
        assert has_answers == tensors[p + "has_answers"].tolist()
        assert (
            start_pos == tensors[p + "start_positions"].tolist() and end_pos == tensors[p + "end_positions"].tolist()
        )
    legacy_call = legacy_retriever_call(retriever, tensors["q0.retrieved_block_ids"], tensors["q0.input_ids"], None)
    assert legacy_call[:3] == (None, None, None)


# transformers v4.41 tests/models/realm/test_retrieval_realm.py: its vocabulary and block records.
LEGACY_VOCAB = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]", "test", "question", "this", "is", "the", "first"]
LEGACY_VOCAB += ["second", "third", "fourth", "fifth", "record", "want", "##want", "##ed", "wa", "un", "runn"]
LEGACY_VOCAB += ["##ing", ",", "low", "lowest"]
LEGACY_RECORDS = [f"This is the {n} record" for n in ("first", "second", "third", "fourth", "fifth")]
LEGACY_RECORDS.append("This is a longer longer longer record")


@pytest.fixture
def legacy_retriever(tmp_path):
    from realm_hf import RealmTokenizer
    from realm_hf.retrieval.retriever import RealmRetriever

    (tmp_path / "vocab.txt").write_text("".join(token + "\n" for token in LEGACY_VOCAB))
    tokenizer = RealmTokenizer.from_pretrained(tmp_path)
    embeddings = np.random.default_rng(0).standard_normal((len(LEGACY_RECORDS), 4)).astype(np.float32)
    return RealmRetriever.from_embeddings(embeddings, LEGACY_RECORDS, tokenizer=tokenizer)


def test_legacy_call_passes_transformers_own_retrieve_test(legacy_retriever):
    """transformers' own `test_retrieve`, against the legacy retriever call (it failed on `special_tokens_mask`)."""
    from realm_hf import RealmConfig
    from realm_hf.retrieval.legacy import legacy_retriever_call

    retriever, config = legacy_retriever, RealmConfig(num_block_records=5)
    tokenizer = retriever.tokenizer
    retrieved_block_ids = np.array([0, 3], dtype=np.int64)
    question_input_ids = tokenizer(["Test question"]).input_ids
    answer_ids = tokenizer(
        ["the fourth"], add_special_tokens=False, return_token_type_ids=False, return_attention_mask=False
    ).input_ids
    has_answers, start_pos, end_pos, concat_inputs = legacy_retriever_call(
        retriever,
        retrieved_block_ids,
        question_input_ids,
        answer_ids=answer_ids,
        max_length=config.reader_seq_len,
        return_tensors="np",
    )
    assert len(has_answers) == len(start_pos) == len(end_pos) == 2
    for key in ("input_ids", "attention_mask", "token_type_ids", "special_tokens_mask"):
        assert concat_inputs[key].shape == (2, 10)
    assert tokenizer.convert_ids_to_tokens(concat_inputs.input_ids[1]) == [
        "[CLS]", "test", "question", "[SEP]", "this", "is", "the", "fourth", "record", "[SEP]"
    ]  # fmt: skip
    assert concat_inputs.special_tokens_mask[1].tolist() == [1, 0, 0, 1, 0, 0, 0, 0, 0, 1]


def test_legacy_call_passes_transformers_own_block_has_answer_test(legacy_retriever):
    from realm_hf.retrieval.legacy import legacy_retriever_call

    tokenizer = legacy_retriever.tokenizer
    answer_ids = tokenizer(
        ["the fourth", "longer longer"],
        add_special_tokens=False,
        return_token_type_ids=False,
        return_attention_mask=False,
    ).input_ids
    has_answers, start_pos, end_pos, _ = legacy_retriever_call(
        legacy_retriever,
        np.array([0, 3, 5]),
        tokenizer(["Test question"]).input_ids,
        answer_ids=answer_ids,
        max_length=320,
        return_tensors="np",
    )
    assert has_answers == [False, True, True]
    assert start_pos == [[-1, -1, -1], [6, -1, -1], [6, 7, 8]]
    assert end_pos == [[-1, -1, -1], [7, -1, -1], [7, 8, 9]]


def test_legacy_positional_constructor_says_what_replaces_it(legacy_retriever):
    from realm_hf.retrieval.retriever import RealmRetriever

    records = np.array([text.encode() for text in LEGACY_RECORDS], dtype=object)
    with pytest.raises(TypeError, match=r"transformers 4 constructor.*from_legacy.*from_documents"):
        RealmRetriever(records, legacy_retriever.tokenizer)


def test_legacy_keyword_constructor_says_what_replaces_it_too(legacy_retriever):
    """`RealmRetriever(block_records=..., tokenizer=...)` gets the positional form's message, not Python's own."""
    from realm_hf.retrieval.retriever import RealmRetriever

    records = np.array([text.encode() for text in LEGACY_RECORDS], dtype=object)
    with pytest.raises(TypeError, match=r"transformers 4 constructor.*from_legacy.*from_documents"):
        RealmRetriever(block_records=records, tokenizer=legacy_retriever.tokenizer)
    # Any other unknown keyword is still refused by name, and the parts are required.
    with pytest.raises(TypeError, match="unexpected keyword argument.*colour"):
        RealmRetriever(legacy_retriever.corpus, legacy_retriever.store.index.index, colour="red")
    with pytest.raises(TypeError, match="needs a `corpus`"):
        RealmRetriever(tokenizer=legacy_retriever.tokenizer)


def test_pickle_is_read_only_when_allowed_by_argument_or_environment(monkeypatch):
    monkeypatch.delenv("REALM_HF_ALLOW_PICKLE", raising=False)
    assert not pickle_allowed() and pickle_allowed(True)
    monkeypatch.setenv("REALM_HF_ALLOW_PICKLE", " Yes ")
    assert pickle_allowed()


def test_legacy_module_loads_without_faiss():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    # realm_hf/__init__ imports the retriever itself; load the subpackage modules directly to test them alone.
    code = (
        "import importlib.util, sys, types; pkg = types.ModuleType('realm_hf'); "
        f"pkg.__path__ = [{os.path.dirname(os.path.dirname(__import__('realm_hf').__file__))!r} + '/realm_hf']; "
        "sys.modules['realm_hf'] = pkg; import realm_hf.retrieval.legacy; "
        "assert 'faiss' not in sys.modules and 'datasets' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
