"""Open-QA fine-tuning with Trainer (`realm_hf.training.openqa`): the data checked when the Trainer is built, the
losses, evaluation, the reader marked trained, and index refresh while training goes on (RealmReindexCallback, on one
process and on two)."""

import copy
import json
import logging
import os
import subprocess
import sys

import datasets
import pytest
import torch
from transformers import TrainerCallback, TrainingArguments

from realm_hf.retrieval.encoding import embed_blocks
from realm_hf.retrieval.refresh import is_stale
from realm_hf.training.callbacks import RealmReindexCallback
from realm_hf.training.openqa import (
    BeamAnswerTally,
    DataCollatorForOpenQA,
    RealmOpenQATrainer,
    check_training_questions,
    evaluate_openqa,
)
from tests.support.legacy_model import QUESTIONS, all_embeddings, load_legacy_model, make_model, training_args
from tests.support.paths import SCRIPTS
from tests.support.tiny_model import DOCS, build_tiny_model


def test_collator_batches_questions_and_answers():
    model = make_model(train_document_embedder=False)
    collator = DataCollatorForOpenQA(model.retriever.tokenizer)
    batch = collator(QUESTIONS[:2])
    assert batch["input_ids"].shape[0] == 2
    assert batch["questions"] == [q["question"] for q in QUESTIONS[:2]]
    assert batch["answers"] == [q["answers"] for q in QUESTIONS[:2]]
    with pytest.raises(ValueError, match="Empty question"):
        collator([{"question": " ", "answers": ["x"]}])


def test_a_plain_trainer_with_default_arguments_is_told_to_keep_the_columns(tmp_path):
    from transformers import Trainer

    model = make_model(train_document_embedder=False)
    dataset = datasets.Dataset.from_list(QUESTIONS)
    collator = DataCollatorForOpenQA(model.retriever.tokenizer)
    # transformers' default drops the `question` column (the forward names `questions`): a bare KeyError before.
    trainer = Trainer(
        model=model, args=training_args(tmp_path, max_steps=2), train_dataset=dataset, data_collator=collator
    )
    with pytest.raises(ValueError, match="remove_unused_columns=False"):
        trainer.train()
    args = training_args(tmp_path, max_steps=2, remove_unused_columns=False)
    trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=collator)
    assert trainer.train().global_step == 2


def full_batch_loss(model):
    collator = DataCollatorForOpenQA(model.retriever.tokenizer)
    # Training mode: retrieval over the searcher beam, the loss the optimizer sees (dropout is off in these tests).
    was_training = model.training
    model.train()
    with torch.no_grad():
        loss = model(**collator(QUESTIONS)).loss.item()
    model.train(was_training)
    return loss


def test_loss_decreases_with_trainer(tmp_path):
    model = make_model(train_document_embedder=False)
    dataset = datasets.Dataset.from_list(QUESTIONS)
    before = full_batch_loss(model)
    args = training_args(tmp_path, max_steps=16, learning_rate=1e-3)
    trainer = RealmOpenQATrainer(model=model, args=args, train_dataset=dataset)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 16
    # Per-batch losses jump with which questions a batch holds; the loss on the whole set must go down.
    after = full_batch_loss(model)
    assert after < 0.8 * before, (before, after)


def test_training_a_document_embedder_without_refresh_warns(tmp_path, caplog):
    """A saved model comes back with its document embedder trainable: training it with no refresh is named."""
    model = make_model()
    dataset = datasets.Dataset.from_list(QUESTIONS)
    args = training_args(tmp_path, max_steps=1)
    with caplog.at_level("WARNING", logger="realm_hf"):
        RealmOpenQATrainer(model=model, args=args, train_dataset=dataset).train()
    assert any("freeze_document_embedder" in r.getMessage() for r in caplog.records)

    caplog.clear()
    for quiet in (
        lambda: model.freeze_document_embedder(),
        lambda: RealmReindexCallback(model.retriever, refresh_steps=100),
    ):
        model.document_embedder.requires_grad_(True)
        callback = quiet()
        with caplog.at_level("WARNING", logger="realm_hf"):
            RealmOpenQATrainer(
                model=model, args=args, train_dataset=dataset, callbacks=[callback] if callback else None
            ).train()
        assert not any("freeze_document_embedder" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("train_document_embedder", [False, True])
def test_logits_stay_fp32_under_bf16_autocast(train_document_embedder):
    # Trainer(bf16=True) on a CPU: the retrieval and span logits must not be rounded to bf16 (about 3 significant
    # digits), or the softmax over the searcher beam and the span marginal lose the differences they learn from.
    model = make_model(train_document_embedder)
    model.train()
    collator = DataCollatorForOpenQA(model.retriever.tokenizer)
    batch = collator(QUESTIONS[:2])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(**batch)
    assert out.retrieved_scores.dtype == torch.float32
    assert out.reader_output.reader_logits.dtype == torch.float32
    assert out.loss.dtype == torch.float32 and torch.isfinite(out.loss)
    out.loss.backward()
    assert model.embedder.cls.dense.weight.grad.abs().sum() > 0
    # The same block scores as in fp32, to bf16 input precision (near ties may swap places in the beam).
    with torch.no_grad():
        reference = model(**batch)
    for b in range(2):
        low = dict(zip(out.retrieved_block_ids[b].tolist(), out.retrieved_scores[b].tolist()))
        high = dict(zip(reference.retrieved_block_ids[b].tolist(), reference.retrieved_scores[b].tolist()))
        assert set(low) == set(high)
        assert all(abs(low[i] - high[i]) <= 0.05 + 0.02 * abs(high[i]) for i in high)


def test_trainer_does_not_rescale_our_mean_losses(tmp_path):
    # With `**kwargs` in forward, Trainer would assume a summed loss and multiply it by the number of processes.
    trainer = RealmOpenQATrainer(model=make_model(), args=training_args(tmp_path))
    assert trainer.model_accepts_loss_kwargs is False


def test_evaluation_reports_em_f1_recall(tmp_path):
    model = make_model(train_document_embedder=False)
    dataset = datasets.Dataset.from_list(QUESTIONS)
    metrics = evaluate_openqa(model, dataset, recall_ks=(1, 3), show_progress=False, return_predictions=True)
    assert set(metrics) >= {"exact_match", "f1", "recall@1", "recall@3", "predictions"}
    # Recall@3 by hand: a question is hit when one of its 3 retrieved blocks contains a normalised answer.
    expected_hits = 0
    tokenizer = model.retriever.tokenizer
    for q in QUESTIONS:
        with torch.no_grad():
            emb = model.embed_questions(**tokenizer([q["question"]], return_tensors="pt"))
        texts = [b["text"].lower() for b in model.retriever.search(emb, 3).blocks[0]]
        expected_hits += any(
            f" {a} " in f" {t} ".replace(".", " ").replace(",", " ") for a in q["answers"] for t in texts
        )
    assert metrics["recall@3"] == pytest.approx(expected_hits / len(QUESTIONS))
    trainer = RealmOpenQATrainer(model=model, args=training_args(tmp_path), eval_dataset=dataset)
    logged = trainer.evaluate()
    assert logged["eval_exact_match"] == pytest.approx(metrics["exact_match"])
    assert logged["eval_recall@3"] if "eval_recall@3" in logged else True


class SnapshotRecorder(TrainerCallback):
    """Copies the document embedder's weights at the given steps (runs before the re-index callback)."""

    def __init__(self, steps):
        self.steps, self.weights = set(steps), {}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step in self.steps:
            self.weights[state.global_step] = copy.deepcopy(model.document_embedder.state_dict())


@pytest.mark.parametrize("background", [False, True])
def test_callback_refreshes_and_index_equals_snapshot_embedding(tmp_path, background):
    model = make_model()
    before = all_embeddings(model.retriever).clone()
    dataset = datasets.Dataset.from_list(QUESTIONS * 2)
    recorder = SnapshotRecorder(steps=[3, 6])
    reindex = RealmReindexCallback(
        model.retriever, refresh_steps=3, background=background, keep_last_snapshot=True, refresh_at_end=False
    )
    trainer = RealmOpenQATrainer(
        model=model,
        args=training_args(tmp_path, max_steps=7),
        train_dataset=dataset,
        callbacks=[recorder, reindex],
    )
    trainer.train()
    # Steps 3 and 6 start refreshes; both are swapped in (the last one at the latest at the end of training).
    assert reindex.refresh_count == 2
    assert reindex.failed_refreshes == 0
    assert reindex.last_refresh_step == 6
    logged = [entry for entry in trainer.state.log_history if "reindex/staleness" in entry]
    assert len(logged) == 2 and all(entry["reindex/staleness"] >= 0 for entry in logged)
    assert all(entry["reindex/index_size"] == len(model.retriever) for entry in logged)
    # The snapshot holds the weights of step 6 ...
    for name, tensor in reindex.last_snapshot.state_dict().items():
        torch.testing.assert_close(tensor, recorder.weights[6][name], atol=0, rtol=0)
    # ... the index now equals a from-scratch embedding of the corpus with them ...
    fresh = copy.deepcopy(model.document_embedder)
    fresh.load_state_dict(recorder.weights[6])
    corpus = model.retriever.corpus
    expected = embed_blocks(
        fresh,
        model.retriever.tokenizer,
        corpus["title"],
        corpus["text"],
        show_progress=False,
        max_length=model.retriever.max_block_length,
    )
    torch.testing.assert_close(all_embeddings(model.retriever), expected, atol=1e-5, rtol=0)
    # ... and training really moved the document embedder (so the refresh changed the index).
    assert not torch.allclose(before, all_embeddings(model.retriever), atol=1e-4)
    # Searching the swapped index gives exact inner-product results.
    query = torch.randn(2, model.retriever.embedding_dim)
    search = model.retriever.search(query, 3)
    brute = (query @ expected.T).topk(3).indices
    assert search.block_ids.tolist() == torch.as_tensor(model.retriever.store.block_ids)[brute].tolist()


def test_failed_refresh_keeps_old_index_and_training_goes_on(tmp_path, monkeypatch, caplog):
    model = make_model()
    before = all_embeddings(model.retriever).clone()

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    # What the callback calls for a refresh (`realm_hf.retrieval.refresh.refresh_index_state`).
    monkeypatch.setattr("realm_hf.training.callbacks.refresh_index_state", broken)
    reindex = RealmReindexCallback(model.retriever, refresh_steps=2, background=True, refresh_at_end=False)
    trainer = RealmOpenQATrainer(
        model=model,
        args=training_args(tmp_path, max_steps=5),
        train_dataset=datasets.Dataset.from_list(QUESTIONS),
        callbacks=[reindex],
    )
    trainer.train()
    assert trainer.state.global_step == 5
    assert reindex.refresh_count == 0
    assert reindex.failed_refreshes == 2
    assert "disk full" in caplog.text
    torch.testing.assert_close(all_embeddings(model.retriever), before, atol=0, rtol=0)


def test_save_and_resume_restore_model_optimizer_and_index(tmp_path):
    dataset = datasets.Dataset.from_list(QUESTIONS * 2)

    class StopAt(TrainerCallback):
        """Interrupts a 6-step run after step 3 (same LR schedule as the uninterrupted run)."""

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                control.should_training_stop = True
            return control

    def run(output_dir, stop_at_3=False):
        model = make_model()
        # No end-of-training refresh: the interrupted run's last index must be the one in checkpoint-3.
        reindex = RealmReindexCallback(model.retriever, refresh_steps=2, background=False, refresh_at_end=False)
        trainer = RealmOpenQATrainer(
            model=model,
            args=training_args(output_dir, max_steps=6, save_strategy="steps", save_steps=3),
            train_dataset=dataset,
            callbacks=[reindex] + ([StopAt()] if stop_at_3 else []),
        )
        trainer.train()
        return model, reindex

    full_model, _ = run(tmp_path / "full")
    _, first = run(tmp_path / "part", stop_at_3=True)
    checkpoint = tmp_path / "part" / "checkpoint-3"
    assert (checkpoint / "retriever" / "retriever_manifest.json").exists()
    # The optimizer state is saved without pickle (training/saving.py), and read back on resume below.
    assert (checkpoint / "optimizer.safetensors").exists() and not (checkpoint / "optimizer.pt").exists()
    saved_index = all_embeddings(first.retriever).clone()

    resumed_model = make_model()
    reindex = RealmReindexCallback(resumed_model.retriever, refresh_steps=2, background=False, refresh_at_end=False)
    trainer = RealmOpenQATrainer(
        model=resumed_model,
        args=training_args(tmp_path / "part", max_steps=6, save_strategy="steps", save_steps=3),
        train_dataset=dataset,
        callbacks=[reindex],
    )
    restored = {}

    class CheckRestore(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            restored["index"] = all_embeddings(resumed_model.retriever).clone()

    trainer.add_callback(CheckRestore())
    trainer.train(resume_from_checkpoint=str(checkpoint))
    torch.testing.assert_close(restored["index"], saved_index, atol=0, rtol=0)
    assert reindex.refresh_count == first.refresh_count + 2  # bookkeeping restored, then steps 4 and 6
    for (name, a), (_, b) in zip(full_model.state_dict().items(), resumed_model.state_dict().items()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=lambda m, name=name: f"{name}: {m}")
    torch.testing.assert_close(all_embeddings(full_model.retriever), all_embeddings(resumed_model.retriever))


def test_refresh_at_end_leaves_an_index_matching_the_final_weights(tmp_path):
    model = make_model()
    reindex = RealmReindexCallback(model.retriever, refresh_steps=3, background=True)
    trainer = RealmOpenQATrainer(
        model=model,
        args=training_args(tmp_path, max_steps=5),
        train_dataset=datasets.Dataset.from_list(QUESTIONS * 2),
        callbacks=[reindex],
    )
    trainer.train()
    # Step 3 refreshes; steps 4-5 train the document embedder further, so training ends with one more refresh.
    assert reindex.refresh_count == 2
    final = reindex.history[-1]
    assert final["reindex/snapshot_step"] == 5 and final["reindex/staleness"] == 0
    assert final["reindex/refresh_seconds"] > 0  # measured up to the swap, not up to the submission
    assert is_stale(model.retriever, model.document_embedder) is False
    corpus = model.retriever.corpus
    expected = embed_blocks(
        model.document_embedder,
        model.retriever.tokenizer,
        corpus["title"],
        corpus["text"],
        show_progress=False,
        max_length=model.retriever.max_block_length,
    )
    torch.testing.assert_close(all_embeddings(model.retriever), expected, atol=1e-5, rtol=0)
    # Nothing to do when the index is already current (e.g. a frozen document embedder).
    assert reindex.refresh_if_stale(model, 5) == {}
    assert reindex.refresh_count == 2


class LogRecorder(TrainerCallback):
    """Stands in for a `report_to` integration: records what each on_log call receives."""

    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs))


def test_refresh_metrics_reach_integrations_and_not_later_evaluation(tmp_path):
    model = make_model()
    recorder = LogRecorder()
    # The reindexer is listed last, as users write it; the trainer must still let it merge metrics first.
    reindex = RealmReindexCallback(model.retriever, refresh_steps=2, background=False, refresh_at_end=False)
    dataset = datasets.Dataset.from_list(QUESTIONS)
    trainer = RealmOpenQATrainer(
        model=model,
        args=training_args(tmp_path, max_steps=4, logging_steps=2),
        train_dataset=dataset,
        eval_dataset=dataset,
        callbacks=[recorder, reindex],
    )
    trainer.train()
    received = [entry for entry in recorder.logs if "reindex/refreshes" in entry]
    assert [entry["reindex/refreshes"] for entry in received] == [1.0, 2.0]
    assert all("loss" in entry for entry in received)  # merged into the step's training log
    recorder.logs.clear()
    trainer.evaluate()
    assert recorder.logs and not any(key.startswith("reindex/") for entry in recorder.logs for key in entry)

    # A plain Trainer gets the same order through attach().
    from transformers import Trainer

    plain = Trainer(model=model, args=training_args(tmp_path), callbacks=[LogRecorder()])
    other = RealmReindexCallback(model.retriever)
    assert other.attach(plain) is other
    assert plain.callback_handler.callbacks[0] is other
    other.attach(plain)
    assert sum(callback is other for callback in plain.callback_handler.callbacks) == 1


def test_checkpoints_write_the_index_once(tmp_path, monkeypatch):
    from realm_hf.retrieval.retriever import RealmRetriever

    model = make_model()
    writes = []
    write = RealmRetriever.write  # what writes a retriever folder, for the model's save or its own

    def counting_write(retriever, directory, *args, **kwargs):
        writes.append(os.path.relpath(str(directory), str(tmp_path)).split(os.sep)[0])
        return write(retriever, directory, *args, **kwargs)

    monkeypatch.setattr(RealmRetriever, "write", counting_write)
    reindex = RealmReindexCallback(model.retriever, refresh_steps=2, background=False, refresh_at_end=False)
    trainer = RealmOpenQATrainer(
        model=model,
        args=training_args(tmp_path, max_steps=4, save_strategy="steps", save_steps=2),
        train_dataset=datasets.Dataset.from_list(QUESTIONS),
        callbacks=[reindex],
    )
    trainer.train()
    assert sorted(writes) == ["checkpoint-2", "checkpoint-4"]
    for step in (2, 4):
        assert (tmp_path / f"checkpoint-{step}" / "retriever" / "retriever_manifest.json").exists()
        assert (tmp_path / f"checkpoint-{step}" / "reindex_state.json").exists()


def test_accelerate_style_loop_uses_step_hook():
    model = make_model()
    model.train()
    reindex = RealmReindexCallback(model.retriever, refresh_steps=2, background=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    collator = DataCollatorForOpenQA(model.retriever.tokenizer)
    logs = []
    for step in range(1, 5):
        loss = model(**collator(QUESTIONS[:2])).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        logs.append(reindex.step(step, model))
    assert reindex.refresh_count == 2
    assert [bool(entry) for entry in logs] == [False, True, False, True]


def test_two_processes_build_the_same_index_as_one(tmp_path):
    script = os.path.join(SCRIPTS, "reindex_worker.py")
    single = tmp_path / "single.json"
    subprocess.run([sys.executable, script, str(single)], check=True, timeout=300)
    double = tmp_path / "double.json"
    env = dict(os.environ, ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1")
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    launcher += [
        "--main_process_port",
        "29517",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
    ]
    result = subprocess.run([*launcher, script, str(double)], env=env, timeout=600, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    one, two = json.loads(single.read_text()), json.loads(double.read_text())
    assert two["world_size"] == 2 and one["world_size"] == 1
    assert two["ranks_agree"]
    torch.testing.assert_close(torch.tensor(two["embeddings"]), torch.tensor(one["embeddings"]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("native", [False, True])
def test_training_arguments_warn_when_bf16_would_be_emulated_on_the_cpu(tmp_path, monkeypatch, native):
    # bf16 autocast on a CPU without AVX512-BF16/AMX trains many times slower than fp32; transformers says nothing.
    import warnings

    from realm_hf.training import recipes

    monkeypatch.setattr(recipes, "has_native_bf16", lambda device="cpu": native)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        args = recipes.training_arguments(str(tmp_path), seed=0, use_cpu=True, bf16=True, max_steps=1)
        recipes.training_arguments(str(tmp_path), seed=0, use_cpu=True, max_steps=1)  # fp32: never warned
    assert args.bf16
    messages = [str(w.message) for w in caught if "bf16" in str(w.message)]
    assert len(messages) == (0 if native else 1)
    if not native:
        assert "Set bf16 to false" in messages[0]


def test_training_questions_without_content_fail_before_training(tiny):
    dataset = __import__("datasets").Dataset.from_dict(
        {"question": ["who wrote unix?", "\U0001f600", "???"], "answers": [["ken"], ["x"], ["y"]]}
    )
    with pytest.raises(ValueError, match=r"2 bad training question.*record 2: .*no word.*record 3: .*no content"):
        check_training_questions(dataset, tiny[1])
    # The Trainer API without the recipe's check: the collator refuses the batch, nothing trains on it.
    with pytest.raises(ValueError, match="no word the model's vocabulary knows"):
        DataCollatorForOpenQA(tiny[1])([{"question": "\U0001f600", "answers": ["x"]}])


GOOD = {"question": ["who wrote unix?", "what is a compiler?"], "answers": [["Ken Thompson"], ["program"]]}


@pytest.mark.parametrize(
    "data, message",
    [
        # Before: the stock Trainer's "The model did not return a loss from the inputs" at the first step.
        ({"question": GOOD["question"]}, "training data.*'answers'"),
        # Before: a bare KeyError: 'question' from the collator at the first step.
        ({"q": GOOD["question"], "answers": GOOD["answers"]}, "training data.*'question'"),
        # Before: torch's "num_samples should be a positive integer value, but got num_samples=0".
        ({"question": [], "answers": []}, "training data.*empty"),
    ],
)
def test_openqa_trainer_refuses_data_it_cannot_train_on(tiny, tmp_path, data, message):
    with pytest.raises(ValueError, match=message):
        RealmOpenQATrainer(
            model=tiny[0], args=training_args(tmp_path, max_steps=1), train_dataset=datasets.Dataset.from_dict(data)
        )


def test_openqa_trainer_checks_its_evaluation_data_too(tiny, tmp_path):
    train = datasets.Dataset.from_dict(GOOD)
    with pytest.raises(ValueError, match="evaluation data.*'answers'"):
        RealmOpenQATrainer(
            model=tiny[0],
            args=training_args(tmp_path, max_steps=1),
            train_dataset=train,
            eval_dataset=train.remove_columns("answers"),
        )


def test_openqa_trainer_accepts_good_data(tiny, tmp_path):
    trainer = RealmOpenQATrainer(
        model=tiny[0], args=training_args(tmp_path, max_steps=1), train_dataset=datasets.Dataset.from_dict(GOOD)
    )
    assert trainer.train().global_step == 1


def test_evaluation_without_answers_names_the_column(tiny):
    # Before: datasets' "Column 'answers' doesn't exist." with no word of which data or what to do.
    with pytest.raises(ValueError, match="evaluation data.*'answers'.*`answers_column`"):
        evaluate_openqa(tiny[0], datasets.Dataset.from_dict({"question": GOOD["question"]}), show_progress=False)


def test_beam_answer_tally_logs_the_share_and_warns_once_at_zero(caplog):
    tally = BeamAnswerTally()
    logs = {"loss": 1.0}
    tally.log_into(logs)
    assert "answer_in_beam" not in logs  # nothing counted yet
    tally.add(torch.tensor([True, False]))
    tally.add(torch.tensor([False, False]))
    tally.log_into(logs)
    assert logs["answer_in_beam"] == 0.25
    eval_logs = {"eval_exact_match": 1.0}
    tally.add(torch.tensor([True]))
    tally.log_into(eval_logs)  # not a training log: left alone, the count kept
    assert "answer_in_beam" not in eval_logs
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            logs = {"loss": 0.0}
            tally.add(torch.tensor([False, False, False]))
            tally.log_into(logs)
    assert logs["answer_in_beam"] == 0.0
    assert caplog.text.count("had a gold answer in its retrieved blocks, so the loss is 0") == 1


@pytest.mark.parametrize(
    "answers, share", [([["Ken Thompson"], ["machine code"]], 1.0), ([["zebra"], ["walrus"]], 0.0)]
)
def test_openqa_training_logs_how_many_beams_held_an_answer(tmp_path, answers, share):
    # Every block is retrieved (beam = corpus), so the share is known without the model: answers in DOCS or not.
    model = build_tiny_model(str(tmp_path))[0]
    model.config.searcher_beam_size = len(DOCS)
    args = training_args(tmp_path, max_steps=1)
    data = datasets.Dataset.from_dict({"question": GOOD["question"], "answers": answers})
    trainer = RealmOpenQATrainer(model=model, args=args, train_dataset=data)
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [entry["answer_in_beam"] for entry in logged] == [share]
    # Before, a run of answers absent from the corpus trained at loss 0 and said nothing.
    assert (logged[0]["loss"] == 0.0) == (share == 0.0)


def test_openqa_trainer_marks_the_reader_trained(tmp_path):
    from realm_hf.training.openqa import RealmOpenQATrainer

    model = load_legacy_model()
    model.config.reader_trained = False  # as after init_from_bert
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=2, report_to=[], use_cpu=True,
        disable_tqdm=True, save_strategy="no",
    )  # fmt: skip
    trainer = RealmOpenQATrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(QUESTIONS[:2]))
    trainer.train()
    assert model.config.reader_trained is True


def test_frozen_reader_is_not_marked_trained():
    from realm_hf.training.openqa import mark_reader_trained

    model = load_legacy_model()
    model.config.reader_trained = False
    model.reader.requires_grad_(False)
    assert mark_reader_trained(model) is False and model.config.reader_trained is False
    model.reader.requires_grad_(True)
    assert mark_reader_trained(model) is True and model.config.reader_trained is True


def test_reindex_callback_destroys_its_groups_and_two_processes_exit_five_times(tmp_path):
    import json

    script = os.path.join(SCRIPTS, "teardown_worker.py")
    out = tmp_path / "teardown.json"
    env = dict(os.environ, ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1")
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    launcher += ["--main_process_port", "29523", "--num_machines", "1", "--mixed_precision", "no"]
    launcher += ["--dynamo_backend", "no"]
    # A hang at exit shows as the timeout.
    result = subprocess.run([*launcher, script, str(out)], env=env, timeout=900, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["world_size"] == 2
    assert report["after_close"] == [report["baseline"]] * 5  # each round's two gloo groups were destroyed


def logged_scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar written under `log_dir`, by tag, as (step, value) pairs."""
    from tensorboard.backend.event_processing import event_accumulator

    scalars = {}
    for run in sorted({p.parent for p in log_dir.rglob("events.out.tfevents.*")}):
        accumulator = event_accumulator.EventAccumulator(str(run))
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend((e.step, e.value) for e in accumulator.Scalars(tag))
    return scalars


def test_training_logs_reach_tensorboard(tmp_path):
    """The Trainer's own logs, the re-index metrics and the evaluation reach TensorBoard (`report_to="tensorboard"`)."""
    pytest.importorskip("tensorboard", reason="tensorboard is not a dependency of realm-hf (docs/training.md)")
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


def _interrupted_run(output_dir, dataset):
    """A 6-step run stopped after step 3 (checkpoint-3 holds the index refreshed at step 2)."""

    class StopAt3(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step == 3
            return control

    model = make_model()
    reindex = RealmReindexCallback(model.retriever, refresh_steps=2, background=False, refresh_at_end=False)
    RealmOpenQATrainer(
        model=model,
        args=training_args(output_dir, max_steps=6, save_strategy="steps", save_steps=3),
        train_dataset=dataset,
        callbacks=[reindex, StopAt3()],
    ).train()
    return output_dir / "checkpoint-3"


def _resume(checkpoint, output_dir, dataset):
    model = make_model()
    reindex = RealmReindexCallback(model.retriever, refresh_steps=2, background=False, refresh_at_end=False)
    trainer = RealmOpenQATrainer(
        model=model,
        args=training_args(output_dir, max_steps=4, save_strategy="no"),
        train_dataset=dataset,
        callbacks=[reindex],
    )
    restored = {}

    class Record(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            restored["index"] = all_embeddings(model.retriever).clone()

    trainer.add_callback(Record())
    trainer.train(resume_from_checkpoint=str(checkpoint))
    return model, reindex, restored["index"]


def test_resuming_from_a_checkpoint_in_another_directory_restores_its_index(tmp_path):
    """The callback took the index of output_dir/checkpoint-N (absent here), not of the checkpoint being resumed."""
    from realm_hf.retrieval.retriever import RealmRetriever

    dataset = datasets.Dataset.from_list(QUESTIONS * 2)
    checkpoint = _interrupted_run(tmp_path / "first", dataset)
    saved = all_embeddings(RealmRetriever.from_pretrained(checkpoint / "retriever"))
    _, reindex, restored = _resume(checkpoint, tmp_path / "elsewhere", dataset)
    torch.testing.assert_close(restored, saved, atol=0, rtol=0)
    assert reindex.refresh_count == 2  # the step-2 refresh restored, then step 4


def test_an_index_saved_with_other_weights_is_not_restored(tmp_path, caplog):
    """The index of a checkpoint was never checked against the checkpoint's weights."""
    import logging
    import shutil

    dataset = datasets.Dataset.from_list(QUESTIONS * 2)
    checkpoint = _interrupted_run(tmp_path / "first", dataset)
    other = _interrupted_run(tmp_path / "other", datasets.Dataset.from_list(QUESTIONS[::-1] * 2))
    # The index and bookkeeping of another run beside these weights.
    shutil.rmtree(checkpoint / "retriever")
    shutil.copytree(other / "retriever", checkpoint / "retriever")
    shutil.copy(other / "reindex_state.json", checkpoint / "reindex_state.json")
    with caplog.at_level(logging.WARNING, logger="realm_hf"):
        model, _, restored = _resume(checkpoint, tmp_path / "first", dataset)
    assert "saved with other weights" in caplog.text and str(checkpoint) in caplog.text
    # Re-embedded with the resumed weights (those of checkpoint-3) before the first resumed step.
    from realm_hf import RealmForOpenQA

    resumed_weights = RealmForOpenQA.from_pretrained(checkpoint, load_retriever=False).document_embedder
    expected = embed_blocks(
        resumed_weights,
        model.retriever.tokenizer,
        model.retriever.corpus["title"],
        model.retriever.corpus["text"],
        show_progress=False,
        max_length=model.retriever.max_block_length,
    )
    torch.testing.assert_close(restored, expected, atol=1e-5, rtol=0)
