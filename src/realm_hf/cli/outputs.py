"""Atomic writes of the files and directories the commands produce."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

from .common import CLIError


def write_text_atomic(path: str, text: str) -> None:
    """Write `text` to `path` through a temporary sibling and one rename."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.tmp-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp files are private; results are ordinary files
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_output_dir(output: str, overwrite: bool = False) -> Iterator[str]:
    """
    Yield a temporary directory next to `output`; on success it replaces `output` in one rename, on failure it is
    removed. An existing non-empty `output` is refused unless `overwrite`, and is only removed after the new one is in
    place.
    """
    output = os.path.abspath(output)
    check_output_dir(output, overwrite)
    parent, name = os.path.split(output)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
    # mkdtemp makes a private (0700) directory; the result should look like any directory the user creates.
    os.chmod(tmp, 0o777 & ~_umask())
    try:
        yield tmp
        _normalize_permissions(tmp)
        if os.path.exists(output):
            backup = tempfile.mkdtemp(prefix=f".{name}.old-", dir=parent)
            os.rmdir(backup)
            os.rename(output, backup)
            try:
                os.rename(tmp, output)
            except BaseException:
                os.rename(backup, output)
                raise
            shutil.rmtree(backup, ignore_errors=True)
        else:
            os.rename(tmp, output)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


def _normalize_permissions(root: str) -> None:
    # Libraries write through private (0600) temporary files; the output should get the user's usual permissions.
    mask = _umask()
    for directory, _dirs, files in os.walk(root):
        os.chmod(directory, 0o777 & ~mask)
        for name in files:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                os.chmod(path, 0o666 & ~mask)


def check_output_dir(output: str, overwrite: bool) -> None:
    """Refuse a non-directory, or a non-empty directory without `overwrite`."""
    if os.path.exists(output):
        if not os.path.isdir(output):
            raise CLIError(f"{output} exists and is not a directory.")
        if os.listdir(output) and not overwrite:
            raise CLIError(f"{output} already exists and is not empty; pass --overwrite to replace it.")
