"""Splitting documents into retriever blocks of at most `max_block_length` wordpieces."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import datasets
import numpy as np

from ..logging_utils import get_logger
from ..text.sentences import sentence_spans
from ..text.tokenizer_calls import tokenizer_call
from ..text.user_text import check_text
from .corpus import TOKEN_IDS_COLUMN, check_doc_id

logger = get_logger(__name__)

# Columns the retriever manages itself; any other document field is kept as block metadata.
_RESERVED_COLUMNS = ("block_id", "doc_id", "title", "text", "char_start", "char_end", "embeddings", TOKEN_IDS_COLUMN)


def _require_offsets(tokenizer) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            f"Splitting documents needs a tokenizer with offset mappings (a 🤗 Tokenizers-backed tokenizer); got "
            f"{type(tokenizer).__name__}. Load it with `AutoTokenizer.from_pretrained(...)`."
        )


def block_spans(
    tokenizer, text: str, title: str = "", max_block_length: int = 288
) -> tuple[list[tuple[int, int]], str]:
    """
    Split `text` into blocks that fit, together with `title`, in `max_block_length` wordpieces as the embedder sees
    them: `[CLS] title [SEP] block [SEP]`.

    Blocks end at sentence ends ([`~realm_hf.text.sentences.sentence_spans`]: `.`, `!`, `?` before a capital, or a
    line break) when one falls in the second half of the wordpiece budget, otherwise at the last word boundary; a block never starts inside a word (with a `##` wordpiece) unless a
    single word is longer than a whole block. Block texts are slices of `text` (via the tokenizer's offsets, not
    `decode`), so casing, accents and punctuation are kept.

    Returns:
        `(spans, title)`: the `(char_start, char_end)` of each block in `text`, and the title actually used (titles
        longer than half a block are cut at a word boundary, with a warning).
    """
    _require_offsets(tokenizer)
    if max_block_length < 8:
        raise ValueError(f"max_block_length={max_block_length} is too small: blocks need room for a title and text.")
    title = title or ""
    title_enc = tokenizer_call(tokenizer, title, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    title_len = len(title_enc["input_ids"])
    max_title = max_block_length // 2
    if title_len > max_title:
        words = title_enc.word_ids()
        cut = max_title
        while cut > 1 and words[cut] == words[cut - 1]:
            cut -= 1
        short = title[: title_enc["offset_mapping"][cut - 1][1]]
        logger.warning(
            "Title %r has %d wordpieces, more than half of max_block_length=%d: using %r for its blocks.",
            title[:60],
            title_len,
            max_block_length,
            short,
        )
        title, title_len = short, cut
    budget = max_block_length - tokenizer.num_special_tokens_to_add(pair=True) - title_len

    enc = tokenizer_call(tokenizer, text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    offsets = enc["offset_mapping"]
    n = len(offsets)
    if n == 0:
        return [], title
    if n <= budget:
        return [(offsets[0][0], offsets[-1][1])], title

    starts = np.array([o[0] for o in offsets], dtype=np.int64)
    ends = np.array([o[1] for o in offsets], dtype=np.int64)
    word_ids = np.array([-1 if w is None else w for w in enc.word_ids()], dtype=np.int64)
    # A cut before token i (1 <= i < n) is a word boundary when token i starts a new word (not a "##" piece) ...
    word_start = np.zeros(n + 1, dtype=bool)
    word_start[1:n] = (word_ids[1:] != word_ids[:-1]) | (word_ids[1:] < 0)
    word_start[n] = True
    # ... and a sentence boundary when token i starts a sentence (the package's one sentence rule, sentences.py).
    sentence_start = np.zeros(n + 1, dtype=bool)
    first_chars = np.array([start for start, _ in sentence_spans(text)], dtype=np.int64)
    sentence_start[1:n] = word_start[1:n] & np.isin(starts[1:], first_chars)
    sentence_start[n] = True
    sentence_cuts = np.flatnonzero(sentence_start)
    word_cuts = np.flatnonzero(word_start)

    spans = []
    s = 0
    while s < n:
        limit = s + budget
        if limit >= n:
            e = n
        else:
            e = None
            i = np.searchsorted(sentence_cuts, limit, side="right") - 1
            if i >= 0 and sentence_cuts[i] >= s + max(1, budget // 2):
                e = int(sentence_cuts[i])
            if e is None:
                i = np.searchsorted(word_cuts, limit, side="right") - 1
                if i >= 0 and word_cuts[i] > s:
                    e = int(word_cuts[i])
            if e is None:
                # One "word" longer than a block (e.g. a long URL): cutting inside it is unavoidable.
                logger.warning("A single word of more than %d wordpieces had to be cut across blocks.", budget)
                e = limit
        spans.append((int(starts[s]), int(ends[e - 1])))
        s = e
    return spans, title


def _iter_documents(documents) -> Iterator[dict]:
    """Rows of `documents`: a `datasets.Dataset`, a dict of columns, or an iterable of dicts (or plain strings)."""
    if isinstance(documents, datasets.Dataset):
        if "text" not in documents.column_names:
            raise KeyError(f"The documents dataset has no 'text' column (columns: {documents.column_names}).")
        for batch in documents.iter(batch_size=1000):
            keys = list(batch)
            for values in zip(*(batch[k] for k in keys)):
                yield dict(zip(keys, values))
        return
    if isinstance(documents, Mapping):
        if "text" not in documents:
            raise KeyError(f"The documents have no 'text' column (keys: {list(documents)}).")
        keys = list(documents)
        # A dict of columns holds one list per field: a single document's dict (`{"text": "..."}`) would be read
        # column-wise, one document per character, and columns of different lengths cut to the shortest by zip.
        for key in keys:
            column = documents[key]
            if isinstance(column, (str, bytes)) or not hasattr(column, "__len__"):
                raise TypeError(
                    f"The documents are a dict, read as columns (one list per field), but its {key!r} is a "
                    f"{type(column).__name__}, not a list. For one document pass a list of dicts: [{{'text': ...}}]."
                )
        lengths = {key: len(documents[key]) for key in keys}
        if len(set(lengths.values())) > 1:
            raise ValueError(
                f"The document columns have different lengths ({lengths}): give every field one value per document."
            )
        for values in zip(*(documents[k] for k in keys)):
            yield dict(zip(keys, values))
        return
    if isinstance(documents, str):
        raise TypeError("`documents` must be an iterable of documents, not a single string; wrap it in a list.")
    if not isinstance(documents, Iterable):
        # `None` or a number: Python's "'NoneType' object is not iterable" named neither the argument nor the cure.
        raise TypeError(
            f"`documents` must be a list of dicts with 'title' and 'text', a dict of columns or a `datasets.Dataset`, "
            f"got {type(documents).__name__}."
        )
    for position, document in enumerate(documents):
        if isinstance(document, str):
            yield {"text": document}
        elif isinstance(document, Mapping):
            if "text" not in document:
                raise KeyError(f"Document {position} has no 'text' field (fields: {list(document)}).")
            yield dict(document)
        else:
            raise TypeError(
                f"Document {position} is a {type(document).__name__}; expected a dict with 'title' and 'text'."
            )


def split_documents(documents, tokenizer, max_block_length: int = 288, first_doc_id: int = 0) -> dict[str, list]:
    """
    Split documents into blocks (see [`block_spans`]).

    Args:
        documents: An iterable of dicts with `text` and optionally `title`, `doc_id` and any metadata fields, a dict
            of columns, or a `datasets.Dataset` with those columns.
        tokenizer: A BERT WordPiece tokenizer (🤗 Tokenizers-backed, for offsets).
        max_block_length (`int`, defaults to 288): Maximum wordpieces per block, title and special tokens included.
        first_doc_id (`int`): Documents without a `doc_id` get consecutive integers from here.

    Returns:
        `dict` of columns, one row per block: `doc_id`, `title`, `text`, `char_start`, `char_end` (the block's span in
        its document's text) and the documents' metadata fields.

    A `doc_id` is an integer or a string, all of one type; documents without one are numbered (integers). A document
    whose text is empty (or only whitespace and control characters) has no block: it is left out of the corpus with
    a warning that lists its doc_id, as empty pages of a dump are; other documents are not held up by it.
    """
    columns: dict[str, list] = {"doc_id": [], "title": [], "text": [], "char_start": [], "char_end": []}
    metadata: dict[str, list] = {}
    num_blocks = 0
    seen_doc_ids: dict = {}  # doc_id -> position of the document that has it
    first_of_kind: dict = {}  # int or str -> position of the first document with a doc_id of that type
    empty: list = []  # doc_ids of documents without text: no block, left out with a warning
    for position, document in enumerate(_iter_documents(documents)):
        text = document.get("text")
        if text is None or not isinstance(text, str):
            raise ValueError(f"Document {position} has a 'text' of type {type(text).__name__}; expected a string.")
        title = document.get("title") or ""
        if not isinstance(title, str):
            raise ValueError(f"Document {position} has a 'title' of type {type(title).__name__}; expected a string.")
        # The rule every entry point shares (user_text): undecodable bytes are refused, never indexed as garbage.
        check_text(text, f"Document {position}'s text")
        check_text(title, f"Document {position}'s title")
        doc_id = document.get("doc_id")
        given = doc_id is not None
        if doc_id is None:
            doc_id = first_doc_id + position
        doc_id = check_doc_id(doc_id, f"Document {position}'s doc_id")
        first_of_kind.setdefault(type(doc_id), position)
        if len(first_of_kind) > 1:
            # 3 and "3" would both be stored as one type: two documents behind one id, removed together.
            other = first_of_kind[int if isinstance(doc_id, str) else str]
            how = "" if given else f" (the id it gets from its position, {first_doc_id} + {position})"
            raise ValueError(
                f"Documents {other} and {position} have doc_ids of different types ({type(doc_id).__name__} "
                f"{doc_id!r}{how}, and {'int' if isinstance(doc_id, str) else 'str'} at document {other}): one "
                "corpus has one doc_id type. Give every document an integer id, or every one a string id."
            )
        if doc_id in seen_doc_ids:
            # `remove_documents(doc_id)` would remove both documents.
            how = "" if given else f" (the id it gets from its position, {first_doc_id} + {position})"
            raise ValueError(
                f"Documents {seen_doc_ids[doc_id]} and {position} have the same doc_id {doc_id!r}{how}: doc_ids "
                "must be unique (give every document its own doc_id, or none to number them by position)."
            )
        seen_doc_ids[doc_id] = position
        spans, block_title = block_spans(tokenizer, text, title, max_block_length)
        if not spans:
            empty.append(doc_id)
        extra = {k: v for k, v in document.items() if k not in _RESERVED_COLUMNS}
        for key in extra:
            if key not in metadata:
                metadata[key] = [None] * num_blocks
        for start, end in spans:
            columns["doc_id"].append(doc_id)
            columns["title"].append(block_title)
            columns["text"].append(text[start:end])
            columns["char_start"].append(start)
            columns["char_end"].append(end)
            for key, values in metadata.items():
                values.append(extra.get(key))
            num_blocks += 1
    if empty:
        logger.warning(
            "%d document(s) have no text and are left out of the corpus (no block to retrieve): doc_id %s%s. "
            "Give them text to index them.",
            len(empty),
            empty[:10],
            f" and {len(empty) - 10} more" if len(empty) > 10 else "",
        )
    columns.update(metadata)
    return columns
