"""Smoke test of `bench/learning_foldoc.py --only options` (issue 26): every option row runs end to end on a tiny BERT
and a slice of the shipped FOLDOC extract, and the table prints one row per option."""

import json

from test_bench_smoke import load_script, tiny_bert


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
