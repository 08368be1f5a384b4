"""Atomic writes (a file, or a whole save into a directory, all or nothing even if killed), checksums, path checks,
reading JSON lines."""

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
from collections.abc import Iterable, Iterator, Sequence
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
    ```

    Every realm-hf writer goes through here ([`atomic_write`] for a file, [`staged_save`] for a set of entries,
    [`replace_directory`] for a whole directory): the file is flushed to disk before the rename and the folder after.
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
        _fsync_dir(directory)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def json_lines(lines: Iterable[str], name: str, error: type[Exception] = ValueError) -> Iterator[tuple[int, object]]:
    """
    The records of a JSON-lines text, each with its line number (from 1); blank lines are skipped. A line that is not
    JSON raises `error` naming `name` and the line (`json`'s own message names neither).

    Args:
        lines (`Iterable[str]`): The lines (an open text file, `text.splitlines()`, ...).
        name (`str`): What the lines come from, for errors (a path).
        error (`type`, *optional*, defaults to `ValueError`): The exception raised (the CLI passes its `CLIError`).
    """
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise error(f"{name}, line {number}: invalid JSON: {err.msg}") from None
        yield number, record


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


_held_locks: dict[str, dict[int, str]] = {}  # directory -> {thread: "exclusive" or "shared"} held in this process
_held_locks_guard = threading.Lock()


@contextlib.contextmanager
def directory_lock(directory: str, shared: bool = False) -> Iterator[None]:
    """
    Hold an `flock` on `directory` (POSIX; nothing on Windows): exclusive for a save, or the recovery of an
    interrupted one, so that two never interleave across processes and threads; `shared` for a load, which so waits
    for a save in progress to finish (and says so in a warning) and keeps saves out until it has read everything.
    Re-entrant within a thread (a shared request inside an exclusive hold too). The lock dies with the process: a
    killed save leaves no stale lock behind.
    """
    try:
        import fcntl  # POSIX only
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    key, me = os.path.realpath(directory), threading.get_ident()
    mode = "shared" if shared else "exclusive"
    with _held_locks_guard:
        held = _held_locks.get(key, {}).get(me)
    if held == "exclusive" or held == mode:
        yield
        return
    if held is not None:
        raise RuntimeError(
            f"Cannot save into {directory} while this thread is loading it (a shared lock cannot become exclusive)."
        )
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        if shared:  # a folder this process may read but not open (no permission): nothing to lock
            yield
            return
        raise
    try:
        # Another thread of this process holding it blocks here too: flock locks belong to the open file.
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            if shared:
                logger.warning(
                    "A save into %s is in progress (another process or thread is writing it): waiting for it to "
                    "finish, so that this load reads exactly one save.",
                    directory,
                )
            fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        with _held_locks_guard:
            _held_locks.setdefault(key, {})[me] = mode
        try:
            yield
        finally:
            with _held_locks_guard:
                holders = _held_locks.get(key, {})
                holders.pop(me, None)
                if not holders:
                    _held_locks.pop(key, None)
    finally:
        os.close(fd)  # releases the lock


def save_in_progress(directory: str | os.PathLike) -> bool:
    """
    Whether a save into `directory`, or into a directory that holds it, is under way (another process or thread
    holds its exclusive lock) or was interrupted (its journal is there). Used to word load errors: a file that is
    missing because a save is swapping it in is not a damaged save.
    """
    path = os.path.abspath(os.fspath(directory))
    for folder in _enclosing_directories(path):
        if os.path.isfile(os.path.join(folder, JOURNAL_NAME)):
            return True
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            continue
        with _held_locks_guard:
            if _held_locks.get(os.path.realpath(folder)):
                continue  # this process holds it: whatever it is doing, it is not hiding files from itself
        try:
            fd = os.open(folder, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
    return False


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
        check_inside(directory, path, JOURNAL_NAME, path)
        with open(path, encoding="utf-8") as f:
            journal = json.load(f)
        staging = journal["staging"]
        names = list(journal["replace"]) + list(journal["remove"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise OSError(
            f"{path} (the journal of an interrupted realm-hf save) cannot be read ({err}). Delete it and save the "
            "model again."
        ) from None
    # A journal could come from anywhere (a downloaded folder): it may only move entries inside this directory, so
    # its staging folder must be a real folder of this directory (not a link to one elsewhere), and no folder on the
    # way to an entry, here or in the staging folder, may be a link leading out.
    if not isinstance(staging, str) or not staging.startswith(STAGING_PREFIX) or os.sep in staging or "/" in staging:
        raise OSError(f"{path} names {staging!r}, not a realm-hf staging folder: delete the journal.")
    staging_path = os.path.join(directory, staging)
    if os.path.islink(staging_path) or (os.path.lexists(staging_path) and not os.path.isdir(staging_path)):
        raise OSError(
            f"{path} names the staging folder {staging!r}, which is a symbolic link or not a folder: a journal may "
            "only move files inside its own directory, so it is refused (nothing was moved). Delete the journal "
            f"and the {staging!r} entry, and save the model again."
        )
    root = os.path.realpath(directory)
    for name in names:
        parts = check_relative_name(name, "an entry", path)
        for base in (directory, staging_path, os.path.join(staging_path, ".old")):
            parent = os.path.realpath(os.path.join(base, *parts[:-1]))
            if parent != root and not parent.startswith(root.rstrip(os.sep) + os.sep):
                raise OSError(
                    f"{path} names the entry {name!r}, whose folder leads through a symbolic link to {parent}, outside "
                    f"{directory}: a journal may only move files inside its own directory, so it is refused (nothing "
                    "was moved). Delete the journal and save the model again."
                )
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


# What marks a directory whose saves replace the entries below it: a model directory (its `retriever/`, tokenizer
# files), a retriever directory (its `tokenizer/`, `corpus/`), a sharded one (its shard folders).
_SAVED_DIRECTORY_MARKERS = ("config.json", "retriever_manifest.json", "sharded_retriever_manifest.json", JOURNAL_NAME)
# The files at the top of a saved directory that a load reads (transformers' config, weights and tokenizer files,
# realm-hf's manifests and auto module): each must be inside the directory, not a link leading out of it. The files
# a retriever manifest names (its index, corpus, tokenizer) are checked against the manifest, with its field's name.
_LOADED_FILE = re.compile(
    r"(?:.*\.json|.*\.safetensors|.*\.bin|.*\.model|.*\.jinja|vocab\.txt|merges\.txt|realm_\w*\.py)"
)
_ENCLOSING_LEVELS = 2  # model dir > retriever/ > tokenizer/: the deepest folder a load reads on its own


def _enclosing_directories(path: str) -> list[str]:
    """`path` and the directories above it (outermost first) whose saves may replace it: see `consistent_read`."""
    found = [path]
    folder = path
    for _ in range(_ENCLOSING_LEVELS):
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
        if any(os.path.lexists(os.path.join(folder, name)) for name in _SAVED_DIRECTORY_MARKERS):
            found.append(folder)
    return found[::-1]


def _journal_covers(directory: str, path: str) -> bool:
    """Whether `directory` holds the journal of an interrupted save that replaces `path` or something under it."""
    if not os.path.isfile(os.path.join(directory, JOURNAL_NAME)):
        return False
    if os.path.normpath(directory) == os.path.normpath(path):
        return True
    journal = _read_journal(directory)  # refused if it would move anything out of the directory
    relative = os.path.relpath(path, directory).replace(os.sep, "/")
    return any(
        name == relative or relative.startswith(name + "/") or name.startswith(relative + "/")
        for name in journal["replace"] + journal["remove"]
    )


@contextlib.contextmanager
def _read_lock(directory: str, path: str) -> Iterator[None]:
    # A save killed after its commit point, between the completion below and the lock, leaves a journal: complete
    # it and take the lock again (each round needs another save to commit and die meanwhile: a few rounds at most).
    for _ in range(100):
        if _journal_covers(directory, path):
            recover_interrupted_save(directory)
        with directory_lock(directory, shared=True):
            if not _journal_covers(directory, path):
                yield
                return
    raise OSError(f"{directory} keeps being saved into and interrupted: load it again once saves have stopped.")


def recover_moved_aside(path: str | os.PathLike) -> bool:
    """
    If `path` is missing because a swap that replaces it as a whole ([`replace_directory`]: the old one moved aside,
    the new one not yet in place) was interrupted, complete that swap (its journal is in the parent), so that `path`
    exists again. Returns whether it did; does nothing for a path that exists or a Hub repo id.
    """
    path = os.path.abspath(os.fspath(path))
    parent = os.path.dirname(path)
    if os.path.lexists(path) or not os.path.isdir(parent) or not _journal_covers(parent, path):
        return False
    return recover_interrupted_save(parent)


def check_loaded_files(directory: str | os.PathLike) -> None:
    """
    Refuse a file at the top of `directory` that a load reads (config, weights, tokenizer files, manifests: see
    `_LOADED_FILE`) if it is a symbolic link leading out of the directory (a Hub cache snapshot's links into its
    blob folder are allowed). The files a retriever's manifest lists are checked by the retriever's own load.
    """
    directory = os.fspath(directory)
    for name in sorted(os.listdir(directory)):
        full = os.path.join(directory, name)
        if _LOADED_FILE.fullmatch(name) and not os.path.isdir(full):
            check_inside(directory, full, name, directory)


@contextlib.contextmanager
def consistent_read(path: str | os.PathLike | None, subfolder: str | None = None) -> Iterator[None]:
    r"""
    Hold this while reading a saved directory (a model, its `retriever/`, a tokenizer or config folder): every
    realm-hf reader goes through here, so all see the same single save.

    - A save into `path`, or into a directory above it that replaces it (a model save replaces its `retriever/`;
      a CLI output directory is swapped in by its parent), that was killed during its swap is completed first
      ([`recover_interrupted_save`]), whichever reader comes first.
    - A save in progress is waited for (a warning says "a save is in progress"), and no save can swap files in
      until the `with` block ends: what it reads (weights, config, tokenizer, corpus, index) is one save.
    - The files at the top of `path` that a load reads must not be symbolic links leading out of it
      ([`check_loaded_files`]).

    Does nothing for a path that is not a local directory (a Hub repo id). `subfolder` (as transformers'
    `from_pretrained` takes it) names the folder inside `path` that is read.
    """
    if isinstance(path, (str, os.PathLike)) and subfolder:
        path = os.path.join(path, subfolder)
    if isinstance(path, (str, os.PathLike)):
        recover_moved_aside(path)
    if not isinstance(path, (str, os.PathLike)) or not os.path.isdir(path):
        yield
        return
    path = os.path.abspath(os.fspath(path))
    with contextlib.ExitStack() as stack:
        for directory in _enclosing_directories(path):
            stack.enter_context(_read_lock(directory, path))
        check_loaded_files(path)
        yield


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


@contextlib.contextmanager
def replace_directory(output: str | os.PathLike) -> Iterator[str]:
    r"""
    Write a whole new directory in the yielded folder; when the `with` block ends without an error it replaces
    `output` (created if missing) all at once, even if the process is killed: it is a [`staged_save`] into `output`'s
    parent whose only entry is `output`, so the swap is journaled, and a swap killed half-way (the old directory moved
    aside, the new one not yet in place) is completed by the next realm-hf load of `output`
    ([`consistent_read`]) or the next `replace_directory` / save into the parent. On an error, `output` is unchanged.
    Files and folders get the user's usual permissions (umask), not the private ones of temporary files.

    Example:

    ```python
    >>> with replace_directory("my-index") as folder:
    ...     retriever.save_pretrained(folder)
    ```"""
    output = os.path.abspath(os.fspath(output))
    parent, name = os.path.split(output)
    with staged_save(parent) as save:
        folder = os.path.join(save.staging, name)
        os.mkdir(folder)
        yield folder
        normalize_permissions(folder)
        save.replace = [name]


__all__ = [
    "allowed_roots",
    "atomic_write",
    "atomic_write_text",
    "check_inside",
    "check_loaded_files",
    "check_relative_name",
    "consistent_read",
    "directory_lock",
    "file_sha256",
    "fsync_tree",
    "normalize_permissions",
    "recover_interrupted_save",
    "recover_moved_aside",
    "replace_directory",
    "save_in_progress",
    "staged_save",
    "StagedSave",
    "swap_into_place",
]
