"""Answers of the REALM question-answering pipeline: the best distinct spans across the blocks read for a question.

The code lives in [`realm_hf.openqa_answers`], which `RealmForOpenQA.answer(top_k=...)` shares; re-exported here.
"""

from __future__ import annotations

from ..openqa_answers import _align_to_words, _best_spans, _normalize_text  # noqa: F401 - re-exported
