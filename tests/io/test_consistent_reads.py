"""A load sees exactly one save, even while another process or thread saves into the same directory.

Every realm-hf reader goes through `realm_hf.io.consistent_reads.consistent_read`: it waits for a save in progress
(saying so) and keeps the next save out until everything it reads (weights, config, retriever) has been read.
"""

import hashlib
import logging
import os
import select
import subprocess
import sys
import threading
import time

import pytest

from realm_hf import RealmForOpenQA
from realm_hf.io.locks import directory_lock
from tests.support.paths import REPO, SCRIPTS
from tests.support.tiny_model import build_tiny_model

WORKER = os.path.join(SCRIPTS, "resave_worker.py")


def _weights(model):
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode() + tensor.detach().numpy().tobytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def two_saves(tmp_path_factory):
    """Saves `a` (6 blocks) and `b` (5 blocks, other weights); what each loads as: weights hash -> corpus size."""
    root = tmp_path_factory.mktemp("resave")
    expected = {}
    for name, seed in (("a", 0), ("b", 1)):
        model, _ = build_tiny_model(str(root), seed=seed)
        if name == "b":
            model.retriever.remove_documents(block_ids=[5])
        model.save_pretrained(root / name, model_card=False)
        expected[_weights(RealmForOpenQA.from_pretrained(root / name))] = len(model.retriever)
    assert sorted(expected.values()) == [5, 6]
    return root, expected


def test_loads_during_saves_of_another_process_each_see_one_save(two_saves):
    """Loads during a re-save had one save's weights with the other's retriever, or a "missing" error."""
    root, expected = two_saves
    target = root / "target"
    RealmForOpenQA.from_pretrained(root / "a").save_pretrained(target, model_card=False)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, *sys.path]))
    worker = subprocess.Popen(
        [sys.executable, WORKER, str(target), str(root / "a"), str(root / "b"), "8"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert worker.stdout.readline().strip() == "ready"
        loads, done = [], False
        while not done and len(loads) < 40:
            model = RealmForOpenQA.from_pretrained(target)  # an error here is a failure too
            loads.append((expected.get(_weights(model)), len(model.retriever)))
            done = bool(select.select([worker.stdout], [], [], 0)[0])
        assert worker.wait(timeout=300) == 0
    finally:
        worker.kill()
    mixed = [(weights, corpus) for weights, corpus in loads if weights != corpus]
    assert loads and not mixed, f"{len(mixed)} of {len(loads)} loads mixed two saves: {mixed}"


def test_a_load_waits_for_a_save_in_progress_and_says_so(two_saves, caplog):
    root, expected = two_saves
    target = root / "waiting"
    RealmForOpenQA.from_pretrained(root / "a").save_pretrained(target, model_card=False)
    loaded = []
    with caplog.at_level(logging.WARNING, logger="realm_hf.io.locks"):
        with directory_lock(str(target)):  # what a save holds while it writes and swaps
            reader = threading.Thread(target=lambda: loaded.append(RealmForOpenQA.from_pretrained(target)))
            reader.start()
            for _ in range(600):  # until the reader reports the wait (bounded: 60 s)
                if "is in progress" in caplog.text:
                    break
                time.sleep(0.1)
            assert not loaded  # it waits for the save
        reader.join(timeout=120)
    assert (
        "A save into" in caplog.text and "is in progress" in caplog.text and "waiting for it to finish" in caplog.text
    )
    assert len(loaded) == 1 and len(loaded[0].retriever) == 6
