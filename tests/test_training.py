"""Open-QA fine-tuning with Trainer, and index refresh while training goes on (RealmReindexCallback)."""

import copy
import json
import os
import subprocess
import sys

import datasets
import pytest
import torch
from transformers import TrainerCallback, TrainingArguments

from realm_hf import RealmForOpenQA
from realm_hf.retrieval.encoding import embed_blocks
from realm_hf.retrieval.refresh import embed_corpus, is_stale
from realm_hf.training.callbacks import RealmReindexCallback
from realm_hf.training.openqa import DataCollatorForOpenQA, RealmOpenQATrainer, evaluate_openqa

HERE = os.path.dirname(__file__)
LEGACY_OPENQA = os.path.join(HERE, "fixtures", "legacy", "openqa")

QUESTIONS = [
    {"question": "What is the capital of France?", "answers": ["paris"]},
    {"question": "Who created the Python language?", "answers": ["guido van rossum", "guido"]},
    {"question": "Which country is Paris in?", "answers": ["france", "europe"]},
    {"question": "What is the capital of England?", "answers": ["london"]},
]


def no_dropout(model):
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def make_model(train_document_embedder=True):
    """The tiny legacy fixture model, with a trainable document embedder and an index built by it."""
    torch.manual_seed(0)
    model = RealmForOpenQA.from_pretrained(LEGACY_OPENQA, allow_pickle=True)
    model.config.searcher_beam_size = 6
    if train_document_embedder:
        model.add_document_embedder()
        embed_corpus(model.retriever, model.document_embedder, show_progress=False)
    return no_dropout(model)


def all_embeddings(retriever):
    ids = torch.as_tensor(retriever.store.block_ids).view(1, -1)
    return retriever.store.embeddings(ids)[0]


def training_args(tmp_path, **overrides):
    args = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        learning_rate=5e-3,
        max_steps=8,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        data_seed=0,
    )
    args.update(overrides)
    return TrainingArguments(**args)


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
    script = os.path.join(HERE, "scripts", "reindex_worker.py")
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
