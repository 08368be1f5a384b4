"""Draw the main job's stage table and learning curve as PNG from the results file a run writes.

    python bench/plot_results.py demo_output/realm-wikipedia              # the model directory `make demo` saves
    python bench/plot_results.py demo_output/realm-wikipedia/demo_results.json --output-dir /tmp/plots
    python bench/plot_results.py stages.json                              # bench/wikipedia_stages.py --json's file

Writes `main_job_stages.png` (one row per stage: steps x batch, seconds, and each evaluation set's held-out EM and
answer recall@5 before training, after each stage the run evaluated, and after training) and `main_job_curve.png`
(held-out EM and recall@5 against the training step, one line per evaluation set) into `--output-dir`
(default `docs/images`). Needs matplotlib (`pip install 'realm-hf[bench]'`).

The results file (docs/results.md, "Pictures of a run", documents it; other keys are ignored):

- `before`, `after`: `{set: metrics}`, each set's metrics before and after training; `metrics` holds `exact_match`
  (0-100) and `recall@5` (0-1).
- `stages`: `[{"stage", "steps", "batch_size", "seconds"}, ...]` in training order; a stage may carry
  `"metrics": {set: metrics}`, the evaluation after it.
- `curve` (optional): `[{"step", "set", "exact_match", "recall@5"}, ...]`, evaluations during training, `step`
  counted from the first step of the first stage. `eval_exact_match` / `eval_recall@5` (a Trainer's evaluation log,
  `realm_hf.training.recipes.evaluation_history`) are read as well; without `set` a point belongs to the set `eval`.
- `num_held_out` (optional): `{set: count}`, shown in the legend.

`bench/wikipedia_stages.py --json` writes such a file too (with `--curve-every N`, its `curve`). Its older output, a list
of `{"stage", "metrics": {set: metrics}, "seconds"}` whose first rows are untrained starts, is read too; it has no step
counts, so its curve is drawn by stage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field

RESULTS_FILE = "demo_results.json"
STAGES_PNG = "main_job_stages.png"
CURVE_PNG = "main_job_curve.png"
METRICS = (("exact_match", "EM", "{:.1f}"), ("recall@5", "recall@5", "{:.2f}"))


@dataclass
class Row:
    """One row of the stage table: a stage (or the start, or the end) and the evaluation after it, if any."""

    name: str
    steps: str = ""
    seconds: float | None = None
    metrics: dict = field(default_factory=dict)  # {set: metrics}
    step: float | None = None  # where the evaluation sits on the curve's x axis


@dataclass
class Results:
    rows: list[Row]
    curve: dict  # {set: [(step, exact_match, recall@5), ...]}
    sets: list[str]
    counts: dict
    by_stage: bool  # no step counts: the curve's x axis is the row's place


def metric(metrics: dict, name: str):
    value = metrics.get(name, metrics.get(f"eval_{name}"))
    return None if value is None else float(value)


def read_results(path: str) -> Results:
    """The stage rows and curve points of a results file, or of the model directory that holds one."""
    if os.path.isdir(path):
        path = os.path.join(path, RESULTS_FILE)
    if not os.path.isfile(path):
        raise SystemExit(
            f"error: no results file at {path}: give the model directory `make demo` saved "
            f"(demo_output/realm-wikipedia, which holds {RESULTS_FILE}) or a results JSON file."
        )
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if isinstance(data, list):
        return _from_stage_list(data, path)
    if not isinstance(data, dict) or "after" not in data:
        raise SystemExit(
            f"error: {path} is not a results file: it has no `after` metrics (bench/plot_results.py --help)."
        )
    return _from_demo_results(data)


def _from_demo_results(data: dict) -> Results:
    rows = []
    if data.get("before"):
        rows.append(Row("before training", "", None, data["before"], 0.0))
    step = 0.0
    for stage in data.get("stages", []):
        steps, batch = stage.get("steps"), stage.get("batch_size")
        step += float(steps or 0)
        label = f"{steps} x {batch}" if steps is not None and batch is not None else str(steps or "")
        rows.append(Row(stage.get("stage", "stage"), label, stage.get("seconds"), stage.get("metrics") or {}, step))
    rows.append(Row("after training", "", None, data["after"], step))
    curve = {}
    for point in data.get("curve") or []:
        em, r5 = metric(point, "exact_match"), metric(point, "recall@5")
        curve.setdefault(point.get("set", "eval"), []).append((float(point["step"]), em, r5))
    sets = _set_order(rows, curve)
    return Results(rows, _with_rows(curve, rows, sets), sets, data.get("num_held_out") or {}, by_stage=False)


def _from_stage_list(data: list, path: str) -> Results:
    if not data or not all(isinstance(r, dict) and "metrics" in r for r in data):
        raise SystemExit(
            f"error: {path}: expected bench/wikipedia_stages.py --json's list of {{stage, metrics}} rows."
        )
    rows = [Row(r.get("stage", "stage"), "", r.get("seconds"), r["metrics"], float(i)) for i, r in enumerate(data)]
    sets = _set_order(rows, {})
    return Results(rows, _with_rows({}, rows, sets), sets, {}, by_stage=True)


def _set_order(rows: list[Row], curve: dict) -> list[str]:
    sets = []
    for name in [s for row in rows for s in row.metrics] + list(curve):
        if name not in sets:
            sets.append(name)
    return sets


def _with_rows(curve: dict, rows: list[Row], sets: list[str]) -> dict:
    """The curve's points: those of the `curve` record and every row's evaluation, by step."""
    points = {name: list(curve.get(name, [])) for name in sets}
    for row in rows:
        for name, metrics in row.metrics.items():
            if not any(p[0] == row.step for p in points[name]):
                points[name].append((row.step, metric(metrics, "exact_match"), metric(metrics, "recall@5")))
    return {name: sorted(p, key=lambda p: p[0]) for name, p in points.items()}


def draw_stage_table(results: Results, out_path: str) -> None:
    import matplotlib.pyplot as plt

    header = ["stage", "steps x batch", "seconds"]
    for name in results.sets:
        header += [f"{name}\n{short}" for _, short, _ in METRICS]
    cells = []
    for row in results.rows:
        line = [row.name, row.steps, "" if row.seconds is None else f"{row.seconds:.0f}"]
        for name in results.sets:
            metrics = row.metrics.get(name) or {}
            for key, _, fmt in METRICS:
                value = metric(metrics, key)
                line.append("" if value is None else fmt.format(value))
        cells.append(line)
    width = 2.4 + 1.0 * (len(header) - 1)
    fig, ax = plt.subplots(figsize=(width, 0.5 + 0.42 * (len(cells) + 1)))
    ax.axis("off")
    table = ax.table(cellText=cells, colLabels=header, loc="center", cellLoc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(9)
    table.scale(1.0, 1.6)
    for (r, c), cell in table.get_celld().items():
        if r == 0:
            cell.set_text_props(weight="bold")
            cell.set_facecolor("#e8eef7")
        if c == 0:
            cell.set_text_props(ha="left")
            cell.PAD = 0.03
    table.auto_set_column_width(list(range(len(header))))
    ax.set_title("Main job: held-out EM and answer recall@5 by stage", fontsize=10)
    fig.savefig(out_path, dpi=150, bbox_inches="tight")
    plt.close(fig)


def draw_curve(results: Results, out_path: str) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, (index, (key, short, _)) in zip(axes, enumerate(METRICS)):
        for name in results.sets:
            points = [(p[0], p[1 + index]) for p in results.curve.get(name, []) if p[1 + index] is not None]
            if not points:
                continue
            count = results.counts.get(name)
            label = f"{name} ({count})" if count else name
            # Points are the run's evaluations; the dashed lines only join them (nothing was measured in between).
            xs, ys = [p[0] for p in points], [p[1] for p in points]
            (line,) = ax.plot(xs, ys, linestyle="--", linewidth=1, alpha=0.6)
            ax.plot(xs, ys, linestyle="none", marker="o", color=line.get_color(), label=label)
        if results.by_stage:
            ax.set_xticks(range(len(results.rows)))
            ax.set_xticklabels([row.name for row in results.rows], rotation=20, ha="right", fontsize=7)
        else:
            ax.set_xlabel("training step")
            start = 0.0
            for number, row in enumerate(r for r in results.rows if r.steps):  # each stage's span, named
                if number % 2:
                    ax.axvspan(start, row.step, color="grey", alpha=0.08, linewidth=0)
                ax.axvline(row.step, color="grey", linestyle=":", linewidth=0.8)
                # Alternate heights: the names of short neighbouring stages would overlap on one line.
                ax.annotate(
                    row.name, ((start + row.step) / 2, 0.02 + 0.05 * (number % 2)), xycoords=("data", "axes fraction"),
                    fontsize=7, ha="center", va="bottom", color="dimgrey",
                )  # fmt: skip
                start = row.step
        ax.set_ylabel(f"held-out {short}")
        ax.set_ylim(0, 100 if key == "exact_match" else 1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.suptitle("Main job: learning curve on the held-out questions (points: evaluations)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out_path, dpi=150)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help=f"a model directory holding {RESULTS_FILE}, or a results JSON file")
    parser.add_argument("--output-dir", default=os.path.join("docs", "images"), help="where the PNGs go")
    args = parser.parse_args(argv)
    try:
        import matplotlib
    except ImportError:
        print("error: bench/plot_results.py needs matplotlib: pip install 'realm-hf[bench]'.", file=sys.stderr)
        return 2
    matplotlib.use("Agg")
    results = read_results(args.results)
    os.makedirs(args.output_dir, exist_ok=True)
    stages, curve = os.path.join(args.output_dir, STAGES_PNG), os.path.join(args.output_dir, CURVE_PNG)
    draw_stage_table(results, stages)
    draw_curve(results, curve)
    print(f"Wrote {stages} and {curve}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
