"""
REALM's salient spans (Guu et al. 2020, section 3.4), found by rule so that no NER model is needed offline: dates and
numbers ([`find_dates_and_numbers`]) and names, runs of capitalised words ([`salient_spans`]). Pre-training masks
them, the reader warm-up and the Wikipedia questions blank them.
"""

from __future__ import annotations

import re

_MONTH = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|Sep(?:t(?:ember)?)?"
    r"|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)\.?"
)
_DAY = r"\d{1,2}(?:st|nd|rd|th)?"
# Alternatives in priority order: at a given position the regex engine takes the first that matches, so a full
# date wins over its day or year alone.
_DATE_NUMBER = re.compile(
    "|".join(
        [
            r"\b\d{4}-\d{2}-\d{2}\b",  # 1990-03-12
            rf"\b{_DAY}\s+{_MONTH},?\s+\d{{4}}\b",  # 12 March 1990
            rf"\b{_MONTH}\s+{_DAY},?\s+\d{{4}}\b",  # March 12, 1990
            rf"\b{_MONTH},?\s+\d{{4}}\b",  # March 1990
            rf"\b{_DAY}\s+{_MONTH}(?!\w)",  # 12 March
            rf"\b{_MONTH}\s+{_DAY}\b",  # March 12
            r"\b\d{4}s\b",  # 1990s
            # Numbers: not glued to a word or to a preceding "." (so "v2.0.1" yields nothing, not "0.1").
            r"(?<![\w.])\d{1,3}(?:,\d{3})+(?:\.\d+)?%?(?!\w)",  # 1,234,567.5
            r"(?<![\w.])\d+(?:\.\d+)+%?(?!\w)",  # 3.14, 2.0.1
            r"(?<![\w.])\d{2,}%?(?!\w)",  # 1984, 80386, 16 (single digits are mostly list markers and counts)
        ]
    )
)


def find_dates_and_numbers(text: str) -> list[tuple[int, int]]:
    """
    Find dates and numbers in a text by pattern: full dates ("12 March 1990", "March 12, 1990", "1990-03-12"),
    month and year ("March 1990"), day and month ("12 March"), decades ("1990s"), numbers with thousands separators
    or decimals ("1,234", "3.14", "2.0.1"), and integers of two or more digits (years such as "1984", model numbers
    such as "80386"). Digits glued to letters ("i386", "Z80") are part of a name, not a number, and are skipped.

    Args:
        text (`str`): The text.

    Returns:
        `list[tuple[int, int]]`: Non-overlapping `(start, end)` character spans, in text order.

    Example:

    ```python
    >>> text = "Released on 12 March 1990 for $1,299.99 on the 80386."
    >>> [text[s:e] for s, e in find_dates_and_numbers(text)]
    ['12 March 1990', '1,299.99', '80386']
    ```
    """
    return [(m.start(), m.end()) for m in _DATE_NUMBER.finditer(text)]


# A capitalised word (letters, digits, apostrophes, inner hyphens/periods as in "St." or "Jean-Paul").
_CAP_WORD = r"[A-Z][\w'’.-]*\w|[A-Z]"
# A name: capitalised words, possibly joined by "of", "de", "the", ... ("Museum of Modern Art", "Leonardo da Vinci").
_NAME = re.compile(
    rf"(?<![\w'’-])(?:{_CAP_WORD})(?:\s+(?:(?:of|de|da|del|der|di|du|la|le|van|von|the|bin|ibn|al)\s+)?(?:{_CAP_WORD}))*"
    r"(?![\w'’-])"
)


def salient_spans(sentence: str) -> list[tuple[int, int]]:
    """
    REALM's salient spans of a sentence, found by rule (no NER model is needed offline): dates and numbers
    ([`find_dates_and_numbers`]) and names (runs of capitalised words, the sentence's first word excluded unless it
    continues into a name). Non-overlapping, in text order.
    """
    spans = list(find_dates_and_numbers(sentence))
    first_word_end = len(sentence) - len(sentence.lstrip()) + len((sentence.split() or [""])[0])
    for m in _NAME.finditer(sentence):
        start, end = m.start(), m.end()
        if start < first_word_end:
            # The sentence's first word is capitalised anyway: a name only when more capitalised words follow it.
            rest = _NAME.match(sentence, first_word_end + 1) if first_word_end < end else None
            if rest is None or rest.start() != first_word_end + 1:
                continue
        text = sentence[start:end].rstrip(".")
        end = start + len(text)
        if end > start and not any(s < end and start < e for s, e in spans):
            spans.append((start, end))
    return sorted(spans)


__all__ = ["find_dates_and_numbers", "salient_spans"]
