"""
Loads that read exactly one save: [`consistent_read`], held by every realm-hf reader of a saved directory, completes
an interrupted save first, waits for a save in progress and keeps saves out until the load is done, and refuses loaded
files that a symbolic link leads out of the directory; [`save_in_progress`] words load errors.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator

from .locks import directory_lock, held_here
from .paths import check_inside
from .staged_saves import JOURNAL_NAME, journal_covers, journal_entries, recover_interrupted_save

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


def _entry_to_recover(directory: str, path: str) -> str | None:
    """
    The one entry of `directory` that an interrupted save found there may replace before `path` is read, or `None`
    for any: the save of a whole saved directory (its journal replaces a config or manifest) completes whole, while in
    a folder that only holds `path` (the parent of an output swapped in whole) a journal naming other entries is
    refused, so that a journal planted beside `path` never touches its siblings.
    """
    if os.path.normpath(directory) == os.path.normpath(path):
        return None
    markers = set(_SAVED_DIRECTORY_MARKERS) - {JOURNAL_NAME}
    if any(name in markers for name in journal_entries(directory)):
        return None
    return os.path.relpath(path, directory).split(os.sep)[0]


@contextlib.contextmanager
def _read_lock(directory: str, path: str) -> Iterator[None]:
    # A save killed after its commit point, between the completion below and the lock, leaves a journal: complete
    # it and take the lock again (each round needs another save to commit and die meanwhile: a few rounds at most).
    for _ in range(100):
        if journal_covers(directory, path):
            recover_interrupted_save(directory, only=_entry_to_recover(directory, path))
        with directory_lock(directory, shared=True):
            if not journal_covers(directory, path):
                yield
                return
    raise OSError(f"{directory} keeps being saved into and interrupted: load it again once saves have stopped.")


def recover_moved_aside(path: str | os.PathLike) -> bool:
    """
    If `path` is missing because a swap that replaces it as a whole
    ([`~realm_hf.io.staged_saves.replace_directory`]: the old one moved aside, the new one not yet in place) was
    interrupted, complete that swap (its journal is in the parent), so that `path` exists again.
    Returns whether it did; does nothing for a path that exists or a Hub repo id.
    """
    path = os.path.abspath(os.fspath(path))
    parent = os.path.dirname(path)
    if os.path.lexists(path) or not os.path.isdir(parent) or not journal_covers(parent, path):
        return False
    return recover_interrupted_save(parent, only=_entry_to_recover(parent, path))


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
      ([`~realm_hf.io.staged_saves.recover_interrupted_save`]), whichever reader comes first.
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
        if held_here(folder):
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


__all__ = ["check_loaded_files", "consistent_read", "recover_moved_aside", "save_in_progress"]
