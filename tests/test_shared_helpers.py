"""The helpers written once and shared: atomic writes, the sentence rule, the block tokenizer, the pickle opt-in."""

import os
import subprocess
import sys

import pytest
from transformers import BertTokenizerFast

from realm_hf.io.atomic import atomic_write, atomic_write_text, swap_into_place
from realm_hf.models.pretraining_inputs import encode_blocks
from realm_hf.retrieval.encoding import tokenize_blocks
from realm_hf.retrieval.legacy import pickle_allowed
from realm_hf.text.sentences import sentence_spans, split_sentences

HERE = os.path.dirname(__file__)


def test_atomic_write_keeps_old_content_on_error(tmp_path):
    path = tmp_path / "state.json"
    atomic_write_text(path, "old")
    with pytest.raises(RuntimeError):
        with atomic_write(path) as f:
            f.write("half")
            raise RuntimeError("boom")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["state.json"]


def test_swap_into_place_undoes_on_failure(tmp_path):
    target, staging = tmp_path / "t", tmp_path / "t" / ".staging"
    staging.mkdir(parents=True)
    (target / "a").write_text("old a")
    (staging / "a").write_text("new a")
    (staging / "sub").mkdir()
    (staging / "sub" / "b").write_text("new b")  # its target folder t/sub does not exist: the move fails
    with pytest.raises(OSError):
        swap_into_place(str(staging), str(target), ["a", "sub/b"])
    assert (target / "a").read_text() == "old a"


def test_one_sentence_rule():
    text = "A type of RAM, e.g. DRAM. It was made by D. Howe in 1966. Fine!\n1. Sense one. next one"
    assert [text[s:e] for s, e in sentence_spans(text)] == [
        "A type of RAM, e.g. DRAM.",
        "It was made by D. Howe in 1966.",
        "Fine!",
        "1. Sense one.",
        "next one",
    ]
    assert split_sentences("paris is big. the seine flows.") == ["paris is big.", "the seine flows."]


def test_block_tokenizer_matches_pretraining_encoding():
    tokenizer = BertTokenizerFast(vocab_file=os.path.join(HERE, "fixtures", "corpus", "vocab.txt"))
    titles, texts = ["paris", None], ["paris is the capital of france.", "the cat sat on the mat."]
    ours = tokenize_blocks(tokenizer, titles, texts, max_length=12, padding=True, return_tensors="pt")
    theirs = encode_blocks(tokenizer, titles, texts, 12)
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        assert ours[key].tolist() == theirs[key].tolist()


def test_pickle_opt_in(monkeypatch):
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
