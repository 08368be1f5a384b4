"""
The read path against a real Hub-compatible server from PyPI: `olah` (a Hub mirror) serving a local git repository of
a saved realm-hf model, loaded with `RealmForOpenQA.from_pretrained(repo_id, revision=<commit>)`, then offline from
the cache huggingface_hub filled.

Opt-in (`-m olah`): olah is not a realm-hf dependency and pulls in a web stack (fastapi, uvicorn, GitPython), so it
lives in its own virtual environment. Point `OLAH_CLI` at its `olah-cli` (e.g. `python -m venv /opt/olah-venv &&
/opt/olah-venv/bin/pip install olah`, then `OLAH_CLI=/opt/olah-venv/bin/olah-cli pytest -m olah
tests/hub/test_olah_mirror.py`) or put `olah-cli` on PATH; without it, or without `git`, the test is skipped. olah
serves repositories read-only (no uploads: the write path is tested against `LocalHub` in
tests/hub/test_repositories.py), and answers a file missing from a mirrored repo with 401 `RepoNotFound` instead of
404 `EntryNotFound`, so it is used here only for repos that hold every file a load asks for.
"""

import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from huggingface_hub import constants

from realm_hf import RealmForOpenQA
from tests.support.hub_server import point_clients_at
from tests.support.tiny_model import answers_of, assert_same_model_answers, build_tiny_model, save_tiny_model

pytestmark = pytest.mark.olah

OLAH_CLI = os.environ.get("OLAH_CLI") or shutil.which("olah-cli")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _git(*args, cwd):
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def olah(tmp_path):
    """An olah server (offline: it never calls huggingface.co) mirroring the git repos under `<tmp>/mirrors`."""
    if not OLAH_CLI or not os.path.isfile(OLAH_CLI):
        pytest.skip("olah is not installed: set OLAH_CLI to its olah-cli (see this module's docstring)")
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    port = _free_port()
    mirrors = tmp_path / "mirrors"
    config = tmp_path / "olah.toml"
    config.write_text(
        "[basic]\n"
        f'host = "127.0.0.1"\nport = {port}\n'
        f'repos-path = "{tmp_path / "olah-repos"}"\nmirrors-path = ["{mirrors}"]\n'
        f'mirror-netloc = "127.0.0.1:{port}"\nmirror-lfs-netloc = "127.0.0.1:{port}"\n'
        "[accessibility]\noffline = true\n"
    )
    log = open(tmp_path / "olah.log", "w")
    proc = subprocess.Popen([OLAH_CLI, "-c", str(config)], cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(url + "/api/models/none/none/revision/main", timeout=1)
            except urllib.error.HTTPError:
                break  # it answers (the repo does not exist)
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"olah exited: {(tmp_path / 'olah.log').read_text()[-2000:]}")
                time.sleep(0.5)
        else:
            pytest.fail("olah did not start within 60 s")
        yield url, mirrors
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_olah_serves_a_saved_model_pinned_to_a_commit_then_offline(olah, tmp_path, monkeypatch):
    url, mirrors = olah
    model, tokenizer = build_tiny_model(str(tmp_path))
    repo = mirrors / "models" / "realm-test" / "tiny"
    save_tiny_model(model, tokenizer, repo)
    _git("init", "-q", "-b", "main", cwd=repo)
    _git("add", "-A", cwd=repo)
    _git("commit", "-qm", "a realm-hf model", cwd=repo)
    commit = _git("rev-parse", "HEAD", cwd=repo)
    # A later commit on main: the pinned load must not see it.
    (repo / "README.md").write_text("# moved on\n")
    _git("commit", "-qam", "later", cwd=repo)
    assert _git("rev-parse", "HEAD", cwd=repo) != commit

    cache = tmp_path / "hf-cache"
    point_clients_at(monkeypatch, url, str(cache))
    expected = answers_of(model)
    reloaded = RealmForOpenQA.from_pretrained("realm-test/tiny", revision=commit)
    assert reloaded.retriever is not None and len(reloaded.retriever) == len(model.retriever)
    assert_same_model_answers(answers_of(reloaded), expected)
    snapshots = os.listdir(cache / "models--realm-test--tiny" / "snapshots")
    assert snapshots == [commit]  # weights and retriever both from the pinned commit
    snapshot = cache / "models--realm-test--tiny" / "snapshots" / commit
    assert (snapshot / "retriever" / "index.faiss").is_file()

    # Offline, from the cache alone.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    offline = RealmForOpenQA.from_pretrained("realm-test/tiny", revision=commit)
    assert_same_model_answers(answers_of(offline), expected)
