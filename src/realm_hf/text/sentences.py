"""Rule-based sentence splitting, the one rule used by FOLDOC loading, the Inverse Cloze Task and block chunking."""

from __future__ import annotations

import re

# Abbreviations after which a period does not end a sentence (FOLDOC writes "e.g." and "i.e." a lot).
_ABBREVIATIONS = frozenset(
    "e.g i.e etc cf vs al inc ltd corp co dr mr mrs ms prof st no vol fig approx ca jr sr dept univ ed eds".split()
)
# No capital required after the end: uncased corpora (ICT blocks, BERT-uncased text) have none.
_SENTENCE_END = re.compile(r"[.!?]+[\"')\]]*\s+")
# Cased text (FOLDOC): a sentence end must also be followed by a capital letter or a digit.
_CASED_SENTENCE_END = re.compile(r"[.!?]+[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")


def sentence_spans(text: str, cased: bool = False) -> list[tuple[int, int]]:
    """
    Split text into sentences with a rule-based splitter: a sentence ends at `.`, `!` or `?` (and closing quotes or
    brackets) followed by whitespace, except when the period follows a common abbreviation ("e.g.", "Inc."), an
    initial ("D. Howe") or a numbered-list marker ("1."). Newlines always end a sentence.

    Args:
        text (`str`): The text.
        cased (`bool`, *optional*, defaults to `False`): For cased text: a sentence also needs a capital letter or a
            digit after its end, and an initial may be written in either case (FOLDOC's rule).

    Returns:
        `list[tuple[int, int]]`: `(start, end)` character offsets of each sentence, without surrounding whitespace.
    """
    spans = []
    offset = 0
    for paragraph in (text or "").split("\n"):
        start = 0
        for m in (_CASED_SENTENCE_END if cased else _SENTENCE_END).finditer(paragraph):
            if cased or m.group(0).startswith("."):
                # Only a period can belong to an abbreviation, an initial or a list marker; ? and ! always end
                # (the cased rule, FOLDOC's since its first release, checks every end).
                before = paragraph[start : m.start()].split()
                raw = before[-1].lstrip("(\"'") if before else ""
                word = raw.lower()
                initial = re.fullmatch(r"[a-z]" if cased else r"[A-Z]", word if cased else raw)
                if word in _ABBREVIATIONS or initial or re.fullmatch(r"(?:[a-z]\.)+[a-z]", word):
                    continue
                if word.isdigit() and len(before) == 1:
                    continue
            end = m.start() + len(m.group(0).rstrip())
            spans.append((offset + start, offset + end))
            start = m.end()
        # Leading whitespace cannot occur in parsed FOLDOC text, but other callers may pass it.
        while start < len(paragraph) and paragraph[start].isspace():
            start += 1
        tail_end = len(paragraph.rstrip())
        if tail_end > start:
            spans.append((offset + start, offset + tail_end))
        offset += len(paragraph) + 1
    return spans


def split_sentences(text: str) -> list[str]:
    """The sentences of `text` as strings (see [`sentence_spans`] for the rule)."""
    return [text[start:end] for start, end in sentence_spans(text)]


__all__ = ["sentence_spans", "split_sentences"]
