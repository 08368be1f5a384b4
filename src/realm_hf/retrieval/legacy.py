"""
Legacy (transformers 4) REALM: the pickle opt-in, `block_records.npy` (read whole, or streamed as Arrow string chunks
without unpickling), the `block_emb` buffer, the legacy constructor refused with what replaces it, and the legacy
retriever call ([`legacy_retriever_call`]: a question paired with its retrieved blocks, answers located in them).

Imports neither faiss nor datasets, so model code can read a legacy checkpoint's embeddings cheaply.

Streaming `block_records.npy` (a pickled numpy object array): `np.load(allow_pickle=True)` builds the whole object
array: ~13 GB of Python `bytes` for google/realm-orqa-nq-openqa's 13,353,718 blocks, before any of it is converted.
The file is `np.save`'s header followed by the pickle of the array, whose items sit in one list: `EMPTY_LIST, MARK,
item, MEMOIZE, item, ..., APPENDS` in batches of 1,000. [`iter_record_chunks`] reads those opcodes from the file and
hands out the items' bytes a chunk at a time; nothing in the file is executed (no object is unpickled). A file laid
out otherwise raises [`UnsupportedRecordsLayout`] before its first chunk or at the item that is not a `bytes`/`str`,
and the caller falls back to `np.load` ([`iter_loaded_record_chunks`]).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import pickletools
import sys
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import torch

from ..constants import ALLOW_PICKLE_ENV, LEGACY_BLOCK_EMB_KEY, LEGACY_BLOCK_RECORDS
from ..text.answer_spans import find_answer_spans
from ..text.tokenizer_calls import tokenizer_call

# Legacy records are decoded in chunks of this many rows (the 13M-record array is 12.6 GB).
_DECODE_CHUNK_ROWS = 1 << 20


def pickle_allowed(allow_pickle: bool = False) -> bool:
    """Whether unpickling a legacy file is allowed: `allow_pickle=True`, or `REALM_HF_ALLOW_PICKLE` set to 1/true/yes."""
    return bool(allow_pickle) or os.environ.get(ALLOW_PICKLE_ENV, "").strip().lower() in ("1", "true", "yes")


def load_legacy_block_emb(legacy_dir: str) -> torch.Tensor | None:
    """
    The legacy `block_emb` buffer of a `RealmForOpenQA` checkpoint, read without loading the other weights into RAM:
    from `model.safetensors` if present, else from `pytorch_model.bin` with `torch.load(weights_only=True, mmap=True)`
    (no arbitrary unpickling, and the 6.8 GB matrix stays memory-mapped).
    """
    safetensors_file = os.path.join(legacy_dir, "model.safetensors")
    if os.path.isfile(safetensors_file):
        from safetensors import safe_open

        with safe_open(safetensors_file, framework="pt") as f:
            if LEGACY_BLOCK_EMB_KEY in f.keys():
                return f.get_tensor(LEGACY_BLOCK_EMB_KEY)
    bin_file = os.path.join(legacy_dir, "pytorch_model.bin")
    if os.path.isfile(bin_file):
        state_dict = torch.load(bin_file, map_location="cpu", weights_only=True, mmap=True)
        return state_dict.get(LEGACY_BLOCK_EMB_KEY)
    return None


class LegacyBlockEmb:
    """
    A legacy checkpoint's `block_emb`, read without holding the matrix in RAM: rows in chunks ([`chunks`]) or by
    index ([`take`]), as float32 copies. A `model.safetensors` is read slice by slice; a `pytorch_model.bin` is
    memory-mapped and the pages read are handed back to the OS once copied, so the process's resident memory does not
    grow with the 6.8 GB matrix (the pages stay in the page cache).
    """

    def __init__(self, legacy_dir: str):
        self._safetensors = os.path.join(legacy_dir, "model.safetensors")
        self._mapped = None
        if os.path.isfile(self._safetensors):
            from safetensors import safe_open

            with safe_open(self._safetensors, framework="pt") as f:
                if LEGACY_BLOCK_EMB_KEY in f.keys():
                    self.shape = tuple(f.get_slice(LEGACY_BLOCK_EMB_KEY).get_shape())
                    return
        bin_file = os.path.join(legacy_dir, "pytorch_model.bin")
        if os.path.isfile(bin_file):
            state_dict = torch.load(bin_file, map_location="cpu", weights_only=True, mmap=True)
            self._mapped = state_dict.get(LEGACY_BLOCK_EMB_KEY)
        if self._mapped is None:
            raise OSError(
                f"No `{LEGACY_BLOCK_EMB_KEY}` tensor found in {legacy_dir} (model.safetensors or pytorch_model.bin)."
            )
        self.shape = tuple(self._mapped.shape)

    def chunks(self, chunk_rows: int) -> Iterator[np.ndarray]:
        """The rows in order, `chunk_rows` at a time."""
        if self._mapped is None:
            from safetensors import safe_open

            with safe_open(self._safetensors, framework="pt") as f:
                rows = f.get_slice(LEGACY_BLOCK_EMB_KEY)
                for start in range(0, self.shape[0], chunk_rows):
                    yield rows[start : start + chunk_rows].float().numpy()
            return
        for start in range(0, self.shape[0], chunk_rows):
            rows = self._mapped[start : start + chunk_rows]
            yield self._copy(rows)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The rows at sorted indices `rows` (a training sample)."""
        if self._mapped is None:
            parts, chunk_rows = [], 1 << 16
            for start, chunk in zip(range(0, self.shape[0], chunk_rows), self.chunks(chunk_rows)):
                inside = rows[(rows >= start) & (rows < start + len(chunk))]
                parts.append(chunk[inside - start])
            return np.concatenate(parts)
        sample = self._mapped[torch.from_numpy(np.asarray(rows, dtype=np.int64))]
        _drop_mapped_pages(self._mapped)
        return sample.float().numpy()

    @staticmethod
    def _copy(rows: torch.Tensor) -> np.ndarray:
        chunk = rows.float().numpy() if rows.dtype != torch.float32 else rows.numpy().copy()
        _drop_mapped_pages(rows)
        return chunk


def _drop_mapped_pages(rows: torch.Tensor) -> None:
    # Only for tensors of a file memory-mapped by `torch.load(mmap=True)` and never written: MADV_DONTNEED on such
    # pages just unmaps them (a later read pages them in from the file again); on anonymous memory it would lose data.
    if not sys.platform.startswith("linux") or rows.numel() == 0:
        return
    start = rows.data_ptr()
    end = start + rows.numel() * rows.element_size()
    first = start - start % mmap.PAGESIZE
    last = end - end % mmap.PAGESIZE
    if last > first:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), 4)  # 4: MADV_DONTNEED


def check_pickle_opt_in(records_path: str, allow_pickle: bool) -> None:
    """Refuse to read a pickled `block_records.npy` unless the caller opted in ([`pickle_allowed`])."""
    if not pickle_allowed(allow_pickle):
        raise ValueError(
            f"{records_path} is a pickled numpy object array: loading it runs the pickle, which can execute "
            "arbitrary code if the file is malicious. If you trust this checkpoint, pass `allow_pickle=True` (or "
            f"set {ALLOW_PICKLE_ENV}=1) once to convert it with `convert_legacy_checkpoint(legacy_dir, "
            "output_dir, allow_pickle=True)`, then use the pickle-free converted retriever."
        )


def _decode_legacy_records(records: np.ndarray) -> list[str]:
    texts = []
    for start in range(0, len(records), _DECODE_CHUNK_ROWS):
        chunk = records[start : start + _DECODE_CHUNK_ROWS]
        texts.extend(r.decode("utf-8") if isinstance(r, bytes) else str(r) for r in chunk)
        # Drop the decoded bytes as we go: the 13M-record legacy array is 12.6 GB.
        records[start : start + _DECODE_CHUNK_ROWS] = None
    return texts


def read_legacy_blocks(legacy_dir: str, block_emb=None, allow_pickle: bool = False) -> tuple[dict, np.ndarray]:
    """
    The blocks of a legacy `RealmForOpenQA` checkpoint as retriever columns (`block_id` = `doc_id` = legacy row,
    empty `title`, `text`) and their `[num_blocks, dim]` float32 embeddings; see [`RealmRetriever.from_legacy`].
    """
    records_path = os.path.join(legacy_dir, LEGACY_BLOCK_RECORDS)
    if not os.path.isfile(records_path):
        raise OSError(f"{legacy_dir} has no {LEGACY_BLOCK_RECORDS}: not a legacy RealmForOpenQA checkpoint directory.")
    check_pickle_opt_in(records_path, allow_pickle)
    if block_emb is None:
        block_emb = load_legacy_block_emb(legacy_dir)
        if block_emb is None:
            raise OSError(
                f"No `{LEGACY_BLOCK_EMB_KEY}` tensor found in {legacy_dir} (model.safetensors or pytorch_model.bin): "
                "pass `block_emb=` explicitly."
            )
    if isinstance(block_emb, torch.Tensor):
        block_emb = block_emb.detach().to("cpu")
        block_emb = block_emb.numpy() if block_emb.dtype == torch.float32 else block_emb.float().numpy()
    block_emb = np.asarray(block_emb, dtype=np.float32)
    records = np.load(records_path, allow_pickle=True)
    if records.ndim != 1 or len(records) != len(block_emb):
        raise ValueError(
            f"{LEGACY_BLOCK_RECORDS} has {records.shape} records but block_emb has {len(block_emb)} rows."
        )
    texts = _decode_legacy_records(records)
    del records
    n = len(texts)
    block_ids = np.arange(n, dtype=np.int64)
    return {"block_id": block_ids, "doc_id": block_ids, "title": [""] * n, "text": texts}, block_emb


def check_constructor_arguments(corpus, index, unknown: dict | None = None) -> None:
    """
    Refuse the transformers 4 constructor `RealmRetriever(block_records, tokenizer)`, positional or with keywords
    (`block_records=...`, given in `unknown`, the keyword arguments `RealmRetriever` does not take), with what replaces
    it, instead of failing deep inside with an AttributeError on a numpy array or with Python's "unexpected keyword
    argument"; then any other unknown keyword and a missing `corpus` / `index`.
    """
    unknown = unknown or {}
    if (
        "block_records" in unknown
        or isinstance(corpus, (np.ndarray, list, tuple))
        or hasattr(index, "convert_tokens_to_ids")
    ):
        raise TypeError(
            "RealmRetriever(block_records, tokenizer) is the transformers 4 constructor; realm-hf's retriever holds a "
            "corpus (`datasets.Dataset`) and a FAISS index. Build one with `RealmRetriever.from_legacy(legacy_dir, "
            "tokenizer=tokenizer, allow_pickle=True)` for a legacy checkpoint's block_records.npy and block_emb, or "
            "`RealmRetriever.from_documents(documents, embedder, tokenizer)` for new text (docs/migration.md)."
        )
    if unknown:
        raise TypeError(f"RealmRetriever() got unexpected keyword argument(s): {', '.join(sorted(unknown))}.")
    if corpus is None or index is None:
        raise TypeError(
            "RealmRetriever() needs a `corpus` (`datasets.Dataset`) and an `index` (FAISS); to build both, use "
            "`RealmRetriever.from_documents(documents, embedder, tokenizer)` or `RealmRetriever.from_pretrained(path)`."
        )


def legacy_retriever_call(
    retriever, retrieved_block_ids, question_input_ids, answer_ids, max_length=None, return_tensors="pt"
):
    """
    What transformers 4's `retriever(retrieved_block_ids, question_input_ids, answer_ids)` did, for code ported from
    it: pair one question with its retrieved blocks and locate the answers in them. New code uses
    `retriever.search` and `realm_hf.build_reader_inputs`.

    Args:
        retriever ([`RealmRetriever`]): The retriever the blocks come from (its `store` and `tokenizer`).
        retrieved_block_ids: Ids of the question's retrieved blocks (1-D).
        question_input_ids: The tokenized question, shape `(1, seq_len)` (decoded, as the legacy code did).
        answer_ids (`list[list[int]]`, *optional*): Gold answers as wordpiece ids.
        max_length (`int`, *optional*): Truncation length of a (question, block) pair.
        return_tensors (`str`, defaults to `"pt"`): Tensor type of the returned inputs.

    Returns:
        `(has_answers, start_pos, end_pos, concat_inputs)`: per block whether an answer occurs and the token positions
        of every occurrence (padded with -1); the first three are `None` without `answer_ids`. `concat_inputs` carries
        `special_tokens_mask`, as in transformers 4.
    """
    tokenizer = retriever.tokenizer
    if tokenizer is None:
        raise ValueError("This retriever has no tokenizer: set `retriever.tokenizer`.")
    if isinstance(retrieved_block_ids, torch.Tensor):
        retrieved_block_ids = retrieved_block_ids.detach().cpu().numpy()
    texts = retriever.store.texts(np.asarray(retrieved_block_ids, dtype=np.int64).reshape(-1))
    question = tokenizer.decode(question_input_ids[0], skip_special_tokens=True)
    # `special_tokens_mask` as transformers 4 returned it: the legacy RealmForOpenQA built its block mask from it.
    concat_inputs = tokenizer_call(
        tokenizer,
        [question] * len(texts),
        texts,
        padding=True,
        truncation=True,
        return_special_tokens_mask=True,
        max_length=max_length,
    )
    concat_inputs_tensors = concat_inputs.convert_to_tensors(return_tensors)
    if answer_ids is None:
        return None, None, None, concat_inputs_tensors
    sep = tokenizer.sep_token_id
    has_answers, start_pos, end_pos = [], [], []
    for ids in concat_inputs["input_ids"]:
        starts, ends = find_answer_spans(list(ids), answer_ids, sep)
        has_answers.append(bool(starts))
        start_pos.append(starts)
        end_pos.append(ends)
    max_answers = max(len(s) for s in start_pos)
    start_pos = [s + [-1] * (max_answers - len(s)) for s in start_pos]
    end_pos = [e + [-1] * (max_answers - len(e)) for e in end_pos]
    return has_answers, start_pos, end_pos, concat_inputs_tensors


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
