"""The one answer path (`models/openqa_answers.py`) as `RealmForOpenQA.answer()`, the pipeline and `realm-hf ask` use
it: answers widened to whole words by default, and "no answer" under a span-probability threshold (abstention)."""

import os

import pytest
import torch

import realm_hf
from realm_hf import RealmConfig, RealmForOpenQA, RealmTokenizer
from realm_hf.models.openqa_answers import DEFAULT_NO_ANSWER_THRESHOLD, resolve_no_answer_threshold
from tests.support.tiny_model import DOCS, QUESTIONS, build_tiny_model, tiny_openqa_config

# Words the tiny vocabulary holds only as pieces, so that a span may start or end inside them.
SPLIT_WORDS = {"compiler": ("comp", "##iler"), "thompson": ("thom", "##pson"), "ritchie": ("rit", "##chie")}


def build_subword_model(tmp_dir, seed=0):
    """A tiny RealmForOpenQA (hidden 32, 2 layers) over DOCS whose vocabulary splits some words into wordpieces."""
    from realm_hf.retrieval.retriever import RealmRetriever

    words = set()
    for title, text in DOCS:
        words.update((title + " " + text).lower().replace(".", " . ").replace("?", " ? ").split())
    words.update(["what", "who", "when", "wrote", "created", "is", "a", "?", "which"])
    for word, pieces in SPLIT_WORDS.items():
        words.discard(word)
        words.update(pieces)
    vocab_file = os.path.join(tmp_dir, "vocab.txt")
    with open(vocab_file, "w") as f:
        f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(words)) + "\n")
    tokenizer = RealmTokenizer(vocab=vocab_file)
    assert tokenizer.tokenize("compiler") == ["comp", "##iler"]
    torch.manual_seed(seed)
    config = tiny_openqa_config(len(tokenizer), initializer_range=0.5)
    model = RealmForOpenQA(config).eval()
    texts = [text for _, text in DOCS]
    with torch.no_grad():
        embeddings = model.embedder(**tokenizer(texts, padding=True, return_tensors="pt")).projected_score
    model.set_retriever(
        RealmRetriever.from_embeddings(embeddings, texts, titles=[t for t, _ in DOCS], tokenizer=tokenizer)
    )
    return model


@pytest.fixture(scope="module")
def subword_model(tmp_path_factory):
    return build_subword_model(str(tmp_path_factory.mktemp("subword")))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny")))[0]


def is_whole_words(answer) -> bool:
    text, start, end = answer["block"]["text"], answer["start"], answer["end"]
    inside_left = start > 0 and text[start - 1].isalnum() and text[start].isalnum()
    inside_right = end < len(text) and text[end].isalnum() and text[end - 1].isalnum()
    return not inside_left and not inside_right


# ------------------------------------------------------------------------------------------------------------------
# Whole words by default
# ------------------------------------------------------------------------------------------------------------------


def test_answers_are_whole_words_by_default(subword_model):
    questions = ["who wrote unix?", "what is a compiler?"]
    raw = [a for answers in subword_model.answer(questions, top_k=40, align_to_words=False) for a in answers]
    # The vocabulary makes the reader score spans that start or end inside a word ("thom" of "Thompson") ...
    assert not all(is_whole_words(answer) for answer in raw)
    # ... and every entry point widens them to whole words unless asked not to.
    from_model = [a for answers in subword_model.answer(questions, top_k=40) for a in answers]
    qa = realm_hf.pipeline("question-answering", model=subword_model)
    from_pipeline = [a for answers in qa(questions, top_k=40) for a in answers]
    for answer in from_model + from_pipeline:
        assert is_whole_words(answer), answer["answer"]
        assert answer["block"]["text"][answer["start"] : answer["end"]] == answer["answer"]
    assert [a["answer"] for a in from_model] == [a["answer"] for a in from_pipeline]


def test_align_to_words_is_checked(subword_model):
    with pytest.raises(ValueError, match="align_to_words"):
        subword_model.answer(QUESTIONS[0], align_to_words="yes")


# ------------------------------------------------------------------------------------------------------------------
# "No answer" under a threshold
# ------------------------------------------------------------------------------------------------------------------


def test_no_answer_under_the_threshold(tiny_model):
    reference = tiny_model.answer(QUESTIONS)
    for question, best in zip(QUESTIONS, reference):
        declined = tiny_model.answer(question, no_answer_threshold=min(1.0, best["score"] + 1e-4))
        assert declined["answer"] == "" and declined["block"] is None
        assert declined["start"] is None and declined["end"] is None and declined["logit"] is None
        # The no-answer's score is the probability of the best span, the one declined.
        assert declined["score"] == pytest.approx(best["score"], abs=1e-6)
        assert declined["question"] == question
        assert [b["block_id"] for b in declined["retrieved"]] == [b["block_id"] for b in best["retrieved"]]
        kept = tiny_model.answer(question, no_answer_threshold=max(0.0, best["score"] - 1e-4))
        assert kept["answer"] == best["answer"] and kept["score"] == pytest.approx(best["score"], abs=1e-6)
    # 0 never abstains: the same answers as REALM's.
    assert [a["answer"] for a in tiny_model.answer(QUESTIONS, no_answer_threshold=0.0)] == [
        a["answer"] for a in reference
    ]


def test_no_answer_threshold_with_top_k_drops_the_spans_under_it(tiny_model):
    answers = tiny_model.answer(QUESTIONS[0], top_k=5)
    cut = answers[2]["score"]
    kept = tiny_model.answer(QUESTIONS[0], top_k=5, no_answer_threshold=cut)
    assert [a["answer"] for a in kept] == [a["answer"] for a in answers if a["score"] >= cut]
    (none,) = tiny_model.answer(QUESTIONS[0], top_k=5, no_answer_threshold=1.0)
    assert none["answer"] == "" and none["score"] == pytest.approx(answers[0]["score"], abs=1e-6)


def test_the_config_threshold_is_the_default(tiny_model):
    best = tiny_model.answer(QUESTIONS[0])
    tiny_model.config.no_answer_threshold = 1.0
    try:
        assert tiny_model.answer(QUESTIONS[0])["answer"] == ""
        assert tiny_model.answer(QUESTIONS[0], no_answer_threshold=0.0)["answer"] == best["answer"]
        qa = realm_hf.pipeline("question-answering", model=tiny_model)
        assert qa(QUESTIONS[0])["answer"] == ""
        # handle_impossible_answer=False: always the best span, whatever the config says.
        assert qa(QUESTIONS[0], handle_impossible_answer=False)["answer"] == best["answer"]
    finally:
        tiny_model.config.no_answer_threshold = None


def test_pipeline_handle_impossible_answer(tiny_model):
    qa = realm_hf.pipeline("question-answering", model=tiny_model)
    best = qa(QUESTIONS[0])
    above = min(1.0, best["score"] + 1e-4)
    declined = qa(QUESTIONS[0], handle_impossible_answer=True, no_answer_threshold=above)
    assert declined["answer"] == "" and declined["block"] is None
    assert declined["score"] == pytest.approx(best["score"], abs=1e-6)
    assert qa(QUESTIONS[0], no_answer_threshold=above)["answer"] == ""  # a threshold implies it
    # Without a threshold anywhere, transformers' switch uses the documented default.
    expected = "" if best["score"] < DEFAULT_NO_ANSWER_THRESHOLD else best["answer"]
    assert qa(QUESTIONS[0], handle_impossible_answer=True)["answer"] == expected
    # The same from a given context.
    context = "Unix was written by Ken Thompson at Bell Labs."
    read = qa(question=QUESTIONS[0], context=context)
    assert qa(question=QUESTIONS[0], context=context, no_answer_threshold=min(1.0, read["score"] + 1e-4)) == {
        "answer": "",
        "score": pytest.approx(read["score"], abs=1e-6),
        "logit": None,
        "start": None,
        "end": None,
        "block": None,
    }
    # Set once for every call, at construction, as transformers' pipelines take their options.
    strict = realm_hf.pipeline("question-answering", model=tiny_model, no_answer_threshold=1.0)
    assert strict(QUESTIONS[0])["answer"] == ""


@pytest.mark.parametrize("value", [-0.1, 1.5, "0.5", True, float("nan")])
def test_bad_thresholds_are_refused_naming_the_parameter(tiny_model, value):
    with pytest.raises(ValueError, match="no_answer_threshold"):
        tiny_model.answer(QUESTIONS[0], no_answer_threshold=value)
    qa = realm_hf.pipeline("question-answering", model=tiny_model)
    with pytest.raises(ValueError, match="no_answer_threshold"):
        qa(QUESTIONS[0], no_answer_threshold=value)
    with pytest.raises(ValueError, match="no_answer_threshold"):
        RealmConfig(no_answer_threshold=value)


def test_contradicting_options_are_refused(tiny_model):
    qa = realm_hf.pipeline("question-answering", model=tiny_model)
    with pytest.raises(ValueError, match="handle_impossible_answer=False"):
        qa(QUESTIONS[0], handle_impossible_answer=False, no_answer_threshold=0.5)
    with pytest.raises(ValueError, match="handle_impossible_answer"):
        qa(QUESTIONS[0], handle_impossible_answer="yes")


def test_resolve_no_answer_threshold():
    config = RealmConfig()
    assert resolve_no_answer_threshold(config) is None  # REALM always answers
    assert resolve_no_answer_threshold(config, handle_impossible_answer=True) == DEFAULT_NO_ANSWER_THRESHOLD
    assert resolve_no_answer_threshold(config, 0.3) == 0.3
    config.no_answer_threshold = 0.2
    assert resolve_no_answer_threshold(config) == 0.2
    assert resolve_no_answer_threshold(config, handle_impossible_answer=True) == 0.2
    assert resolve_no_answer_threshold(config, handle_impossible_answer=False) is None


def test_the_threshold_is_saved_with_the_config(tmp_path):
    config = RealmConfig(no_answer_threshold=0.25)
    config.save_pretrained(tmp_path)
    assert RealmConfig.from_pretrained(tmp_path).no_answer_threshold == 0.25
