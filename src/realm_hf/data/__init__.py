"""Corpora and question sets: FOLDOC parsing, the shipped FOLDOC extract, and link questions."""

from .foldoc import (
    load_foldoc,
    make_link_questions,
    parse_foldoc,
    parse_foldoc_entry,
    resolve_links,
    split_questions,
    split_sentences,
)

__all__ = [
    "load_foldoc",
    "make_link_questions",
    "parse_foldoc",
    "parse_foldoc_entry",
    "resolve_links",
    "split_questions",
    "split_sentences",
]
