"""The REALM question-answering pipeline: answers with provenance, context reading, batching, and every entry point.

The model is the tiny RealmForOpenQA of support/tiny_model.py (a real corpus and FAISS index).
"""

import json
import os
import re
import sys

import datasets
import pytest
import torch
import transformers

import realm_hf
from realm_hf import RealmConfig, RealmForOpenQA, RealmTokenizer
from realm_hf.models.provenance import PROVENANCE_KEYS
from realm_hf.pipelines import (
    PIPELINE_MODULE_FILE,
    REALM_QA_TASK,
    RealmQuestionAnsweringPipeline,
    declare_pipeline,
    is_realm_model,
    register_pipeline,
    write_pipeline_module,
)
from tests.support.paths import LEGACY_OPENQA
from tests.support.tiny_model import DOCS, QUESTIONS, assert_same_answers, save_tiny_model


@pytest.fixture(scope="module")
def qa(tiny):
    return realm_hf.pipeline("question-answering", model=tiny[0])


def _check_open_answer(answer):
    assert set(answer) == {"answer", "score", "logit", "start", "end", "block"}
    block = answer["block"]
    # The shared schema (docs/provenance.md): `score` is the answer's probability, never the block's.
    assert set(block) == set(PROVENANCE_KEYS)
    assert block["text"][answer["start"] : answer["end"]] == answer["answer"]
    assert answer["answer"].strip()
    assert 0.0 < answer["score"] <= 1.0
    assert (block["title"], block["text"]) == DOCS[block["block_id"]]


# ------------------------------------------------------------------------------------------------------------------
# Answers
# ------------------------------------------------------------------------------------------------------------------


def test_single_question_answer_with_provenance_matches_model(tiny, qa):
    model = tiny[0]
    answer = qa(QUESTIONS[0])
    _check_open_answer(answer)
    reference = model.answer(QUESTIONS[0])
    # Top-1 is the model's own prediction, with the same probability, logit and block dict.
    assert answer["answer"] == reference["answer"]
    assert answer["block"]["block_id"] == reference["block"]["block_id"]
    assert (answer["start"], answer["end"]) == (reference["start"], reference["end"])
    assert answer["logit"] == pytest.approx(reference["logit"], abs=1e-4)
    assert answer["score"] == pytest.approx(reference["score"], abs=1e-5)
    assert answer["block"]["retrieval_score"] == pytest.approx(reference["block"]["retrieval_score"], abs=1e-4)


def test_batched_questions_match_single_and_use_one_forward(tiny, qa):
    model = tiny[0]
    calls = []
    hook = model.register_forward_hook(lambda *args: calls.append(1))
    try:
        batched = qa(QUESTIONS, batch_size=len(QUESTIONS))
    finally:
        hook.remove()
    assert len(calls) == 1  # one forward pass for the whole batch
    assert len(batched) == len(QUESTIONS)
    for question, answer in zip(QUESTIONS, batched):
        single = qa(question)
        _check_open_answer(answer)
        assert answer["answer"] == single["answer"]
        assert answer["block"]["block_id"] == single["block"]["block_id"]
        assert answer["logit"] == pytest.approx(single["logit"], abs=1e-3)


def test_batch_size_one_and_uneven_batches(qa):
    one = qa(QUESTIONS, batch_size=1)
    two = qa(QUESTIONS, batch_size=2)  # last batch has one question
    assert [a["answer"] for a in one] == [a["answer"] for a in two]


def test_top_k_distinct_answers_across_blocks(tiny, qa):
    answers = qa(QUESTIONS[1], top_k=5)
    assert isinstance(answers, list) and len(answers) == 5
    for answer in answers:
        _check_open_answer(answer)
    logits = [a["logit"] for a in answers]
    assert logits == sorted(logits, reverse=True)
    texts = [" ".join(a["answer"].lower().split()) for a in answers]
    assert len(set(texts)) == len(texts)
    assert sum(a["score"] for a in answers) <= 1.0 + 1e-6
    assert answers[0]["answer"] == qa(QUESTIONS[1])["answer"]
    # Every read block may contribute: the candidates come from reader_logits over all blocks (1000 > all spans).
    assert {a["block"]["block_id"] for a in qa(QUESTIONS[1], top_k=1000)} == {
        b["block_id"] for b in tiny[0].answer(QUESTIONS[1])["retrieved"]
    }


def test_top_k_batched_returns_list_per_question(qa):
    answers = qa(QUESTIONS[:2], top_k=2)
    assert len(answers) == 2 and all(isinstance(a, list) and len(a) == 2 for a in answers)


def test_num_blocks_and_max_answer_len(tiny, qa):
    model = tiny[0]
    seen = []
    # What the reader sees during the call: 5 blocks while the config still says 3 (nothing shared is changed).
    hook = model.reader.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append((kwargs["input_ids"].shape[1], model.config.reader_beam_size)),
        with_kwargs=True,
    )
    try:
        answers = qa(QUESTIONS[0], num_blocks=5, top_k=1000)  # every span of every block: all 5 blocks are read
    finally:
        hook.remove()
    assert seen == [(5, 3)]
    assert len({a["block"]["block_id"] for a in answers}) == 5
    assert model.config.reader_beam_size == 3  # a per-call setting, not a change to the model
    tokenizer = tiny[1]
    for answer in qa(QUESTIONS[0], max_answer_len=1, top_k=10):
        assert len(tokenizer(answer["answer"], add_special_tokens=False)["input_ids"]) == 1
    with pytest.raises(ValueError, match="max_span_width"):
        qa(QUESTIONS[0], max_answer_len=model.config.max_span_width + 1)
    with pytest.raises(ValueError, match="top_k"):
        qa(QUESTIONS[0], top_k=0)


def test_pipeline_restores_training_mode(tiny):
    model = tiny[0]
    pipe = realm_hf.pipeline("question-answering", model=model)
    model.train()
    try:
        answer = pipe(QUESTIONS[0])
        assert model.training
    finally:
        model.eval()
    assert answer["answer"] == pipe(QUESTIONS[0])["answer"]


# ------------------------------------------------------------------------------------------------------------------
# Context
# ------------------------------------------------------------------------------------------------------------------


def test_context_answers_from_the_context_alone(tiny, qa):
    model = tiny[0]
    context = "Unix was written by Ken Thompson at Bell Labs."
    calls = []
    hook = model.embedder.register_forward_hook(lambda *args: calls.append(1))
    try:
        answer = qa(question=QUESTIONS[0], context=context)
        dict_answer = qa({"question": QUESTIONS[0], "context": context})
    finally:
        hook.remove()
    assert not calls  # no retrieval
    assert set(answer) == {"answer", "score", "logit", "start", "end", "block"}
    # Same schema as retrieval answers: the block is the context itself, from no corpus, relevance 0.
    assert {k: answer["block"][k] for k in PROVENANCE_KEYS} == {
        "block_id": None,
        "doc_id": None,
        "title": None,
        "text": context,
        "retrieval_score": 0.0,
    }
    assert context[answer["start"] : answer["end"]] == answer["answer"]
    assert answer == dict_answer
    # Relevance score 0: the logit is the reader's span score alone.
    encoded = tiny[1](QUESTIONS[0], context, return_tensors="pt")
    with torch.no_grad():
        reader = model.reader(
            input_ids=encoded["input_ids"][:, None],
            attention_mask=encoded["attention_mask"][:, None],
            token_type_ids=encoded["token_type_ids"][:, None],
            relevance_score=torch.zeros(1, 1),
            block_mask=(encoded["token_type_ids"].bool() & (encoded["input_ids"] != tiny[1].sep_token_id))[:, None],
            return_dict=True,
        )
    assert answer["logit"] == pytest.approx(float(reader.reader_logits.max()), abs=1e-4)


def test_long_context_is_read_in_windows(tiny, qa):
    filler = " ".join(text for _, text in DOCS)
    context = filler + " " + filler + " The compiler was written by Grace Hopper."
    assert len(tiny[1](context)["input_ids"]) > tiny[0].config.reader_seq_len
    answers = qa(question="who wrote the compiler?", context=context, top_k=50, doc_stride=16)
    assert max(a["end"] for a in answers) > len(filler) * 2  # spans from the last window are read too
    for answer in answers:
        assert context[answer["start"] : answer["end"]] == answer["answer"]


def test_mixed_batch_of_context_and_open_questions(qa):
    inputs = [{"question": QUESTIONS[0], "context": "Unix was written at Bell Labs."}, QUESTIONS[1]]
    batched = qa(inputs, batch_size=2)
    assert batched[0]["block"]["block_id"] is None and batched[1]["block"]["block_id"] is not None
    assert batched[0] == qa(inputs[0])
    assert batched[1]["answer"] == qa(inputs[1])["answer"]
    both = qa(question=QUESTIONS[:2], context="Unix was written by Ken Thompson.")
    assert len(both) == 2 and all(a["block"]["block_id"] is None for a in both)


def test_context_without_retriever(tiny):
    model, tokenizer = tiny[0], tiny[1]
    bare = RealmForOpenQA(model.config)
    bare.load_state_dict(model.state_dict())
    pipe = RealmQuestionAnsweringPipeline(model=bare.eval(), tokenizer=tokenizer, task=REALM_QA_TASK)
    answer = pipe(question=QUESTIONS[0], context="Unix was written by Ken Thompson.")
    assert answer["answer"]
    with pytest.raises(ValueError, match="retriever"):
        pipe(QUESTIONS[0])


# ------------------------------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad, message",
    [
        ("", "Empty question"),
        ("   ", "Empty question"),
        ([QUESTIONS[0], ""], "Empty question"),
        ([], "No questions"),
        ("what " * 80, "longer than the limit"),
        ({"context": "no question here"}, "needs a `question`"),
        ({"question": QUESTIONS[0], "context": "  "}, "Empty context"),
        (42, "must be a string or a dict"),
    ],
)
def test_invalid_questions_raise_clear_errors(qa, bad, message):
    with pytest.raises(ValueError, match=message):
        qa(bad)


def test_question_length_limit_is_a_parameter(qa):
    with pytest.raises(ValueError, match="limit of 2"):
        qa(QUESTIONS[0], max_question_length=2)


def test_unknown_parameter_is_refused(qa):
    with pytest.raises(TypeError, match="Unknown.*temperature.*`top_k`"):
        qa(QUESTIONS[0], temperature=0.5)


# ------------------------------------------------------------------------------------------------------------------
# The classic question-answering options and datasets
# ------------------------------------------------------------------------------------------------------------------


def test_classic_options_with_a_meaning_for_realm_are_accepted(qa):
    reference = qa(QUESTIONS[0], top_k=2)
    # handle_impossible_answer=False asks for what REALM does by default: an answer from a read block (True and its
    # threshold: tests/models/test_openqa_answers.py).
    assert qa(QUESTIONS[0], top_k=2, handle_impossible_answer=False) == reference
    # max_question_len is the classic name of max_question_length.
    assert qa(QUESTIONS[0], top_k=2, max_question_len=64) == reference
    with pytest.raises(ValueError, match="limit of 2"):
        qa(QUESTIONS[0], max_question_len=2)
    with pytest.raises(ValueError, match="`max_question_len`.*`max_question_length`"):
        qa(QUESTIONS[0], max_question_len=8, max_question_length=8)
    # The whole vocabulary of the tiny model is whole words: aligning to words changes nothing here.
    assert qa(QUESTIONS[0], top_k=2, align_to_words=True) == reference
    assert qa(QUESTIONS[0], top_k=2, doc_stride=16, max_answer_len=4) == reference


@pytest.mark.parametrize(
    "option, value, reason",
    [
        ("max_seq_len", 384, "reader_seq_len"),
        ("padding", True, "pads each batch itself"),
        ("topk", 2, "use `top_k`"),
        ("align_to_words", "yes", "True or False"),
    ],
)
def test_classic_options_without_a_meaning_are_refused_with_the_reason(tiny, qa, option, value, reason):
    with pytest.raises(ValueError, match=re.escape(reason)) as refused:
        qa(QUESTIONS[0], **{option: value})
    assert f"`{option}" in str(refused.value)  # the message names the option
    # At construction too: transformers.pipeline hands unknown keyword arguments to the pipeline.
    with pytest.raises(ValueError, match=re.escape(reason)):
        realm_hf.pipeline("question-answering", model=tiny[0], **{option: value})


def test_align_to_words_widens_wordpiece_spans():
    from realm_hf.models.openqa_answers import _align_to_words

    text = "Unix was rewritten in C, (mostly) by Ritchie."
    start = text.index("written")  # a span starting at the wordpiece `##written`
    assert _align_to_words(text, start, start + 4) == (text.index("rewritten"), text.index(" in C"))
    assert _align_to_words(text, text.index("ostly"), text.index(")")) == (text.index("mostly"), text.index(")"))
    assert _align_to_words(text, text.index("C,"), text.index(",")) == (text.index("C,"), text.index(","))


def test_a_datasets_dataset_is_streamed_by_its_question_column(qa):
    dataset = datasets.Dataset.from_dict(
        {"id": [7, 8, 9], "question": QUESTIONS, "answers": [["Ken Thompson"], ["a program"], ["1991"]]}
    )
    streamed = qa(dataset, top_k=2)
    assert not isinstance(streamed, list)  # an iterator, consumed lazily
    assert list(streamed) == qa(QUESTIONS, top_k=2)


def test_a_datasets_dataset_with_a_context_column(qa):
    contexts = [text for _, text in DOCS[:2]]
    dataset = datasets.Dataset.from_dict({"question": QUESTIONS[:2], "context": contexts})
    expected = [qa(question=q, context=c) for q, c in zip(QUESTIONS[:2], contexts)]
    assert list(qa(dataset, batch_size=1)) == expected


def test_a_dataset_without_a_question_column_or_with_splits_is_refused(qa):
    dataset = datasets.Dataset.from_dict({"query": QUESTIONS})
    with pytest.raises(ValueError, match=r"`question` column.*\['query'\].*rename_column"):
        qa(dataset)
    with pytest.raises(ValueError, match="pass one split"):
        qa(datasets.DatasetDict({"test": dataset}))


# ------------------------------------------------------------------------------------------------------------------
# Entry points
# ------------------------------------------------------------------------------------------------------------------


def test_realm_pipeline_from_directory(tiny):
    pipe = realm_hf.pipeline("question-answering", model=tiny[2], top_k=2)
    assert isinstance(pipe, RealmQuestionAnsweringPipeline)
    answers = pipe(QUESTIONS[0])
    assert len(answers) == 2
    reference = tiny[0].answer(QUESTIONS[0])
    assert answers[0]["answer"] == reference["answer"]
    assert answers[0]["logit"] == pytest.approx(reference["logit"], abs=1e-4)


def test_realm_pipeline_infers_the_task_for_realm_models(tiny):
    assert isinstance(realm_hf.pipeline(model=tiny[2]), RealmQuestionAnsweringPipeline)
    assert isinstance(realm_hf.pipeline(REALM_QA_TASK, model=tiny[0]), RealmQuestionAnsweringPipeline)


def test_transformers_pipeline_with_registered_task(tiny):
    for model in (tiny[2], tiny[0]):
        pipe = transformers.pipeline(REALM_QA_TASK, model=model)
        assert isinstance(pipe, RealmQuestionAnsweringPipeline)
        assert pipe(QUESTIONS[0])["answer"] == tiny[0].answer(QUESTIONS[0])["answer"]


def test_transformers_question_answering_is_removed_without_declaration(tiny):
    # The removed-task check runs before the registry and ignores pipeline_class: hence realm_hf.pipeline.
    with pytest.raises(KeyError, match="removed"):
        transformers.pipeline("question-answering", model=tiny[2], pipeline_class=RealmQuestionAnsweringPipeline)


def test_declared_custom_pipeline_for_transformers_question_answering(tiny, tmp_path):
    model, tokenizer = tiny[0], tiny[1]
    path = str(tmp_path / "declared")
    declare_pipeline(model.config)
    try:
        save_tiny_model(model, tokenizer, path)
    finally:
        del model.config.custom_pipelines
    write_pipeline_module(path)
    with open(os.path.join(path, "config.json")) as f:
        assert json.load(f)["custom_pipelines"]["question-answering"]["impl"].startswith(PIPELINE_MODULE_FILE[:-3])
    expected = model.answer(QUESTIONS[0])["answer"]
    pipe = transformers.pipeline("question-answering", model=path, pipeline_class=RealmQuestionAnsweringPipeline)
    assert pipe(QUESTIONS[0])["answer"] == expected
    pipe = transformers.pipeline("question-answering", model=path, trust_remote_code=True)
    assert type(pipe).__name__ == "RealmQuestionAnsweringPipeline"
    assert pipe(QUESTIONS[0])["answer"] == expected
    # Without either, transformers refuses rather than running a generic pipeline on a REALM model.
    with pytest.raises(ValueError, match="trust_remote_code"):
        transformers.pipeline("question-answering", model=path)
    assert isinstance(realm_hf.pipeline("question-answering", model=path), RealmQuestionAnsweringPipeline)


def test_non_realm_models_are_passed_to_transformers(tmp_path, monkeypatch):
    bert = transformers.BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37
    )
    transformers.BertForSequenceClassification(bert).save_pretrained(tmp_path / "bert")
    assert not is_realm_model(str(tmp_path / "bert"))
    with pytest.raises(KeyError, match="removed"):  # transformers' own answer, unchanged
        realm_hf.pipeline("question-answering", model=str(tmp_path / "bert"))
    calls = {}

    def fake_pipeline(task=None, model=None, **kwargs):
        calls.update(task=task, model=model, kwargs=kwargs)
        return "delegated"

    # transformers swaps its module object in sys.modules at import: patch the one `import transformers` returns.
    monkeypatch.setattr(sys.modules["transformers"], "pipeline", fake_pipeline)
    assert realm_hf.pipeline("text-classification", model="some/model", top_k=2) == "delegated"
    assert calls == {"task": "text-classification", "model": "some/model", "kwargs": {"top_k": 2}}


def test_is_realm_model(tiny, tmp_path):
    assert is_realm_model(tiny[0]) and is_realm_model(tiny[2])
    assert not is_realm_model(tiny[0].reader)
    assert not is_realm_model(str(tmp_path))  # no config.json
    assert not is_realm_model("no-such-org/no-such-model")  # offline in tests: not found, not an error


def test_registration_is_idempotent(caplog):
    from transformers.pipelines import PIPELINE_REGISTRY

    register_pipeline()
    with caplog.at_level("WARNING"):
        register_pipeline()
    assert "already registered" not in caplog.text
    assert PIPELINE_REGISTRY.supported_tasks[REALM_QA_TASK]["impl"] is RealmQuestionAnsweringPipeline
    assert RealmForOpenQA in PIPELINE_REGISTRY.supported_tasks[REALM_QA_TASK]["pt"]


def test_pipeline_save_pretrained_round_trip(tiny, qa, tmp_path):
    qa.save_pretrained(tmp_path / "saved")
    # No code copied: only realm_hf_auto.py, the auto_map's pointer to the installed realm-hf (hub/test_cards.py).
    assert [name for name in os.listdir(tmp_path / "saved") if name.endswith(".py")] == ["realm_hf_auto.py"]
    reloaded = realm_hf.pipeline("question-answering", model=str(tmp_path / "saved"))
    for question in QUESTIONS:
        assert_same_answers(reloaded(question, top_k=3), qa(question, top_k=3))


def _directory_digest(path):
    import hashlib

    digest = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                digest[os.path.relpath(full, path)] = hashlib.sha256(f.read()).hexdigest()
    return digest


def test_pipeline_save_failing_at_the_tokenizer_keeps_the_previous_save(tiny, qa, tmp_path, monkeypatch):
    """The tokenizer was written after the model's all-or-nothing swap: a failure there left new weights, old rest."""
    target = tmp_path / "saved"
    qa.save_pretrained(target)
    before = _directory_digest(target)

    save_tokenizer = type(qa.tokenizer).save_pretrained

    def disk_full(self, save_directory, *args, **kwargs):
        # The model's own copy in retriever/ still saves: the disk fills up at the top-level tokenizer.
        if "retriever" in os.path.relpath(save_directory, tmp_path):
            return save_tokenizer(self, save_directory, *args, **kwargs)
        raise OSError(28, "No space left on device")

    weight = qa.model.reader.qa_outputs.dense_output.bias
    original = weight.detach().clone()
    monkeypatch.setattr(type(qa.tokenizer), "save_pretrained", disk_full)
    try:
        with torch.no_grad():
            weight.add_(1.0)  # this save's weights differ from the first one's
        with pytest.raises(OSError, match="No space left"):
            qa.save_pretrained(target)
    finally:
        with torch.no_grad():
            weight.copy_(original)
    assert _directory_digest(target) == before


# ------------------------------------------------------------------------------- answers that repeat the question


def test_is_question_phrase_needs_the_words_together_and_in_order():
    from realm_hf.models.openqa_answers import is_question_phrase

    question = "which treaty split the carolingian empire in 843"
    assert is_question_phrase("Carolingian Empire", question)
    assert is_question_phrase("The Carolingian  empire.", question)  # SQuAD normalisation: case, articles, punctuation
    assert not is_question_phrase("Empire Carolingian", question)
    assert not is_question_phrase("Treaty of Verdun", question)
    assert not is_question_phrase("Kuwait City", "What is the capital and largest city of Kuwait?")
    assert not is_question_phrase("", question) and not is_question_phrase("the", question)


def _phrase_of_what_is_a_compiler(answer: str) -> bool:
    # Written out by hand for "what is a compiler?": every run of its words, lower-cased, articles and punctuation
    # dropped (SQuAD's normalisation).
    phrases = {"what", "is", "compiler", "what is", "is compiler", "what is compiler"}
    words = [w for w in answer.lower().replace("?", " ").replace(".", " ").split() if w not in ("a", "an", "the")]
    return " ".join(words) in phrases


def test_skip_answers_in_question_ranks_question_phrases_last(tiny):
    model, question = tiny[0], QUESTIONS[1]
    plain = model.answer(question, top_k=1000)
    assert any(_phrase_of_what_is_a_compiler(a["answer"]) for a in plain), "the fixture must offer a question phrase"
    assert model.config.skip_answers_in_question is False
    model.config.skip_answers_in_question = True
    try:
        skipped = model.answer(question, top_k=1000)
        best = model.answer(question)
        piped = realm_hf.pipeline("question-answering", model=model)(question, top_k=1000)
    finally:
        model.config.skip_answers_in_question = False
    # The same answers, the ones that repeat the question moved behind the others, each group in its own order.
    expected = [a for a in plain if not _phrase_of_what_is_a_compiler(a["answer"])]
    expected += [a for a in plain if _phrase_of_what_is_a_compiler(a["answer"])]
    assert [a["answer"] for a in skipped] == [a["answer"] for a in expected]
    assert [a["answer"] for a in piped] == [a["answer"] for a in expected]
    assert best["answer"] == expected[0]["answer"] and not _phrase_of_what_is_a_compiler(best["answer"])


def test_skip_answers_in_question_still_answers_when_every_span_repeats_it(tiny):
    model = tiny[0]
    context = "Unix is an operating system."
    example = {"question": "is unix an operating system?", "context": context}
    qa = realm_hf.pipeline("question-answering", model=model)
    plain = qa(example)
    model.config.skip_answers_in_question = True
    try:
        skipped = qa(example)
    finally:
        model.config.skip_answers_in_question = False
    # Every span of the context is a phrase of the question: the best of them is still the answer.
    assert skipped["answer"] == plain["answer"] and skipped["answer"]


def test_skip_answers_in_question_is_a_checked_saved_config_field(tmp_path):
    with pytest.raises(ValueError, match="skip_answers_in_question"):
        RealmConfig(skip_answers_in_question="yes")
    RealmConfig(skip_answers_in_question=True).save_pretrained(tmp_path)
    assert RealmConfig.from_pretrained(tmp_path).skip_answers_in_question is True
    assert RealmConfig().skip_answers_in_question is False


# ------------------------------------------------------------------------------------------------------------------
# How answering weighs the read blocks (config.answer_block_prior)


def _forward_eval(model, tokenizer, questions):
    inputs = tokenizer(questions, padding=True, return_tensors="pt")
    with model.evaluating(), torch.no_grad():
        return model(**inputs, questions=questions, return_dict=True)


def test_answer_block_prior_rank_replaces_retrieval_scores_by_the_retrievers_order(tiny):
    model, tokenizer = tiny[0], tiny[1]
    assert model.config.answer_block_prior == "retrieval"
    by_score = _forward_eval(model, tokenizer, QUESTIONS)
    model.config.answer_block_prior = "rank"
    try:
        by_rank = _forward_eval(model, tokenizer, QUESTIONS)
        piped = realm_hf.pipeline("question-answering", model=model)(QUESTIONS[0], top_k=1000)
        answered = model.answer(QUESTIONS[0], top_k=1000)
    finally:
        model.config.answer_block_prior = "retrieval"
    # The same blocks in the same order, their retrieval scores reported as they are.
    assert torch.equal(by_rank.retrieved_block_ids, by_score.retrieved_block_ids)
    assert torch.equal(by_rank.retrieved_scores, by_score.retrieved_scores)
    # Each read block's span scores: the retrieval score taken out, minus its place in the order put in.
    score_logits = by_score.reader_output.reader_logits
    beam = score_logits.shape[1]
    assert beam > 1, "the fixture must read several blocks"
    places = torch.arange(beam, dtype=score_logits.dtype).view(1, beam, 1)
    expected = score_logits - by_score.retrieved_scores[:, :beam, None] - places
    finite = torch.isfinite(score_logits)
    assert torch.equal(torch.isfinite(by_rank.reader_output.reader_logits), finite)
    torch.testing.assert_close(by_rank.reader_output.reader_logits[finite], expected[finite], rtol=1e-5, atol=1e-4)
    # The pipeline and model.answer follow the saved setting alike.
    assert [(a["answer"], a["block"]["block_id"]) for a in piped] == [
        (a["answer"], a["block"]["block_id"]) for a in answered
    ]


def test_answer_block_prior_leaves_training_unchanged(tiny):
    model, tokenizer = tiny[0], tiny[1]
    inputs = tokenizer(QUESTIONS, padding=True, return_tensors="pt")
    answers = [["ken thompson"], ["translator"], ["1991"]]
    losses = {}
    was_training = model.training
    model.train()
    try:
        for prior in ("retrieval", "rank"):
            model.config.answer_block_prior = prior
            torch.manual_seed(0)
            losses[prior] = model(**inputs, questions=QUESTIONS, answers=answers, return_dict=True).loss
    finally:
        model.config.answer_block_prior = "retrieval"
        model.train(was_training)
    assert torch.isfinite(losses["retrieval"])
    torch.testing.assert_close(losses["rank"], losses["retrieval"])


def test_answer_block_prior_is_a_checked_saved_config_field(tmp_path):
    with pytest.raises(ValueError, match="answer_block_prior"):
        RealmConfig(answer_block_prior="bm25")
    RealmConfig(answer_block_prior="rank").save_pretrained(tmp_path)
    assert RealmConfig.from_pretrained(tmp_path).answer_block_prior == "rank"
    assert RealmConfig().answer_block_prior == "retrieval"


def test_question_too_long_to_read_with_a_context_is_a_clear_error(qa):
    question = "who wrote unix " * 15  # 45 wordpieces: [CLS] q [SEP] [SEP] leaves no room in 48
    with pytest.raises(ValueError, match="45 wordpieces.*reader_seq_len=48.*at most 44"):
        qa(question, context="Unix was written by Ken.")
    assert qa("who wrote unix " * 14 + "?", context="Unix was written by Ken.")["answer"]


def test_pipeline_names_a_realm_model_that_cannot_answer(tiny):
    model, tokenizer, _ = tiny
    # Before: transformers' "The task question-answering has been removed from transformers".
    with pytest.raises(ValueError, match="RealmReader"):
        realm_hf.pipeline("question-answering", model=model.reader, tokenizer=tokenizer)


def test_pipeline_without_a_retriever_says_what_is_missing():
    import realm_hf

    model = RealmForOpenQA.from_pretrained(LEGACY_OPENQA, load_retriever=False)
    with pytest.raises(ValueError, match="no retriever.*set_retriever"):
        realm_hf.pipeline("question-answering", model=model)


def test_trust_remote_code_runs_no_file_of_the_folder(tiny, tmp_path):
    """docs/hub.md: `pipeline` never runs a folder's realm_hf_auto.py; `trust_remote_code=True` ran it."""
    import shutil

    path = tmp_path / "pipeline-remote-code-model"  # transformers caches a module by its folder's name
    shutil.copytree(tiny[2], path)
    marker = tmp_path / "ran"
    for name in ("realm_hf_auto.py", PIPELINE_MODULE_FILE):
        if (path / name).exists():
            with open(path / name, "a") as f:
                f.write(f"\nopen({str(marker)!r}, 'a').write({name!r} + '\\n')\n")
    qa = realm_hf.pipeline("question-answering", model=str(path), trust_remote_code=True)
    assert isinstance(qa, RealmQuestionAnsweringPipeline) and isinstance(qa.tokenizer, RealmTokenizer)
    assert qa(QUESTIONS[0])["answer"]
    qa = realm_hf.pipeline(model=str(path), trust_remote_code=True)
    assert isinstance(qa, RealmQuestionAnsweringPipeline)
    assert not marker.exists(), marker.read_text()


def test_filter_keeps_retrieval_to_the_matching_blocks(tiny, qa):
    model = tiny[0]
    titles = ["Unix", "Python"]
    answers = qa(QUESTIONS, filter={"title": titles}, top_k=2)
    expected = model.answer(QUESTIONS, filter={"title": titles}, top_k=2)
    for got, want in zip(answers, expected):
        assert all(a["block"]["title"] in titles for a in got)
        assert [(a["answer"], a["block"]["block_id"]) for a in got] == [
            (a["answer"], a["block"]["block_id"]) for a in want
        ]
    # A context is read as given: the filter only narrows retrieval.
    read = qa(question=QUESTIONS[0], context=DOCS[0][1], filter={"title": ["Unix"]})
    assert read["answer"] in DOCS[0][1]
    with pytest.raises(TypeError, match="`filter` takes a dict"):
        qa(QUESTIONS[0], filter="Unix")
    with pytest.raises(ValueError, match="no block"):
        qa(QUESTIONS[0], filter={"title": "Fortran"})
