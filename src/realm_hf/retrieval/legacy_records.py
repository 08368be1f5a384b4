"""
Streaming the block texts out of a legacy `block_records.npy` (a pickled numpy object array) as Arrow string chunks.

`np.load(allow_pickle=True)` builds the whole object array: ~13 GB of Python `bytes` for google/realm-orqa-nq-openqa's
13,353,718 blocks, before any of it is converted. The file is `np.save`'s header followed by the pickle of the array,
whose items sit in one list: `EMPTY_LIST, MARK, item, MEMOIZE, item, ..., APPENDS` in batches of 1,000. This module
reads those opcodes from the file and hands out the items' bytes a chunk at a time; nothing in the file is executed
(no object is unpickled). A file laid out otherwise raises [`UnsupportedRecordsLayout`] before its first chunk or at
the item that is not a `bytes`/`str`, and the caller falls back to `np.load` ([`iter_loaded_record_chunks`]).
"""

from __future__ import annotations

import os
import pickletools
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

# Rows per Arrow chunk handed out (REALM blocks: ~1 KB of text each, so ~64 MB per chunk).
RECORD_CHUNK_ROWS = 1 << 16
# Bytes read from the file at a time.
_READ_SIZE = 16 << 20

# Pickle opcodes met in the items list (protocols 2 to 5); see `pickletools`.
_SHORT_BINBYTES, _BINBYTES, _BINBYTES8 = 0x43, 0x42, 0x8E
_SHORT_BINUNICODE, _BINUNICODE, _BINUNICODE8 = 0x8C, 0x58, 0x8D
_MEMOIZE, _BINPUT, _LONG_BINPUT = 0x94, 0x71, 0x72
_BINGET, _LONG_BINGET = 0x68, 0x6A
_MARK, _APPENDS, _APPEND, _FRAME = 0x28, 0x65, 0x61, 0x95
# Item opcode -> bytes of its length field.
_ITEM_LENGTH_BYTES = {
    _SHORT_BINBYTES: 1,
    _BINBYTES: 4,
    _BINBYTES8: 8,
    _SHORT_BINUNICODE: 1,
    _BINUNICODE: 4,
    _BINUNICODE8: 8,
}
# What the pickle of a numpy object array names before its items (`ndarray.__reduce__`).
_ARRAY_GLOBALS = {"_reconstruct", "ndarray", "dtype"}


class UnsupportedRecordsLayout(ValueError):
    """The records file is not the pickle of a 1-D object array that this module can stream: read it with `np.load`."""


def records_count(path: str) -> int:
    """The number of records in `path`, from its `.npy` header (nothing unpickled). Raises if it is not 1-D objects."""
    with open(path, "rb") as f:
        return _read_npy_header(f, path)


def _read_npy_header(f, path: str) -> int:
    from numpy.lib import format as npy_format

    try:
        version = npy_format.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = npy_format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, _, dtype = npy_format.read_array_header_2_0(f)
        else:
            raise UnsupportedRecordsLayout(f"{path}: .npy format version {version}")
    except ValueError as err:
        if isinstance(err, UnsupportedRecordsLayout):
            raise
        raise ValueError(f"{path} is not a .npy file ({err}): not a legacy block_records.npy.") from None
    if dtype != np.dtype(object) or len(shape) != 1:
        raise ValueError(
            f"{path} holds a {dtype} array of shape {shape}; a legacy block_records.npy is a 1-D object array of "
            "block texts (bytes)."
        )
    return int(shape[0])


class _Reader:
    """Sequential reads over a file with a sliding buffer, and the file offset of every position in it."""

    def __init__(self, f, start: int):
        self.f, self.buf, self.pos, self.base = f, b"", 0, start

    def need(self, n: int) -> None:
        if self.pos + n > len(self.buf):
            more = self.f.read(max(_READ_SIZE, n))
            self.base += self.pos
            self.buf = self.buf[self.pos :] + more
            self.pos = 0
            if n > len(self.buf):
                raise ValueError("the file ends in the middle of the pickle (truncated download?)")

    def uint(self, n: int) -> int:
        self.need(n)
        value = int.from_bytes(self.buf[self.pos : self.pos + n], "little")
        self.pos += n
        return value


def _scan_prefix(f, path: str) -> tuple[int, int]:
    """
    Walk the opcodes before the items list (the array's class, shape and dtype: read, never run) up to its
    `EMPTY_LIST`. Returns (file offset after it, number of memo entries so far).
    """
    memo, names = 0, set()
    for opcode, arg, _ in pickletools.genops(f):
        if opcode.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
            names.add(arg)
        elif opcode.name == "GLOBAL":
            names.update(str(arg).split())
        elif opcode.name == "MEMOIZE":
            memo += 1
        elif opcode.name in ("BINPUT", "LONG_BINPUT", "PUT"):
            memo = max(memo, int(arg) + 1)
        elif opcode.name == "EMPTY_LIST":
            if not _ARRAY_GLOBALS <= names:
                break
            return f.tell(), memo
        elif opcode.name == "STOP":
            break
    raise UnsupportedRecordsLayout(f"{path}: not the pickle of a numpy object array")


def _iter_items(path: str) -> Iterator[bytes]:
    """The UTF-8 bytes of each record, in order, read from the pickle opcodes (see the module docstring)."""
    with open(path, "rb") as f, open(path, "rb") as lookup:
        count = _read_npy_header(f, path)
        start, memo_len = _scan_prefix(f, path)
        f.seek(start)
        r = _Reader(f, start)
        # File offset of the item opcode behind each memo entry (-1: not an item), for BINGET of a repeated object.
        memo_offsets = np.full(max(16, memo_len + 1), -1, dtype=np.int64)
        last_offset, seen = -1, 0
        while True:
            r.need(1)
            op = r.buf[r.pos]
            r.pos += 1
            width = _ITEM_LENGTH_BYTES.get(op)
            if width is not None:
                last_offset = r.base + r.pos - 1
                n = r.uint(width)
                r.need(n)
                yield r.buf[r.pos : r.pos + n]
                r.pos += n
                seen += 1
            elif op in (_MEMOIZE, _BINPUT, _LONG_BINPUT):
                index = memo_len if op == _MEMOIZE else r.uint(1 if op == _BINPUT else 4)
                memo_len = max(memo_len, index + 1)
                if index >= len(memo_offsets):
                    memo_offsets = np.concatenate([memo_offsets, np.full(len(memo_offsets) + index, -1, np.int64)])
                memo_offsets[index] = last_offset
                last_offset = -1
            elif op in (_BINGET, _LONG_BINGET):
                index = r.uint(1 if op == _BINGET else 4)
                offset = memo_offsets[index] if index < len(memo_offsets) else -1
                if offset < 0:
                    raise UnsupportedRecordsLayout(f"{path}: record {seen} refers to an object that is not a text")
                yield _read_item_at(lookup, int(offset))
                last_offset = -1
                seen += 1
            elif op in (_MARK, _APPENDS, _APPEND):
                last_offset = -1
            elif op == _FRAME:
                r.uint(8)  # frames only group opcodes: read through them
            else:
                break  # the end of the items list (TUPLE of the array's state)
        if seen != count:
            raise UnsupportedRecordsLayout(f"{path}: {seen} texts in the items list, {count} in the header")


def _read_item_at(f, offset: int) -> bytes:
    op = os.pread(f.fileno(), 1, offset)[0]
    width = _ITEM_LENGTH_BYTES[op]
    n = int.from_bytes(os.pread(f.fileno(), width, offset + 1), "little")
    return os.pread(f.fileno(), n, offset + 1 + width)


def _string_array(payloads: list[bytes], first_row: int, path: str) -> pa.Array:
    lengths = np.fromiter(map(len, payloads), dtype=np.int64, count=len(payloads))
    offsets = np.zeros(len(payloads) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    array = pa.LargeStringArray.from_buffers(len(payloads), pa.py_buffer(offsets), pa.py_buffer(b"".join(payloads)))
    try:
        array.validate(full=True)  # UTF-8, as the legacy loader's `bytes.decode("utf-8")` required
    except pa.ArrowInvalid:
        for i, payload in enumerate(payloads):
            try:
                payload.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(
                    f"{path}: block {first_row + i} is not valid UTF-8 ({err}): the file is corrupt."
                ) from None
        raise
    return array.cast(pa.string())


def iter_record_chunks(path: str, chunk_rows: int = RECORD_CHUNK_ROWS) -> Iterator[pa.Array]:
    """
    The texts of a legacy `block_records.npy`, `chunk_rows` at a time, as Arrow string arrays, streamed from the
    pickle without unpickling it (see the module docstring). Raises [`UnsupportedRecordsLayout`] for a file it
    cannot stream (then read it with [`iter_loaded_record_chunks`]) and `ValueError` for a corrupt one.
    """
    payloads, first_row = [], 0
    try:
        for payload in _iter_items(path):
            payloads.append(payload)
            if len(payloads) == chunk_rows:
                yield _string_array(payloads, first_row, path)
                first_row += len(payloads)
                payloads = []
    except (OSError, EOFError, KeyError, IndexError) as err:
        raise UnsupportedRecordsLayout(f"{path}: {type(err).__name__}: {err}") from None
    if payloads:
        yield _string_array(payloads, first_row, path)


def iter_loaded_record_chunks(path: str, chunk_rows: int = RECORD_CHUNK_ROWS) -> Iterator[pa.Array]:
    """The same chunks as [`iter_record_chunks`], from the array `np.load(allow_pickle=True)` builds (all in memory)."""
    records = np.load(path, allow_pickle=True)
    if records.ndim != 1:
        raise ValueError(f"{path} holds an array of shape {records.shape}; expected 1-D block texts.")
    for start in range(0, len(records), chunk_rows):
        chunk = records[start : start + chunk_rows]
        yield pa.array([r.decode("utf-8") if isinstance(r, bytes) else str(r) for r in chunk], type=pa.string())
        records[start : start + chunk_rows] = None  # free the bytes as we go
