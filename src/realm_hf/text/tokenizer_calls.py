"""
Calling a tokenizer safely: one call at a time per tokenizer object, across threads ([`tokenizer_call`],
[`tokenizer_lock`]), and refusing a tokenizer loaded without its vocabulary ([`check_vocabulary`]). Every tokenizer
call of realm-hf goes through here, whatever the tokenizer's class.
"""

from __future__ import annotations

import os
import threading
import weakref

from transformers import BatchEncoding

# One lock per tokenizer object. A 🤗 Tokenizers-backed tokenizer keeps its padding and truncation settings in the
# shared Rust object: each call first sets them (`set_truncation_and_padding`), then encodes. Two threads calling
# the same tokenizer with different settings interleave those two steps, and one of them encodes with the other's
# settings (unpadded rows, then "expected sequence of length 24 at dim 1 (got 23)" when they become a tensor).
_TOKENIZER_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()
_FALLBACK_LOCK = threading.RLock()


def tokenizer_lock(tokenizer) -> threading.RLock:
    """
    The lock that makes one call of `tokenizer` atomic: held by [`tokenizer_call`] and by every
    [`RealmTokenizer`] call. Hold it around your own calls of a shared non-REALM tokenizer that realm-hf also uses
    (e.g. from a server thread), since such calls change the tokenizer's padding/truncation state.
    """
    with _LOCKS_GUARD:
        try:
            lock = _TOKENIZER_LOCKS.get(tokenizer)
            if lock is None:
                lock = _TOKENIZER_LOCKS[tokenizer] = threading.RLock()
        except TypeError:  # not weakly referenceable or not hashable: one lock for all such objects
            lock = _FALLBACK_LOCK
    return lock


def tokenizer_call(tokenizer, *args, **kwargs) -> BatchEncoding:
    """
    `tokenizer(*args, **kwargs)`, safe while other threads call the same tokenizer: every tokenizer call of realm-hf
    (questions, reader pairs, blocks, answers) goes through here, so answering from several threads, or training
    while a background index refresh tokenizes the corpus, never mixes one call's padding or truncation into another.
    """
    with tokenizer_lock(tokenizer):
        return tokenizer(*args, **kwargs)


# The files a BERT WordPiece vocabulary is read from (transformers 5 writes tokenizer.json; older saves vocab.txt).
VOCABULARY_FILES = ("tokenizer.json", "vocab.txt")


def check_vocabulary(tokenizer, source) -> None:
    """
    Refuse a tokenizer that was loaded from `source` without its vocabulary. transformers 5 builds a BERT tokenizer
    of only its special tokens when `vocab.txt`/`tokenizer.json` is missing (a folder without them, or a Hub id that is
    neither cached nor reachable), and that tokenizer maps every word to [UNK], so every question gets the same answer.
    """
    special = set(getattr(tokenizer, "all_special_tokens", None) or [])
    if len(tokenizer) > len(special):
        return
    source = os.fspath(source)
    if os.path.isdir(source):
        where = f"the folder {source} has no {' or '.join(VOCABULARY_FILES)}"
        todo = "copy the tokenizer's files there, or save the tokenizer there again (`tokenizer.save_pretrained`)"
    else:
        offline = (
            " (HF_HUB_OFFLINE is set)"
            if os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
            else ""
        )
        where = (
            f"{source!r} is not a local folder, and no {' or '.join(VOCABULARY_FILES)} of it was found on the Hub or "
            f"in the local cache{offline}"
        )
        todo = "check the path or repo id, or download the repo while online (then it loads from the cache)"
    raise OSError(
        f"Cannot load a tokenizer from {source}: {where}. Without a vocabulary every word would become [UNK] "
        f"(it loads with only its {len(tokenizer)} special tokens): {todo}."
    )


__all__ = ["VOCABULARY_FILES", "check_vocabulary", "tokenizer_call", "tokenizer_lock"]
