"""bench/plot_results.py reads the results file the main job writes (and bench/wikipedia_stages.py's) and draws both PNGs."""

import json

import pytest

from tests.support.bench import load_script

plot = load_script("plot_results")

BEFORE = {"generated": {"exact_match": 0.5, "recall@5": 0.82}, "hand-written": {"exact_match": 1.3, "recall@5": 0.98}}
AFTER = {"generated": {"exact_match": 44.0, "recall@5": 0.82}, "hand-written": {"exact_match": 40.4, "recall@5": 0.98}}
DEMO_RESULTS = {
    "before": BEFORE,
    "after": AFTER,
    "stages": [
        {"stage": "reader warm-up", "steps": 120, "batch_size": 16, "seconds": 234.0},
        {"stage": "Open-QA fine-tuning", "steps": 300, "batch_size": 8, "seconds": 900.0},
    ],
    "num_held_out": {"generated": 200, "hand-written": 225},
    "seconds": 680.0,  # other keys are ignored
}


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def test_demo_results_give_one_row_per_stage_and_the_curve_from_start_to_end(tmp_path):
    write(tmp_path / "model" / "demo_results.json", DEMO_RESULTS)
    results = plot.read_results(str(tmp_path / "model"))  # the model directory, as make demo saves it
    assert [(r.name, r.steps, r.step) for r in results.rows] == [
        ("before training", "", 0.0),
        ("reader warm-up", "120 x 16", 120.0),
        ("Open-QA fine-tuning", "300 x 8", 420.0),
        ("after training", "", 420.0),
    ]
    assert results.sets == ["generated", "hand-written"] and not results.by_stage
    assert results.curve["generated"] == [(0.0, 0.5, 0.82), (420.0, 44.0, 0.82)]


def test_stage_metrics_and_the_curve_record_add_points_in_step_order(tmp_path):
    data = json.loads(json.dumps(DEMO_RESULTS))
    data["stages"][0]["metrics"] = {"generated": {"exact_match": 30.0, "recall@5": 0.8}}
    data["curve"] = [
        {"step": 60, "set": "generated", "exact_match": 20.0, "recall@5": 0.81},
        {"step": 300, "eval_exact_match": 41.0, "eval_recall@5": 0.83},  # a Trainer's log: the set "eval"
    ]
    results = plot.read_results(str(write(tmp_path / "r.json", data)))
    assert results.curve["generated"] == [
        (0.0, 0.5, 0.82),
        (60.0, 20.0, 0.81),
        (120.0, 30.0, 0.8),
        (420.0, 44.0, 0.82),
    ]
    assert results.curve["eval"] == [(300.0, 41.0, 0.83)]
    assert results.rows[1].metrics == {"generated": {"exact_match": 30.0, "recall@5": 0.8}}


def test_wikipedia_stages_rows_are_drawn_by_stage(tmp_path):
    rows = [
        {"stage": "start (PCA projection)", "metrics": BEFORE, "seconds": 0},
        {"stage": "+ reader warm-up", "metrics": AFTER, "seconds": 570},
    ]
    results = plot.read_results(str(write(tmp_path / "stages.json", rows)))
    assert results.by_stage and [r.name for r in results.rows] == ["start (PCA projection)", "+ reader warm-up"]
    assert results.curve["hand-written"] == [(0.0, 1.3, 0.98), (1.0, 40.4, 0.98)]


def test_a_folder_without_results_is_named_with_what_to_give(tmp_path):
    with pytest.raises(SystemExit, match="demo_results.json"):
        plot.read_results(str(tmp_path))
    with pytest.raises(SystemExit, match="no `after` metrics"):
        plot.read_results(str(write(tmp_path / "other.json", {"loss": 1.0})))


def test_both_pngs_are_drawn(tmp_path):
    pytest.importorskip("matplotlib")
    write(tmp_path / "model" / "demo_results.json", DEMO_RESULTS)
    assert plot.main([str(tmp_path / "model"), "--output-dir", str(tmp_path / "images")]) == 0
    for name in (plot.STAGES_PNG, plot.CURVE_PNG):
        assert (tmp_path / "images" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
