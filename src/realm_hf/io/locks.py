"""
Directory locks: an `flock` on a saved directory, exclusive while a save (or the recovery of an interrupted one)
writes it, shared while a load reads it, re-entrant within a thread and released when the process dies.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

from ..logging_utils import get_logger

logger = get_logger(__name__)

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


def held_here(directory: str | os.PathLike) -> bool:
    """
    Whether a thread of this process holds a [`directory_lock`] on `directory`: a save this process runs does not
    hide files from this process's own loads.
    """
    with _held_locks_guard:
        return bool(_held_locks.get(os.path.realpath(os.fspath(directory))))


__all__ = ["directory_lock", "held_here"]
