"""What every command shares (`realm_hf.cli.common`): model and tokenizer folders checked, damaged weights and
config files named, not a traceback."""

import os
import shutil

import pytest

from tests.support.cli import run
from tests.support.paths import LEGACY


def test_tokenizer_lookup_refuses_a_folder_without_vocabulary(tmp_path):
    from realm_hf.cli.common import CLIError, load_tokenizer

    # A plain BERT tokenizer config (not realm-hf's class) and no vocabulary file.
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "BertTokenizer"}')
    with pytest.raises(CLIError, match="no tokenizer.json or vocab.txt"):
        load_tokenizer(str(tmp_path))


def test_model_given_as_a_file_is_named(tmp_path, capsys):
    from realm_hf.cli import main

    model = tmp_path / "model.safetensors"
    model.write_bytes(b"not a directory")
    status = main(["-q", "ask", "--model", str(model), "who wrote unix?"])
    err = capsys.readouterr().err
    # Before: the Hub client's "Repo id must be in the form 'repo_name' or 'namespace/repo_name'".
    assert status == 2 and f"Model {str(model)!r} is a file: give a model directory" in err


LEGACY_EMBEDDER = os.path.join(LEGACY, "embedder")


def test_truncated_weights_are_named_not_a_traceback(tiny_dir, tmp_path, capsys):
    damaged = tmp_path / "damaged"
    shutil.copytree(tiny_dir, damaged)
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:2000])
    # SafetensorError ("invalid header length") was a traceback.
    assert run("ask", "--model", damaged, "who wrote unix?") == 2
    err = capsys.readouterr().err
    assert f"Could not load the model in {damaged}" in err and "truncated or damaged" in err
    assert "Traceback" not in err


def test_damaged_legacy_weights_are_named(tmp_path, capsys):
    source = tmp_path / "embedder"
    shutil.copytree(LEGACY_EMBEDDER, source)
    (source / "pytorch_model.bin").write_bytes(b"hello world" * 10)
    # torch's reader raised KeyError(101): "error: 101".
    assert run("convert", source, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert f"Could not load the model in {source}" in err
    assert not (tmp_path / "out").exists()


def test_broken_config_json_is_named(tiny_dir, tmp_path, capsys):
    damaged = tmp_path / "damaged"
    shutil.copytree(tiny_dir, damaged)
    (damaged / "config.json").write_text("{")
    # "error: Expecting property name enclosed in double quotes: line 2 column 1 (char 2)": no file named.
    assert run("ask", "--model", damaged, "who wrote unix?") == 2
    assert f"{damaged / 'config.json'} is not valid JSON" in capsys.readouterr().err
