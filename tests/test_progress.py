"""realm-hf's progress bars obey every switch of the Hugging Face libraries.

Each case runs realm-hf's real bars, "Embedding blocks" (`embed_blocks`, which corpus building and re-indexing use)
and "Evaluating" (`evaluate_openqa`), on the tiny model of support/tiny_model.py and reads what reached stderr: with
no switch flipped both bars draw (so the test can fail), with any one flipped neither does.
"""

import os
import subprocess
import sys

import datasets
import huggingface_hub.utils
import pytest
from transformers.utils import logging as transformers_logging

import realm_hf.progress
from realm_hf.progress import PROGRESS_BAR_GROUP, progress_bars_enabled
from realm_hf.retrieval.encoding import embed_blocks
from realm_hf.training import evaluate_openqa
from tests.support.tiny_model import DOCS, build_tiny_model

SWITCHES = {
    "none": lambda: None,
    "transformers": transformers_logging.disable_progress_bar,
    "datasets": datasets.disable_progress_bars,
    "huggingface_hub": huggingface_hub.utils.disable_progress_bars,
    "realm_hf group": lambda: huggingface_hub.utils.disable_progress_bars(PROGRESS_BAR_GROUP),
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny")))


def _all_switches_on():
    transformers_logging.enable_progress_bar()  # also turns huggingface_hub's global switch back on
    datasets.enable_progress_bars()
    huggingface_hub.utils.enable_progress_bars(PROGRESS_BAR_GROUP)
    huggingface_hub.utils.enable_progress_bars()


@pytest.fixture
def restore_switches():
    # Every case starts from all switches on: a library used by an earlier test of the same run (not realm-hf, which
    # restores what it turns off) may have left one off.
    _all_switches_on()
    yield
    _all_switches_on()


def run_bars(model, tokenizer) -> None:
    titles, texts = zip(*DOCS)
    embed_blocks(model.embedder, tokenizer, list(titles), list(texts), batch_size=2)
    questions = datasets.Dataset.from_dict({"question": ["who wrote unix?"], "answers": [["Ken Thompson"]]})
    evaluate_openqa(model, questions, tokenizer=tokenizer, batch_size=1, recall_ks=(1,))


@pytest.mark.parametrize("switch", list(SWITCHES))
def test_every_switch_silences_realm_hf_bars(tiny, switch, capsys, restore_switches):
    model, tokenizer = tiny
    SWITCHES[switch]()
    assert progress_bars_enabled() is (switch == "none")
    run_bars(model, tokenizer)
    err = capsys.readouterr().err
    for bar in ("Embedding blocks", "Evaluating"):
        assert (bar in err) is (switch == "none"), f"{bar!r} with switch {switch!r}: {err!r}"


@pytest.mark.parametrize("switch", list(SWITCHES))
def test_every_switch_silences_datasets_saving_bar_in_a_corpus_save(tiny, switch, capfd, restore_switches, tmp_path):
    # datasets heeds only its own switch: its "Saving the dataset" bar drew under the others.
    model, tokenizer = tiny
    SWITCHES[switch]()
    model.retriever.save_pretrained(str(tmp_path / "retriever"))
    err = capfd.readouterr().err
    assert ("Saving the dataset" in err) is (switch == "none"), f"switch {switch!r}: {err!r}"
    assert datasets.is_progress_bar_enabled() is (switch != "datasets")  # left as it was


# The helper's module run on its own (it imports no other realm_hf module): the probe then skips `import realm_hf`,
# which loads torch, and costs about a second instead of several.
_ENV_PROBE = """
import importlib.util, io, sys
spec = importlib.util.spec_from_file_location("realm_hf_progress", sys.argv[1])
progress = importlib.util.module_from_spec(spec)
spec.loader.exec_module(progress)
progress_bar, progress_bars_enabled = progress.progress_bar, progress.progress_bars_enabled
stream = io.StringIO()
for _ in progress_bar(range(3), desc="Embedding blocks", file=stream):
    pass
print(progress_bars_enabled(), "Embedding blocks" in stream.getvalue())
"""


@pytest.mark.parametrize("variable", ["HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS"])
def test_environment_variables_silence_realm_hf_bars(variable):
    # Read when the libraries are imported, hence a fresh interpreter.
    env = {**os.environ, variable: "1"}
    probe = [sys.executable, "-c", _ENV_PROBE, realm_hf.progress.__file__]
    result = subprocess.run(probe, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]


@pytest.mark.parametrize(("value", "drawn"), [("1", False), ("true", False), ("0", True), (None, True)])
def test_tqdm_disable_silences_realm_hf_bars(monkeypatch, value, drawn):
    import io

    import huggingface_hub.utils

    from realm_hf.progress import progress_bar

    huggingface_hub.utils.enable_progress_bars()  # an earlier test may have left a switch off
    if value is None:
        monkeypatch.delenv("TQDM_DISABLE", raising=False)
    else:
        monkeypatch.setenv("TQDM_DISABLE", value)
    stream = io.StringIO()
    for _ in progress_bar(range(3), desc="Embedding blocks", file=stream):
        pass
    assert ("Embedding blocks" in stream.getvalue()) is drawn
