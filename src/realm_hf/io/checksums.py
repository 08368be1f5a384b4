"""Checksums of saved files: the sha256 a retriever manifest records for each file, read in constant memory."""

from __future__ import annotations

import hashlib
import os


def file_sha256(path: str | os.PathLike, chunk_size: int = 1 << 20) -> str:
    """The sha256 hex digest of a file, read in `chunk_size` pieces (constant memory for multi-GB files)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


__all__ = ["file_sha256"]
