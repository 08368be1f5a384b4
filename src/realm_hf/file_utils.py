"""Atomic writes: a file, or a set of entries of a directory, replaced all at once or not at all."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from typing import IO


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """
    Open a temporary file next to `path` for writing and move it onto `path` with `os.replace` when the `with` block
    ends without an error; on an error the temporary file is removed and `path` keeps its previous content. A reader
    never sees a half-written file.

    Args:
        path (`str` or `os.PathLike`): The destination (its directory is created if needed).
        mode (`str`, defaults to `"w"`): `"w"` (text) or `"wb"` (bytes).
        encoding (`str`, *optional*, defaults to `"utf-8"`): Text encoding (ignored for `"wb"`).

    Example:

    ```python
    >>> with atomic_write("out/state.json") as f:
    ...     json.dump(state, f)
    ```"""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write writes new files only: mode must be 'w' or 'wb', got {mode!r}.")
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
        # mkstemp creates the file readable by its owner only; give it the permissions `open` would.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically (see [`atomic_write`])."""
    with atomic_write(path) as f:
        f.write(text)


def swap_into_place(staging: str, target: str, names: Sequence[str]) -> None:
    """
    Move `staging/<name>` to `target/<name>` for each name in order (put the one that marks a complete save, such
    as a manifest, last), replacing what is there; a name missing from `staging` removes the old entry. Old entries
    are first moved aside inside `staging` (deleted with it afterwards); on any failure the moves are undone, so the
    target keeps its previous complete content.

    Args:
        staging (`str`): A directory on the same filesystem as `target` (e.g. `tempfile.mkdtemp(dir=target)`).
        target (`str`): The directory whose entries are replaced.
        names (`Sequence[str]`): The entries (files or folders) to replace.
    """
    done: list[tuple[str, str | None]] = []  # (target path, where its old version was moved, or None)
    try:
        for name in names:
            new = os.path.join(staging, name)
            dest = os.path.join(target, name)
            old_aside = None
            if os.path.lexists(dest):
                old_aside = os.path.join(staging, f".old-{name}")
                os.replace(dest, old_aside)
            done.append((dest, old_aside))
            if os.path.lexists(new):
                os.replace(new, dest)
    except BaseException:
        for dest, old_aside in reversed(done):
            if os.path.lexists(dest):
                if os.path.isdir(dest) and not os.path.islink(dest):
                    shutil.rmtree(dest, ignore_errors=True)
                else:
                    os.remove(dest)
            if old_aside is not None:
                os.replace(old_aside, dest)
        raise


__all__ = ["atomic_write", "atomic_write_text", "swap_into_place"]
