"""Bad input to the command line found by the fourth round (`realm-hf index | ask | train | evaluate | convert`).

Each test failed before its fix: an `evaluate` output over its own QA file or over the other output, `--limit 0`,
gold answers of the wrong type (a traceback, or the answer "None"), one column named for two roles in `index`, size
options checked only after the model loaded (or not at all), a damaged weights file or config.json, and training
config values of the wrong type. The tiny model is the one of test_pipeline.py (hidden 32, 2 layers, 6 blocks,
`max_position_embeddings=64`).
"""

import json
import os
import shutil

import pytest
from test_pipeline import build_tiny_model

from realm_hf.cli import load_train_config, main
from realm_hf.cli.common import CLIError
from realm_hf.cli.readers import load_documents, load_qa

HERE = os.path.dirname(os.path.abspath(__file__))
LEGACY_EMBEDDER = os.path.join(HERE, "fixtures", "legacy", "embedder")


def run(*argv):
    return main(["-q", *map(str, argv)])


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("round4") / "tiny"
    model, tokenizer = build_tiny_model(str(path.parent))
    model.save_pretrained(path, tokenizer=tokenizer)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def docs(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text(
        json.dumps({"title": "Unix", "text": "Unix was written by Ken Thompson."})
        + "\n"
        + json.dumps({"title": "Python", "text": "Python was created by Guido van Rossum."})
        + "\n"
    )
    return path


# ------------------------------------------------------------------------------------------------------------------
# evaluate
# ------------------------------------------------------------------------------------------------------------------


def test_evaluate_never_writes_over_its_qa_file_or_its_other_output(tiny_dir, tmp_path, capsys):
    qa = tmp_path / "qa.jsonl"
    content = json.dumps({"question": "who wrote unix?", "answers": ["ken thompson"]}) + "\n"
    qa.write_text(content)
    # The QA file was replaced by the metrics JSON (the next run then failed on "invalid JSON").
    assert run("evaluate", qa, "--model", tiny_dir, "--output", os.path.join(tmp_path, ".", "qa.jsonl")) == 2
    assert "is the QA file being evaluated" in capsys.readouterr().err
    assert run("evaluate", qa, "--model", tiny_dir, "--predictions", qa) == 2
    assert "is the QA file being evaluated" in capsys.readouterr().err
    assert qa.read_text() == content
    # The predictions silently replaced the metrics.
    out = tmp_path / "out.json"
    assert run("evaluate", qa, "--model", tiny_dir, "--output", out, "--predictions", tmp_path / "." / "out.json") == 2
    assert "--output and --predictions both name" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    "option, message",
    [
        (["--limit", "0"], "--limit must be at least 1"),  # evaluated every question
        (["--limit", "-1"], "--limit must be at least 1"),  # "The evaluation set is empty", after the model loaded
        (["--batch-size", "0"], "--batch-size must be at least 1"),  # `batch_size` ..., after the model loaded
    ],
)
def test_evaluate_counts_are_checked_before_the_model_loads(tmp_path, capsys, option, message):
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"question": "who wrote unix?", "answers": ["ken"]}) + "\n")
    no_model = tmp_path / "no-model"  # exists, holds nothing: reached only if the model were loaded
    no_model.mkdir()
    assert run("evaluate", qa, "--model", no_model, *option) == 2
    err = capsys.readouterr().err
    assert message in err and "config.json" not in err


# ------------------------------------------------------------------------------------------------------------------
# QA files: gold answers
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answers, message",
    [
        (["ken", None], "line 1: an answer in the list is null"),  # graded against the answer "None"
        ({"answer": "ken"}, "line 1: the answers are a mapping without 'text'"),  # graded against "answer"
        ([True], "line 1: an answer is of type bool"),
        ({"text": [["ken"]]}, "line 1: an answer is of type list"),
    ],
)
def test_answers_of_the_wrong_type_name_the_line(tmp_path, answers, message):
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({"question": "who wrote unix?", "answers": answers}) + "\n")
    with pytest.raises(CLIError, match=message):
        load_qa(str(path), "question", "answers")


def test_numeric_answers_of_a_csv_are_read_as_text(tmp_path):
    # A column of digits reads as integers (a traceback: 'int' object is not iterable), with an empty cell as floats.
    path = tmp_path / "qa.csv"
    path.write_text("question,answers\nwhen was unix written?,1969\nwhen was python created?,1991\n")
    assert load_qa(str(path), "question", "answers")["answers"] == [["1969"], ["1991"]]
    path.write_text("question,answers,other\nwhen was unix written?,1969,x\nwhen was python created?,,y\n")
    with pytest.raises(CLIError, match="record 2: no answer given"):
        load_qa(str(path), "question", "answers")
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({"question": "when was unix written?", "answers": {"text": 1969}}) + "\n")
    assert load_qa(str(path), "question", "answers")["answers"] == [["1969"]]


# ------------------------------------------------------------------------------------------------------------------
# index: one column, two roles
# ------------------------------------------------------------------------------------------------------------------


def test_text_column_title_indexes_the_titles(docs):
    # The `text` column was indexed, silently: the text and the default title column were the same name.
    dataset = load_documents([str(docs)], text_column="title")
    assert dataset["text"] == ["Unix", "Python"]
    assert "title" not in dataset.column_names


def test_id_column_title_keeps_the_titles(docs):
    # The titles were renamed to doc_id: every block lost its title.
    dataset = load_documents([str(docs)], id_column="title")
    assert dataset["title"] == ["Unix", "Python"] and dataset["doc_id"] == ["Unix", "Python"]
    assert dataset["text"][0].startswith("Unix was written")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"title_column": "text"}, "--text-column and --title-column both name the column 'text'"),
        ({"id_column": "text"}, "--id-column names the text column 'text'"),
    ],
)
def test_one_column_for_text_and_title_or_id_is_refused(docs, kwargs, message):
    # datasets' 'Field "text" does not exist in schema' before.
    with pytest.raises(CLIError, match=message):
        load_documents([str(docs)], **kwargs)


# ------------------------------------------------------------------------------------------------------------------
# index: options checked before the documents are read and embedded
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "option, message",
    [
        (["--batch-size", "0"], "--batch-size must be at least 1"),
        (["--train-size", "-5"], "--train-size must be at least 1"),  # taken: an IVF index trained on a slice
        (["--dtype", "float64"], "--dtype must be fp32, bf16, auto or fp16"),
    ],
)
def test_index_options_fail_before_reading_documents(tiny_dir, tmp_path, capsys, option, message):
    garbage = tmp_path / "docs.jsonl"
    garbage.write_text("not json\n")  # reading it would fail with another error
    argv = ["index", garbage, "--model", tiny_dir, "--max-block-length", "64", "--output", tmp_path / "out"]
    assert run(*argv, *option) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_index_factory_string_fails_before_embedding(tiny_dir, docs, tmp_path, capsys, monkeypatch):
    from realm_hf.retrieval import building

    def embed(*args, **kwargs):
        raise AssertionError("the corpus was embedded before the factory string was checked")

    monkeypatch.setattr(building, "split_and_embed", embed)
    argv = ["index", docs, "--model", tiny_dir, "--max-block-length", "64", "--output", tmp_path / "out"]
    assert run(*argv, "--index", "Nonsense") == 2
    assert "--index 'Nonsense': Invalid FAISS index factory string" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------------------------
# Damaged model directories
# ------------------------------------------------------------------------------------------------------------------


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


def test_damaged_legacy_weights_are_named_not_error_101(tmp_path, capsys):
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


# ------------------------------------------------------------------------------------------------------------------
# train: config values
# ------------------------------------------------------------------------------------------------------------------


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


def test_train_output_dir_that_is_a_file_fails_before_training(tmp_path, capsys):
    (tmp_path / "out").write_text("my notes")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model": str(tmp_path), "train_file": "qa.jsonl", "output_dir": "out"}))
    # "[Errno 17] File exists", once training was over.
    assert run("train", path) == 2
    assert f"output_dir {str(tmp_path / 'out')!r} is a file" in capsys.readouterr().err
    assert (tmp_path / "out").read_text() == "my notes"


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


def test_train_index_factory_string_fails_before_embedding(tiny_dir, docs, tmp_path, capsys, monkeypatch):
    from realm_hf.retrieval import building

    def embed(*args, **kwargs):
        raise AssertionError("the corpus was embedded before the factory string was checked")

    monkeypatch.setattr(building, "split_and_embed", embed)
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"question": "who wrote unix?", "answers": ["ken"]}) + "\n")
    config = {
        "model": str(tiny_dir),
        "train_file": str(qa),
        "documents": str(docs),
        "max_block_length": 64,
        "index": "Nonsense",
        "output_dir": str(tmp_path / "out"),
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert run("train", path) == 2
    assert "index: Invalid FAISS index factory string 'Nonsense'" in capsys.readouterr().err
