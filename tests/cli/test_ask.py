"""`realm-hf ask`: answers with provenance, from arguments, files and contexts, and bad input refused."""

import json

import pytest

from realm_hf.cli import main
from tests.support.cli import QUESTIONS, run
from tests.support.paths import LEGACY_OPENQA


def test_ask_json_has_provenance(converted, legacy_model, capsys):
    assert run("ask", *QUESTIONS[:2], "--model", converted, "--json", "--top-k", "2") == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["question"] for r in records] == [QUESTIONS[0]] * 2 + [QUESTIONS[1]] * 2
    assert [r["rank"] for r in records] == [1, 2, 1, 2]
    for record in records:
        assert set(record) >= {"answer", "score", "start", "end", "block"}
        block = record["block"]
        assert set(block) >= {"block_id", "title", "text", "retrieval_score"} and "id" not in block
        assert block["text"][record["start"] : record["end"]] == record["answer"]
    expected = legacy_model.answer(QUESTIONS[:2])
    assert [r["answer"] for r in records if r["rank"] == 1] == [e["answer"] for e in expected]
    assert [r["block"]["block_id"] for r in records if r["rank"] == 1] == [e["block"]["block_id"] for e in expected]


def test_ask_text_from_file(converted, tmp_path, capsys):
    questions = tmp_path / "questions.txt"
    questions.write_text(f"{QUESTIONS[0]}\n\n{json.dumps({'question': QUESTIONS[1]})}\n")
    assert run("ask", "--file", questions, "--model", converted) == 0
    out = capsys.readouterr().out
    assert out.count("Q: ") == 2 and out.count("A: ") == 2
    assert "[source: (block 9)]" in out


def test_ask_with_context_reads_only_the_context(converted, capsys):
    context = "paris is the capital of france."
    assert run("ask", "what is the capital of france?", "--context", context, "--model", converted, "--json") == 0
    record = json.loads(capsys.readouterr().out)
    assert record["block"]["block_id"] is None and record["block"]["text"] == context  # the context, no corpus block
    assert context[record["start"] : record["end"]] == record["answer"]


def test_ask_no_answer_threshold(converted, legacy_model, capsys):
    best = legacy_model.answer(QUESTIONS[0])
    above = f"{min(1.0, best['score'] + 1e-3):.6f}"
    assert run("ask", QUESTIONS[0], "--model", converted, "--no-answer-threshold", above) == 0
    out = capsys.readouterr().out
    assert "A: " not in out and f"(no answer: the best span's probability {best['score']:.3f} is under" in out
    assert run("ask", QUESTIONS[0], "--model", converted, "--no-answer-threshold", above, "--json") == 0
    record = json.loads(capsys.readouterr().out)
    assert (record["answer"], record["block"], record["rank"]) == ("", None, 1)
    assert record["score"] == pytest.approx(best["score"], abs=1e-5)
    assert run("ask", QUESTIONS[0], "--model", converted, "--no-answer-threshold", "0", "--json") == 0
    assert json.loads(capsys.readouterr().out)["answer"] == best["answer"]
    # Not a probability: refused when the arguments are parsed, before the model loads.
    for bad in ("1.5", "-0.1", "high", "nan"):
        assert run("ask", QUESTIONS[0], "--model", converted, "--no-answer-threshold", bad) == 2
        assert "--no-answer-threshold" in capsys.readouterr().err


def test_ask_bad_input(converted, tmp_path, capsys):
    assert run("ask", "   ", "--model", converted) == 2
    assert "Empty question" in capsys.readouterr().err
    assert run("ask", "why?", "--model", tmp_path / "missing") == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["--debug", "ask", "why?", "--model", str(tmp_path / "missing")]) == 2
    assert "Traceback" in capsys.readouterr().err
    # A legacy directory without --allow-pickle says how to get a usable model.
    assert run("ask", "why?", "--model", LEGACY_OPENQA) == 2
    assert "realm-hf convert" in capsys.readouterr().err


def test_ask_filter_answers_from_the_matching_blocks_only(converted, legacy_model, capsys):
    # The converted legacy corpus has block ids and no other metadata: filter on the block ids.
    expected = legacy_model.answer(QUESTIONS[0], top_k=3, filter={"block_id": [2, 5]})
    assert run("ask", QUESTIONS[0], "--model", converted, "--json", "--top-k", "3",
               "--filter", "block_id=2", "--filter", "block_id=5") == 0  # fmt: skip
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["block"]["block_id"] for r in records} <= {2, 5}
    assert [(r["answer"], r["block"]["block_id"]) for r in records] == [
        (e["answer"], e["block"]["block_id"]) for e in expected
    ]


@pytest.mark.parametrize(
    "option, message",
    [
        ("block_id", "expected COLUMN=VALUE"),
        ("topic=science", "no column 'topic' to filter on"),
        ("block_id=100000", "found no block"),
    ],
)
def test_ask_bad_filter_is_named(converted, capsys, option, message):
    assert run("ask", QUESTIONS[0], "--model", converted, "--filter", option) == 2
    assert message in capsys.readouterr().err


def test_ask_filter_with_a_context_is_refused(converted, capsys):
    assert run("ask", QUESTIONS[0], "--model", converted, "--context", "a passage.", "--filter", "block_id=1") == 2
    assert "--filter narrows retrieval" in capsys.readouterr().err


def test_filter_values_are_read_in_the_column_type():
    from datasets import Features, Value

    from realm_hf.cli.ask import metadata_filter

    features = Features({"title": Value("string"), "year": Value("int64"), "draft": Value("bool")})
    conditions = [("title", "1984"), ("year", "1999"), ("year", "2001"), ("draft", "false"), ("topic", "7")]
    assert metadata_filter(conditions, features) == {
        "title": "1984", "year": [1999, 2001], "draft": False, "topic": "7"
    }  # fmt: skip
    # Text that is no JSON stays text: the filter then names the column's type.
    assert metadata_filter([("year", "nineteen")], features) == {"year": "nineteen"}
