"""RealmForOpenQA: legacy equivalence through the retriever, batching, provenance, bad input."""

import json
import logging
import os

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModel, AutoTokenizer

import realm_hf
from realm_hf import RealmForOpenQA
from realm_hf.retrieval.retriever import RealmRetriever
from tests.support.legacy_model import load_legacy_model
from tests.support.paths import LEGACY_OPENQA
from tests.support.tiny_model import QUESTIONS, build_tiny_model


@pytest.fixture(scope="module")
def legacy():
    tensors = load_file(os.path.join(LEGACY_OPENQA, "expected_outputs.safetensors"))
    with open(os.path.join(LEGACY_OPENQA, "expected_outputs.json")) as f:
        info = json.load(f)
    return tensors, info


@pytest.fixture(scope="module")
def model():
    model = RealmForOpenQA.from_pretrained(LEGACY_OPENQA, allow_pickle=True)
    return model.eval()


def test_legacy_checkpoint_without_pickle_keeps_block_emb_but_no_texts(legacy):
    tensors, _ = legacy
    model = RealmForOpenQA.from_pretrained(LEGACY_OPENQA)
    assert model.retriever is None
    # The corpus embeddings are kept (outside the weights), not silently dropped ...
    torch.testing.assert_close(model.legacy_block_emb, tensors["block_emb"], atol=0, rtol=0)
    assert "block_emb" not in model.state_dict()
    # ... and answering says exactly what to do.
    tokenizer = AutoTokenizer.from_pretrained(LEGACY_OPENQA)
    with pytest.raises(ValueError, match="realm-hf convert"):
        model(**tokenizer(["what is the capital of france?"], return_tensors="pt"))


def test_legacy_checkpoint_with_pickle_builds_exact_retriever(model, legacy):
    tensors, _ = legacy
    assert isinstance(model.retriever, RealmRetriever)
    assert len(model.retriever) == tensors["block_emb"].shape[0]
    ids = torch.arange(len(model.retriever)).view(1, -1)
    torch.testing.assert_close(model.retriever.store.embeddings(ids)[0], tensors["block_emb"], atol=0, rtol=0)


@pytest.mark.parametrize("qi", [0, 1, 2, 3])
def test_openqa_matches_legacy_per_question(model, legacy, qi):
    tensors, info = legacy
    p = f"q{qi}."
    answer_ids = [[t for t in row if t >= 0] for row in tensors[p + "answer_ids"].tolist()]
    inputs = {k: tensors[p + k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        out = model(**inputs, answer_ids=answer_ids)
        plain = model(**inputs)
    assert out.retrieved_block_ids[0].tolist() == tensors[p + "retrieved_block_ids"].tolist()
    torch.testing.assert_close(out.retrieved_scores[0], tensors[p + "retrieved_scores"], atol=1e-5, rtol=0)
    reader = out.reader_output
    for key in ("loss", "retriever_loss", "reader_loss"):
        torch.testing.assert_close(getattr(reader, key).reshape(()), tensors[p + key].reshape(()), atol=1e-5, rtol=0)
    assert int(reader.block_idx[0]) == int(tensors[p + "block_idx"])
    assert int(reader.start_pos[0]) == int(tensors[p + "start_pos"])
    assert int(reader.end_pos[0]) == int(tensors[p + "end_pos"])
    assert torch.equal(reader.retriever_correct[0], tensors[p + "retriever_correct"])
    assert out.predicted_answer_ids.tolist() == tensors[p + "predicted_answer_ids"].tolist()
    assert plain.predicted_answer_ids.tolist() == tensors[p + "noanswer.predicted_answer_ids"].tolist()
    assert plain.loss is None
    tokenizer = model.retriever.tokenizer
    assert tokenizer.decode(out.predicted_answer_ids) == info["questions"][qi]["predicted_answer"]
    # The cased answer is cut from the block's own text at the predicted span.
    block = out.retrieved_blocks[0][int(reader.block_idx[0])]
    start, end = out.answer_char_spans[0]
    assert block["text"][start:end] == out.predicted_answers[0]
    assert out.predicted_answers[0].lower() == info["questions"][qi]["predicted_answer"]


def test_batch_equals_single_calls(model, legacy):
    tensors, info = legacy
    questions = [q["question"] for q in info["questions"]]
    answers = [q["answers"] for q in info["questions"]]
    tokenizer = model.retriever.tokenizer
    with torch.no_grad():
        batch = model(**tokenizer(questions, padding=True, return_tensors="pt"), answers=answers)
        singles = [model(**tokenizer([q], return_tensors="pt"), answers=[a]) for q, a in zip(questions, answers)]
    assert len(batch.predicted_answers) == len(questions)
    for i, single in enumerate(singles):
        assert batch.predicted_answers[i] == single.predicted_answers[0]
        assert batch.retrieved_block_ids[i].tolist() == single.retrieved_block_ids[0].tolist()
        torch.testing.assert_close(batch.answer_scores[i], single.answer_scores[0], atol=1e-4, rtol=0)
        torch.testing.assert_close(batch.retrieved_scores[i], single.retrieved_scores[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(
            batch.reader_output.retriever_loss[i], single.reader_output.retriever_loss[0], atol=1e-4, rtol=0
        )
        torch.testing.assert_close(
            batch.reader_output.reader_loss[i], single.reader_output.reader_loss[0], atol=1e-4, rtol=0
        )
    mean = torch.stack([s.loss for s in singles]).mean()
    torch.testing.assert_close(batch.loss, mean, atol=1e-4, rtol=0)


def test_answer_gives_provenance(model):
    results = model.answer(["what is the capital of france?", "which country is paris in?"])
    assert len(results) == 2
    for result in results:
        assert set(result) >= {"question", "answer", "score", "block", "retrieved", "start", "end"}
        assert result["block"]["text"][result["start"] : result["end"]] == result["answer"]
        assert len(result["retrieved"]) == model.config.reader_beam_size
        scores = [b["retrieval_score"] for b in result["retrieved"]]
        assert scores == sorted(scores, reverse=True)


@pytest.mark.parametrize("bad", ["", "   ", "word " * 100])
def test_bad_questions_are_refused_clearly(model, bad):
    with pytest.raises(ValueError, match="question|Question"):
        model.answer(bad)


def test_automodel_with_allow_pickle_attaches_retriever():
    model = AutoModel.from_pretrained(LEGACY_OPENQA, allow_pickle=True)
    assert isinstance(model, RealmForOpenQA)
    assert model.retriever is not None


def test_training_loss_backpropagates_to_question_embedder(model, legacy):
    tensors, info = legacy
    model.train()
    try:
        tokenizer = model.retriever.tokenizer
        questions = [q["question"] for q in info["questions"][:2]]
        out = model(
            **tokenizer(questions, padding=True, return_tensors="pt"),
            answers=[q["answers"] for q in info["questions"][:2]],
        )
        out.loss.backward()
        assert model.embedder.cls.dense.weight.grad is not None
        assert model.embedder.cls.dense.weight.grad.abs().sum() > 0
        assert model.reader.qa_outputs.dense_output.weight.grad.abs().sum() > 0
    finally:
        model.zero_grad()
        model.eval()


@pytest.mark.parametrize("budget", [1, 40])
def test_length_grouped_reading_equals_one_padded_batch(model, legacy, budget):
    # Rows of different lengths read in length-sorted chunks (budget 1: one row per chunk) must give the numbers of
    # one padded batch: logits of every real span, predictions, losses and gradients.
    _, info = legacy
    questions = [q["question"] for q in info["questions"]]
    answers = [q["answers"] for q in info["questions"]]
    inputs = model.retriever.tokenizer(questions, padding=True, return_tensors="pt")
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    results = {}
    try:
        for name, value in (("one batch", None), ("chunked", budget)):
            model.reader.max_tokens_per_chunk = value
            model.zero_grad()
            out = model(**inputs, answers=answers)
            out.loss.backward()
            grads = {n: p.grad.clone() for n, p in model.reader.named_parameters() if p.grad is not None}
            results[name] = (out, grads)
    finally:
        model.reader.max_tokens_per_chunk = 4096
        model.zero_grad()
    (full, full_grads), (chunked, chunked_grads) = results["one batch"], results["chunked"]
    full_logits, chunked_logits = full.reader_output.reader_logits, chunked.reader_output.reader_logits
    real = full_logits > torch.finfo(full_logits.dtype).min / 2
    assert real.any() and not real.all()  # padding spans exist, so the chunked path really cut rows short
    assert torch.equal(real, chunked_logits > torch.finfo(chunked_logits.dtype).min / 2)
    torch.testing.assert_close(chunked_logits[real], full_logits[real], atol=1e-5, rtol=1e-5)
    assert chunked.predicted_answers == full.predicted_answers
    torch.testing.assert_close(chunked.loss, full.loss, atol=1e-5, rtol=1e-5)
    assert set(chunked_grads) == set(full_grads)
    for name, grad in full_grads.items():
        torch.testing.assert_close(chunked_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_reader_uses_the_fused_tanh_gelu(model):
    from transformers.activations import GELUTanh, NewGELUActivation

    assert model.config.hidden_act == "gelu_new"
    activations = [m for m in model.modules() if isinstance(m, (GELUTanh, NewGELUActivation))]
    assert activations and all(isinstance(m, GELUTanh) for m in activations)
    x = torch.linspace(-6, 6, 1001)
    torch.testing.assert_close(GELUTanh()(x), NewGELUActivation()(x), atol=1e-6, rtol=1e-6)


def test_retriever_of_another_embedding_size_is_refused(model):
    from realm_hf.models.modeling_pretraining import RealmForPreTraining
    from realm_hf.retrieval.retriever import RealmRetriever

    proj = model.config.retriever_proj_size
    wrong = RealmRetriever.from_embeddings(
        torch.randn(3, proj + 1), ["a", "b", "c"], tokenizer=model.retriever.tokenizer, index="Flat"
    )
    before = model.retriever
    with pytest.raises(ValueError, match=rf"{proj + 1}-d.*{proj} dimensions"):
        model.set_retriever(wrong)
    assert model.retriever is before  # unchanged: the model still answers from its own corpus
    with pytest.raises(ValueError, match="holds .*-d embeddings"):
        RealmForOpenQA(model.config, retriever=wrong)
    with pytest.raises(ValueError, match="holds .*-d embeddings"):
        RealmForPreTraining(model.config, retriever=wrong)
    right = RealmRetriever.from_embeddings(
        torch.randn(3, proj), ["a", "b", "c"], tokenizer=model.retriever.tokenizer, index="Flat"
    )
    model.set_retriever(right)
    assert model.retriever is right
    model.set_retriever(before)


def test_nan_reader_weights_are_an_error_not_an_empty_answer(tmp_path):
    model, _ = build_tiny_model(str(tmp_path))
    with torch.no_grad():
        model.reader.qa_outputs.dense_output.weight.fill_(float("nan"))
    qa = realm_hf.pipeline("question-answering", model=model)
    for call in (
        lambda: model.answer(QUESTIONS[0]),
        lambda: qa(QUESTIONS[0]),
        lambda: qa(QUESTIONS[0], context="Unix was written by Ken."),
    ):
        with pytest.raises(ValueError, match="The reader's span scores are NaN"):
            call()


def untrained_warnings(caplog):
    return [r for r in caplog.records if "reader was never trained" in r.getMessage()]


def test_untrained_reader_warns_at_load_and_answer_and_in_card(legacy_vocab_bert, tmp_path, caplog):
    from huggingface_hub import ModelCard

    from realm_hf import RealmRetriever, RealmTokenizer
    from realm_hf.models.initialization import init_from_bert

    model = init_from_bert(
        RealmForOpenQA, legacy_vocab_bert, retriever_proj_size=8, span_hidden_size=8, base_model="org/tiny-bert"
    )
    tokenizer = RealmTokenizer.from_pretrained(legacy_vocab_bert)
    documents = [{"title": "Paris", "text": "Paris is the capital of France."}]
    model.set_retriever(RealmRetriever.from_documents(documents, model.embedder, tokenizer, show_progress=False))
    with caplog.at_level(logging.WARNING):
        model.answer("what is the capital of france?")
        model.answer("what is the capital of france?")
    assert len(untrained_warnings(caplog)) == 1  # once per model, not once per call
    model.save_pretrained(tmp_path / "m")
    card = ModelCard.load(tmp_path / "m" / "README.md")
    assert "reader was never trained" in card.text
    assert card.data.base_model == "org/tiny-bert"
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        reloaded = RealmForOpenQA.from_pretrained(tmp_path / "m")
    assert reloaded.config.reader_trained is False
    assert len(untrained_warnings(caplog)) == 1
    caplog.clear()
    import realm_hf

    with caplog.at_level(logging.WARNING):
        realm_hf.pipeline("question-answering", model=RealmForOpenQA.from_pretrained(tmp_path / "m"))
    assert untrained_warnings(caplog)


def test_legacy_checkpoint_counts_as_trained(caplog):
    with caplog.at_level(logging.WARNING):
        model = load_legacy_model()
        model.answer("what is the capital of france?")
    assert model.config.reader_trained is True
    assert not untrained_warnings(caplog)


def test_answer_top_k_matches_the_pipeline():
    import realm_hf

    model = load_legacy_model()
    question = "what is the capital of france?"
    best = model.answer(question)
    top = model.answer(question, top_k=3)
    piped = realm_hf.pipeline("question-answering", model=model)(question, top_k=3)
    assert isinstance(top, list) and 1 <= len(top) <= 3
    keys = ("answer", "score", "logit", "start", "end", "block")
    assert [{k: a[k] for k in keys} for a in top] == [{k: a[k] for k in keys} for a in piped]
    # The first of the top k is answer()'s best answer; texts are distinct, scores best first.
    assert {k: top[0][k] for k in keys} == {k: best[k] for k in keys}
    assert len({a["answer"].lower() for a in top}) == len(top)
    assert [a["score"] for a in top] == sorted((a["score"] for a in top), reverse=True)
    assert all(a["question"] == question and a["retrieved"] == best["retrieved"] for a in top)
    batch = model.answer([question, "who created python?"], top_k=2)
    assert len(batch) == 2 and all(isinstance(answers, list) for answers in batch)
    with pytest.raises(ValueError, match="top_k"):
        model.answer(question, top_k=0)


# ---------------------------------------------------------------------------------------------------------------------
# Metadata filters
# ---------------------------------------------------------------------------------------------------------------------


def restricted_to(tmp_path, titles):
    """The tiny model (built again: the same weights) over a corpus of the blocks of `titles` alone."""
    other, tokenizer = build_tiny_model(str(tmp_path))
    corpus = other.retriever.corpus
    rows = [i for i, title in enumerate(corpus["title"]) if title in titles]
    embeddings = torch.tensor([corpus[i]["embeddings"] for i in rows])
    texts, kept = [corpus[i]["text"] for i in rows], [corpus[i]["title"] for i in rows]
    restricted = RealmRetriever.from_embeddings(embeddings, texts, titles=kept, tokenizer=tokenizer, index="Flat")
    other.set_retriever(restricted)
    return other


def same_answer(got, expected):
    assert (got["answer"], got["start"], got["end"]) == (expected["answer"], expected["start"], expected["end"])
    assert got["score"] == pytest.approx(expected["score"], abs=1e-5)
    assert got["block"]["title"] == expected["block"]["title"]
    assert [b["title"] for b in got["retrieved"]] == [b["title"] for b in expected["retrieved"]]


# Three titles fill the reader's beam of 3; two leave a place of it empty, which the filtered answer must not read.
@pytest.mark.parametrize("titles", [("Unix", "Lisp", "Python"), ("Compiler", "Emacs")])
def test_a_filtered_answer_is_the_answer_over_the_matching_blocks_alone(tmp_path, titles):
    model, _ = build_tiny_model(str(tmp_path))
    (tmp_path / "restricted").mkdir()
    reference = restricted_to(tmp_path / "restricted", titles)
    got = model.answer(QUESTIONS, filter={"title": list(titles)})
    expected = reference.answer(QUESTIONS)
    for g, e in zip(got, expected):
        same_answer(g, e)
        assert len(g["retrieved"]) == min(len(titles), model.config.reader_beam_size)
    by_callable = model.answer(QUESTIONS[0], filter=lambda block: block["title"] in titles, top_k=2)
    assert [a["answer"] for a in by_callable] == [a["answer"] for a in reference.answer(QUESTIONS[0], top_k=2)]


def test_a_filter_that_lets_no_block_through_is_refused_naming_the_question(tmp_path):
    model, _ = build_tiny_model(str(tmp_path))
    with pytest.raises(ValueError, match=r"no block for 1 question\(s\) \('who wrote unix\?'\).*Loosen the filter"):
        model.answer(QUESTIONS[0], filter={"title": "Fortran"})
    with pytest.raises(TypeError, match="`filter` takes a dict"):
        model.answer(QUESTIONS[0], filter="Unix")


def test_training_with_a_filter_keeps_the_loss_finite_over_fewer_blocks_than_the_beam(tmp_path):
    model, tokenizer = build_tiny_model(str(tmp_path))
    model.train()
    inputs = tokenizer(QUESTIONS, padding=True, return_tensors="pt")
    answers = [["Ken Thompson"], ["a program"], ["1991"]]
    out = model(**inputs, answers=answers, filter={"title": ["Unix", "Python"]})
    assert torch.isfinite(out.loss)
    assert out.retrieved_block_ids.shape == (3, 2) and set(out.retrieved_block_ids.flatten().tolist()) == {1, 3}
    out.loss.backward()
    assert model.embedder.cls.dense.weight.grad.abs().sum() > 0


def test_a_place_left_empty_for_one_question_takes_no_share_and_is_not_listed(tmp_path, monkeypatch):
    # An approximate index can fill fewer places for one question of a batch than for another.
    model, _ = build_tiny_model(str(tmp_path))
    search = model.retriever.search

    def search_leaving_a_place_empty(*args, **kwargs):
        out = search(*args, **kwargs)
        out.block_ids[0, -1] = -1
        out.blocks[0][-1] = {"block_id": -1, "title": "", "text": ""}
        return out

    monkeypatch.setattr(model.retriever, "search", search_leaving_a_place_empty)
    with torch.inference_mode():
        inputs = model.retriever.tokenizer(QUESTIONS, padding=True, return_tensors="pt")
        out = model(**inputs, questions=QUESTIONS)
    scores = out.retrieved_scores
    assert scores.shape == (3, 3) and torch.isneginf(scores[0, -1]) and torch.isfinite(scores[1:]).all()
    assert torch.isneginf(out.reader_output.reader_logits[0, -1]).all()  # no span of the empty place can win
    answers = model.answer(QUESTIONS)
    assert [len(a["retrieved"]) for a in answers] == [2, 3, 3]
    assert answers[0]["block"]["block_id"] >= 0


def test_drop_unfilled_blocks_keeps_the_places_some_question_filled():
    from realm_hf.models.reader_inputs import drop_unfilled_blocks
    from realm_hf.retrieval.contract import RealmSearchOutput

    ids = torch.tensor([[4, -1, -1, -1], [2, 5, -1, -1]])
    blocks = [[{"block_id": int(i)} for i in row] for row in ids]
    out = drop_unfilled_blocks(RealmSearchOutput(block_ids=ids, scores=torch.zeros(2, 4), blocks=blocks), ["a", "b"])
    assert out.block_ids.tolist() == [[4, -1], [2, 5]]
    assert [[b["block_id"] for b in row] for row in out.blocks] == [[4, -1], [2, 5]]
    with pytest.raises(ValueError, match=r"no block for 1 question\(s\) \('c'\)"):
        drop_unfilled_blocks(RealmSearchOutput(block_ids=torch.tensor([[3], [-1]]), blocks=[[{}], [{}]]), ["d", "c"])
