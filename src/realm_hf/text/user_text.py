"""
The rules for user text that every entry point shares: what a question may be, undecodable bytes, empty, unreadable
and over-long questions, and cutting training questions to length.

One place decides, and [`RealmForOpenQA.answer`], the question-answering pipeline, `realm-hf ask`, the Open-QA
collator and evaluation, and corpus building from documents all call it:

- A question is a `str`, or a `{"question": str}` dict (the pipeline also takes a `"context"` key). Anything else
  (bytes, numbers, `None`) is refused with an error naming its type.
- Text with undecodable bytes (lone surrogates, what `errors="surrogateescape"` makes of non-UTF-8 input, e.g. argv
  or stdin under a C locale, or a JSON `"\\udce9"` escape) is refused, questions and documents alike: replacing the
  bytes would answer (or index) a different text than the one given.
- An empty question, or one with no content wordpiece (only zero-width characters, emoji, punctuation, special tokens
  such as `[MASK]`, ...: it tokenizes to nothing, or only to `[UNK]`, punctuation and special tokens), is refused: the
  model would answer it confidently from noise. Training data follows the same rule ([`check_training_questions`]).
- A question longer than `max_question_length` wordpieces (or than the model's position embeddings take) is refused
  when answering (shorten it or raise the limit) and cut to the limit when training, as transformers' collators
  truncate.
- A count argument (`top_k`, `k`, `num_blocks`, `batch_size`, ...) is an integer (numpy integers too), never a `bool`
  or a float ([`check_positive_int`]).
"""

from __future__ import annotations

import numbers
import unicodedata
from collections.abc import Iterable, Mapping, Sequence

from .tokenizer_calls import tokenizer_call

#: How many bad questions one error message describes; the positions of the others are listed after them.
_MAX_LISTED = 5
#: How many further positions one error message lists before saying how to see every problem.
_MAX_POSITIONS = 100
# Prefixes that mark a wordpiece as a continuation (WordPiece, SentencePiece, byte-level BPE): not content.
_PIECE_MARKS = ("##", "\u2581", "\u0120")


def check_positive_int(value, name: str, minimum: int = 1) -> int:
    """
    `value` as an `int` when it is an integer (Python or numpy) of at least `minimum`, else a `ValueError` naming
    `name`. `True` and `2.7` are refused (they would silently mean 1 and 2).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer of at least {minimum}"
        raise ValueError(f"`{name}` must be {kind}, got {value!r}.")
    return int(value)


def undecodable_text_problem(text: str) -> str | None:
    """
    Why `text` cannot be used as Unicode text (it holds lone surrogates: bytes that were not valid UTF-8), or `None`.
    """
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        # What the user's bytes were, where errors="surrogateescape" made them into surrogates.
        near = text[max(0, err.start - 10) : err.end + 10]
        try:
            snippet = near.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:  # a surrogate that stands for no byte, e.g. from a JSON "\ud800" escape
            snippet = near.encode("utf-8", "backslashreplace")
        return (
            f"holds bytes that are not valid UTF-8 at character {err.start} (near {snippet!r}): re-encode the input "
            "as UTF-8 (e.g. `iconv -f latin1 -t utf-8`) or decode it with its own encoding before passing it"
        )
    return None


def check_text(text: str, what: str) -> None:
    """Refuse `text` with undecodable bytes with a `ValueError` that starts with `what` (e.g. `"Document 3's text"`)."""
    problem = undecodable_text_problem(text)
    if problem:
        raise ValueError(f"{what} {problem}.")


def question_example(item) -> dict:
    """
    One question input as `{"question": ..., "context": ...}`: a `str`, or a dict with `question` and an optional
    `context` (what the pipeline accepts). Anything else is refused with a `ValueError` naming its type.
    """
    if isinstance(item, str):
        return {"question": item, "context": None}
    if isinstance(item, Mapping):
        unknown = set(item) - {"question", "context"}
        if "question" not in item or unknown:
            raise ValueError(
                f"A question dict needs a `question` key and may have a `context` key; got keys {sorted(item)}."
            )
        return {"question": item["question"], "context": item.get("context")}
    hint = " Decode bytes first (`question.decode('utf-8')`)." if isinstance(item, (bytes, bytearray)) else ""
    raise ValueError(
        f"A question must be a string or a dict with `question` (and `context`), got {type(item).__name__}.{hint}"
    )


def _is_blank(text: str) -> bool:
    # Whitespace, control and format characters (NUL, zero-width spaces): the tokenizer drops every one of them.
    return all(char.isspace() or unicodedata.category(char) in ("Cc", "Cf") for char in text)


def check_context(context) -> None:
    """Refuse an empty, non-string or undecodable `context` (`None`, no context, passes)."""
    if context is None:
        return
    if not isinstance(context, str):
        hint = " (decode bytes first: `context.decode('utf-8')`)" if isinstance(context, (bytes, bytearray)) else ""
        raise ValueError(f"A context must be a string, got {type(context).__name__}{hint}.")
    if _is_blank(context):
        raise ValueError(f"Empty context {context[:20]!r}: give some text to answer from, or no context to retrieve.")
    check_text(context, "The context")


def as_question_list(questions) -> tuple[list[str], bool]:
    """
    The questions of [`RealmForOpenQA.answer`] as a list, and whether a single question was given: a `str`, a
    `{"question": ...}` dict, or an iterable of those. A `context` is refused: `answer()` always retrieves (read a given
    context with the pipeline, `qa(question=..., context=...)`).
    """
    single = isinstance(questions, (str, Mapping, bytes, bytearray))
    if not single and not isinstance(questions, Iterable):
        raise ValueError(
            f"`questions` must be a string, a {{'question': ...}} dict or a list of them, got "
            f"{type(questions).__name__}."
        )
    items = [questions] if single else list(questions)
    texts = []
    for position, item in enumerate(items):
        if not isinstance(item, Mapping):
            texts.append(item)  # strings, and other types for `check_questions` to name with the other problems
            continue
        try:
            example = question_example(item)
        except ValueError as err:
            raise ValueError(f"questions[{position}]: {err}" if not single else str(err)) from None
        if example["context"] is not None:
            raise ValueError(
                "`answer()` retrieves from the corpus and takes no `context`: to read a given context use the "
                "pipeline, `realm_hf.pipeline('question-answering', model=model)(question=..., context=...)`."
            )
        texts.append(example["question"])
    return texts, single


def _text_problem(question) -> str | None:
    if not isinstance(question, str):
        hint = " (decode bytes first)" if isinstance(question, (bytes, bytearray)) else ""
        return f"A question must be a string, got {type(question).__name__}{hint}"
    if not question.strip():
        return f"Empty question {question!r}: every question needs some text"
    problem = undecodable_text_problem(question)
    return f"The question {problem}" if problem else None


def question_text_problems(questions: Sequence) -> list[tuple[int, str]]:
    """`(position, reason)` of every question that is not a non-empty, decodable string (no tokenizer needed)."""
    return [(i, problem) for i, question in enumerate(questions) if (problem := _text_problem(question))]


def _is_content_piece(token: str) -> bool:
    for mark in _PIECE_MARKS:
        if token.startswith(mark):
            token = token[len(mark) :]
            break
    # Punctuation (P*) and symbols (S*) alone say nothing to retrieve or read with.
    return any(unicodedata.category(char)[0] not in "PSZC" for char in token)


def _content_problem(question: str, ids: list[int], tokenizer) -> str | None:
    """Why the wordpieces `ids` of `question` hold no content word, or `None` (at least one wordpiece is content)."""
    unk = getattr(tokenizer, "unk_token_id", None)
    special = set(getattr(tokenizer, "all_special_ids", None) or []) | {unk}
    candidates = [t for t in ids if t not in special]
    if candidates and hasattr(tokenizer, "convert_ids_to_tokens"):
        tokens = tokenizer.convert_ids_to_tokens(candidates)
        candidates = [
            t for t, token in zip(candidates, tokens) if not isinstance(token, str) or _is_content_piece(token)
        ]
    if candidates:
        return None
    if not any(t != unk for t in ids):
        what = f"only {len(ids)} unknown wordpiece(s) ([UNK])" if ids else "no wordpieces at all"
        return (
            f"The question {question[:60]!r} has no word the model's vocabulary knows (it tokenizes to {what}): it "
            "would be answered from noise. Ask it with words"
        )
    return (
        f"The question {question[:60]!r} has no content word the model's vocabulary knows (it tokenizes only to "
        "punctuation, special tokens such as [MASK] and [UNK]): it would be answered from noise. Ask it with words"
    )


def question_content_problems(questions: Sequence, tokenizer) -> list[tuple[int, str]]:
    """
    `(position, reason)` of every question that is not a non-empty, decodable string, or that has no content
    wordpiece (only `[UNK]`, punctuation and special tokens): the rule for training data, where over-long questions
    are cut instead of refused. One tokenizer call for the list.
    """
    problems = question_text_problems(questions)
    bad = {i for i, _ in problems}
    good = [i for i in range(len(questions)) if i not in bad]
    if good:
        encoded = tokenizer_call(tokenizer, [questions[i] for i in good], add_special_tokens=False)["input_ids"]
        problems += [
            (i, content)
            for i, ids in zip(good, encoded)
            if (content := _content_problem(questions[i], ids, tokenizer)) is not None
        ]
    return sorted(problems)


def question_problems(
    questions: Sequence, tokenizer, max_question_length: int, max_positions: int | None = None
) -> list[tuple[int, str]]:
    """
    `(position, reason)` of every question that cannot be answered, in order: not a string, empty, undecodable bytes,
    no known wordpiece (only `[UNK]` or nothing), or longer than `max_question_length` wordpieces or than the model's
    `max_positions` (`config.max_position_embeddings`, less `[CLS]` and `[SEP]`). One tokenizer call for the list.
    """
    check_max_question_length(max_question_length)
    # [CLS] question [SEP] must fit the question embedder's position embeddings, whatever the parameter says.
    model_limit = max_positions - 2 if max_positions is not None else None
    problems = question_text_problems(questions)
    bad = {i for i, _ in problems}
    good = [i for i in range(len(questions)) if i not in bad]
    if good:
        encoded = tokenizer_call(tokenizer, [questions[i] for i in good], add_special_tokens=False)["input_ids"]
        for i, ids in zip(good, encoded):
            if (content := _content_problem(questions[i], ids, tokenizer)) is not None:
                problems.append((i, content))
            elif model_limit is not None and len(ids) > model_limit and model_limit < max_question_length:
                problems.append(
                    (
                        i,
                        f"Question of {len(ids)} wordpieces is longer than the limit of {model_limit} the model "
                        f"takes (config.max_position_embeddings={max_positions} less [CLS] and [SEP]) "
                        f"({questions[i][:60]!r}...): shorten it",
                    )
                )
            elif len(ids) > max_question_length:
                problems.append(
                    (
                        i,
                        f"Question of {len(ids)} wordpieces is longer than the limit of {max_question_length} "
                        f"({questions[i][:60]!r}...): shorten it or raise `max_question_length`",
                    )
                )
    return sorted(problems)


def check_questions(
    questions: Sequence, tokenizer, max_question_length: int, max_positions: int | None = None
) -> None:
    """
    Refuse a list of questions before any model work when one of them cannot be answered ([`question_problems`]),
    with a `ValueError` that names each bad question's position (`questions[i]`) and says what to do.
    """
    if not questions:
        raise ValueError("No questions given.")
    problems = question_problems(questions, tokenizer, max_question_length, max_positions)
    if not problems:
        return
    if len(questions) == 1:
        raise ValueError(f"{problems[0][1]}.")
    listed = "; ".join(f"questions[{i}]: {reason}" for i, reason in problems[:_MAX_LISTED])
    raise ValueError(
        f"{len(problems)} of {len(questions)} questions cannot be answered, so none was: {listed}"
        f"{more_problems(problems, 'questions[{}]')}. Fix or drop them and ask again."
    )


def more_problems(problems: Sequence[tuple[int, str]], name: str) -> str:
    """
    The tail of an error message that describes the first `_MAX_LISTED` of `problems`: where the others are (`name`
    formats a position, e.g. `"questions[{}]"`), and, past `_MAX_POSITIONS`, how to list every one.
    """
    rest = [i for i, _ in problems[_MAX_LISTED:]]
    if not rest:
        return ""
    shown = ", ".join(name.format(i) for i in rest[:_MAX_POSITIONS])
    tail = (
        f" and {len(rest) - _MAX_POSITIONS} more (`realm_hf.text.user_text.question_problems(questions, tokenizer, "
        "max_question_length)` lists every problem)"
        if len(rest) > _MAX_POSITIONS
        else ""
    )
    return f"; also bad: {shown}{tail}"


def check_max_question_length(max_question_length) -> None:
    """Refuse a `max_question_length` that is not a positive integer."""
    check_positive_int(max_question_length, "max_question_length")


def truncate_questions(questions: Sequence[str], tokenizer, max_question_length: int) -> tuple[list[str], list[int]]:
    """
    Cut questions longer than `max_question_length` wordpieces to their first `max_question_length` wordpieces (as
    text, so the reader sees the same question as the question embedder). Returns `(questions, truncated positions)`.
    """
    check_max_question_length(max_question_length)
    questions = list(questions)
    if not questions:
        return [], []
    fast = getattr(tokenizer, "is_fast", False)
    encoded = tokenizer_call(tokenizer, questions, add_special_tokens=False, return_offsets_mapping=fast)
    truncated = []
    for i, ids in enumerate(encoded["input_ids"]):
        if len(ids) <= max_question_length:
            continue
        if fast:
            questions[i] = questions[i][: encoded["offset_mapping"][i][max_question_length - 1][1]]
        else:
            questions[i] = tokenizer.decode(ids[:max_question_length])
        truncated.append(i)
    return questions, truncated


__all__ = [
    "as_question_list",
    "check_context",
    "check_max_question_length",
    "check_positive_int",
    "check_questions",
    "check_text",
    "more_problems",
    "question_example",
    "question_content_problems",
    "question_problems",
    "question_text_problems",
    "truncate_questions",
    "undecodable_text_problem",
]
