"""Compute dtype of answering and embedding: one rule (`realm_hf.precision`), the `dtype` option of `answer()`, the
pipeline, `realm-hf ask` and `realm-hf serve`, bf16 and int8 answers against fp32 on the tiny fixtures, the warning
where bf16 is not native, and int8's copies that never change the saved weights.

Where a test needs bf16 to run, it declares the CPU bf16-native by monkeypatching `has_native_bf16` (autocast then runs
in bf16 on any CPU, emulated where the instructions are missing); where it needs the fallback, it declares it not.
"""

import json
import warnings

import pytest
import torch

import realm_hf
from realm_hf import precision
from realm_hf.cli import main
from realm_hf.models.modeling_reader import RealmReaderProjection
from realm_hf.retrieval.encoding import embed_blocks
from tests.support.tiny_model import QUESTIONS


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
        ("int8", "int8"),
        ("INT8", "int8"),
        ("qint8", "int8"),
        (torch.qint8, "int8"),
        (torch.int8, "int8"),
    ],
)
def test_parse_dtype_accepts_names_and_torch_dtypes(given, expected):
    assert precision.parse_dtype(given) == expected


@pytest.mark.parametrize("bad", ["int4", "bf32", "", 16, torch.quint8, torch.float64])
def test_parse_dtype_refuses_unknown_values_saying_what_to_use(bad):
    with pytest.raises(ValueError, match=r"Unknown dtype .*'fp32', 'bf16'.*'int8'.*'auto'"):
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
    with pytest.warns(UserWarning, match="AVX512-BF16.*AMX.*fp32"):
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
    with pytest.warns(UserWarning, match="answering runs in fp32"):
        bf16 = model.answer(QUESTIONS, dtype="bf16")
    assert bf16 == fp32
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert model.answer(QUESTIONS, dtype="auto") == fp32


def test_answer_refuses_an_unknown_dtype(tiny):
    with pytest.raises(ValueError, match=r"Unknown dtype 'int4'.*'fp32', 'bf16', 'fp16'.*'int8'"):
        tiny[0].answer(QUESTIONS[0], dtype="int4")


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
    assert main(["-q", "ask", QUESTIONS[0], "--model", tiny[2], "--dtype", "int4"]) == 2
    assert "--dtype must be fp32, bf16, auto, fp16 (GPUs only) or int8 (CPUs only)" in capsys.readouterr().err


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
        embed_blocks(model.embedder, tokenizer, None, texts, dtype="int4", show_progress=False)
    # int8 answers; an index embedded in int8 would no longer match the questions' vectors.
    with pytest.raises(ValueError, match="'int8'.*answering only.*'fp32'"):
        embed_blocks(model.embedder, tokenizer, None, texts, dtype="int8", show_progress=False)


# ------------------------------------------------------------------------------------------------------------------
# int8 answering (CPUs)
# ------------------------------------------------------------------------------------------------------------------


def _is_int8(module) -> bool:
    return type(module).__module__.startswith("torch.ao.nn.quantized")


def test_answer_int8_runs_an_int8_copy_of_the_reader(tiny):
    model = tiny[0]
    fp32 = model.answer(QUESTIONS)
    int8 = model.answer(QUESTIONS, dtype="int8")
    assert [set(a) for a in int8] == [set(a) for a in fp32]
    assert all(a["answer"] and a["block"] is not None and a["retrieved"] for a in int8)
    # The reader's probabilities moved: int8 did run (the answers may differ where spans nearly tie) ...
    assert [a["score"] for a in int8] != [a["score"] for a in fp32]
    # ... and retrieval is exactly fp32's: the question embedder stays fp32, as under bf16.
    assert [[(b["block_id"], b["retrieval_score"]) for b in a["retrieved"]] for a in int8] == [
        [(b["block_id"], b["retrieval_score"]) for b in a["retrieved"]] for a in fp32
    ]
    with precision.int8_answering():
        embedder, reader = model.answering_modules()
    assert _is_int8(reader.realm.encoder.layer[0].attention.self.query)
    assert _is_int8(reader.realm.encoder.layer[0].output.dense)
    assert embedder is model.embedder
    # The span scorer stays fp32; the model's own layers are untouched.
    assert type(reader.qa_outputs.dense_output) is torch.nn.Linear
    assert type(model.reader.realm.encoder.layer[0].attention.self.query) is torch.nn.Linear
    assert model.answering_modules() == (model.embedder, model.reader)  # outside int8 answering
    assert model.answer(QUESTIONS, dtype=torch.qint8) == int8  # the copies are kept between calls
    # One context entered once per batch. Activations are quantized with one scale per batch, so an int8 answer can
    # depend on the other questions of its batch: one question per batch is compared with one question per call.
    assert model.answer(QUESTIONS, dtype="int8", batch_size=1) == [model.answer(q, dtype="int8") for q in QUESTIONS]


def test_int8_answering_never_changes_the_saved_weights(tmp_path, tiny):
    from safetensors.torch import load_file

    model = tiny[0]
    model.save_pretrained(tmp_path / "before")
    keys = set(model.state_dict())
    model.answer(QUESTIONS, dtype="int8")
    assert set(model.state_dict()) == keys  # no packed int8 parameter joined the model
    model.save_pretrained(tmp_path / "after")
    before = load_file(tmp_path / "before" / "model.safetensors")
    after = load_file(tmp_path / "after" / "model.safetensors")
    assert before.keys() == after.keys()
    assert all(after[k].dtype == before[k].dtype and torch.equal(after[k], before[k]) for k in before)


def test_int8_copies_follow_the_weights(tiny):
    model = tiny[0]
    with precision.int8_answering():
        first = model.answering_modules()
        assert model.answering_modules()[1] is first[1]
        state = {k: v.clone() for k, v in model.reader.state_dict().items()}
        try:
            with torch.no_grad():
                model.reader.qa_outputs.dense_output.bias.add_(1.0)
            assert model.answering_modules()[1] is not first[1]  # rebuilt from the changed weights
        finally:
            model.reader.load_state_dict(state)


def test_int8_and_fp32_calls_at_the_same_time_each_get_their_own(tiny):
    from concurrent.futures import ThreadPoolExecutor

    model = tiny[0]
    expected = {dtype: model.answer(QUESTIONS, dtype=dtype) for dtype in ("fp32", "int8")}
    with ThreadPoolExecutor(4) as pool:
        runs = [(dtype, pool.submit(model.answer, QUESTIONS, dtype=dtype)) for dtype in ("fp32", "int8") * 4]
        assert all(future.result() == expected[dtype] for dtype, future in runs)


def test_int8_is_refused_off_the_cpu_and_outside_answering(tiny, monkeypatch):
    with pytest.raises(ValueError, match=r"CPUs only.*on cuda.*'bf16' or 'fp16'"):
        precision.resolve_autocast_dtype("int8", "cuda")
    with pytest.raises(ValueError, match="'int8' is for answering only"):
        precision.autocast("cpu", "int8", "training")
    model = tiny[0]
    monkeypatch.setattr(type(model), "device", property(lambda self: torch.device("cuda")))
    with pytest.raises(ValueError, match=r"CPUs only.*model\.to\('cpu'\)"):
        model.answer(QUESTIONS[0], dtype="int8")


def test_pipeline_and_serve_take_int8(tiny):
    from realm_hf.serving.service import RealmQAService

    model = tiny[0]
    expected = model.answer(QUESTIONS, dtype="int8")
    qa = realm_hf.pipeline("question-answering", model=model)
    assert [_key(a) for a in qa(QUESTIONS, dtype="int8")] == [_key(a) for a in expected]
    context = "Unix is an operating system written by Ken Thompson and Dennis Ritchie at Bell Labs."
    assert qa(question=QUESTIONS[0], context=context, dtype="int8")["answer"]
    # Every question answered, as `model.answer` does (the served default abstains under 0.1).
    served = RealmQAService(model, dtype="int8", no_answer_threshold=0).answer(QUESTIONS[0], top_k=1)
    assert _key(served[0]) == _key(expected[0])


def test_ask_takes_int8_and_refuses_it_on_a_gpu(tiny, capsys, monkeypatch):
    import realm_hf.cli.ask as ask

    model, _, path = tiny
    assert main(["-q", "ask", *QUESTIONS, "--model", path, "--json", "--dtype", "int8"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["answer"] for r in records] == [a["answer"] for a in model.answer(QUESTIONS, dtype="int8")]
    # A model loaded onto a GPU is refused before any question is read.
    on_gpu = type("OnGpu", (), {"device": torch.device("cuda")})()
    monkeypatch.setattr(ask, "load_openqa", lambda *args, **kwargs: on_gpu)
    assert main(["-q", "ask", QUESTIONS[0], "--model", path, "--dtype", "int8"]) == 2
    assert "--dtype int8 answers on CPUs only, but the model is on cuda: add --device cpu" in capsys.readouterr().err
