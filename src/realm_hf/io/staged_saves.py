"""
Journaled saves: a set of entries saved into a directory all at once or not at all, even if the process is killed
([`staged_save`]; a whole directory: [`replace_directory`]), and the completion of a save interrupted while its
entries were being swapped in ([`recover_interrupted_save`], run by every realm-hf load and save).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator

from ..logging_utils import get_logger
from .atomic import fsync_directory, fsync_tree, normalize_permissions
from .locks import directory_lock
from .paths import check_inside, check_relative_name

logger = get_logger(__name__)

# A staged save writes into `<target>/.realm-hf-staging-XXXX/`; the journal, present only while the new entries are
# being swapped in, names that folder and the entries, so that an interrupted swap can be completed.
STAGING_PREFIX = ".realm-hf-staging-"
JOURNAL_NAME = ".realm-hf-save-journal.json"
# Temporary folders of earlier realm-hf versions (a retriever save killed before its swap), removed by the next save.
_OLD_STAGING_PREFIXES = (STAGING_PREFIX, ".tmp-retriever-")


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
def staged_save(target: str | os.PathLike, only: str | None = None) -> Iterator[StagedSave]:
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
    Concurrent saves into one directory are serialised with an `flock` on it (POSIX). `only` (the one entry this save
    replaces, as [`replace_directory`] gives it) limits the completion of an interrupted save found in `target` to that
    entry (see [`recover_interrupted_save`]).

    Example:

    ```python
    >>> with staged_save("my-model") as save:
    ...     write_everything(save.staging)
    ```"""
    target = os.path.abspath(os.fspath(target))
    os.makedirs(target, exist_ok=True)
    with directory_lock(target):
        recover_interrupted_save(target, only=only)
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
    fsync_directory(save.target)
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
        fsync_directory(folder)


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
    fsync_directory(target)
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


def recover_interrupted_save(directory: str | os.PathLike, only: str | None = None) -> bool:
    """
    Complete a save into `directory` that was interrupted while its entries were being swapped in (see
    [`staged_save`]), so that the directory holds exactly the new save. Does nothing (and writes nothing) when no
    save was interrupted. Called by realm-hf before it loads or saves a local model or retriever directory.

    Args:
        directory (`str` or `os.PathLike`): The directory saved into.
        only (`str`, *optional*): The one entry of `directory` that a save may have replaced there, for a folder that
            is only the parent of an output swapped in whole ([`replace_directory`]): a journal naming any other entry
            is refused and nothing is moved, so a journal planted beside an output never touches its siblings.

    Returns:
        `bool`: Whether an interrupted save was completed.

    Raises:
        `OSError`: The swap cannot be completed (e.g. the directory is read-only), or the journal names entries
            outside `only`: the message says what to do.
    """
    directory = os.fspath(directory)
    if not os.path.isfile(os.path.join(directory, JOURNAL_NAME)):
        return False
    with directory_lock(directory):
        if not os.path.isfile(os.path.join(directory, JOURNAL_NAME)):
            return False  # the saver holding the lock finished meanwhile
        journal = _read_journal(directory)
        if only is not None:
            _refuse_other_entries(directory, journal, only)
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


def _refuse_other_entries(directory: str, journal: dict, only: str) -> None:
    others = [
        name for name in journal["replace"] + journal["remove"] if name != only and not name.startswith(only + "/")
    ]
    if others:
        raise OSError(
            f"{os.path.join(directory, JOURNAL_NAME)} (the journal of an interrupted realm-hf save) names "
            f"{', '.join(map(repr, others[:5]))} beside {only!r}: it is not the journal of a save of {only!r}, so it is "
            f"refused and nothing was moved. If no realm-hf save into {directory} was interrupted, delete the journal "
            "and run again."
        )


def journal_entries(directory: str | os.PathLike) -> list[str]:
    """
    The entries (relative paths) that the journal of an interrupted [`staged_save`] in `directory` replaces or
    removes; `[]` when there is none. A journal that would move anything out of `directory` is refused (`OSError`).
    """
    directory = os.fspath(directory)
    if not os.path.isfile(os.path.join(directory, JOURNAL_NAME)):
        return []
    journal = _read_journal(directory)
    return list(journal["replace"]) + list(journal["remove"])


def journal_covers(directory: str, path: str) -> bool:
    """
    Whether `directory` holds the journal of an interrupted [`staged_save`] that replaces `path` or something under
    it (a journal that would move anything out of `directory` is refused with an `OSError`).
    """
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
def replace_directory(output: str | os.PathLike) -> Iterator[str]:
    r"""
    Write a whole new directory in the yielded folder; when the `with` block ends without an error it replaces
    `output` (created if missing) all at once, even if the process is killed: it is a [`staged_save`] into `output`'s
    parent whose only entry is `output`, so the swap is journaled, and a swap killed half-way (the old directory moved
    aside, the new one not yet in place) is completed by the next realm-hf load of `output`
    ([`~realm_hf.io.consistent_reads.consistent_read`]) or the next `replace_directory` / save into the parent. On an
    error, `output` is unchanged. Files and folders get the user's usual permissions (umask), not the private ones of
    temporary files.

    Example:

    ```python
    >>> with replace_directory("my-index") as folder:
    ...     retriever.save_pretrained(folder)
    ```"""
    output = os.path.abspath(os.fspath(output))
    parent, name = os.path.split(output)
    # The parent is only the folder the output sits in: an interrupted save found there may only be of `output`.
    with staged_save(parent, only=name) as save:
        folder = os.path.join(save.staging, name)
        os.mkdir(folder)
        yield folder
        normalize_permissions(folder)
        save.replace = [name]


__all__ = [
    "JOURNAL_NAME",
    "STAGING_PREFIX",
    "StagedSave",
    "journal_covers",
    "journal_entries",
    "recover_interrupted_save",
    "replace_directory",
    "staged_save",
]
