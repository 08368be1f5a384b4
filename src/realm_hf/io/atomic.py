"""
Files written whole: [`atomic_write`] (a temporary file flushed to disk and renamed over the destination), a set of
entries swapped into a directory with the moves undone on failure, flushing files and folders to disk, and the user's
usual permissions for what was written through private temporary files. Every realm-hf writer goes through here or
through [`~realm_hf.io.staged_saves.staged_save`], which builds on it.
"""

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
    ```

    Every realm-hf writer goes through here ([`atomic_write`] for a file,
    [`~realm_hf.io.staged_saves.staged_save`] for a set of entries, [`~realm_hf.io.staged_saves.replace_directory`]
    for a whole directory): the file is flushed to disk before the rename and the folder after.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write writes new files only: mode must be 'w' or 'wb', got {mode!r}.")
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            # On disk before the rename: a crash (power loss) after it must find the whole new file, not an empty one.
            f.flush()
            os.fsync(f.fileno())
        # mkstemp creates the file readable by its owner only; give it the permissions `open` would.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
        fsync_directory(directory)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


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


def fsync_directory(path: str) -> None:
    """
    Flush the entry list of the folder `path` to disk, so that renames and new names inside it survive a crash
    (nothing on systems where a directory cannot be opened, such as Windows).
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_tree(root: str) -> None:
    """Flush every file and folder under `root` (and `root`) to disk, so a crash after a rename finds whole files."""
    for folder, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            if os.path.islink(path):
                continue
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        fsync_directory(folder)


def normalize_permissions(root: str) -> None:
    """
    Give `root` and everything under it the user's usual permissions (umask): libraries write through private (0600)
    temporary files and folders, and an output should look like any file the user creates.
    """
    mask = _umask()
    for directory, _dirs, files in os.walk(root):
        os.chmod(directory, 0o777 & ~mask)
        for name in files:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                os.chmod(path, 0o666 & ~mask)


__all__ = [
    "atomic_write",
    "atomic_write_text",
    "fsync_directory",
    "fsync_tree",
    "normalize_permissions",
    "swap_into_place",
]
