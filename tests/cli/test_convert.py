"""`realm-hf convert`: legacy checkpoints, from a folder or the Hub, into realm-hf models that answer as they did."""

import os

import pytest
import torch

from realm_hf import RealmForOpenQA
from tests.support.cli import QUESTIONS, run
from tests.support.paths import LEGACY, LEGACY_OPENQA


def test_convert_refuses_pickle_and_writes_nothing(tmp_path, capsys):
    output = tmp_path / "out"
    assert run("convert", LEGACY_OPENQA, output) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ")
    assert "pickle" in err and "arbitrary code" in err and "--allow-pickle" in err
    assert os.listdir(tmp_path) == []


def test_converted_model_answers_exactly_as_legacy(converted, legacy_model):
    files = [os.path.join(root, f) for root, _, names in os.walk(converted) for f in names]
    assert os.path.isfile(converted / "model.safetensors")
    assert os.path.isfile(converted / "retriever" / "index.faiss")
    assert not [f for f in files if f.endswith((".bin", ".npy", ".pkl", ".pt", ".pth"))]
    assert not [f for f in os.listdir(converted.parent) if f.startswith(".")]  # no temporary directories left
    model = RealmForOpenQA.from_pretrained(converted).eval()
    for got, expected in zip(model.answer(QUESTIONS), legacy_model.answer(QUESTIONS)):
        assert got["answer"] == expected["answer"]
        assert (got["start"], got["end"]) == (expected["start"], expected["end"])
        assert got["block"]["block_id"] == expected["block"]["block_id"]
        assert [b["block_id"] for b in got["retrieved"]] == [b["block_id"] for b in expected["retrieved"]]
        assert got["score"] == pytest.approx(expected["score"], abs=1e-5)


def test_convert_never_clobbers_without_overwrite(tmp_path, capsys):
    output = tmp_path / "taken"
    output.mkdir()
    (output / "keep.txt").write_text("mine")
    assert run("convert", os.path.join(LEGACY, "reader"), output) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert os.listdir(output) == ["keep.txt"]
    # A non-OpenQA legacy directory converts through AutoModel; --overwrite swaps the new directory in.
    assert run("convert", os.path.join(LEGACY, "reader"), output, "--overwrite") == 0
    assert not os.path.exists(output / "keep.txt")
    from realm_hf import RealmReader

    converted = RealmReader.from_pretrained(output)
    reference = RealmReader.from_pretrained(os.path.join(LEGACY, "reader"))
    assert os.path.isfile(output / "model.safetensors")
    for key, value in reference.state_dict().items():
        assert torch.equal(converted.state_dict()[key], value), key


def test_convert_hub_id_offline_says_it_cannot(tmp_path, capsys):
    assert run("convert", "google/realm-orqa-nq-openqa", tmp_path / "out", "--allow-pickle") == 2
    err = capsys.readouterr().err
    assert "HF_HUB_OFFLINE" in err and "local directory" in err
    assert not os.path.exists(tmp_path / "out")


def test_convert_downloads_a_hub_checkpoint(local_hub, tmp_path, legacy_model):
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo("google-test/realm-tiny-openqa")
    api.upload_folder(repo_id="google-test/realm-tiny-openqa", folder_path=LEGACY_OPENQA)
    output = tmp_path / "converted"
    assert run("convert", "google-test/realm-tiny-openqa", output, "--allow-pickle") == 0
    model = RealmForOpenQA.from_pretrained(output).eval()
    assert [r["answer"] for r in model.answer(QUESTIONS)] == [r["answer"] for r in legacy_model.answer(QUESTIONS)]
