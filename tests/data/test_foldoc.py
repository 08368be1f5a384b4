import gzip
import json
import os

import pytest

from realm_hf.data import foldoc
from realm_hf.data.foldoc import (
    decode_dictd_number,
    load_foldoc,
    make_cross_document_task,
    make_link_questions,
    parse_foldoc,
    parse_foldoc_entry,
    read_dictd_index,
    split_questions,
    split_sentences,
    truncate_entry,
    write_foldoc_jsonl,
)
from realm_hf.metrics import has_answer


@pytest.fixture
def foldoc_dir(fixtures_dir):
    return os.path.join(fixtures_dir, "foldoc")


@pytest.fixture
def entries(foldoc_dir):
    return parse_foldoc(os.path.join(foldoc_dir, "foldoc.dict.dz"))


def by_title(entries, title):
    return next(e for e in entries if e["title"] == title)


def test_decode_dictd_number():
    # Hand-worked: G=6, b=27, 9=61, L=11 -> ((6*64 + 27)*64 + 61)*64 + 11.
    assert decode_dictd_number("Gb9L") == 1687371
    assert decode_dictd_number("A") == 0
    assert decode_dictd_number("/") == 63
    assert decode_dictd_number("BA") == 64


def test_read_index(foldoc_dir):
    rows = read_dictd_index(os.path.join(foldoc_dir, "foldoc.index"))
    names = [r[0] for r in rows]
    assert "00-database-short" in names and "dynamic ram" in names
    # Aliases of one entry share its offset and length.
    spans = {name: (offset, length) for name, offset, length in rows}
    assert spans["dram"] == spans["dynamic random-access memory"] == spans["dynamic ram"]


def test_titles_aliases_and_skipped_records(entries):
    # dictd's 00-database-* record and Debian's appended section (marker + "developer") are not entries.
    assert [e["title"] for e in entries] == ["capacitor", "dynamic random-access memory", "RAM", "C"]
    assert by_title(entries, "dynamic random-access memory")["aliases"] == ["dynamic RAM", "DRAM"]


def test_debian_additions_optional(foldoc_dir):
    entries = parse_foldoc(os.path.join(foldoc_dir, "foldoc.dict.dz"), include_debian_additions=True)
    assert [e["title"] for e in entries][-2:] == ["Dictionary.debian", "developer"]


def test_text_cleaned_and_date_removed(entries):
    capacitor = by_title(entries, "capacitor")
    assert capacitor["text"] == (
        "An electronic device that can store electrical charge. The basis of a dynamic RAM cell is a capacitor. "
        "Without decoupling, devices cause hard to trace glitches."
    )
    assert capacitor["date"] == "1995-04-12"
    assert capacitor["categories"] == ["electronics"]
    for entry in entries:
        assert "(19" not in entry["text"] and "(20" not in entry["text"]
        assert "<" not in entry["text"]
    # Numbered senses stay as paragraphs, their category tags moved out.
    ram = by_title(entries, "RAM")
    assert ram["text"] == '1. random-access memory.\n2. Memory, as in "this program needs 16 megabytes of RAM".'
    assert ram["categories"] == ["storage", "jargon"]


def test_link_offsets_and_targets(entries):
    for entry in entries:
        for link in entry["links"]:
            assert entry["text"][link["start"] : link["end"]] == link["term"]
        for link in entry["external_links"]:
            assert link["end"] > link["start"]
    capacitor = by_title(entries, "capacitor")
    # "{dynamic\n   RAM}" is wrapped across lines; "{glitch}es" links only the stem.
    assert [(lk["term"], lk["start"]) for lk in capacitor["links"]] == [("dynamic RAM", 70), ("glitch", 151)]
    # Resolved through the alias "dynamic RAM"; "glitch" is not an entry.
    assert [lk["target_title"] for lk in capacitor["links"]] == ["dynamic random-access memory", None]

    dram = by_title(entries, "dynamic random-access memory")
    terms = [(lk["term"], lk["target"], lk["target_title"]) for lk in dram["links"]]
    assert terms == [
        ("RAM", "RAM", "RAM"),
        ("capacitor", "capacitor", "capacitor"),
        ("Robert Dennard", "Robert H. Dennard", None),  # {display (target)} form
        ("IBM", "IBM", None),
    ]
    # External links are not cross-references; their display text stays in the text.
    assert dram["text"].endswith("\nHome, RFC 1234.")
    assert [lk["url"] for lk in dram["external_links"]] == ["http://example.org/dram", "rfc:1234"]
    assert [dram["text"][lk["start"] : lk["end"]] for lk in dram["external_links"]] == ["Home", "RFC 1234"]


def test_literal_braces_kept(entries):
    c = by_title(entries, "C")
    assert "A block is written { x = 1; } in C." in c["text"]
    assert [lk["term"] for lk in c["links"]] == ["Dennis Ritchie", "AT&T Bell Labs", "Unix"]


def test_parse_entry_forms():
    raw = (
        "loop\n\n   <programming> See {loops (loop)}, {news:comp.lang.c}, {x | x in S}\n"
        "   and {Free Software Foundation}.\n\n   (2020-01-02)\n"
    )
    entry = parse_foldoc_entry(raw)
    assert entry["text"] == "See loops, news:comp.lang.c, {x | x in S} and Free Software Foundation."
    assert [(lk["term"], lk["target"]) for lk in entry["links"]] == [
        ("loops", "loop"),
        ("Free Software Foundation", "Free Software Foundation"),
    ]
    assert [lk["url"] for lk in entry["external_links"]] == ["news:comp.lang.c"]
    assert entry["date"] == "2020-01-02"
    assert parse_foldoc_entry("\n\n") is None


def test_split_sentences():
    text = "A type of RAM, e.g. DRAM. It was made by D. Howe in 1966. Fine!\n1. Sense one. Next"
    spans = split_sentences(text)
    assert [text[s:e] for s, e in spans] == [
        "A type of RAM, e.g. DRAM.",
        "It was made by D. Howe in 1966.",
        "Fine!",
        "1. Sense one.",
        "Next",
    ]


def test_link_questions(entries):
    questions = make_link_questions(entries, max_per_entry=None)
    by_id = {q["id"]: q for q in questions}
    assert by_id["capacitor#0"]["question"] == "capacitor: The basis of a ___ cell is a capacitor."
    assert by_id["capacitor#0"]["answers"] == ["dynamic RAM"]
    assert by_id["capacitor#0"]["answer_target"] == "dynamic random-access memory"
    assert by_id["C#0"]["question"] == "C: A programming language designed by ___ at AT&T Bell Labs."
    for q in questions:
        entry = by_title(entries, q["source_title"])
        hint = q["source_block_hint"]
        assert entry["text"][hint["answer_start"] : hint["answer_end"]] == q["answers"][0]
        assert hint["sentence_start"] <= hint["answer_start"] < hint["answer_end"] <= hint["sentence_end"]
        assert "___" in q["question"]
        # The question never gives the answer away.
        assert not has_answer(q["question"], q["answers"])
        assert len(q["answers"][0].split()) <= 5
    answers = {q["answers"][0] for q in questions}
    # "Unix" is mentioned twice in its sentence, so blanking one mention would leave it in the question.
    assert "Unix" not in answers
    # "1. {random-access memory}." leaves no words around the blank.
    assert "random-access memory" not in answers
    assert len(questions) == 9


def test_link_questions_limits_and_determinism(entries):
    questions = make_link_questions(entries, max_per_entry=1, seed=3)
    assert len(questions) == 4  # one per entry
    assert questions == make_link_questions(entries, max_per_entry=1, seed=3)
    # An entry's draw does not depend on which other entries are given.
    dram = [e for e in entries if e["title"].startswith("dynamic")]
    assert make_link_questions(dram, max_per_entry=1, seed=3) == [
        q for q in questions if q["source_title"] == "dynamic random-access memory"
    ]
    assert all(len(q["answers"][0].split()) <= 1 for q in make_link_questions(entries, max_answer_words=1))
    resolved = make_link_questions(entries, max_per_entry=None, only_resolved_links=True)
    assert {q["answers"][0] for q in resolved} == {"dynamic RAM", "RAM", "capacitor"}
    custom = make_link_questions(entries, template="In {title}, fill the blank: {cloze}")
    assert all(q["question"].startswith("In ") for q in custom)


def test_split_questions():
    questions = [{"id": str(i), "question": f"q{i}"} for i in range(20)]
    train, held_out = split_questions(questions, held_out_fraction=0.25, seed=1)
    assert len(held_out) == 5 and len(train) == 15
    assert {q["id"] for q in train}.isdisjoint(q["id"] for q in held_out)
    assert split_questions(questions, 0.25, seed=1) == (train, held_out)
    assert split_questions(questions, 0.25, seed=2)[1] != held_out
    assert split_questions(questions[:3], 0.01)[1] != []  # at least one held out
    with pytest.raises(ValueError):
        split_questions(questions, 1.5)


def test_load_foldoc_paths(foldoc_dir, entries, tmp_path):
    assert load_foldoc(foldoc_dir) == entries
    assert load_foldoc(os.path.join(foldoc_dir, "foldoc.dict.dz")) == entries
    out = tmp_path / "sub.jsonl.gz"
    write_foldoc_jsonl(entries, out)
    assert load_foldoc(out) == entries
    with gzip.open(out, "rt", encoding="utf-8") as f:
        assert json.loads(f.readline())["title"] == "capacitor"
    assert [p.name for p in tmp_path.iterdir()] == ["sub.jsonl.gz"]  # no temporary left behind
    with pytest.raises(ValueError):
        load_foldoc(source="nope")


def test_shipped_extract():
    entries = load_foldoc(source="extract")
    assert 2500 <= len(entries) <= 3500
    assert os.path.getsize(foldoc.EXTRACT_PATH) < 1.5e6
    titles = {e["title"] for e in entries}
    n_links = n_inside = 0
    for entry in entries:
        assert entry["text"]
        for link in entry["links"]:
            assert entry["text"][link["start"] : link["end"]] == link["term"]
            assert link["target_title"] is None or link["target_title"] in titles
            n_links += 1
            n_inside += link["target_title"] is not None
    # Self-consistent: most cross-references lead to an entry of the extract.
    assert n_inside / n_links > 0.7
    assert len(make_link_questions(entries)) > 3000


def test_auto_source_falls_back_to_extract(monkeypatch):
    monkeypatch.setattr(foldoc, "DEFAULT_DICT_PATH", "/nonexistent/foldoc.dict.dz")
    assert len(load_foldoc()) == len(load_foldoc(source="extract"))
    with pytest.raises(FileNotFoundError):
        load_foldoc(source="dictd")


@pytest.mark.skipif(not os.path.exists(foldoc.DEFAULT_DICT_PATH), reason="dict-foldoc not installed")
def test_real_dictionary():
    entries = parse_foldoc()
    assert len(entries) > 10000
    card = by_title(entries, "card")
    assert card["text"].startswith("1. A circuit board.\n2. SD card.")
    assert all(e["text"][lk["start"] : lk["end"]] == lk["term"] for e in entries for lk in e["links"])


# ------------------------------------------------------------------------------------------ cross-document task


def filled(question: dict) -> str:
    """The question's source sentence: its blank filled with the linked term."""
    return question["question"].replace("___", question["answers"][0])


def test_cross_document_task_removes_question_sentences(entries):
    task = make_cross_document_task(entries, num_questions=None)
    questions, documents = task["questions"], task["documents"]
    # Both resolved cross-references between different entries become questions (one per source entry).
    assert [q["source_title"] for q in questions] == ["capacitor", "dynamic random-access memory"]
    capacitor = questions[0]
    assert capacitor["question"] == "The basis of a ___ cell is a capacitor."
    # The term as written and the title of the entry it links to are both gold answers.
    assert capacitor["answers"] == ["dynamic RAM", "dynamic random-access memory"]
    for question in questions:
        assert "___" in question["question"]
        # No title shortcut: the question is the sentence alone and names neither answer.
        assert not question["question"].startswith(question["source_title"] + ":")
        assert not has_answer(question["question"], question["answers"])
        # The question's own sentence is in no block ...
        assert all(filled(question) not in document["text"] for document in documents)
        # ... while the entry it links to is in the corpus, headword first, and holds an answer.
        target = next(d for d in documents if d["title"] == question["answer_target"])
        assert target["text"].startswith(question["answer_target"] + ": ")
        assert has_answer(target["text"], question["answers"])
        assert target["title"] != question["source_title"]
    # The rest of each source entry stays.
    capacitor_doc = next(d for d in documents if d["title"] == "capacitor")
    assert capacitor_doc["text"] == (
        "capacitor: An electronic device that can store electrical charge. Without decoupling, devices cause hard to "
        "trace glitches."
    )
    assert {d["doc_id"] for d in documents} == {e["title"] for e in entries}


def test_cross_document_task_options_and_masked_sentences(entries):
    task = make_cross_document_task(entries, num_questions=1, seed=3, headword_in_text=False)
    assert len(task["questions"]) == 1
    assert task == make_cross_document_task(entries, num_questions=1, seed=3, headword_in_text=False)
    asked = task["questions"][0]
    other = "dynamic random-access memory" if asked["source_title"] == "capacitor" else "capacitor"
    # The sentence not drawn as a question stays in the corpus and becomes a pre-training input instead.
    [masked] = task["masked_sentences"]
    assert masked["source_title"] == other
    start, end = masked["salient_spans"][0]
    term = masked["text"][start:end]
    assert term in ("dynamic RAM", "RAM")
    assert any(masked["text"] in d["text"] for d in task["documents"])
    assert all(not d["text"].startswith(d["title"] + ": ") for d in task["documents"])
    assert filled(asked) not in " ".join(d["text"] for d in task["documents"])


def test_cross_document_task_refuses_bad_sizes(entries):
    # A negative count would silently drop questions from the end of the draw; a zero budget would empty the corpus.
    with pytest.raises(ValueError, match="num_questions"):
        make_cross_document_task(entries, num_questions=-1)
    with pytest.raises(ValueError, match="max_entry_chars"):
        make_cross_document_task(entries, max_entry_chars=0)
    assert make_cross_document_task(entries, num_questions=0)["questions"] == []


def test_truncate_entry(entries):
    entry = by_title(entries, "capacitor")
    cut = truncate_entry(entry, 110)
    assert (
        cut["text"]
        == "An electronic device that can store electrical charge. The basis of a dynamic RAM cell is a capacitor."
    )
    assert [link["term"] for link in cut["links"]] == ["dynamic RAM"]
    assert entry["text"].startswith(cut["text"]) and len(entry["links"]) == 2  # the original is untouched
    assert truncate_entry(entry, None)["text"] == entry["text"]
    # No sentence end within the budget: a hard cut.
    assert truncate_entry(entry, 10)["text"] == entry["text"][:10]


@pytest.mark.skipif(not os.path.exists(foldoc.DEFAULT_DICT_PATH), reason="dict-foldoc is not installed")
def test_cross_document_task_on_the_real_dictionary():
    entries = load_foldoc(source="dictd")
    task = make_cross_document_task(entries, num_questions=500, max_entry_chars=300)
    # Every entry is in the corpus (an entry whose only kept sentence became a question may drop out).
    assert len(task["documents"]) >= 0.97 * len(entries) > 10_000
    # A question whose linked entry lost its only kept sentence to another question is dropped.
    assert 480 <= len(task["questions"]) <= 500
    texts = [d["text"] for d in task["documents"]]
    by_title_doc = {d["title"]: d["text"] for d in task["documents"]}
    for question in task["questions"][:100]:
        assert not any(filled(question) in text for text in texts)
        assert has_answer(by_title_doc[question["answer_target"]], question["answers"])
