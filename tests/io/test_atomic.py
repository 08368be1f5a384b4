"""Atomic writes: a write that fails keeps the old content, a swap that fails puts the old entries back."""

import os

import pytest

from realm_hf.io.atomic import atomic_write, atomic_write_text, swap_into_place


def test_atomic_write_keeps_old_content_on_error(tmp_path):
    path = tmp_path / "state.json"
    atomic_write_text(path, "old")
    with pytest.raises(RuntimeError):
        with atomic_write(path) as f:
            f.write("half")
            raise RuntimeError("boom")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["state.json"]


def test_swap_into_place_undoes_on_failure(tmp_path):
    target, staging = tmp_path / "t", tmp_path / "t" / ".staging"
    staging.mkdir(parents=True)
    (target / "a").write_text("old a")
    (staging / "a").write_text("new a")
    (staging / "sub").mkdir()
    (staging / "sub" / "b").write_text("new b")  # its target folder t/sub does not exist: the move fails
    with pytest.raises(OSError):
        swap_into_place(str(staging), str(target), ["a", "sub/b"])
    assert (target / "a").read_text() == "old a"
