"""The Trainer's own logs reach TensorBoard (`report_to="tensorboard"`), the re-index metrics and evaluation included.

Skipped where the `tensorboard` package is not installed (it is not a dependency of realm-hf; docs/training.md).
"""

import datasets
import pytest
from test_training import QUESTIONS, make_model, training_args

from realm_hf.training.callbacks import RealmReindexCallback
from realm_hf.training.openqa import RealmOpenQATrainer

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def logged_scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar written under `log_dir`, by tag, as (step, value) pairs."""
    scalars = {}
    for run in sorted({p.parent for p in log_dir.rglob("events.out.tfevents.*")}):
        accumulator = event_accumulator.EventAccumulator(str(run))
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend((e.step, e.value) for e in accumulator.Scalars(tag))
    return scalars


def test_training_logs_reach_tensorboard(tmp_path):
    model = make_model()
    dataset = datasets.Dataset.from_list(QUESTIONS)
    reindex = RealmReindexCallback(model.retriever, refresh_steps=2, background=False, refresh_at_end=False)
    # transformers 5 writes under OUTPUT_DIR/runs/ (or $TENSORBOARD_LOGGING_DIR); `logging_dir` is gone.
    output_dir = tmp_path / "out"
    trainer = RealmOpenQATrainer(
        model=model,
        args=training_args(output_dir, max_steps=4, logging_steps=2, report_to="tensorboard"),
        train_dataset=dataset,
        eval_dataset=dataset,
        recall_ks=(1,),
        callbacks=[reindex],
    )
    trainer.train()
    trainer.evaluate()
    trainer.callback_handler.on_train_end(trainer.args, trainer.state, trainer.control)  # flushes the writer
    scalars = logged_scalars(output_dir / "runs")
    assert [step for step, _ in scalars["train/loss"]] == [2, 4]
    assert [value for _, value in scalars["train/reindex/refreshes"]] == [1.0, 2.0]
    assert "train/answer_in_beam" in scalars
    assert {"eval/exact_match", "eval/f1", "eval/recall@1"} <= set(scalars)
