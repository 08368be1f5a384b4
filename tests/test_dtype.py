"""Compute dtype of answering and embedding: one rule (`realm_hf.precision`), the `dtype` option of `answer()`, the
pipeline and `realm-hf ask`, bf16 answers against fp32 on the tiny fixtures, and the warning where bf16 is not native.

Where a test needs bf16 to run, it declares the CPU bf16-native by monkeypatching `has_native_bf16` (autocast then runs
in bf16 on any CPU, emulated where the instructions are missing); where it needs the fallback, it declares it not.
"""

import json
import warnings

import pytest
import torch
from test_pipeline import QUESTIONS, build_tiny_model, save_tiny_model

import realm_hf
from realm_hf import precision
from realm_hf.cli import main
from realm_hf.models.modeling_reader import RealmReaderProjection
from realm_hf.retrieval.encoding import embed_blocks


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tiny-dtype")
    model, tokenizer = build_tiny_model(str(tmp))
    return model, tokenizer, save_tiny_model(model, tokenizer, tmp / "model")


@pytest.fixture
def native(monkeypatch):
    monkeypatch.setattr(precision, "has_native_bf16", lambda device="cpu": True)


@pytest.fixture
def not_native(monkeypatch):
    monkeypatch.setattr(precision, "has_native_bf16", lambda device="cpu": False)


def _key(answer):
    return answer["answer"], answer["start"], answer["end"], answer["block"]["block_id"]


# ------------------------------------------------------------------------------------------------------------------
# The rule
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given, expected",
    [
        (None, None),
        ("auto", "auto"),
        ("AUTO", "auto"),
        ("fp32", torch.float32),
        ("float32", torch.float32),
        ("bf16", torch.bfloat16),
        ("bfloat16", torch.bfloat16),
        ("torch.bfloat16", torch.bfloat16),
        ("fp16", torch.float16),
        ("half", torch.float16),
        (torch.bfloat16, torch.bfloat16),
        (torch.float32, torch.float32),
    ],
)
def test_parse_dtype_accepts_names_and_torch_dtypes(given, expected):
    assert precision.parse_dtype(given) == expected


@pytest.mark.parametrize("bad", ["int8", "bf32", "", 16, torch.int8, torch.float64])
def test_parse_dtype_refuses_unknown_values_saying_what_to_use(bad):
    with pytest.raises(ValueError, match=r"Unknown dtype .*'fp32', 'bf16'.*'auto'"):
        precision.parse_dtype(bad)


def test_bf16_only_where_native(monkeypatch):
    resolve = precision.resolve_autocast_dtype
    monkeypatch.setattr(precision, "has_native_bf16", lambda device="cpu": True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning where bf16 is native
        assert resolve("bf16", "cpu") == torch.bfloat16
        assert resolve("auto", "cpu") == torch.bfloat16
        assert resolve("fp32", "cpu") is None and resolve(None, "cpu") is None
    monkeypatch.setattr(precision, "has_native_bf16", lambda device="cpu": False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve("auto", "cpu") is None  # "auto" falls back silently
    with pytest.warns(UserWarning, match="neither AVX512-BF16 nor AMX.*slower than fp32.*runs in fp32"):
        assert resolve("bf16", "cpu") is None
    with pytest.warns(UserWarning, match="no fast fp16"):
        assert resolve("fp16", "cpu") is None


def test_has_native_bf16_answers_for_this_machine():
    # No claim about this CPU; only that the check runs and answers a bool, and that no GPU means no CUDA bf16.
    assert isinstance(precision.has_native_bf16("cpu"), bool)
    if not torch.cuda.is_available():
        assert precision.has_native_bf16("cuda") is False


# ------------------------------------------------------------------------------------------------------------------
# answer()
# ------------------------------------------------------------------------------------------------------------------


def test_answer_bf16_agrees_with_fp32_and_retrieves_the_same_blocks(tiny, native):
    model = tiny[0]
    fp32 = model.answer(QUESTIONS)
    bf16 = model.answer(QUESTIONS, dtype="bf16")
    # On the tiny fixtures every bf16 answer is the fp32 one (same span, same block) ...
    assert [_key(a) for a in bf16] == [_key(a) for a in fp32]
    for low, high in zip(bf16, fp32):
        assert low["score"] == pytest.approx(high["score"], rel=0.05)
        # ... and retrieval is exactly fp32's: the question embedder runs in fp32 under autocast outside training.
        assert [(b["block_id"], b["retrieval_score"]) for b in low["retrieved"]] == [
            (b["block_id"], b["retrieval_score"]) for b in high["retrieved"]
        ]
    # bf16 did run: the reader's span probabilities moved (by far less than the answers' margins).
    assert any(low["score"] != high["score"] for low, high in zip(bf16, fp32))
    assert model.answer(QUESTIONS, dtype=torch.bfloat16) == bf16
    assert model.answer(QUESTIONS, dtype="auto") == bf16  # "auto" is bf16 where native


def test_answer_warns_and_runs_fp32_where_bf16_is_not_native(tiny, not_native):
    model = tiny[0]
    fp32 = model.answer(QUESTIONS)
    with pytest.warns(UserWarning, match="slower than fp32, so answering runs in fp32"):
        bf16 = model.answer(QUESTIONS, dtype="bf16")
    assert bf16 == fp32
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert model.answer(QUESTIONS, dtype="auto") == fp32


def test_answer_refuses_an_unknown_dtype(tiny):
    with pytest.raises(ValueError, match="Unknown dtype 'int8'"):
        tiny[0].answer(QUESTIONS[0], dtype="int8")


def test_span_logits_are_computed_in_fp32_under_autocast():
    # The cast to fp32 after the span head came too late: its output layer had already rounded the logits to bf16
    # (1/16 at 10), which decided between spans whose fp32 logits differ by less.
    from realm_hf import RealmConfig

    torch.manual_seed(0)
    config = RealmConfig(hidden_size=32, span_hidden_size=16, max_span_width=4, initializer_range=0.5)
    head = RealmReaderProjection(config).eval()
    # Under autocast the encoder hands the head bf16 hidden states: the same values in fp32 are the reference.
    hidden = (torch.randn(3, 12, 32) * 4).bfloat16()
    block_mask = torch.ones(3, 12, dtype=torch.bool)
    with torch.no_grad():
        reference, _, _ = head(hidden.float(), block_mask)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low, _, _ = head(hidden, block_mask)
    assert low.dtype == torch.float32
    torch.testing.assert_close(low, reference, rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------------------------------------------
# The pipeline and `realm-hf ask`
# ------------------------------------------------------------------------------------------------------------------


def test_pipeline_takes_dtype_per_call_and_at_construction(tiny, native):
    model = tiny[0]
    expected = model.answer(QUESTIONS, dtype="bf16")
    qa = realm_hf.pipeline("question-answering", model=model)
    per_call = qa(QUESTIONS, dtype="bf16")
    assert [_key(a) for a in per_call] == [_key(a) for a in expected]
    assert [a["score"] for a in per_call] == pytest.approx([a["score"] for a in expected], rel=1e-5)
    assert [a["score"] for a in qa(QUESTIONS)] != [a["score"] for a in per_call]  # the next call is fp32 again
    built = realm_hf.pipeline("question-answering", model=model, dtype="bf16")
    assert [a["score"] for a in built(QUESTIONS)] == [a["score"] for a in per_call]
    # Reading a given context takes it too.
    context = "Unix is an operating system written by Ken Thompson and Dennis Ritchie at Bell Labs."
    fp32, bf16 = qa(question=QUESTIONS[0], context=context), qa(question=QUESTIONS[0], context=context, dtype="bf16")
    assert (bf16["answer"], bf16["start"]) == (fp32["answer"], fp32["start"])


def test_pipeline_refuses_an_unknown_dtype(tiny):
    qa = realm_hf.pipeline("question-answering", model=tiny[0])
    with pytest.raises(ValueError, match="Unknown dtype 'fp64'"):
        qa(QUESTIONS[0], dtype="fp64")
    with pytest.raises(ValueError, match="Unknown dtype 'fp64'"):
        realm_hf.pipeline("question-answering", model=tiny[0], dtype="fp64")


def test_ask_takes_dtype(tiny, native, capsys):
    model, _, path = tiny
    assert main(["-q", "ask", *QUESTIONS, "--model", path, "--json", "--dtype", "bf16"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = model.answer(QUESTIONS, dtype="bf16")
    assert [(r["answer"], r["block"]["block_id"]) for r in records] == [
        (e["answer"], e["block"]["block_id"]) for e in expected
    ]
    assert [r["score"] for r in records] == pytest.approx([e["score"] for e in expected], rel=1e-5)


def test_ask_refuses_an_unknown_dtype(tiny, capsys):
    assert main(["-q", "ask", QUESTIONS[0], "--model", tiny[2], "--dtype", "int8"]) == 2
    assert "--dtype must be fp32, bf16, auto" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------------------------
# Embedding follows the same rule
# ------------------------------------------------------------------------------------------------------------------


def test_embedding_follows_the_same_rule(tiny, not_native):
    model, tokenizer, _ = tiny
    texts = ["A compiler translates source code.", "Unix was written at Bell Labs."]
    fp32 = embed_blocks(model.embedder, tokenizer, None, texts, show_progress=False)
    with pytest.warns(UserWarning, match="asked for embedding.*runs in fp32"):
        fallback = embed_blocks(model.embedder, tokenizer, None, texts, dtype="bf16", show_progress=False)
    assert torch.equal(fallback, fp32)
    with pytest.raises(ValueError, match="Unknown dtype"):
        embed_blocks(model.embedder, tokenizer, None, texts, dtype="int8", show_progress=False)
