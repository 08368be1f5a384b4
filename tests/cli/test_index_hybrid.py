"""
`realm-hf index --index Flat+bm25`: the BM25 index (retrieval/bm25.py) built beside the dense one and saved under
the same manifest, used by `ask`, `evaluate` and the pipeline of the model it is attached to; clear errors for an
unknown suffix and for a missing `bm25s`.
"""

import json
import os
import shutil
import sys

import pytest
import torch

from realm_hf import RealmForOpenQA
from realm_hf.cli.common import CLIError
from realm_hf.cli.index import split_index_spec
from realm_hf.retrieval.retriever import RealmRetriever
from tests.support.cli import run
from tests.support.paths import CORPUS_DOCUMENTS, REPO

pytest.importorskip("bm25s")
QUESTION = "who designed the torre alba lighthouse?"


def test_index_spec_suffixes():
    assert split_index_spec("Flat+bm25") == ("Flat", "bm25")
    assert split_index_spec("IVF16,Flat+BM25") == ("IVF16,Flat", "bm25")
    assert split_index_spec("HNSW32") == ("HNSW32", None)
    assert split_index_spec("IVF256,PQ8+16") == ("IVF256,PQ8+16", None)  # FAISS's own '+', digits
    with pytest.raises(CLIError, match=r"unknown suffix '\+splade'.*'\+bm25'"):
        split_index_spec("Flat+splade")
    with pytest.raises(CLIError, match="name the dense FAISS index"):
        split_index_spec("+bm25")


def test_building_a_bm25_index_prints_no_debug_lines(converted, tmp_path):
    import subprocess

    # bm25s sets its own logger to DEBUG when imported: its "Building index from tokens" went to the terminal,
    # with -q too. A fresh interpreter: the console script sets up logging only where nothing else has.
    src = os.path.join(REPO, "src")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]), HF_HUB_OFFLINE="1")
    for quiet in (["-q"], []):
        argv = [
            "index",
            CORPUS_DOCUMENTS,
            "--model",
            str(converted),
            "--index",
            "Flat+bm25",
            "--max-block-length",
            "32",
        ]
        argv += ["--output", str(tmp_path / f"corpus{len(quiet)}")]
        result = subprocess.run(
            [sys.executable, "-m", "realm_hf_cli", *quiet, *argv], capture_output=True, text=True, timeout=600, env=env
        )
        assert result.returncode == 0, result.stderr
        assert "DEBUG" not in result.stderr and "Building index" not in result.stderr, result.stderr
        if quiet:
            assert result.stderr == ""


def test_index_flat_bm25_is_attached_and_used_by_ask_evaluate_and_the_pipeline(converted, tmp_path, capsys):  # noqa: F811
    import realm_hf

    model_dir = tmp_path / "model"
    shutil.copytree(converted, model_dir)
    argv = ["index", CORPUS_DOCUMENTS, "--attach-to", model_dir, "--max-block-length", 32, "--overwrite"]
    assert run(*argv, "--index", "Flat+bm25", "--output", tmp_path / "corpus") == 0
    for folder in (model_dir / "retriever", tmp_path / "corpus"):
        manifest = json.loads((folder / "retriever_manifest.json").read_text())
        assert manifest["sparse_index"]["library"] == "bm25s"
        assert RealmRetriever.from_pretrained(folder).store.sparse is not None
    model = RealmForOpenQA.from_pretrained(model_dir)
    assert model.retriever.store.sparse is not None
    # The model's search takes the BM25 candidates: the best BM25 block of the question is among those read.
    (best_sparse,), _ = model.retriever.store.sparse.nearest([QUESTION], 1)
    assert best_sparse[0] >= 0
    inputs = model.retriever.tokenizer([QUESTION], return_tensors="pt")
    with torch.no_grad():
        embeddings = model.embed_questions(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"])
    searched = model.retriever.search(embeddings, k=1, questions=[QUESTION])
    assert int(best_sparse[0]) in searched.block_ids[0].tolist()
    assert realm_hf.pipeline("question-answering", model=model).model.retriever is model.retriever

    capsys.readouterr()
    assert run("ask", QUESTION, "--model", model_dir, "--json") == 0
    record = json.loads(capsys.readouterr().out)
    assert record["block"]["title"]
    qa_file = tmp_path / "qa.jsonl"
    qa_file.write_text(json.dumps({"question": QUESTION, "answers": ["torre alba"]}) + "\n")
    assert run("evaluate", qa_file, "--model", model_dir, "--ks", 1, "--output", tmp_path / "metrics.json") == 0
    assert json.loads((tmp_path / "metrics.json").read_text())["num_questions"] == 1

    # A dense-only index replaces it (and the model loads a plain retriever again).
    assert run(*argv, "--index", "Flat") == 0
    assert RealmForOpenQA.from_pretrained(model_dir).retriever.store.sparse is None


def test_unknown_suffix_and_missing_bm25s_are_clear(converted, tmp_path, monkeypatch, capsys):  # noqa: F811
    out = tmp_path / "corpus"
    assert run("index", CORPUS_DOCUMENTS, "--model", converted, "--output", out, "--index", "Flat+bm52") == 2
    err = capsys.readouterr().err
    assert "unknown suffix '+bm52'" in err and "'+bm25'" in err
    monkeypatch.setitem(sys.modules, "bm25s", None)  # as if not installed: `import bm25s` raises ImportError
    assert run("index", CORPUS_DOCUMENTS, "--model", converted, "--output", out, "--index", "Flat+bm25") == 2
    err = capsys.readouterr().err
    assert "pip install 'realm-hf[hybrid]'" in err and "--index Flat" in err
    assert not os.path.exists(out)
