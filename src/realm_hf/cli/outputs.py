"""The directories the commands produce, swapped in through realm-hf's one atomic-write path (file_utils; files go through
`file_utils.atomic_write_text` directly)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from ..file_utils import recover_interrupted_save, replace_directory
from .common import CLIError


@contextlib.contextmanager
def atomic_output_dir(output: str, overwrite: bool = False) -> Iterator[str]:
    """
    Yield a temporary directory; on success it replaces `output` in one journaled swap, on failure it is removed (see
    [`realm_hf.file_utils.replace_directory`]: a run killed half-way through the swap leaves a journal that the next
    run, or a load of `output`, completes). An existing non-empty `output` is refused unless `overwrite`, and is only
    removed after the new one is in place.
    """
    output = os.path.abspath(output)
    parent = os.path.dirname(output)
    if os.path.isdir(parent):
        # A run killed during its swap: `output` is the old or the new directory again before it is judged.
        recover_interrupted_save(parent)
    check_output_dir(output, overwrite)
    with replace_directory(output) as folder:
        yield folder


def check_output_dir(output: str, overwrite: bool) -> None:
    """Refuse a non-directory, or a non-empty directory without `overwrite`."""
    if os.path.exists(output):
        if not os.path.isdir(output):
            raise CLIError(f"{output} exists and is not a directory.")
        if os.listdir(output) and not overwrite:
            raise CLIError(f"{output} already exists and is not empty; pass --overwrite to replace it.")
