"""What every command shares (`realm_hf.cli.common`): model and tokenizer folders checked, damaged weights and
config files named, not a traceback."""

import json
import os
import shutil

import pytest

from realm_hf.cli.common import CLIError, check_written_paths
from realm_hf.io.staged_saves import JOURNAL_NAME, STAGING_PREFIX
from tests.support.cli import run
from tests.support.paths import CORPUS_DOCUMENTS, LEGACY


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


def _tree(path):
    """Every file under `path` with its bytes: what must survive a refused command."""
    found = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                found[os.path.relpath(full, path)] = f.read()
    return found


@pytest.fixture
def embedder_dir(tmp_path):
    """A copy of the tiny legacy embedder: a REALM model directory `index --model` takes."""
    target = tmp_path / "model"
    shutil.copytree(os.path.join(LEGACY, "embedder"), target)
    return target


def test_index_output_holding_its_documents_is_refused(tmp_path, embedder_dir, capsys):
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(CORPUS_DOCUMENTS, data / "docs.jsonl")
    before = _tree(data)
    assert run("index", data / "docs.jsonl", "--model", embedder_dir, "--output", data, "--overwrite") == 2
    err = capsys.readouterr().err
    assert "--output" in err and "docs.jsonl" in err
    assert _tree(data) == before


def test_index_output_that_is_its_model_is_refused(embedder_dir, capsys):
    before = _tree(embedder_dir)
    assert run("index", CORPUS_DOCUMENTS, "--model", embedder_dir, "--output", embedder_dir, "--overwrite") == 2
    err = capsys.readouterr().err
    assert "--output" in err and "--model" in err
    assert _tree(embedder_dir) == before


def test_index_output_inside_its_model_is_refused(embedder_dir, capsys):
    assert run("index", CORPUS_DOCUMENTS, "--model", embedder_dir, "--output", embedder_dir / "corpus") == 2
    assert "--model" in capsys.readouterr().err
    assert not (embedder_dir / "corpus").exists()


def test_index_through_a_symbolic_link_to_its_input_is_refused(tmp_path, embedder_dir, capsys):
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(CORPUS_DOCUMENTS, data / "docs.jsonl")
    os.symlink(data, tmp_path / "alias")
    assert (
        run("index", data / "docs.jsonl", "--model", embedder_dir, "--output", tmp_path / "alias", "--overwrite") == 2
    )
    assert "--output" in capsys.readouterr().err
    assert (data / "docs.jsonl").is_file()


def test_convert_into_the_folder_of_its_source_is_refused(tmp_path, capsys):
    parent = tmp_path / "parent"
    shutil.copytree(os.path.join(LEGACY, "embedder"), parent / "legacy")
    before = _tree(parent)
    assert run("convert", parent / "legacy", parent, "--overwrite") == 2
    err = capsys.readouterr().err
    assert "output" in err and "legacy" in err
    assert _tree(parent) == before
    assert run("convert", parent / "legacy", parent / "legacy" / "converted") == 2
    assert not (parent / "legacy" / "converted").exists()


def test_evaluate_output_inside_the_model_is_refused(tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(os.path.join(LEGACY, "openqa"), model)
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"question": "where is port estrel?", "answers": ["velmora"]}) + "\n")
    before = _tree(model)
    for option in ("--output", "--predictions"):
        assert run("evaluate", qa, "--model", model, option, model / "config.json") == 2
        err = capsys.readouterr().err
        assert option in err and "--model" in err
    assert _tree(model) == before


def test_check_written_paths_pins_each_relation(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.txt").write_text("x")
    os.link(folder / "a.txt", tmp_path / "hard.txt")
    inputs = [("the documents", str(folder / "a.txt")), ("--model", "some-org/some-model")]
    with pytest.raises(CLIError, match="--output .* is the documents"):
        check_written_paths([("--output", str(folder / "a.txt"))], inputs)
    with pytest.raises(CLIError, match="--output .* is the documents"):
        check_written_paths([("--output", str(tmp_path / "hard.txt"))], inputs)
    with pytest.raises(CLIError, match="--output .* holds the documents"):
        check_written_paths([("--output", str(folder))], inputs)
    with pytest.raises(CLIError, match="--output .* is inside --data"):
        check_written_paths([("--output", str(folder / "new"))], [("--data", str(folder))])
    # Apart, missing outputs, Hub ids and unset options: nothing to refuse.
    check_written_paths([("--output", str(tmp_path / "out")), ("--predictions", None)], inputs)


def test_an_outputs_parent_journal_naming_other_entries_is_never_applied(tmp_path, embedder_dir, capsys):
    """A journal planted in the output's parent folder moved (deleted) a sibling of the output."""
    parent = tmp_path / "parent"
    parent.mkdir()
    (parent / "sibling.txt").write_text("keep me")
    staging = parent / f"{STAGING_PREFIX}planted"
    staging.mkdir()
    (parent / JOURNAL_NAME).write_text(json.dumps({"staging": staging.name, "replace": [], "remove": ["sibling.txt"]}))
    assert (
        run("index", CORPUS_DOCUMENTS, "--model", embedder_dir, "--output", parent / "x", "--max-block-length", 32)
        == 2
    )
    err = capsys.readouterr().err
    assert JOURNAL_NAME in err and "sibling.txt" in err
    assert (parent / "sibling.txt").read_text() == "keep me"
    assert not (parent / "x").exists()


def test_train_output_dir_that_is_its_model_is_refused(tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(os.path.join(LEGACY, "openqa"), model)
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"question": "where is port estrel?", "answers": ["velmora"]}) + "\n")
    config = tmp_path / "train.json"
    config.write_text(
        json.dumps({"task": "finetune", "model": str(model), "train_file": str(qa), "output_dir": str(model)})
    )
    before = _tree(model)
    assert run("train", config) == 2
    err = capsys.readouterr().err
    assert "output_dir" in err and "`model`" in err
    assert _tree(model) == before
