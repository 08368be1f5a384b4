"""
The options of transformers' classic question-answering pipeline, as the REALM pipeline takes them: the ones with a
meaning for REALM are mapped to its own parameters, the others are refused with a `ValueError` saying why.
"""

from __future__ import annotations

#: Classic option -> the REALM pipeline's parameter of the same meaning.
CLASSIC_ALIASES = {
    # Longer questions are refused rather than truncated: a truncated question is a different question.
    "max_question_len": "max_question_length",
}

#: Classic options that mean nothing for REALM -> why, and what to do instead.
CLASSIC_REFUSED = {
    "max_seq_len": (
        "REALM reads (question, block) pairs of `config.reader_seq_len` wordpieces, the length its reader was trained "
        "on; a long `context` is read in windows of that length (`doc_stride` sets their overlap)"
    ),
    "padding": "the pipeline pads each batch itself",
    "topk": "use `top_k`",
}


def map_classic_options(kwargs: dict) -> dict:
    """
    `kwargs` with the classic options replaced by the REALM pipeline's own: `max_question_len` becomes
    `max_question_length`, `handle_impossible_answer=False` is dropped (REALM always answers from a read block, which
    is what it asks for), and the options in `CLASSIC_REFUSED`, and `handle_impossible_answer=True`, raise a
    `ValueError` naming the option and why. Unknown options are left for the caller to refuse.
    """
    kwargs = dict(kwargs)
    for name, reason in CLASSIC_REFUSED.items():
        if name in kwargs:
            raise ValueError(f"The REALM question-answering pipeline has no `{name}` option: {reason}.")
    if "handle_impossible_answer" in kwargs:
        if kwargs.pop("handle_impossible_answer"):
            raise ValueError(
                "The REALM question-answering pipeline has no `handle_impossible_answer=True`: REALM's reader scores "
                "no 'no answer' option, every answer is a span of a read block. Use the answers' `score` (the span "
                "probability) to reject unlikely answers."
            )
    for classic, own in CLASSIC_ALIASES.items():
        if classic in kwargs:
            if own in kwargs:
                raise ValueError(f"Give either `{classic}` or `{own}` (the same option), not both.")
            kwargs[own] = kwargs.pop(classic)
    return kwargs


__all__ = ["CLASSIC_ALIASES", "CLASSIC_REFUSED", "map_classic_options"]
