"""`realm-hf index`: a corpus built from JSON lines or CSV and attached to the model; options checked before the
documents are read."""

import csv
import json
import os
import shutil

import pytest

from realm_hf import RealmForOpenQA
from tests.support.cli import run
from tests.support.paths import CORPUS_DOCUMENTS


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


def test_index_refuses_a_non_realm_model_before_reading_documents(legacy_vocab_bert, tmp_path, capsys):
    from realm_hf_cli import main

    documents = tmp_path / "docs.jsonl"
    documents.write_text('{"title": "a", "text": "b"}\nnot json at all\n')  # reading it would fail on line 2
    assert main(["index", str(documents), "--model", str(legacy_vocab_bert), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "holds a `bert` model, not a REALM one" in err and "init_from_bert" in err
    assert "line 2" not in err and not (tmp_path / "out").exists()


def test_index_builds_corpus_and_attaches_it(converted, tmp_path, capsys):
    from realm_hf.retrieval.retriever import RealmRetriever

    corpus_dir = tmp_path / "corpus"
    assert run("index", CORPUS_DOCUMENTS, "--model", converted, "--max-block-length", 32, "--output", corpus_dir) == 0
    retriever = RealmRetriever.from_pretrained(corpus_dir)
    with open(CORPUS_DOCUMENTS) as f:
        documents = [json.loads(line) for line in f]
    assert len(retriever) >= len(documents)
    assert retriever.max_block_length == 32
    assert "source" in retriever.corpus.column_names  # metadata columns are kept
    assert set(retriever.corpus["title"]) == {d["title"] for d in documents}

    # Not over an existing corpus without --overwrite.
    assert run("index", CORPUS_DOCUMENTS, "--model", converted, "--output", corpus_dir) == 2
    assert "--overwrite" in capsys.readouterr().err

    # Attach to a copy of the model: it then answers from the new corpus, with titles as provenance.
    model_dir = tmp_path / "model"
    shutil.copytree(converted, model_dir)
    assert run("index", CORPUS_DOCUMENTS, "--attach-to", model_dir, "--max-block-length", 32, "--overwrite") == 0
    model = RealmForOpenQA.from_pretrained(model_dir)
    assert len(model.retriever) == len(retriever)
    capsys.readouterr()
    assert run("ask", "who designed the torre alba lighthouse?", "--model", model_dir, "--json") == 0
    record = json.loads(capsys.readouterr().out)
    assert record["block"]["title"] in {d["title"] for d in documents}


def test_index_csv_columns(converted, tmp_path, capsys):
    docs = tmp_path / "docs.csv"
    with open(docs, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["headline", "body", "url"])
        writer.writerow(["Paris", "paris is the capital of france.", "http://a"])
        writer.writerow(["Berlin", "berlin is the capital of germany.", "http://b"])
    assert run("index", docs, "--model", converted, "--output", tmp_path / "c1") == 2
    assert "no text column 'text'" in capsys.readouterr().err and not os.path.exists(tmp_path / "c1")
    assert (
        run(
            "index",
            docs,
            "--model",
            converted,
            "--text-column",
            "body",
            "--title-column",
            "headline",
            "--max-block-length",
            32,
            "--output",
            tmp_path / "c2",
        )
        == 0
    )
    from realm_hf.retrieval.retriever import RealmRetriever

    retriever = RealmRetriever.from_pretrained(tmp_path / "c2")
    assert retriever.corpus["title"] == ["Paris", "Berlin"]
    assert retriever.corpus["url"] == ["http://a", "http://b"]


def test_index_bad_jsonl_names_file_and_line(converted, tmp_path, capsys):
    documents = tmp_path / "docs.jsonl"
    documents.write_text('{"title": "a", "text": "fine"}\n{"title": "b", "text": \n')
    assert run("index", documents, "--model", converted, "--output", tmp_path / "out") == 2
    assert f"{documents}, line 2: invalid JSON" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
