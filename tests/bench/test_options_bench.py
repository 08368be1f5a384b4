"""Smoke test of `bench/learning_foldoc.py --only options`: every option row runs end to end on a tiny BERT
and a slice of the shipped FOLDOC extract, and the table prints one row per option; and the same rows on the Wikipedia
main job (`bench/options_wikipedia.py`) from a tiny saved demo model."""

import json

from tests.support.bench import load_script, tiny_bert
from tests.support.paths import FIXTURES


def test_learning_bench_options_stage_runs_every_row(tmp_path, capsys):
    bert = tiny_bert(tmp_path)
    learning = load_script("learning_foldoc")
    out = tmp_path / "options.json"
    args = ["--quick", "--bert", str(bert), "--foldoc", "extract", "--entries", "300", "--freeze-layers", "1"]
    args += ["--embed-dtype", "fp32", "--train-dtype", "fp32", "--output", str(tmp_path / "scratch")]
    args += ["--only", "options", "--option-seeds", "0", "--qa-steps", "2", "--json", str(out)]
    assert learning.main(args) == 0
    printed = capsys.readouterr().out
    table = json.loads(out.read_text())["results"]["options"]
    assert list(table) == list(learning.OPTION_ROWS)
    for option, per_seed in table.items():
        metrics = per_seed["0"]
        assert 0.0 <= metrics["recall@1"] <= metrics["recall@5"] <= metrics["recall@20"] <= 1.0, option
        assert f"| {option} |" in printed


def test_wikipedia_options_bench_runs_every_row_from_a_saved_demo_model(tmp_path, capsys):
    """bench/options_wikipedia.py: a tiny demo model saved first, then every option row from it, both held-out sets."""
    import os

    wiki = os.path.join(FIXTURES, "wikipedia")
    bert = tiny_bert(tmp_path, max_positions=256, seed=0)
    data = [
        "--summaries",
        os.path.join(wiki, "summaries.json"),
        "--handwritten",
        os.path.join(wiki, "handwritten.jsonl"),
    ]
    demo = load_script("demo_wikipedia", folder="examples")
    demo_argv = data + [
        "--output", str(tmp_path / "run"), "--bert", str(bert), "--max-block-length", "48", "--pca-sample", "64",
        "--retriever-steps", "1", "--retriever-batch-size", "4", "--reader-steps", "1", "--reader-batch-size", "4",
        "--searcher-beam", "4", "--eval-questions", "4", "--show", "1",
        # Open-QA fine-tuning reads the written training questions: the fixture's.
        "--written-train", os.path.join(wiki, "written_train.jsonl"), "--openqa-steps", "1", "--openqa-batch-size", "2",
    ]  # fmt: skip
    assert demo.main(demo_argv) == 0
    start = tmp_path / "run" / "realm-wikipedia"
    options = load_script("options_wikipedia")
    out = tmp_path / "options.json"
    argv = data + [
        "--start", str(start), "--seeds", "0", "--steps", "2", "--batch-size", "2", "--searcher-beam", "4",
        "--refresh-steps", "1", "--rerank-factor", "2", "--eval-questions", "4", "--output", str(tmp_path / "scratch"),
        "--json", str(out),
    ]  # fmt: skip
    capsys.readouterr()
    assert options.main(argv) == 0
    printed = capsys.readouterr().out
    results = json.loads(out.read_text())["results"]
    assert list(results) == list(options.OPTION_ROWS)
    for option, per_seed in results.items():
        row = per_seed["0"]
        for name in ("generated", "hand-written"):
            metrics = row[name]
            assert 0.0 <= metrics["recall@1"] <= metrics["recall@5"] <= metrics["recall@20"] <= 1.0, option
        # End-to-end rows refresh (every step here, and at the end); query-side never does.
        assert (row["refreshes"] == 0) == (option == "query_side"), option
        assert printed.count(f"| {option} |") == 2  # one table per held-out set
