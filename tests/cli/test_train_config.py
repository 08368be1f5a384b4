"""`realm-hf train`'s config files (`realm_hf.cli.train_config`): every value of the wrong type named by its key."""

import json
import os

import pytest

from realm_hf.cli import load_train_config
from tests.support.cli import run
from tests.support.paths import TRAIN_CONFIG_EXAMPLE


@pytest.mark.parametrize(
    "values, message",
    [
        ({"model": 5}, "model must be a path (a string), got 5"),  # AttributeError traceback
        ({"training_args": 5}, "training_args must be a mapping"),  # AttributeError traceback
        ({"training_args": {"max_steps": "100"}}, "training_args.max_steps must be an integer"),  # TypeError
        ({"training_args": {"learning_rate": "fast"}}, "training_args.learning_rate must be a number"),  # TypeError
        ({"training_args": {"max_steps": 0}}, "training_args.max_steps must be a positive number"),  # 3 epochs
        ({"training_args": {"per_device_train_batch_size": 0}}, "per_device_train_batch_size must be at least 1"),
        ({"retriever_warmup": {"max_steps": 1, "learning_rate": "x"}}, "retriever_warmup.learning_rate must be a"),
        ({"lora": {"r": "8"}}, "lora.r must be an integer"),  # TypeError traceback
        ({"lora": [1]}, "lora must be true"),  # the default LoRA, silently
        # Named after the corpus was embedded, or (r: 0) a ValueError of add_lora then.
        ({"lora": {"rank": 8}}, "unknown lora option(s) rank (did you mean lora.r?)"),
        ({"lora": {"lora_alpha": 8}}, "(did you mean lora.alpha?)"),
        ({"lora": {"r": 0}}, "LoRA rank `r` must be a positive integer, got 0"),
        ({"lora": {"dropout": 1.0}}, "LoRA `dropout` must be in [0, 1)"),
        ({"lora": {"alpha": -2}}, "LoRA `alpha` must be a positive number"),
        ({"lora": {"target_modules": ["query", "ffn"]}}, "lora.target_modules ['ffn'] are not attention projections"),
        ({"lora": {"modules_to_save": "qa_outputs"}}, "lora.modules_to_save must be a list of names"),
        ({"recall_ks": [0]}, "recall_ks must be a list of positive integers"),  # taken
        ({"train_document_embedder": "false"}, "train_document_embedder must be true or false"),  # read as true
        ({"reindex_batch_size": "abc"}, "reindex_batch_size must be an integer"),  # invalid literal for int()
        ({"max_block_length": "abc"}, "max_block_length must be an integer of at least 8"),
        ({"documents": []}, "documents must be a file path or a non-empty list"),  # the model's corpus, silently
        ({"question_column": 5}, "question_column must be a string"),
        ({"embedder_lr_ratio": "x"}, "embedder_lr_ratio must be a positive number"),
    ],
)
def test_train_config_values_of_the_wrong_type_name_the_key(tmp_path, capsys, values, message):
    config = {"model": str(tmp_path), "train_file": "qa.jsonl", "output_dir": "out", **values}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert run("train", path) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_yaml_learning_rate_written_without_a_dot_is_a_number(tmp_path):
    # YAML 1.1 reads 3e-5 as the string "3e-5": the optimizer failed with a TypeError traceback.
    path = tmp_path / "config.yaml"
    path.write_text("model: m\ntrain_file: qa.jsonl\noutput_dir: out\ntraining_args:\n  learning_rate: 3e-5\n")
    assert load_train_config(str(path))["training_args"]["learning_rate"] == 3e-5


def test_config_file_that_is_a_directory_or_not_utf8_is_named(tmp_path, capsys):
    # "Config file ... does not exist" for a directory that exists.
    assert run("train", tmp_path) == 2
    assert "is a directory" in capsys.readouterr().err
    path = tmp_path / "config.json"
    path.write_bytes(b'{"output_dir": "caf\xe9"}')
    # "'utf-8' codec can't decode byte 0xe9 ...": no file named.
    assert run("train", path) == 2
    assert f"{path}: not valid UTF-8" in capsys.readouterr().err


def test_example_config_parses():
    config = load_train_config(TRAIN_CONFIG_EXAMPLE)
    assert config["task"] == "finetune"
    assert os.path.isabs(config["train_file"]) and os.path.isabs(config["output_dir"])
    assert "learning_rate" in config["training_args"]


def test_train_config_errors(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("task: finetune\noutput_dir: out\nlerning_rate: 0.1\n")
    assert run("train", path) == 2
    assert "unknown config key(s) lerning_rate" in capsys.readouterr().err
    path.write_text("task: finetune\noutput_dir: out\nmodel: does-not-exist/\ntrain_file: nope.jsonl\n")
    assert run("train", path) == 2
    err = capsys.readouterr().err
    assert "train_file" in err and "does not exist" in err
    assert run("train", tmp_path / "missing.yaml") == 2
