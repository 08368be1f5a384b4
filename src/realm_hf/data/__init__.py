"""Corpora and question sets: Wikipedia's Vital Articles and their questions, FOLDOC parsing, the shipped FOLDOC extract, and link questions."""

from .foldoc import (
    load_foldoc,
    make_link_questions,
    parse_foldoc,
    parse_foldoc_entry,
    resolve_links,
    split_questions,
    split_sentences,
)
from .vital_questions import load_vital_questions
from .wikipedia import load_handwritten_questions, load_vital_articles, make_wikipedia_qa_task

__all__ = [
    "load_foldoc",
    "load_handwritten_questions",
    "load_vital_articles",
    "load_vital_questions",
    "make_wikipedia_qa_task",
    "make_link_questions",
    "parse_foldoc",
    "parse_foldoc_entry",
    "resolve_links",
    "split_questions",
    "split_sentences",
]
