"""
The question sets written by hand about Wikipedia's Level-4 Vital Articles, and the rules every question keeps.

Three splits, one JSON object per line (`{"question", "answers", "title", "kind"}`), each over its own articles of the
main job's article split ([`make_wikipedia_qa_task`] with seed 0):

- `train`: questions over training articles, for Open-QA fine-tuning (`vital_articles_questions_train.jsonl`);
- `dev`: questions over held-out articles, on which every training choice is made (`vital_articles_questions_dev.jsonl`);
- `test`: the 225 questions written first, report-only, never trained or tuned on (`vital_articles_questions.jsonl`).

`kind` is what the answer is: `"title"` (the article's own subject) or, for an answer found inside its text, one of
`"person"`, `"place"`, `"organisation"`, `"date"`, `"number"`, `"work"`, `"thing"`. `data/vital_articles_questions.md`
says how the sets were written; `scripts/check_vital_questions.py` checks every rule against the corpus and the split.
The rules live here, free of torch, so the script, the tests and the loaders share them.
"""

from __future__ import annotations

import collections
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from ..io.json_lines import json_lines
from ..metrics import has_answer, normalize_answer

__all__ = [
    "ANSWER_KINDS",
    "QUESTION_FORMS",
    "SPLITS",
    "answer_kind_problem",
    "check_question_set",
    "load_vital_questions",
    "longest_shared_run",
    "question_form",
    "question_problems",
    "title_names",
]

_DATA = Path(__file__).parent
SPLIT_PATHS = {
    "train": str(_DATA / "vital_articles_questions_train.jsonl"),
    "dev": str(_DATA / "vital_articles_questions_dev.jsonl"),
    "test": str(_DATA / "vital_articles_questions.jsonl"),
}
SPLITS = tuple(SPLIT_PATHS)
ANSWER_KINDS = ("title", "person", "place", "organisation", "date", "number", "work", "thing")
IN_TEXT_KINDS = ANSWER_KINDS[1:]
#: The longest run of consecutive words a question may share with its article: 5 (a run of 6 is copying).
MAX_SHARED_RUN = 5
MAX_ANSWER_WORDS = 5
MIN_QUESTION_WORDS, MAX_QUESTION_WORDS = 3, 30
#: Forms every written set must use (people ask in all of them), and the largest share one form may take.
REQUIRED_FORMS = ("who", "what", "when", "where", "which", "how many", "how long", "phrase")
MAX_FORM_SHARE = 0.4
#: A topic of the corpus must get at least this fraction of its share of the articles.
MIN_TOPIC_SHARE_RATIO = 1 / 3
# Words that give away a question written while looking at a page rather than asked by a person.
_PAGE_WORDS = re.compile(
    r"\b(article|passage|summary|paragraph|text above|mentioned above|according to the (text|article|summary))\b"
    r"|_{2,}",
    re.IGNORECASE,
)
_PARENTHETICAL = re.compile(r"\s*\([^()]*\)\s*$")
_MONTHS = (
    "january february march april may june july august september october november december "
    "jan feb mar apr jun jul aug sep sept oct nov dec century centuries bc bce ad ce millennium decade"
).split()
_NUMBER_WORDS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand million "
    "billion trillion dozen half third quarter first second"
).split()

# The form of a question: its question word(s), or "phrase" for a search-box phrase without one.
QUESTION_FORMS = (
    "how many",
    "how much",
    "how long",
    "how old",
    "how",
    "who",
    "whom",
    "whose",
    "what",
    "when",
    "where",
    "which",
    "why",
    "in what",
    "in which",
    "yes/no",
    "phrase",
)
_FORM_PATTERN = re.compile(
    r"\b(how many|how much|how long|how old|how far|how big|how tall|how high|how deep|how large|how|who|whom|whose"
    r"|what|when|where|which|why)\b",
    re.IGNORECASE,
)
_YES_NO_START = re.compile(r"^(is|are|was|were|do|does|did|can|could|has|have|had)\b", re.IGNORECASE)


def title_names(title: str) -> list[str]:
    """The names an article is known by in text: its title, and the title without a parenthetical qualifier."""
    names = [title]
    bare = _PARENTHETICAL.sub("", title).strip()
    if bare and bare != title:
        names.append(bare)
    return names


def load_vital_questions(split: str = "train", path: str | os.PathLike | None = None) -> list[dict]:
    """
    A shipped question set about the Vital Articles: `question`, `answers`, the `title` of the article that holds the
    answer and `kind` (what the answer is: `"title"` or the type of an in-text answer; the `test` split's questions
    have `kind` `"handwritten"`).

    Args:
        split (`str`, *optional*, defaults to `"train"`): `"train"` (for fine-tuning), `"dev"` (for every training
            choice) or `"test"` (the 225 report-only questions: never train or tune on them).
        path (`str` or `os.PathLike`, *optional*): A file of the same format instead of the shipped one.

    Raises:
        `ValueError`: for an unknown split, or a line that is not such a question (named with file and line).
    """
    if split not in SPLIT_PATHS:
        raise ValueError(f"Unknown split {split!r}: use one of {list(SPLITS)}.")
    path = SPLIT_PATHS[split] if path is None else os.fspath(path)
    questions = []
    with open(path, encoding="utf-8") as f:
        for number, record in json_lines(f, path):
            problem = record_problem(record, need_kind=split != "test")
            if problem:
                raise ValueError(f"{path}, line {number}: {problem}.")
            kind = "handwritten" if split == "test" else record["kind"]
            questions.append({**record, "kind": kind})
    if not questions:
        raise ValueError(
            f"{path} holds no questions: write one JSON object per line with `question`, `answers` and `title`."
        )
    return questions


def record_problem(record, need_kind: bool = True) -> str | None:
    """Why `record` is not a question record (`question`, a non-empty `answers` list and the `title` of the article
    holding the answer, all text, and with `need_kind` a known `kind`), or `None`."""
    if not isinstance(record, dict):
        return f"expected a JSON object with `question`, `answers` and `title`, got {type(record).__name__}"
    for key in ("question", "title"):
        if not isinstance(record.get(key), str) or not record[key].strip():
            return f"`{key}` must be non-empty text, got {record.get(key)!r}"
    answers = record.get("answers")
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a.strip() for a in answers):
        return f"`answers` must be a non-empty list of non-empty strings, got {answers!r}"
    if need_kind and record.get("kind") not in ANSWER_KINDS:
        return f"`kind` must be one of {list(ANSWER_KINDS)}, got {record.get('kind')!r}"
    return None


def question_form(question: str) -> str:
    """
    The form of a question: `"how many"`, `"who"`, `"which"`, ... (its first question word, or `"in which"` /
    `"in what"` when a preposition leads it), `"yes/no"`, or `"phrase"` for a search-box phrase without one
    ("tallest mountain in africa").
    """
    text = question.strip().lower()
    match = _FORM_PATTERN.search(text)
    if match is None:
        return "yes/no" if _YES_NO_START.match(text) and text.endswith("?") else "phrase"
    word = match.group(1).lower()
    if word.startswith("how ") and word not in QUESTION_FORMS:
        word = "how"
    before = text[: match.start()].split()
    # "In which year ...", "on what day ...": a preposition opening the question.
    if word in ("what", "which") and len(before) == 1 and before[0] in ("in", "on", "at", "from", "to", "by", "for"):
        return f"in {word}"
    return word


def _words(text: str) -> list[str]:
    return normalize_answer(text).split()


def longest_shared_run(question: str, text: str) -> int:
    """The longest run of consecutive words (SQuAD-normalised) that `question` shares with `text`."""
    q, t = _words(question), _words(text)
    if not q or not t:
        return 0
    # Longest common substring over words, by dynamic programming over the question's words (questions are short).
    best, previous = 0, [0] * (len(q) + 1)
    for word in t:
        current = [0] * (len(q) + 1)
        for j, q_word in enumerate(q, 1):
            if q_word == word:
                current[j] = previous[j - 1] + 1
                best = max(best, current[j])
        previous = current
    return best


def answer_kind_problem(kind: str, answers: Sequence[str], title: str) -> str | None:
    """Why `kind` does not describe `answers` for the article `title`, or `None`: `"title"` answers name the
    article; in-text answers do not, dates and numbers carry a digit or a number word."""
    names = {normalize_answer(n) for n in title_names(title)}
    is_title = any(normalize_answer(a) in names for a in answers)
    if kind == "title":
        return None if is_title else f"kind 'title' but no answer is the title {title!r}"
    if is_title:
        return f"an answer is the article's title {title!r}: kind must be 'title', got {kind!r}"
    if kind in ("date", "number"):
        words = set(normalize_answer(" ".join(answers)).split())
        if not any(ch.isdigit() for ch in "".join(answers)) and not words & set(_MONTHS + _NUMBER_WORDS):
            return f"kind {kind!r} but no answer has a digit or a {kind} word: {list(answers)}"
    return None


def question_problems(
    record: Mapping,
    article_text: str,
    full_text: str | None = None,
    kind: bool = True,
    max_shared_run: int | None = MAX_SHARED_RUN,
) -> list[str]:
    """
    Every rule one question breaks, as messages (empty when it keeps them all):

    - `question`, `answers`, `title` (and `kind`) are well formed; answers have at most 5 words, the question 3 to 30;
    - every answer occurs (SQuAD-normalised, whole words) in `article_text`, the article as the corpus holds it;
    - the question contains none of its answers, and a `"title"` question not the title either;
    - `kind` fits the answers ([`answer_kind_problem`]);
    - the question shares no run of more than `max_shared_run` (5) consecutive words with the article (`full_text`,
      default `article_text`): written, not copied (`None`: not checked, for the `test` set written before the rule);
    - it reads as a person's question, not a note about a page ("according to the article", a `___` blank).
    """
    problem = record_problem(record, need_kind=kind)
    if problem:
        return [problem]
    question, answers, title = record["question"], record["answers"], record["title"]
    problems = []
    n_words = len(question.split())
    if not MIN_QUESTION_WORDS <= n_words <= MAX_QUESTION_WORDS:
        problems.append(f"the question has {n_words} words (keep {MIN_QUESTION_WORDS} to {MAX_QUESTION_WORDS})")
    for answer in answers:
        if len(answer.split()) > MAX_ANSWER_WORDS:
            problems.append(f"answer {answer!r} is longer than {MAX_ANSWER_WORDS} words")
        if not has_answer(article_text, [answer]):
            problems.append(f"answer {answer!r} does not occur in the text of {title!r}")
    if has_answer(question, answers):
        problems.append("the question contains its answer")
    if kind:
        if record["kind"] == "title" and has_answer(question, title_names(title)):
            problems.append(f"the question names its answer, the title {title!r}")
        kind_problem = answer_kind_problem(record["kind"], answers, title)
        if kind_problem:
            problems.append(kind_problem)
    run = longest_shared_run(question, article_text if full_text is None else full_text)
    if max_shared_run is not None and run > max_shared_run:
        problems.append(f"the question copies {run} consecutive words of the article (at most {max_shared_run})")
    if _PAGE_WORDS.search(question):
        problems.append("the question speaks of a page ('article', 'passage', a blank), not of the world")
    return problems


def check_question_set(
    questions: Sequence[Mapping],
    articles: Mapping[str, Mapping],
    allowed_titles: Iterable[str],
    other_questions: Iterable[str] = (),
    min_questions: int = 0,
    min_in_text_share: float = 0.6,
    kind: bool = True,
    spread: bool = True,
    max_shared_run: int | None = MAX_SHARED_RUN,
) -> tuple[list[str], dict]:
    """
    Check a question set: every question's rules ([`question_problems`]) and the set's own.

    Args:
        questions (`Sequence[Mapping]`): The records.
        articles (`Mapping[str, Mapping]`): Every article of the corpus by title: `text` (as the corpus holds it),
            optionally `full_text` (the whole summary) and `topic`.
        allowed_titles (`Iterable[str]`): The articles this set may ask about (its side of the article split).
        other_questions (`Iterable[str]`): Questions of the other sets: none may be asked again here.
        min_questions (`int`, *optional*, defaults to 0): The smallest size the set may have.
        min_in_text_share (`float`, *optional*, defaults to 0.6): The least share of in-text answers (with `kind`).
        kind (`bool`, *optional*, defaults to `True`): Whether the records carry `kind` (the test split's do not).
        spread (`bool`, *optional*, defaults to `True`): Whether the set must be spread over forms and topics: every
            form of `REQUIRED_FORMS` used, none above `MAX_FORM_SHARE`, and every topic of the allowed articles given
            at least `MIN_TOPIC_SHARE_RATIO` of its share of them.
        max_shared_run (`int`, *optional*, defaults to 5): See [`question_problems`].

    Returns:
        `(problems, report)`: messages naming the line (1-based) and the rule, and counts by topic, kind and form.
    """
    allowed = set(allowed_titles)
    seen = {normalize_answer(q): "another set" for q in other_questions}
    problems: list[str] = []
    topics, kinds, forms = collections.Counter(), collections.Counter(), collections.Counter()
    per_article = collections.Counter()
    for line, record in enumerate(questions, 1):
        title = record.get("title") if isinstance(record, Mapping) else None
        article = articles.get(title) if isinstance(title, str) else None
        if article is None:
            problems.append(f"line {line}: unknown article {title!r}")
            continue
        if title not in allowed:
            problems.append(f"line {line}: {title!r} is not an article of this split")
        for problem in question_problems(
            record, article["text"], article.get("full_text"), kind=kind, max_shared_run=max_shared_run
        ):
            problems.append(f"line {line}: {problem}")
        key = normalize_answer(str(record.get("question", "")))
        if key in seen:
            problems.append(f"line {line}: the question is asked twice (also {seen[key]}): {record.get('question')!r}")
        seen.setdefault(key, f"line {line}")
        topics[article.get("topic") or "Uncategorized"] += 1
        kinds[record.get("kind", "handwritten")] += 1
        forms[question_form(str(record.get("question", "")))] += 1
        per_article[title] += 1
    if len(questions) < min_questions:
        problems.append(f"the set has {len(questions)} questions, fewer than {min_questions}")
    in_text = sum(n for k, n in kinds.items() if k in IN_TEXT_KINDS)
    if kind and questions and in_text / len(questions) < min_in_text_share:
        problems.append(
            f"{in_text / len(questions):.0%} of the answers are in-text, fewer than {min_in_text_share:.0%}"
        )
    if spread and questions:
        problems += _spread_problems(forms, topics, len(questions), [articles[t] for t in allowed if t in articles])
    report = {
        "questions": len(questions),
        "articles": len(per_article),
        "in_text_share": in_text / max(1, len(questions)),
        "kinds": dict(kinds.most_common()),
        "forms": dict(forms.most_common()),
        "topics": dict(topics.most_common()),
    }
    return problems, report


def _spread_problems(forms: collections.Counter, topics: collections.Counter, total: int, allowed: list) -> list[str]:
    problems = [f"no question of the form {form!r}" for form in REQUIRED_FORMS if not forms[form]]
    problems += [
        f"{count / total:.0%} of the questions are of the form {form!r} (at most {MAX_FORM_SHARE:.0%})"
        for form, count in forms.items()
        if count / total > MAX_FORM_SHARE
    ]
    corpus = collections.Counter(article.get("topic") or "Uncategorized" for article in allowed)
    for topic, count in corpus.items():
        share, wanted = topics[topic] / total, MIN_TOPIC_SHARE_RATIO * count / len(allowed)
        if share < wanted:
            problems.append(f"topic {topic!r} has {share:.1%} of the questions, fewer than {wanted:.1%}")
    return problems
