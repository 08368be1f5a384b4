"""
realm-hf's Trainers write and upload no pickle: checkpoints hold
the arguments as JSON and the optimizer, scheduler and RNG states as safetensors, the pushes made during training
(`hub_strategy`) upload none of transformers' `torch.save` files, and a run resumed from such a checkpoint ends where
an uninterrupted one does.
"""

import logging
import os
import shutil
from concurrent.futures import Future

import datasets
import numpy as np
import pytest
import torch
from transformers import TrainingArguments

from realm_hf import RealmForOpenQA
from realm_hf.training.openqa import RealmOpenQATrainer
from realm_hf.training.saving import load_state, save_state
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


def test_state_round_trip_keeps_types(tmp_path):
    import random

    state = {
        "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.arange(4.0)}},
        "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0], "foreach": None, "eps": float("inf")}],
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    save_state(state, str(tmp_path / "s.safetensors"))
    back = load_state(str(tmp_path / "s.safetensors"))
    assert list(back["state"]) == [0] and torch.equal(back["state"][0]["exp_avg"], torch.arange(4.0))
    assert back["param_groups"][0]["betas"] == (0.9, 0.999) and back["param_groups"][0]["eps"] == float("inf")
    assert back["python"] == state["python"]
    assert back["numpy"][0] == "MT19937" and np.array_equal(back["numpy"][1], state["numpy"][1])
    assert back["numpy"][1].dtype == state["numpy"][1].dtype


def test_unsupported_state_is_a_clear_error(tmp_path):
    with pytest.raises(TypeError, match=r"optimizer\.safetensors\.param_groups\[0\]\.fn.*builtin_function_or_method"):
        save_state({"param_groups": [{"fn": len}]}, str(tmp_path / "optimizer.safetensors"))


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
    import json
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
