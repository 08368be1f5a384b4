"""Atomic writes (a file, or a whole save into a directory, all or nothing even if killed), checksums, path checks."""

from __future__ import annotations

import contextlib
import hashlib
import json
import ntpath
import os
import posixpath
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator, Sequence
from typing import IO

from .logging_utils import get_logger

logger = get_logger(__name__)

# A staged save writes into `<target>/.realm-hf-staging-XXXX/`; the journal, present only while the new entries are
# being swapped in, names that folder and the entries, so that an interrupted swap can be completed.
STAGING_PREFIX = ".realm-hf-staging-"
JOURNAL_NAME = ".realm-hf-save-journal.json"
# Temporary folders of earlier realm-hf versions (a retriever save killed before its swap), removed by the next save.
_OLD_STAGING_PREFIXES = (STAGING_PREFIX, ".tmp-retriever-")


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


def file_sha256(path: str | os.PathLike, chunk_size: int = 1 << 20) -> str:
    """The sha256 hex digest of a file, read in `chunk_size` pieces (constant memory for multi-GB files)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def check_relative_name(name, what: str, source: str) -> list[str]:
    """
    The parts of `name`, a relative path that must stay inside its folder: refuse anything absolute (POSIX or
    Windows), with a drive, with `..`, or empty. `what` and `source` (the field and the file that gave `name`) go into
    the error message.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{source}: {what} must be a relative path (a string), got {name!r}.")
    parts = [part for part in re.split(r"[\\/]", name) if part not in ("", ".")]
    if posixpath.isabs(name) or ntpath.isabs(name) or ntpath.splitdrive(name)[0] or ".." in parts or not parts:
        raise ValueError(
            f"{source}: {what} is {name!r}, a path that leads outside its folder. realm-hf only reads files inside a "
            "model or retriever directory (a downloaded repo must not make it read anything else): the field must "
            "be a relative name such as 'index.faiss'. Fix the file, or save the model or retriever again."
        )
    return parts


def allowed_roots(directory: str) -> list[str]:
    """
    Real paths under which the files of `directory` may lie: the directory itself and, for a Hugging Face Hub cache
    snapshot (`.../<repo>/snapshots/<revision>/...`, whose files are symlinks into `.../<repo>/blobs/`), that repo's
    blob folder.
    """
    roots = [os.path.realpath(directory)]
    parts = os.path.abspath(directory).split(os.sep)
    for i in range(len(parts) - 2, 0, -1):
        if parts[i] == "snapshots":
            blobs = os.sep.join(parts[:i] + ["blobs"])
            if os.path.isdir(blobs):
                roots.append(os.path.realpath(blobs))
            break
    return roots


def check_inside(directory: str, path: str, what: str, source: str, recursive: bool = False) -> None:
    """
    Refuse `path` (and, with `recursive`, everything under it) if it resolves, through symbolic links, outside
    `directory` (see [`allowed_roots`]).
    """
    roots = allowed_roots(directory)

    def check(candidate: str) -> None:
        real = os.path.realpath(candidate)
        if not any(real == root or real.startswith(root.rstrip(os.sep) + os.sep) for root in roots):
            raise ValueError(
                f"{source}: {what} leads to {candidate}, a symbolic link to {real}, outside {directory}. realm-hf "
                "only reads files inside a model or retriever directory: replace the link by the file itself."
            )

    check(path)
    if recursive and os.path.isdir(path):
        for folder, dirs, files in os.walk(path):
            for name in dirs + files:
                check(os.path.join(folder, name))


def _fsync_dir(path: str) -> None:
    # Makes renames and new names inside `path` durable; directories cannot be opened this way on Windows.
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
        _fsync_dir(folder)


_held_locks: dict[str, int] = {}  # directory -> the thread holding its lock in this process
_held_locks_guard = threading.Lock()


@contextlib.contextmanager
def directory_lock(directory: str) -> Iterator[None]:
    """
    Hold an exclusive `flock` on `directory` (POSIX; nothing on Windows) so that two saves, or a save and the recovery
    of an interrupted one, never interleave, across processes and threads. Re-entrant within a thread. The lock dies
    with the process: a killed save leaves no stale lock behind.
    """
    try:
        import fcntl  # POSIX only
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    key, me = os.path.realpath(directory), threading.get_ident()
    with _held_locks_guard:
        reentrant = _held_locks.get(key) == me
    if reentrant:
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        # Another thread of this process holding it blocks here too: flock locks belong to the open file.
        fcntl.flock(fd, fcntl.LOCK_EX)
        with _held_locks_guard:
            _held_locks[key] = me
        try:
            yield
        finally:
            with _held_locks_guard:
                _held_locks.pop(key, None)
    finally:
        os.close(fd)  # releases the lock


class StagedSave:
    """
    A save in progress (see [`staged_save`]): write the new entries into `staging`, a fresh folder inside `target`.

    Attributes:
        target (`str`): The directory being saved into.
        staging (`str`): Where to write the new entries, at the same relative paths they get in `target`.
        replace (`list[str]`, *optional*): The entries (relative paths, files or folders) to install from `staging`,
            in order; defaults to every top-level entry written into `staging`.
        remove (`list[str]`): Entries of `target` that the new save drops (e.g. weight shards of an earlier save).
    """

    def __init__(self, target: str, staging: str):
        self.target, self.staging = target, staging
        self.replace: list[str] | None = None
        self.remove: list[str] = []


@contextlib.contextmanager
def staged_save(target: str | os.PathLike) -> Iterator[StagedSave]:
    r"""
    Save a set of entries into `target` all at once or not at all, even if the process is killed (SIGKILL, power
    loss after the data reached the disk).

    The `with` block writes the new entries into `StagedSave.staging` (a fresh `.realm-hf-staging-*` folder inside
    `target`, hence on the same filesystem). When it ends without an error: everything written is flushed to disk,
    a journal (`.realm-hf-save-journal.json`) naming the entries is written atomically - the commit point - and each
    old entry is moved aside and the new one renamed into place; then the journal and the staging folder are
    removed. Killed before the journal exists, `target` keeps the old save (the next save removes the staging
    leftovers); killed after, [`recover_interrupted_save`] (run by every realm-hf load and save of the directory)
    finishes the swap, so the directory holds the new save. An exception during the swap puts the old entries back.

    Only the named entries are touched: other files in `target` (a Trainer's checkpoints, your notes) are kept.
    Concurrent saves into one directory are serialised with an `flock` on it (POSIX).

    Example:

    ```python
    >>> with staged_save("my-model") as save:
    ...     write_everything(save.staging)
    ```"""
    target = os.path.abspath(os.fspath(target))
    os.makedirs(target, exist_ok=True)
    with directory_lock(target):
        recover_interrupted_save(target)
        for name in os.listdir(target):
            if name.startswith(_OLD_STAGING_PREFIXES) and os.path.isdir(os.path.join(target, name)):
                # A save killed before its commit point: nothing in it was ever part of the directory's content.
                shutil.rmtree(os.path.join(target, name), ignore_errors=True)
        staging = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=target)
        try:
            save = StagedSave(target, staging)
            yield save
            _commit(save)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _commit(save: StagedSave) -> None:
    names = list(save.replace) if save.replace is not None else sorted(os.listdir(save.staging))
    remove = [name for name in save.remove if name not in names]
    for name in names + remove:
        check_relative_name(name, "an entry", "staged_save")
    fsync_tree(save.staging)
    journal = {"staging": os.path.basename(save.staging), "replace": names, "remove": remove}
    journal_path = os.path.join(save.target, JOURNAL_NAME)
    # Written inside the staging folder and renamed into place: the rename is the commit point, and a save killed
    # before it leaves no temporary file outside the staging folder.
    staged_journal = os.path.join(save.staging, JOURNAL_NAME)
    with open(staged_journal, "w", encoding="utf-8") as f:
        json.dump(journal, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(staged_journal, journal_path)
    _fsync_dir(save.target)
    try:
        _apply_journal(save.target, journal)
    except BaseException:
        try:
            _roll_back_journal(save.target, journal)
            os.remove(journal_path)
        except BaseException:  # noqa: BLE001 - the journal stays: the next load or save completes the new save
            logger.exception("Could not undo the failed save in %s; the next load or save completes it.", save.target)
        raise
    _finish_journal(save.target, journal)


def _entry_paths(target: str, journal: dict, i: int, name: str) -> tuple[str, str, str]:
    staging = os.path.join(target, journal["staging"])
    return os.path.join(staging, name), os.path.join(target, name), os.path.join(staging, ".old", str(i))


def _remove_entry(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.remove(path)


def _apply_journal(target: str, journal: dict) -> None:
    # Idempotent, so that it can be re-run from any point: a new entry still in staging is not installed yet, and
    # then whatever sits at its destination is the old entry.
    os.makedirs(os.path.join(target, journal["staging"], ".old"), exist_ok=True)
    replace = journal["replace"]
    for i, name in enumerate(replace + journal["remove"]):
        new, dest, aside = _entry_paths(target, journal, i, name)
        if i >= len(replace):  # an entry the new save drops
            if os.path.lexists(dest):
                if os.path.lexists(aside):
                    _remove_entry(aside)
                os.replace(dest, aside)
            continue
        if not os.path.lexists(new):
            continue
        if os.path.lexists(dest):
            if os.path.lexists(aside):
                _remove_entry(aside)
            # A folder cannot be renamed over a non-empty folder: move the old entry aside first.
            os.replace(dest, aside)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        os.replace(new, dest)
    for folder in {os.path.dirname(os.path.join(target, name)) for name in replace + journal["remove"]}:
        _fsync_dir(folder)


def _roll_back_journal(target: str, journal: dict) -> None:
    replace = journal["replace"]
    for i, name in reversed(list(enumerate(replace + journal["remove"]))):
        new, dest, aside = _entry_paths(target, journal, i, name)
        if i < len(replace) and not os.path.lexists(new) and os.path.lexists(dest):
            os.makedirs(os.path.dirname(new), exist_ok=True)
            os.replace(dest, new)
        if os.path.lexists(aside):
            os.replace(aside, dest)


def _finish_journal(target: str, journal: dict) -> None:
    os.remove(os.path.join(target, JOURNAL_NAME))
    _fsync_dir(target)
    shutil.rmtree(os.path.join(target, journal["staging"]), ignore_errors=True)


def _read_journal(directory: str) -> dict:
    path = os.path.join(directory, JOURNAL_NAME)
    try:
        with open(path, encoding="utf-8") as f:
            journal = json.load(f)
        staging = journal["staging"]
        names = list(journal["replace"]) + list(journal["remove"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise OSError(
            f"{path} (the journal of an interrupted realm-hf save) cannot be read ({err}). Delete it and save the "
            "model again."
        ) from None
    # A journal could come from anywhere (a downloaded folder): it may only move entries inside this directory.
    if not isinstance(staging, str) or not staging.startswith(STAGING_PREFIX) or os.sep in staging or "/" in staging:
        raise OSError(f"{path} names {staging!r}, not a realm-hf staging folder: delete the journal.")
    for name in names:
        check_relative_name(name, "an entry", path)
    return journal


def recover_interrupted_save(directory: str | os.PathLike) -> bool:
    """
    Complete a save into `directory` that was interrupted while its entries were being swapped in (see
    [`staged_save`]), so that the directory holds exactly the new save. Does nothing (and writes nothing) when no
    save was interrupted. Called by realm-hf before it loads or saves a local model or retriever directory.

    Returns:
        `bool`: Whether an interrupted save was completed.

    Raises:
        `OSError`: The swap cannot be completed (e.g. the directory is read-only): the message says what to do.
    """
    directory = os.fspath(directory)
    if not os.path.isfile(os.path.join(directory, JOURNAL_NAME)):
        return False
    with directory_lock(directory):
        if not os.path.isfile(os.path.join(directory, JOURNAL_NAME)):
            return False  # the saver holding the lock finished meanwhile
        journal = _read_journal(directory)
        try:
            if os.path.isdir(os.path.join(directory, journal["staging"])):
                _apply_journal(directory, journal)
            _finish_journal(directory, journal)
        except OSError as err:
            raise OSError(
                f"{directory} holds a save that was interrupted while its files were being swapped in ({JOURNAL_NAME})"
                f", and completing it failed: {err}. Give realm-hf write access to the folder and load it again: the "
                "load completes the save."
            ) from None
    logger.warning(
        "Completed a save into %s that had been interrupted (the directory now holds that save).", directory
    )
    return True


__all__ = [
    "allowed_roots",
    "atomic_write",
    "atomic_write_text",
    "check_inside",
    "check_relative_name",
    "directory_lock",
    "file_sha256",
    "fsync_tree",
    "recover_interrupted_save",
    "staged_save",
    "StagedSave",
    "swap_into_place",
]
