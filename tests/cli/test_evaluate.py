"""`realm-hf evaluate`: metrics on known answers, CSV columns, and outputs that never overwrite the QA file."""

import csv
import json
import os

import pytest

from tests.support.cli import QUESTIONS, run


def test_output_directory_is_named_before_any_work(tmp_path, capsys):
    from realm_hf.cli import main

    qa_file = tmp_path / "qa.jsonl"
    qa_file.write_text('{"question": "who wrote unix?", "answers": ["ken"]}\n')
    model = tmp_path / "not-a-model"
    model.mkdir()  # exists, so the early path check passes: the output is refused before the model is read
    status = main(["-q", "evaluate", str(qa_file), "--model", str(model), "--output", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 2 and f"--output {str(tmp_path)!r} is a directory: give a file name" in err


def test_evaluate_never_writes_over_its_qa_file_or_its_other_output(tiny_dir, tmp_path, capsys):
    qa = tmp_path / "qa.jsonl"
    content = json.dumps({"question": "who wrote unix?", "answers": ["ken thompson"]}) + "\n"
    qa.write_text(content)
    # The QA file was replaced by the metrics JSON (the next run then failed on "invalid JSON").
    assert run("evaluate", qa, "--model", tiny_dir, "--output", os.path.join(tmp_path, ".", "qa.jsonl")) == 2
    assert "is the QA file being evaluated" in capsys.readouterr().err
    assert run("evaluate", qa, "--model", tiny_dir, "--predictions", qa) == 2
    assert "is the QA file being evaluated" in capsys.readouterr().err
    assert qa.read_text() == content
    # The predictions silently replaced the metrics.
    out = tmp_path / "out.json"
    assert run("evaluate", qa, "--model", tiny_dir, "--output", out, "--predictions", tmp_path / "." / "out.json") == 2
    assert "--output and --predictions both name" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    "option, message",
    [
        (["--limit", "0"], "--limit must be at least 1"),  # evaluated every question
        (["--limit", "-1"], "--limit must be at least 1"),  # "The evaluation set is empty", after the model loaded
        (["--batch-size", "0"], "--batch-size must be at least 1"),  # `batch_size` ..., after the model loaded
    ],
)
def test_evaluate_counts_are_checked_before_the_model_loads(tmp_path, capsys, option, message):
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"question": "who wrote unix?", "answers": ["ken"]}) + "\n")
    no_model = tmp_path / "no-model"  # exists, holds nothing: reached only if the model were loaded
    no_model.mkdir()
    assert run("evaluate", qa, "--model", no_model, *option) == 2
    err = capsys.readouterr().err
    assert message in err and "config.json" not in err


def test_evaluate_known_answers(converted, legacy_model, tmp_path, capsys):
    predicted = [r["answer"] for r in legacy_model.answer(QUESTIONS)]
    qa_file = tmp_path / "qa.jsonl"
    rows = [
        {"question": QUESTIONS[0], "answers": [predicted[0].upper(), "paris"]},  # EM after normalisation
        {"question": QUESTIONS[1], "answers": "france"},  # retrieved at rank 1, not predicted
        {"question": QUESTIONS[2], "answers": ["london"]},  # never retrieved
    ]
    qa_file.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    metrics_file = tmp_path / "metrics.json"
    predictions = tmp_path / "predictions.jsonl"
    assert (
        run(
            "evaluate",
            qa_file,
            "--model",
            converted,
            "--ks",
            1,
            2,
            50,
            "--output",
            metrics_file,
            "--predictions",
            predictions,
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "exact_match" in out and "recall@1" in out
    metrics = json.loads(metrics_file.read_text())
    assert metrics["exact_match"] == pytest.approx(100 / 3)
    assert metrics["num_questions"] == 3
    # Top blocks: q0 -> [9 "france is a country ...", 0 "paris is the capital ..."]; q1 -> block 9 (has "france").
    assert metrics["recall@1"] == pytest.approx(2 / 3)
    assert metrics["recall@2"] == pytest.approx(2 / 3)
    assert "recall@50" not in metrics  # more than the 12 blocks of the corpus
    lines = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert [line["exact_match"] for line in lines] == [1.0, 0.0, 0.0]


def test_evaluate_ranking_metrics_and_trec_run_file(converted, legacy_model, tmp_path, capsys):
    from realm_hf.metrics import answer_mrr_at_k, answer_ndcg_at_k

    qa_file = tmp_path / "qa.jsonl"
    rows = [
        {"id": "q-paris", "question": QUESTIONS[0], "answers": ["paris"]},
        {"id": "q france", "question": QUESTIONS[1], "answers": "france"},
        {"question": QUESTIONS[2], "answers": ["london"]},  # no id: its number in the file
    ]
    qa_file.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    metrics_file, run_file = tmp_path / "metrics.json", tmp_path / "run.trec"
    argv = ["evaluate", qa_file, "--model", converted, "--ks", 1, 3, "--output", metrics_file]
    assert run(*argv, "--run-file", run_file, "--run-tag", "dense") == 0
    assert "mrr@3" in capsys.readouterr().out
    metrics = json.loads(metrics_file.read_text())
    # The model's own retrieval (Flat: exact), down to the deepest k.
    legacy_model.config.reader_beam_size, beam = 3, legacy_model.config.reader_beam_size
    try:
        retrieved = [r["retrieved"] for r in legacy_model.answer(QUESTIONS)]
    finally:
        legacy_model.config.reader_beam_size = beam
    texts, golds = [[b["text"] for b in blocks] for blocks in retrieved], [r["answers"] for r in rows]
    golds = [[g] if isinstance(g, str) else g for g in golds]
    for name, value in {**answer_mrr_at_k(texts, golds, [1, 3]), **answer_ndcg_at_k(texts, golds, [1, 3])}.items():
        assert metrics[name.removeprefix("answer_")] == pytest.approx(value), name
    assert 0.0 < metrics["mrr@3"] <= metrics["recall@3"]
    # qid Q0 block_id rank score tag, best first, three blocks a question.
    lines = [line.split() for line in run_file.read_text().splitlines()]
    assert [line[0] for line in lines] == ["q-paris"] * 3 + ["q_france"] * 3 + ["3"] * 3
    flat = [block for blocks in retrieved for block in blocks]
    for line, block in zip(lines, flat, strict=True):
        assert (line[1], line[5]) == ("Q0", "dense") and int(line[2]) == block["block_id"]
        assert float(line[4]) == pytest.approx(block["retrieval_score"], abs=1e-4)
    assert [int(line[3]) for line in lines] == [1, 2, 3] * 3
    # A run file over the QA file or another output, or a tag of two words: refused before the model loads.
    assert run(*argv, "--run-file", metrics_file) == 2
    assert "--output and --run-file both name" in capsys.readouterr().err
    assert run("evaluate", qa_file, "--model", converted, "--run-file", run_file, "--run-tag", "my run") == 2
    assert "--run-tag must be one word" in capsys.readouterr().err


def test_trec_run_lines_keep_the_retrievers_order():
    from realm_hf.cli.evaluate import trec_run_lines

    assert trec_run_lines(["1"], [[(4, 2.5), (7, 1.0)]], "t") == ["1 Q0 4 1 2.500000 t", "1 Q0 7 2 1.000000 t"]
    # Scores that do not fall with the rank (a fused order): 1/rank, which trec_eval reads in the same order.
    assert trec_run_lines(["1"], [[(4, 1.0), (7, 2.5)]], "t") == ["1 Q0 4 1 1.000000 t", "1 Q0 7 2 0.500000 t"]


def test_evaluate_csv_and_missing_column(converted, tmp_path, capsys):
    qa_file = tmp_path / "qa.csv"
    with open(qa_file, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["q", "golds"])
        writer.writerow([QUESTIONS[1], "europe|france"])
    assert (
        run(
            "evaluate", qa_file, "--model", converted, "--question-column", "q", "--answers-column", "golds", "--ks", 1
        )
        == 0
    )
    assert "recall@1" in capsys.readouterr().out
    assert run("evaluate", qa_file, "--model", converted) == 2
    assert "no question column 'question'" in capsys.readouterr().err
