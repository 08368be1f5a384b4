"""
Paths that must stay inside their folder: a relative name read from a saved file (a manifest, a journal) refused when
it is absolute or climbs out, and files refused when a symbolic link leads them out of a model or retriever directory
(a Hub cache snapshot's links into its blob folder are allowed).
"""

from __future__ import annotations

import ntpath
import os
import posixpath
import re


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


def resolve_inside(directory: str, relative, what: str, source: str, recursive: bool = True) -> str:
    """
    `directory/relative` for a relative name read from a saved file, refused when the name leads out of `directory`
    ([`check_relative_name`]) or, when the path exists, when a symbolic link on the way (or, with `recursive`, under
    it) does ([`check_inside`]). `what` and `source` (the field and the file that gave `relative`) go into the error.
    """
    full = os.path.join(directory, *check_relative_name(relative, what, source))
    if os.path.lexists(full):
        check_inside(directory, full, what, source, recursive=recursive)
    return full


__all__ = ["allowed_roots", "check_inside", "check_relative_name", "resolve_inside"]
