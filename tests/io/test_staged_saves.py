"""Saving over an earlier save is all-or-nothing: a save killed by SIGKILL at any moment leaves a directory that loads
as exactly the old save or exactly the new one, never mixed or unloadable, and the next save succeeds.

A child process (tests/scripts/crash_save_worker.py) saves a tiny RealmForOpenQA with its retriever over an earlier
save and is killed before its N-th filesystem operation (deterministic: every operation is a kill point in the slow
test, a few chosen ones around the commit point in the quick one) or after a random delay (inside the C++/Rust
writers of FAISS, safetensors and Arrow). The earlier save is sharded and the new one is not, so the swap also
removes files; the directory also holds files of the user's, which must survive every kill.
"""

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from realm_hf import RealmConfig, RealmForOpenQA, RealmTokenizer
from realm_hf.io.staged_saves import JOURNAL_NAME, STAGING_PREFIX
from realm_hf.retrieval.retriever import RealmRetriever
from tests.support.paths import SCRIPTS
from tests.support.tiny_model import build_tiny_model

WORKER = os.path.join(SCRIPTS, "crash_save_worker.py")
USER_FILES = {"notes.md": "my notes\n", os.path.join("checkpoint-10", "trainer_state.json"): "{}\n"}


def signature(path):
    """What a loaded save answers with: its weights and its corpus + index (texts, stored vectors, a search)."""
    model = RealmForOpenQA.from_pretrained(path)
    weights = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        weights.update(name.encode() + tensor.detach().numpy().tobytes())
    retriever = model.retriever
    ids = torch.from_numpy(np.sort(retriever.store.block_ids))
    corpus = hashlib.sha256(json.dumps(retriever.store.texts(ids)).encode())
    corpus.update(retriever.store.embeddings(ids).numpy().tobytes())
    query = torch.linspace(-1, 1, retriever.embedding_dim).view(1, -1)
    search = retriever.search(query, k=3, return_blocks=False)
    corpus.update(search.block_ids.numpy().tobytes() + search.scores.numpy().tobytes())
    return weights.hexdigest(), corpus.hexdigest()


@pytest.fixture(scope="module")
def saves(tmp_path_factory):
    root = tmp_path_factory.mktemp("crash")
    old, tokenizer = build_tiny_model(str(root), seed=0)
    # The earlier save is sharded: the new one (a single file) must also make its shards go. Each save holds its
    # tokenizer (the new one a token more), so that a reader of the tokenizer alone can tell which save it read.
    old.save_pretrained(root / "old", max_shard_size="20KB", tokenizer=tokenizer)
    new, tokenizer = build_tiny_model(str(root), seed=1)
    tokenizer.add_tokens(["[NEW]"])
    new.retriever.remove_documents(block_ids=[5])  # another corpus size too
    new.save_pretrained(root / "new", tokenizer=tokenizer)
    expected = {"old": signature(root / "old"), "new": signature(root / "new")}
    assert expected["old"][0] != expected["new"][0] and expected["old"][1] != expected["new"][1]
    return root, expected


def _save_read_by_each_reader(target):
    """
    Which save each reader sees first in a killed save's directory (each on its own copy, before any other reader
    completes the swap): the tokenizer alone, the retriever alone, the config, and then the model on that copy, which
    must be the same save. Every reader completes the swap, not only a model load.
    """
    seen = {}
    readers = {
        "tokenizer": lambda d: "new" if "[NEW]" in RealmTokenizer.from_pretrained(d).get_vocab() else "old",
        "retriever": lambda d: {6: "old", 5: "new"}[len(RealmRetriever.from_pretrained(d / "retriever"))],
        "config": lambda d: {6: "old", 5: "new"}[RealmConfig.from_pretrained(d).num_block_records],
    }
    for name, read in readers.items():
        copy = target.parent / f"{target.name}-{name}"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(target, copy, symlinks=True)
        seen[name] = read(copy)
        model = RealmForOpenQA.from_pretrained(copy)
        assert {6: "old", 5: "new"}[len(model.retriever)] == seen[name], (name, seen)
        shutil.rmtree(copy)
    return seen


@pytest.fixture(scope="module")
def worker(saves):
    root, _ = saves
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(WORKER)), *sys.path]))
    with open(root / "worker.log", "w") as log:
        process = subprocess.Popen(
            [sys.executable, WORKER, str(root / "new")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=env,
        )

    def request(**kwargs):
        process.stdin.write(json.dumps(kwargs) + "\n")
        process.stdin.flush()
        line = process.stdout.readline()
        assert line, f"the worker died: see {root / 'worker.log'}"
        return json.loads(line)

    yield request
    process.kill()
    process.wait(timeout=60)


@pytest.fixture(scope="module")
def operations(saves, worker):
    """The filesystem operations of one uninterrupted save over the old one (what the kill points count)."""
    root, expected = saves
    target = root / "count"
    shutil.copytree(root / "old", target)
    answer = worker(target=str(target))
    assert not answer["killed"] and isinstance(answer["result"], list), answer
    assert signature(target) == expected["new"]
    return answer["result"]


def _fresh_target(root, name):
    target = root / name
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(root / "old", target)
    for relative, text in USER_FILES.items():
        os.makedirs(os.path.dirname(target / relative), exist_ok=True)
        (target / relative).write_text(text)
    return target


def _check_after_kill(root, expected, target, answer):
    """The directory loads as exactly one save, keeps the user's files, and takes a further save cleanly."""
    readers = _save_read_by_each_reader(target)
    state = signature(target)  # a load completes an interrupted swap
    assert state in (expected["old"], expected["new"]), f"mixed or unknown state after {answer}"
    # Whichever reader comes first sees the save the model then loads.
    assert set(readers.values()) == {"old" if state == expected["old"] else "new"}, (readers, answer)
    for relative, text in USER_FILES.items():
        assert (target / relative).read_text() == text
    assert not os.path.exists(target / JOURNAL_NAME)
    # The next save removes what the killed one left and replaces the directory's content as usual.
    RealmForOpenQA.from_pretrained(root / "new").save_pretrained(
        target, tokenizer=RealmTokenizer.from_pretrained(root / "new")
    )
    assert signature(target) == expected["new"]
    entries = sorted(os.listdir(target))
    assert entries == sorted(
        ["README.md", "checkpoint-10", "config.json", "model.safetensors", "notes.md", "realm_hf_auto.py", "retriever"]
        + ["tokenizer.json", "tokenizer_config.json"]
    )
    assert not [name for name in os.listdir(target / "retriever") if name.startswith(".")]
    return "old" if state == expected["old"] else "new"


def _kill_points(operations):
    """A few telling kill points: while writing, just before and after the journal (the commit point), mid-swap."""
    journal = next(i for i, op in enumerate(operations, 1) if op.startswith("replace") and "journal" in op)
    return sorted({len(operations) // 4, journal, journal + 1, journal + 5})


def test_killed_save_leaves_old_or_new_save(saves, worker, operations):
    root, expected = saves
    outcomes = []
    for n in _kill_points(operations):
        target = _fresh_target(root, "quick")
        answer = worker(target=str(target), kill_after=n)
        assert answer["killed"], answer
        outcomes.append(_check_after_kill(root, expected, target, answer))
    # Killed before the journal exists: the old save; from the journal's rename on: the new one.
    assert "old" in outcomes and "new" in outcomes, outcomes


@pytest.mark.slow
def test_killed_save_at_every_operation_and_random_moments(saves, worker, operations):
    root, expected = saves
    outcomes = {"old": 0, "new": 0}
    for n in range(1, len(operations) + 1):
        target = _fresh_target(root, "every")
        answer = worker(target=str(target), kill_after=n)
        assert answer["killed"], (n, answer)
        outcomes[_check_after_kill(root, expected, target, answer)] += 1
    rng = random.Random(0)
    for _ in range(15):
        target = _fresh_target(root, "random")
        # A save in the worker takes ~0.1-1 s on a loaded 2-core machine: most delays land inside it.
        answer = worker(target=str(target), kill_at=rng.uniform(0.2, 1.5))
        outcomes[_check_after_kill(root, expected, target, answer)] += 1
    assert outcomes["old"] and outcomes["new"], outcomes


def test_interrupted_swap_is_completed_by_the_next_save(saves, worker, operations):
    """Killed mid-swap, the directory is completed by the next save too (not only by a load)."""
    root, expected = saves
    target = _fresh_target(root, "next-save")
    journal = next(i for i, op in enumerate(operations, 1) if op.startswith("replace") and "journal" in op)
    assert worker(target=str(target), kill_after=journal + 3)["killed"]
    assert os.path.exists(target / JOURNAL_NAME)
    RealmForOpenQA.from_pretrained(root / "old").save_pretrained(target)
    assert signature(target) == expected["old"]
    assert not [name for name in os.listdir(target) if name.startswith((STAGING_PREFIX, JOURNAL_NAME))]


# ------------------------------------------------------------------------------------------------------------------
# The staged save on its own
# ------------------------------------------------------------------------------------------------------------------


def test_staged_save_puts_the_old_entries_back_when_the_swap_fails(tmp_path, monkeypatch):
    from realm_hf.io.staged_saves import staged_save

    (tmp_path / "a").write_text("old a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x").write_text("old x")
    real_replace, calls = os.replace, []

    def failing_replace(src, dst):
        calls.append(dst)
        if len(calls) == 5:  # journal, a aside, a in, b aside, then b in fails
            raise OSError("disk gone")
        return real_replace(src, dst)

    with pytest.raises(OSError, match="disk gone"):
        with staged_save(tmp_path) as save:
            (tmp_path / save.staging / "a").write_text("new a")
            os.makedirs(os.path.join(save.staging, "b"))
            (tmp_path / save.staging / "b" / "x").write_text("new x")
            monkeypatch.setattr(os, "replace", failing_replace)
    monkeypatch.undo()
    assert (tmp_path / "a").read_text() == "old a" and (tmp_path / "b" / "x").read_text() == "old x"
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]


def test_a_journal_cannot_move_files_out_of_its_directory(tmp_path):
    from realm_hf.io.staged_saves import recover_interrupted_save

    model_dir = tmp_path / "model"
    (model_dir / (STAGING_PREFIX + "x")).mkdir(parents=True)
    (tmp_path / "precious").write_text("keep")
    journal = {"staging": STAGING_PREFIX + "x", "replace": [], "remove": ["../precious"]}
    (model_dir / JOURNAL_NAME).write_text(json.dumps(journal))
    with pytest.raises(ValueError, match="outside its folder"):
        recover_interrupted_save(model_dir)
    assert (tmp_path / "precious").read_text() == "keep"
    (model_dir / JOURNAL_NAME).write_text(json.dumps({**journal, "staging": "../elsewhere", "remove": []}))
    with pytest.raises(OSError, match="not a realm-hf staging folder"):
        recover_interrupted_save(model_dir)


def test_concurrent_saves_into_one_directory_do_not_interleave(tmp_path):
    import threading

    from realm_hf.retrieval.retriever import RealmRetriever

    rng = np.random.default_rng(0)
    retrievers = [
        RealmRetriever.from_embeddings(rng.normal(size=(n, 8)).astype(np.float32), [f"{n}-{i}" for i in range(n)])
        for n in (3, 7)
    ]
    errors = []

    def save_repeatedly(retriever):
        try:
            for _ in range(3):
                retriever.save_pretrained(tmp_path)
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=save_repeatedly, args=(r,)) for r in retrievers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    loaded = RealmRetriever.from_pretrained(tmp_path)
    assert len(loaded) in (3, 7) and loaded.store.texts([0])[0] == f"{len(loaded)}-0"
    assert sorted(os.listdir(tmp_path)) == ["corpus", "index.faiss", "retriever_manifest.json"]


@pytest.mark.parametrize("how", ["staging link", "entry folder link", "old-entries link"])
def test_a_journal_whose_folders_lead_outside_is_refused_and_moves_nothing(tmp_path, how):
    """A staging folder (or a folder on the way to an entry) that is a link out of the directory."""
    from realm_hf.io.staged_saves import recover_interrupted_save

    model_dir, outside = tmp_path / "model", tmp_path / "outside"
    (model_dir / "retriever").mkdir(parents=True)
    (model_dir / "retriever" / "index.faiss").write_text("the model's index")
    (model_dir / "config.json").write_text("{}")
    (outside / "retriever").mkdir(parents=True)
    (outside / "retriever" / "index.faiss").write_text("another index")
    (outside / "config.json").write_text('{"evil": true}')
    staging = model_dir / (STAGING_PREFIX + "x")
    journal = {"staging": staging.name, "replace": ["config.json"], "remove": ["retriever/index.faiss"]}
    if how == "staging link":
        os.symlink(outside, staging)
    else:
        staging.mkdir()
        if how == "entry folder link":  # `retriever/` inside the staging folder leads out
            os.symlink(outside / "retriever", staging / "retriever")
            journal = {**journal, "replace": ["retriever/index.faiss"], "remove": []}
        else:
            os.symlink(outside, staging / ".old")
    (model_dir / JOURNAL_NAME).write_text(json.dumps(journal))
    before = {p: p.read_text() for p in (*model_dir.rglob("*"), *outside.rglob("*")) if p.is_file()}
    with pytest.raises(OSError, match="symbolic link.*refused"):
        recover_interrupted_save(model_dir)
    with pytest.raises(OSError, match="symbolic link.*refused"):
        RealmForOpenQA.from_pretrained(model_dir)
    after = {p: p.read_text() for p in (*model_dir.rglob("*"), *outside.rglob("*")) if p.is_file()}
    assert after == before  # nothing moved in either direction


# ------------------------------------------------------------------------------------------------------------------
# The CLI's directory outputs (`realm-hf index --output OUT --overwrite`, `convert --overwrite`)
# ------------------------------------------------------------------------------------------------------------------


def _count_operations(kill_after):
    import importlib.util

    spec = importlib.util.spec_from_file_location("crash_save_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.count_operations(kill_after)


def _replace_output_in_child(output, source, kill_after):
    """Fork a child that replaces `output` by a copy of `source` as the CLI does, SIGKILLed before operation N."""
    import signal

    from realm_hf.cli.common import atomic_output_dir

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        try:
            with atomic_output_dir(str(output), overwrite=True) as folder:
                shutil.copytree(source, folder, dirs_exist_ok=True)
                ops = _count_operations(kill_after)  # the kill points: the commit of the output, not its writing
            os.write(write, json.dumps(len(ops)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        payload = pipe.read()
    _, status = os.waitpid(pid, 0)
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    return killed, json.loads(payload) if payload else None


@pytest.fixture(scope="module")
def index_outputs(tmp_path_factory):
    """Two retriever directories (what `realm-hf index --output` writes): 3 blocks (old) and 5 (new)."""
    root = tmp_path_factory.mktemp("cli-output")
    rng = np.random.default_rng(0)
    for name, n in (("old", 3), ("new", 5)):
        embeddings = rng.normal(size=(n, 8)).astype(np.float32)
        RealmRetriever.from_embeddings(embeddings, [f"{name} {i}" for i in range(n)]).save_pretrained(root / name)
    return root


def test_cli_output_killed_at_every_step_of_its_swap_is_the_old_or_the_new_one(index_outputs):
    """Killed between its two renames, `index --overwrite` left no OUT (old and new in hidden folders)."""
    root = index_outputs
    target = root / "parent" / "OUT"
    shutil.rmtree(root / "parent", ignore_errors=True)
    shutil.copytree(root / "old", target)
    killed, count = _replace_output_in_child(target, root / "new", kill_after=None)
    assert not killed and count and len(RealmRetriever.from_pretrained(target)) == 5
    outcomes = []
    for n in range(1, count + 1):
        for reader in ("load", "next run"):
            shutil.rmtree(root / "parent")
            shutil.copytree(root / "old", target)
            killed, _ = _replace_output_in_child(target, root / "new", kill_after=n)
            assert killed, n
            if reader == "load":  # a load of OUT completes or ignores the interrupted swap...
                outcomes.append(len(RealmRetriever.from_pretrained(target)))
                assert outcomes[-1] in (3, 5), n
            else:  # ...and so does the next run, before it judges OUT
                from realm_hf.cli.common import atomic_output_dir

                before = {3: "old", 5: "new"}
                with atomic_output_dir(str(target), overwrite=True) as folder:
                    assert before[len(RealmRetriever.from_pretrained(target))] in ("old", "new"), n
                    shutil.copytree(root / "old", folder, dirs_exist_ok=True)
                assert len(RealmRetriever.from_pretrained(target)) == 3
            left = sorted(os.listdir(root / "parent"))
            if (
                reader == "load"
            ):  # killed before its commit point, a run leaves its staging folder: the next removes it
                left = [name for name in left if not name.startswith(STAGING_PREFIX)]
            assert left == ["OUT"], (n, reader, os.listdir(root / "parent"))
    assert 3 in outcomes and 5 in outcomes, outcomes
