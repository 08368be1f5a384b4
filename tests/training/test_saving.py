"""
realm-hf's Trainers write and upload no pickle: checkpoints hold
the arguments as JSON and the optimizer, scheduler and RNG states as safetensors, the pushes made during training
(`hub_strategy`) upload none of transformers' `torch.save` files, and a run resumed from such a checkpoint ends where
an uninterrupted one does.
"""

import json
import logging
import os
import shutil
from concurrent.futures import Future

import datasets
import pytest
import torch
from transformers import TrainingArguments

from realm_hf import RealmForOpenQA
from realm_hf.training.checkpoint_state import load_state, save_state
from realm_hf.training.openqa import RealmOpenQATrainer
from tests.support.legacy_model import QUESTIONS, load_legacy_model


def is_pickle(data: bytes) -> bool:
    """A pickle stream (protocol 2+ starts with PROTO, 0x80) or `torch.save`'s zip archive (a `data.pkl` inside)."""
    return (len(data) > 1 and data[0] == 0x80 and data[1] in range(2, 6)) or data.startswith(b"PK\x03\x04")


def pickled_files(folder) -> list[str]:
    found = []
    for root, _, names in os.walk(folder):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                if is_pickle(f.read(8)):
                    found.append(os.path.relpath(os.path.join(root, name), folder))
    return found


def test_the_pickle_check_finds_torch_save_files(tmp_path):
    # The check below is only worth something if it sees what transformers writes.
    torch.save({"a": torch.ones(2)}, tmp_path / "optimizer.pt")
    torch.save(TrainingArguments(output_dir=str(tmp_path), report_to=[]), tmp_path / "training_args.bin")
    import pickle

    (tmp_path / "plain.pkl").write_bytes(pickle.dumps({"a": 1}))
    save_state({"a": torch.ones(2)}, str(tmp_path / "state.safetensors"))
    assert sorted(pickled_files(tmp_path)) == ["optimizer.pt", "plain.pkl", "training_args.bin"]


class RecordingApi:
    """Stands in for the `HfApi` the Trainer pushes with: copies each uploaded folder as it was at upload time."""

    def __init__(self, tmp_path):
        self.tmp_path, self.uploads = tmp_path, []

    def create_repo(self, repo_id, **kwargs):
        from huggingface_hub import RepoUrl

        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(self, *, repo_id, folder_path, run_as_future=False, **kwargs):
        copy = self.tmp_path / f"upload-{len(self.uploads)}"
        shutil.copytree(folder_path, copy, ignore=shutil.ignore_patterns(*kwargs.get("ignore_patterns") or ()))
        self.uploads.append({"folder": copy, "path_in_repo": kwargs.get("path_in_repo")})
        if not run_as_future:
            return "commit-info"
        done = Future()
        done.set_result("commit-info")
        return done


def arguments(output_dir, **values):
    values = {
        "per_device_train_batch_size": 1,
        "max_steps": 2,
        "learning_rate": 1e-3,
        "save_strategy": "steps",
        "save_steps": 1,
        "report_to": [],
        "use_cpu": True,
        "disable_tqdm": True,
        "seed": 0,
        **values,
    }
    return TrainingArguments(output_dir=str(output_dir), **values)


def trainer(output_dir, **values):
    model = load_legacy_model()
    return RealmOpenQATrainer(
        model=model, args=arguments(output_dir, **values), train_dataset=datasets.Dataset.from_list(QUESTIONS[:2])
    )


@pytest.mark.parametrize("strategy", ["every_save", "checkpoint", "all_checkpoints"])
def test_hub_strategy_pushes_and_checkpoints_hold_no_pickle(strategy, tmp_path, monkeypatch):
    import transformers.trainer

    api = RecordingApi(tmp_path)
    monkeypatch.setattr(transformers.trainer, "hf_api", lambda: api)
    out = tmp_path / "out"
    run = trainer(out, push_to_hub=True, hub_model_id="realm-test/run", hub_strategy=strategy)
    run.train()
    run.push_to_hub()
    checkpoints = sorted(name for name in os.listdir(out) if name.startswith("checkpoint-"))
    assert checkpoints == ["checkpoint-1", "checkpoint-2"]
    for name in checkpoints:
        files = set(os.listdir(out / name))
        assert {"optimizer.safetensors", "scheduler.safetensors", "rng_state.safetensors"} <= files
        assert "training_args.json" in files and "retriever" in files
        assert pickled_files(out / name) == []
    # Every push during training, plus the final one; the checkpoint folders too for the checkpoint strategies.
    checkpoint_pushes = [u for u in api.uploads if u["path_in_repo"] is not None]
    assert len(api.uploads) == 3 + len(checkpoint_pushes)
    assert len(checkpoint_pushes) == (0 if strategy == "every_save" else 2)
    for upload in api.uploads:
        assert pickled_files(upload["folder"]) == [], upload
        assert "training_args.json" in os.listdir(upload["folder"])
    if strategy == "checkpoint":
        assert {u["path_in_repo"] for u in checkpoint_pushes} == {"last-checkpoint"}
    # A push made during training is a model that loads: weights and retriever from the same save.
    from realm_hf import RealmForOpenQA

    first = api.uploads[0]["folder"]
    reloaded = RealmForOpenQA.from_pretrained(first)
    step1 = RealmForOpenQA.from_pretrained(out / "checkpoint-1")
    for (name, a), (_, b) in zip(reloaded.state_dict().items(), step1.state_dict().items()):
        assert torch.equal(a, b), name


def test_resume_from_a_pickle_free_checkpoint_ends_where_an_uninterrupted_run_does(tmp_path):
    straight = trainer(tmp_path / "straight", max_steps=3)
    straight.train()
    interrupted = trainer(tmp_path / "resumed", max_steps=3)
    interrupted.train()  # writes checkpoint-1, -2, -3; resume from the first in a fresh Trainer
    assert pickled_files(tmp_path / "resumed") == []
    resumed = trainer(tmp_path / "resumed", max_steps=3)
    resumed.train(resume_from_checkpoint=str(tmp_path / "resumed" / "checkpoint-1"))
    for (name, a), (_, b) in zip(straight.model.state_dict().items(), resumed.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    # Not trivially equal: training moved the weights.
    untouched = load_legacy_model()
    assert not all(
        torch.equal(a, b) for a, b in zip(untouched.state_dict().values(), resumed.model.state_dict().values())
    )


def test_resume_warns_of_no_missing_keys_for_tied_weights(tmp_path, monkeypatch):
    import transformers.trainer

    run = trainer(tmp_path / "run", max_steps=1)
    run.train()
    warnings = []
    monkeypatch.setattr(transformers.trainer.logger, "warning", lambda message, *a, **k: warnings.append(str(message)))
    resumed = trainer(tmp_path / "run", max_steps=2)
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-1"))
    # The heads' decoder.bias is saved once (tied): "There were missing keys ... decoder.bias" was printed.
    assert not [w for w in warnings if "missing keys" in w], warnings
    model = resumed.model
    assert model.reader.cls.predictions.decoder.bias is model.reader.cls.predictions.bias  # tied again
    # A key that is really missing is still named.
    from types import SimpleNamespace

    resumed._issue_warnings_after_load(
        SimpleNamespace(missing_keys=["reader.qa_outputs.dense_output.weight"], unexpected_keys=[])
    )
    assert any("reader.qa_outputs.dense_output.weight" in w for w in warnings)


def test_every_realm_hf_trainer_checkpoints_without_pickle():
    import importlib
    import pkgutil

    from transformers import Trainer

    import realm_hf.training
    from realm_hf.training.saving import RealmCheckpointMixin

    for module in pkgutil.iter_modules(realm_hf.training.__path__):
        importlib.import_module(f"realm_hf.training.{module.name}")

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    ours = {cls for cls in subclasses(Trainer) if cls.__module__.startswith("realm_hf.")}
    assert {cls.__name__ for cls in ours} >= {
        "RealmOpenQATrainer", "RealmPreTrainingTrainer", "RealmICTTrainer", "RealmReaderTrainer", "RealmRetrieverTrainer"
    }  # fmt: skip
    assert [cls.__name__ for cls in ours if not issubclass(cls, RealmCheckpointMixin)] == []


def test_background_pushes_show_no_data_file_warning_and_upload_everything(tmp_path, monkeypatch, caplog):
    """
    `trainer.push_to_hub(blocking=False)` and the `hub_strategy` pushes commit in huggingface_hub's worker thread,
    after the call returned: huggingface_hub's "about to commit a data file" warning for each corpus file used to show
    there (realm-hf hid it only around blocking pushes). The same warning for other files still shows.
    """
    import logging
    import warnings

    from realm_hf import RealmForOpenQA
    from tests.support.hub_server import TOKEN, LocalHub, point_clients_at

    with LocalHub() as hub, warnings.catch_warnings(record=True) as caught:  # also restores the filters afterwards
        warnings.simplefilter("default")
        point_clients_at(monkeypatch, hub.url, str(tmp_path / "hf-cache"))
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        run = trainer(
            tmp_path / "out", max_steps=1, push_to_hub=True, hub_model_id="realm-test/bg", hub_strategy="checkpoint"
        )
        with caplog.at_level(logging.INFO, logger="realm_hf"):
            run.train()  # its checkpoint is pushed in the background
            future = run.push_to_hub(blocking=False)
            future.result()
        # The filter is for the corpus only: the same warning for another data file still shows.
        other = "It seems that you are about to commit a data file (results.parquet) to a model repository."
        warnings.warn(other, UserWarning, stacklevel=1)
        files = set(hub.files("realm-test/bg"))
        reloaded = RealmForOpenQA.from_pretrained("realm-test/bg")
    assert reloaded.retriever.corpus["text"] == run.model.retriever.corpus["text"]
    assert any(name.startswith("retriever/corpus/") for name in files)
    assert any(name.startswith("last-checkpoint/retriever/corpus/") for name in files)
    assert [str(w.message) for w in caught if "about to commit a data file" in str(w.message)] == [other]
    assert any("hidden for them" in record.getMessage() for record in caplog.records)


def test_trainer_push_uploads_json_arguments_and_explains_data_files_once(tmp_path, monkeypatch, caplog):
    import warnings

    from realm_hf.training.openqa import RealmOpenQATrainer
    from tests.support.hub_server import TOKEN, LocalHub, point_clients_at

    with LocalHub() as hub:
        point_clients_at(monkeypatch, hub.url, str(tmp_path / "hf-cache"))
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        model = load_legacy_model()
        args = TrainingArguments(
            output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=2, report_to=[], use_cpu=True,
            disable_tqdm=True, save_strategy="no", hub_model_id="realm-test/trained",
        )  # fmt: skip
        trainer = RealmOpenQATrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(QUESTIONS[:2]))
        trainer.train()
        with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO):
            warnings.simplefilter("always")
            logging.getLogger("realm_hf").setLevel(logging.INFO)
            try:
                trainer.push_to_hub()
            finally:
                logging.getLogger("realm_hf").setLevel(logging.NOTSET)
        files = set(hub.files("realm-test/trained"))
        reloaded = RealmForOpenQA.from_pretrained("realm-test/trained")
        assert reloaded.retriever.corpus["text"] == model.retriever.corpus["text"]
    assert "training_args.json" in files and "training_args.bin" not in files
    # The corpus went up as Parquet shards, as model.push_to_hub writes it, and the repo loads.
    corpus = [name for name in files if name.startswith("retriever/corpus/")]
    assert any(name.endswith(".parquet") for name in corpus) and not any(name.endswith(".arrow") for name in corpus)
    assert not any(name.endswith((".bin", ".pt", ".pkl", ".pickle", ".pth")) for name in files), files
    assert not [w for w in caught if "about to commit a data file" in str(w.message)]
    assert len([r for r in caplog.records if "corpus data file(s)" in r.getMessage()]) == 1
    assert json.loads((tmp_path / "out" / "training_args.json").read_text())["max_steps"] == 1


# ------------------------------------------------------------------------------ resuming from damaged checkpoints


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A 2-step run with a checkpoint at each step (copied by the tests that damage one)."""
    out = tmp_path_factory.mktemp("finished") / "out"
    trainer(out).train()
    return out


def _copy(finished, tmp_path):
    target = tmp_path / "out"
    shutil.copytree(finished, target)
    return target


def test_a_torn_last_checkpoint_is_skipped_when_resuming_the_last(finished, tmp_path, caplog):
    """A checkpoint torn by a kill (no trainer_state.json) was picked and failed with a bare FileNotFoundError."""
    import logging

    out = _copy(finished, tmp_path)
    os.remove(out / "checkpoint-2" / "trainer_state.json")
    run = trainer(out, max_steps=2)
    with caplog.at_level(logging.WARNING, logger="realm_hf"):
        run.train(resume_from_checkpoint=True)
    assert "checkpoint-2" in caplog.text and "trainer_state.json" in caplog.text
    assert run.state.global_step == 2  # resumed from checkpoint-1, trained step 2 again
    os.remove(out / "checkpoint-2" / "trainer_state.json")  # written again by that run
    with pytest.raises(ValueError, match=r"checkpoint-2.*no trainer_state\.json"):
        trainer(out, max_steps=2).train(resume_from_checkpoint=str(out / "checkpoint-2"))


def test_a_missing_optimizer_state_is_an_error_not_a_fresh_optimizer(finished, tmp_path):
    out = _copy(finished, tmp_path)
    os.remove(out / "checkpoint-1" / "optimizer.safetensors")
    with pytest.raises(ValueError, match=r"checkpoint-1 holds no optimizer state"):
        trainer(out, max_steps=2).train(resume_from_checkpoint=str(out / "checkpoint-1"))


def test_without_an_optimizer_state_the_scheduler_state_is_still_honoured(finished, tmp_path, caplog):
    import logging

    out = _copy(finished, tmp_path)
    os.remove(out / "checkpoint-1" / "optimizer.safetensors")
    run = trainer(out, max_steps=2, save_only_model=True)
    loaded = []
    original = run.create_scheduler

    def recording_scheduler(*args, **kwargs):
        scheduler = original(*args, **kwargs)
        load = scheduler.load_state_dict
        scheduler.load_state_dict = lambda state: (loaded.append(state), load(state))[1]
        return scheduler

    run.create_scheduler = recording_scheduler
    with caplog.at_level(logging.WARNING, logger="realm_hf"):
        run.train(resume_from_checkpoint=str(out / "checkpoint-1"))
    assert "fresh optimizer" in caplog.text
    assert loaded and loaded[0]["last_epoch"] == 1


def test_an_optimizer_state_of_another_model_size_is_refused(finished, tmp_path):
    out = _copy(finished, tmp_path)
    path = out / "checkpoint-1" / "optimizer.safetensors"
    state = load_state(str(path))
    first = next(iter(state["state"]))
    state["state"][first] = {
        k: (torch.zeros(*v.shape[:-1], v.shape[-1] + 1) if v.dim() else v) for k, v in state["state"][first].items()
    }
    save_state(state, str(path))
    with pytest.raises(ValueError, match=r"optimizer\.safetensors.*shape.*another size"):
        trainer(out, max_steps=2).train(resume_from_checkpoint=str(out / "checkpoint-1"))


def test_a_damaged_weights_file_is_named(finished, tmp_path):
    out = _copy(finished, tmp_path)
    weights = out / "checkpoint-1" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ValueError, match=r"checkpoint-1 cannot be read.*truncated or damaged"):
        trainer(out, max_steps=2).train(resume_from_checkpoint=str(out / "checkpoint-1"))
