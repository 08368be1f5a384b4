"""FOLDOC, the Free On-line Dictionary of Computing (Denis Howe, https://foldoc.org/, GFDL 1.1 or later).

Parses the dictd files of Debian's `dict-foldoc` package into entries with plain-text definitions and character
offsets of their `{cross-references}`, loads the compact extract shipped with realm-hf when the package is not
installed, and turns cross-references into cloze-style questions for Open-QA fine-tuning.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..io.atomic import atomic_write
from ..io.json_lines import json_lines
from ..metrics import has_answer, normalize_answer
from ..text.sentences import sentence_spans

__all__ = [
    "DEFAULT_DICT_PATH",
    "DEFAULT_INDEX_PATH",
    "EXTRACT_PATH",
    "QUESTION_TEMPLATE",
    "decode_dictd_number",
    "load_foldoc",
    "make_cross_document_task",
    "make_link_questions",
    "parse_foldoc",
    "parse_foldoc_entry",
    "read_dictd_index",
    "resolve_links",
    "split_questions",
    "split_sentences",
    "truncate_entry",
    "write_foldoc_jsonl",
]


def split_sentences(text: str) -> list[tuple[int, int]]:
    """
    FOLDOC's sentences: `(start, end)` character spans by the package's sentence rule in its cased form
    ([`~realm_hf.text.sentences.sentence_spans`] with `cased=True`: an end needs a capital letter or a digit after it).
    """
    return sentence_spans(text, cased=True)


DEFAULT_DICT_PATH = "/usr/share/dictd/foldoc.dict.dz"
DEFAULT_INDEX_PATH = "/usr/share/dictd/foldoc.index"
#: The extract shipped in the package (see `scripts/make_foldoc_extract.py` and `FOLDOC_LICENSE.md`).
EXTRACT_PATH = str(Path(__file__).with_name("foldoc_extract.jsonl.gz"))

#: Default question form of [`make_link_questions`]: the entry title, then the sentence with the linked term blanked.
QUESTION_TEMPLATE = "{title}: {cloze}"
BLANK = "___"

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_B64_VALUE = {c: i for i, c in enumerate(_B64)}

# Markers threaded through whitespace clean-up so link offsets can be read off the final text. They are private-use
# characters that FOLDOC does not contain; the record index rides in a supplementary private-use character.
_LINK_START = "\ue000"
_LINK_END = "\ue001"
_RECORD_BASE = 0xF0000
_MARKERS = re.compile(f"{_LINK_START}(.)|{_LINK_END}", flags=re.S)

_BRACES = re.compile(r"\{([^{}]*)\}")
_URL = re.compile(r"^(?:[a-z][a-z0-9+.\-]*:|/)|\.html?$", flags=re.I)
_BARE_URL = re.compile(r"^(?:news|mailto|https?|ftp|telnet|gopher|img|rfc):\S+$", flags=re.I)
_EXTERNAL = re.compile(r"(.*?)\(((?:[a-z][a-z0-9+.\-]*:|/)\S*)\)", flags=re.I | re.S)
_DISPLAY_TARGET = re.compile(r"(.+?)\s+\(([^()]+)\)")
_DATE_PARAGRAPH = re.compile(r"\((\d{4}-\d{2}-\d{2})\)")
_CATEGORY = re.compile(r"^(\d+\.\s*)?<([a-z][a-z0-9 ,/&'\-]*)>\s*")
_BLANK_LINE = re.compile(r"\n[ \t]*\n")
_DEBIAN_MARKER = "Dictionary.debian"


def decode_dictd_number(value: str) -> int:
    """
    Decode a dictd index number (offset or length), written in base 64 with the alphabet `A-Za-z0-9+/`.

    Args:
        value (`str`): The encoded number, e.g. `"Gb9L"`.

    Returns:
        `int`
    """
    number = 0
    for ch in value:
        number = number * 64 + _B64_VALUE[ch]
    return number


def read_dictd_index(index_path: str | os.PathLike) -> list[tuple[str, int, int]]:
    """
    Read a dictd `.index` file: one `headword<TAB>offset<TAB>length` line per headword (several headwords may share
    an entry).

    Args:
        index_path (`str` or `os.PathLike`): Path of the `.index` file.

    Returns:
        `list[tuple[str, int, int]]`: `(headword, byte offset, byte length)` rows in file order.
    """
    rows = []
    with open(index_path, encoding="utf-8") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 3:
                continue
            rows.append((parts[0], decode_dictd_number(parts[1]), decode_dictd_number(parts[2])))
    return rows


def _read_dict_bytes(dict_path: str | os.PathLike) -> bytes:
    # `.dict.dz` is dictzip, a gzip variant that gzip reads whole; plain `.dict` files are uncompressed.
    with open(dict_path, "rb") as f:
        magic = f.read(2)
    opener = gzip.open if magic == b"\x1f\x8b" else open
    with opener(dict_path, "rb") as f:
        return f.read()


def _classify_braces(inner: str) -> tuple[str, str, str | None] | None:
    """Return `(kind, display, target_or_url)` for a `{...}` group, or None when the braces are literal."""
    flat = " ".join(inner.split())
    if not flat:
        return None
    external = _EXTERNAL.fullmatch(flat)
    # Line-wrapped external links sometimes hold a whitespace-only line, so they may span a "blank" line.
    if external and len(external.group(1)) <= 300:
        # {display (http://...)} or {(http://...)}: external links may have long titles with any punctuation.
        display, url = external.group(1).strip(), external.group(2)
        if not display:
            rfc = re.fullmatch(r"rfc:(\d+)", url, flags=re.I)
            display = f"RFC {rfc.group(1)}" if rfc else url
        return "external", display, url
    # Code samples and set notation ({x | P x}, { f(x) : x in S }) also use braces: cross-references never span a
    # blank line, start or end with whitespace or contain these characters.
    if (
        _BLANK_LINE.search(inner)
        or inner != inner.strip()
        or any(ch in inner for ch in "|;={}")
        or re.search(r":\s", inner)
        or len(flat) > 120
    ):
        return None
    if _BARE_URL.match(flat):
        return "external", flat, flat
    match = _DISPLAY_TARGET.fullmatch(flat)
    if match:
        display, target = match.group(1), match.group(2).strip()
        if _URL.search(target):
            return "external", display, target
        # {loops (loop)}: display text, then the entry it points to.
        return "internal", display, target
    return "internal", flat, flat


def parse_foldoc_entry(raw: str, strip_categories: bool = True) -> dict | None:
    """
    Parse the raw dictd text of one FOLDOC entry.

    The raw text has headword lines (the title, then aliases) up to the first blank line, then the indented
    definition, with cross-references written `{term}`, `{display text (target entry)}`, `{display (URL)}` or
    `{(URL)}`, sense tags such as `<hardware>` and a trailing `(YYYY-MM-DD)` date line.

    Args:
        raw (`str`): The entry text as stored in the `.dict` file.
        strip_categories (`bool`, *optional*, defaults to `True`):
            Move the `<category>` tags that open a paragraph (or a numbered sense) out of the text into
            `categories`.

    Returns:
        `dict` or `None` (for an entry with no headword): `title` (`str`), `aliases` (`list[str]`), `categories`
        (`list[str]`), `text` (`str`: paragraphs joined by newlines, whitespace collapsed, braces removed), `links`
        (`list[dict]`: cross-references to other entries, with `start`/`end` character offsets into `text`, `term`
        (`== text[start:end]`), `target` (the entry name it points to) and `target_title` (None until
        [`resolve_links`])), `external_links` (`list[dict]`: `start`, `end`, `url`) and `date` (`str` or None).
    """
    raw = raw.replace("\r\n", "\n").strip("\n")
    match = _BLANK_LINE.search(raw)
    header, body = (raw[: match.start()], raw[match.end() :]) if match else (raw, "")
    names = []
    for line in header.split("\n"):
        # The database's own introduction lists its synonyms on one line separated by "%%%".
        for name in line.split("%%%"):
            name = " ".join(name.split())
            if name and name not in names:
                names.append(name)
    if not names:
        return None

    records: list[tuple[str, str | None]] = []

    def replace(m: re.Match) -> str:
        classified = _classify_braces(m.group(1))
        if classified is None:
            return m.group(0)
        kind, display, target = classified
        records.append((kind, target))
        return f"{_LINK_START}{chr(_RECORD_BASE + len(records) - 1)}{display}{_LINK_END}"

    marked = _BRACES.sub(replace, body)

    paragraphs, categories, date = [], [], None
    for paragraph in _BLANK_LINE.split(marked):
        paragraph = " ".join(paragraph.split())
        if not paragraph:
            continue
        date_match = _DATE_PARAGRAPH.fullmatch(paragraph)
        if date_match:
            date = date_match.group(1)
            continue
        if strip_categories:
            cat = _CATEGORY.match(paragraph)
            if cat:
                for name in cat.group(2).split(","):
                    name = name.strip()
                    if name and name not in categories:
                        categories.append(name)
                paragraph = (cat.group(1) or "") + paragraph[cat.end() :]
                if not paragraph.strip():
                    continue
        paragraphs.append(paragraph)

    # Read the link offsets off the cleaned text while removing the markers.
    text_parts, links, external_links = [], [], []
    length, pos, open_record = 0, 0, None
    joined = "\n".join(paragraphs)
    for m in _MARKERS.finditer(joined):
        text_parts.append(joined[pos : m.start()])
        length += m.start() - pos
        pos = m.end()
        if m.group(1) is not None:
            open_record = (ord(m.group(1)) - _RECORD_BASE, length)
        elif open_record is not None:
            index, start = open_record
            open_record = None
            kind, target = records[index]
            if length == start:
                continue
            if kind == "internal":
                links.append({"start": start, "end": length, "term": None, "target": target, "target_title": None})
            else:
                external_links.append({"start": start, "end": length, "url": target})
    text_parts.append(joined[pos:])
    text = "".join(text_parts)
    for link in links:
        link["term"] = text[link["start"] : link["end"]]
    return {
        "title": names[0],
        "aliases": names[1:],
        "categories": categories,
        "text": text,
        "links": links,
        "external_links": external_links,
        "date": date,
    }


def _plural_variants(name: str) -> list[str]:
    # {compilers} -> "compiler", {glitches} -> "glitch", {libraries} -> "library".
    variants = [name]
    if name.endswith("ies"):
        variants.append(name[:-3] + "y")
    if name.endswith("es"):
        variants.append(name[:-2])
    if name.endswith("s"):
        variants.append(name[:-1])
    return variants


def resolve_links(entries: list[dict], extra_names: dict[str, str] | None = None) -> list[dict]:
    """
    Fill each link's `target_title` with the title of the entry it points to among `entries` (case-insensitive
    match on titles and aliases, then on singular forms of a plural target), or None when it points nowhere.

    Args:
        entries (`list[dict]`): Parsed entries; modified in place.
        extra_names (`dict[str, str]`, *optional*): More lowercase names mapped to entry titles (e.g. dictd index
            headwords). Names whose title is not among `entries` are ignored.

    Returns:
        `list[dict]`: `entries`.
    """
    titles = {entry["title"] for entry in entries}
    names: dict[str, str] = {}
    # Titles win over aliases, and earlier entries over later ones, so resolution does not depend on dict order.
    for entry in entries:
        names.setdefault(entry["title"].lower(), entry["title"])
    for entry in entries:
        for alias in entry.get("aliases", []):
            names.setdefault(alias.lower(), entry["title"])
    for name, title in (extra_names or {}).items():
        if title in titles:
            names.setdefault(name.lower(), title)
    for entry in entries:
        for link in entry["links"]:
            link["target_title"] = None
            for variant in _plural_variants(link["target"].lower()):
                if variant in names:
                    link["target_title"] = names[variant]
                    break
    return entries


def parse_foldoc(
    dict_path: str | os.PathLike | None = None,
    index_path: str | os.PathLike | None = None,
    strip_categories: bool = True,
    include_debian_additions: bool = False,
) -> list[dict]:
    """
    Parse a FOLDOC dictd database (Debian's `dict-foldoc`) into entries.

    Args:
        dict_path (`str` or `os.PathLike`, *optional*, defaults to `/usr/share/dictd/foldoc.dict.dz`):
            The `.dict.dz` (dictzip/gzip) or plain `.dict` file.
        index_path (`str` or `os.PathLike`, *optional*):
            The `.index` file; defaults to the one next to `dict_path` (`foldoc.index`).
        strip_categories (`bool`, *optional*, defaults to `True`): See [`parse_foldoc_entry`].
        include_debian_additions (`bool`, *optional*, defaults to `False`):
            Keep the few definitions Debian appends after a `Dictionary.debian` marker entry (developer,
            maintainer, ...). They are under a different licence (verbatim copies) from FOLDOC's GFDL, so they are
            left out by default.

    Returns:
        `list[dict]`: One dict per entry, as [`parse_foldoc_entry`] describes, with links resolved against the
        whole dictionary ([`resolve_links`]), in file order. dictd's own `00-database-*` entries are skipped; an
        entry listed under several headwords appears once.

    Example:

    ```python
    >>> from realm_hf.data import parse_foldoc

    >>> entries = parse_foldoc()  # needs `apt-get install dict-foldoc`
    >>> entry = next(e for e in entries if e["title"] == "card")
    >>> link = entry["links"][0]
    >>> entry["text"][link["start"] : link["end"]] == link["term"]
    True
    ```
    """
    dict_path = Path(dict_path or DEFAULT_DICT_PATH)
    if index_path is None:
        stem = dict_path.name.split(".dict")[0]
        index_path = dict_path.with_name(f"{stem}.index")
    data = _read_dict_bytes(dict_path)
    rows = read_dictd_index(index_path)

    headwords_by_span: dict[tuple[int, int], list[str]] = {}
    for headword, offset, length in rows:
        if headword.startswith("00-database-") or headword.startswith("00database"):
            continue
        headwords_by_span.setdefault((offset, length), []).append(headword)

    entries, extra_names = [], {}
    for offset, length in sorted(headwords_by_span):
        raw = data[offset : offset + length].decode("utf-8", errors="replace")
        entry = parse_foldoc_entry(raw, strip_categories=strip_categories)
        if entry is None or entry["title"].startswith("00-database-"):
            continue
        if entry["title"] == _DEBIAN_MARKER and not include_debian_additions:
            # Debian appends its own definitions after this marker entry, at the end of the file.
            break
        entries.append(entry)
        for headword in headwords_by_span[(offset, length)]:
            extra_names.setdefault(headword.lower(), entry["title"])
    return resolve_links(entries, extra_names)


def _read_jsonl(path: str | os.PathLike) -> list[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [record for _, record in json_lines(f, os.fspath(path))]


def write_foldoc_jsonl(entries: Iterable[dict], path: str | os.PathLike) -> None:
    """
    Write entries as JSON lines (gzip-compressed when `path` ends in `.gz`, with a fixed timestamp so the bytes are
    reproducible), atomically: a temporary file in the same directory, then `os.replace`.

    Args:
        entries (`Iterable[dict]`): Entries as [`parse_foldoc`] returns them.
        path (`str` or `os.PathLike`): Destination.
    """
    with atomic_write(path, "wb") as raw:
        if Path(path).name.endswith(".gz"):
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as f:
                for entry in entries:
                    f.write((json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n").encode())
        else:
            for entry in entries:
                raw.write((json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n").encode())


def load_foldoc(path: str | os.PathLike | None = None, source: str = "auto") -> list[dict]:
    """
    Load FOLDOC entries from wherever they are available.

    Args:
        path (`str` or `os.PathLike`, *optional*):
            A `.jsonl`/`.jsonl.gz` file of entries (such as the shipped extract), a dictd `.dict`/`.dict.dz` file
            (its `.index` next to it), or a directory holding `foldoc.dict.dz` (or `foldoc.dict`) and
            `foldoc.index`. Overrides `source`.
        source (`str`, *optional*, defaults to `"auto"`):
            Without `path`: `"dictd"` parses the installed `dict-foldoc` package (the whole dictionary, ~15,000
            entries), `"extract"` loads the ~3,000-entry extract shipped with realm-hf, and `"auto"` uses the
            package when it is installed and the extract otherwise.

    Returns:
        `list[dict]`: Entries as [`parse_foldoc`] returns them.
    """
    if path is not None:
        path = Path(path)
        if path.is_dir():
            dict_file = path / "foldoc.dict.dz"
            if not dict_file.exists():
                dict_file = path / "foldoc.dict"
            return parse_foldoc(dict_file, path / "foldoc.index")
        if path.name.endswith((".jsonl", ".jsonl.gz", ".json")):
            return _read_jsonl(path)
        return parse_foldoc(path)
    if source not in ("auto", "dictd", "extract"):
        raise ValueError(f"`source` must be 'auto', 'dictd' or 'extract', got {source!r}.")
    installed = os.path.exists(DEFAULT_DICT_PATH) and os.path.exists(DEFAULT_INDEX_PATH)
    if source == "dictd" or (source == "auto" and installed):
        if not installed:
            raise FileNotFoundError(
                f"dict-foldoc is not installed ({DEFAULT_DICT_PATH} missing): `apt-get install dict-foldoc`, or use "
                "source='extract'."
            )
        return parse_foldoc()
    return _read_jsonl(EXTRACT_PATH)


def _word_count(s: str) -> int:
    return len(s.split())


def make_link_questions(
    entries: Sequence[dict],
    max_per_entry: int | None = 2,
    seed: int = 0,
    max_answer_words: int = 5,
    min_sentence_words: int = 5,
    max_sentence_words: int = 60,
    only_resolved_links: bool = False,
    template: str = QUESTION_TEMPLATE,
) -> list[dict]:
    """
    Make cloze-style question/answer pairs from FOLDOC cross-references, for Open-QA fine-tuning on FOLDOC.

    For a sentence of entry `T` that contains a link `{Y}`, the question is the entry title and the sentence with
    `Y` replaced by a blank (`___`), and the answer is `Y`. With the default template:

    - entry "capacitor", sentence "The basis of a {dynamic RAM} cell is a capacitor."
    - question `"capacitor: The basis of a ___ cell is a capacitor."`, answers `["dynamic RAM"]`.

    A pair is kept only when the answer has at most `max_answer_words` words and the question does not contain the
    answer (compared after SQuAD normalisation, as whole tokens: a sentence that mentions the answer twice, or a
    title that contains it, is skipped), so a reader has to find it in the corpus. Numbered-sense markers ("2. ")
    are dropped from the sentence.

    Args:
        entries (`Sequence[dict]`): Entries as [`parse_foldoc`] or [`load_foldoc`] return them.
        max_per_entry (`int`, *optional*, defaults to 2): At most this many questions per entry, with distinct
            answers, drawn at random; `None` keeps all.
        seed (`int`, *optional*, defaults to 0): The draw for an entry depends only on the seed and its title, so
            an entry gets the same questions whichever other entries are given.
        max_answer_words (`int`, *optional*, defaults to 5): Longest answer, in words.
        min_sentence_words (`int`, *optional*, defaults to 5): Shortest cloze sentence, in words besides the blank.
        max_sentence_words (`int`, *optional*, defaults to 60): Longest source sentence, in words.
        only_resolved_links (`bool`, *optional*, defaults to `False`): Keep only links whose target entry is among
            the entries (`target_title` set).
        template (`str`, *optional*, defaults to `"{title}: {cloze}"`): Question format, with the fields `title`
            and `cloze` (the sentence with the blank).

    Returns:
        `list[dict]`: In entry order, each with `id` (`"<title>#<n>"`), `question`, `answers` (`[Y]`),
        `source_title` (`T`), `answer_target` (the title of the entry `Y` links to, or None) and
        `source_block_hint` (`dict` of character offsets into the entry's `text`: `sentence_start`, `sentence_end`,
        `answer_start`, `answer_end`), which locate the corpus block holding the evidence.
    """
    questions = []
    seen_questions = set()
    for entry in entries:
        title, text = entry["title"], entry["text"]
        title_norm = normalize_answer(title)
        candidates = []
        for sent_start, sent_end in split_sentences(text):
            sentence = text[sent_start:sent_end]
            n_words = _word_count(sentence)
            if n_words > max_sentence_words:
                continue
            # Drop a numbered-sense marker, which says nothing about the answer.
            marker = re.match(r"\d+\.\s+", sentence)
            body_start = sent_start + (marker.end() if marker else 0)
            for link in entry["links"]:
                if not (body_start <= link["start"] and link["end"] <= sent_end):
                    continue
                answer = link["term"]
                answer_norm = normalize_answer(answer)
                if not answer_norm or _word_count(answer) > max_answer_words or answer_norm == title_norm:
                    continue
                if only_resolved_links and link.get("target_title") is None:
                    continue
                cloze = text[body_start : link["start"]] + BLANK + text[link["end"] : sent_end]
                if _word_count(cloze) - 1 < min_sentence_words:
                    continue
                question = template.format(title=title, cloze=cloze)
                if has_answer(question, [answer]) or question in seen_questions:
                    continue
                candidates.append((question, answer, answer_norm, link, sent_start, sent_end))
        rng = random.Random(f"{seed}:{title}")
        rng.shuffle(candidates)
        chosen, chosen_answers = [], set()
        for candidate in candidates:
            if max_per_entry is not None and len(chosen) >= max_per_entry:
                break
            if candidate[2] in chosen_answers or candidate[0] in seen_questions:
                continue
            chosen.append(candidate)
            chosen_answers.add(candidate[2])
            seen_questions.add(candidate[0])
        # Keep the entry's questions in text order so the output reads naturally.
        chosen.sort(key=lambda c: c[3]["start"])
        for n, (question, answer, _, link, sent_start, sent_end) in enumerate(chosen):
            questions.append(
                {
                    "id": f"{title}#{n}",
                    "question": question,
                    "answers": [answer],
                    "source_title": title,
                    "answer_target": link.get("target_title"),
                    "source_block_hint": {
                        "sentence_start": sent_start,
                        "sentence_end": sent_end,
                        "answer_start": link["start"],
                        "answer_end": link["end"],
                    },
                }
            )
    return questions


def split_questions(
    questions: Sequence[dict], held_out_fraction: float = 0.1, seed: int = 0
) -> tuple[list[dict], list[dict]]:
    """
    Split questions into a training and a held-out set, by question, deterministically. For closed-corpus QA it is
    intended that held-out questions may come from entries that training questions also come from: both sets ask
    about the same corpus.

    Args:
        questions (`Sequence[dict]`): Questions, e.g. from [`make_link_questions`].
        held_out_fraction (`float`, *optional*, defaults to 0.1): Fraction held out (rounded; at least one question
            when the fraction is positive and there are two or more questions).
        seed (`int`, *optional*, defaults to 0): Seed of the shuffle that picks the held-out questions.

    Returns:
        `tuple[list[dict], list[dict]]`: `(train, held_out)`, each in the input order.
    """
    if not 0.0 <= held_out_fraction <= 1.0:
        raise ValueError(f"`held_out_fraction` must be in [0, 1], got {held_out_fraction}.")
    n = len(questions)
    n_held_out = round(n * held_out_fraction)
    if held_out_fraction > 0 and n >= 2:
        n_held_out = max(1, n_held_out)
    order = list(range(n))
    random.Random(seed).shuffle(order)
    held_out_indices = set(order[:n_held_out])
    train = [q for i, q in enumerate(questions) if i not in held_out_indices]
    held_out = [q for i, q in enumerate(questions) if i in held_out_indices]
    return train, held_out


def truncate_entry(entry: dict, max_chars: int | None) -> dict:
    """
    Cut an entry's text to at most `max_chars` characters, at the end of a sentence when one ends in the first
    `max_chars` characters (else at `max_chars`), keeping only the links that still fit. FOLDOC entries open with
    their definition, so the cut keeps what the entry is about.

    Args:
        entry (`dict`): An entry as [`parse_foldoc`] returns it (not modified).
        max_chars (`int`, *optional*): The budget; `None` keeps the whole text.

    Returns:
        `dict`: A copy of the entry with `text`, `links` and `external_links` cut.
    """
    text = entry["text"]
    if max_chars is None or len(text) <= max_chars:
        return dict(entry)
    ends = [end for _, end in split_sentences(text) if end <= max_chars]
    cut = ends[-1] if ends else max_chars
    return dict(
        entry,
        text=text[:cut],
        links=[dict(link) for link in entry["links"] if link["end"] <= cut],
        external_links=[dict(link) for link in entry.get("external_links", []) if link["end"] <= cut],
    )


def make_cross_document_task(
    entries: Sequence[dict],
    num_questions: int | None = 3000,
    seed: int = 0,
    max_entry_chars: int | None = None,
    headword_in_text: bool = True,
    max_answer_words: int = 5,
    min_sentence_words: int = 5,
    max_sentence_words: int = 40,
) -> dict:
    """
    A cross-document open-QA task from FOLDOC: the answer must come from another block than the question's.

    Each question is a sentence of an entry A with one cross-reference `{Y}` to another entry B blanked out, with no
    title in front ("The basis of a ___ cell is a capacitor." -> "dynamic RAM"). The corpus holds every entry, with
    the sentence of every question (training and held-out alike) removed from its entry, so no block contains the
    question's own text and nothing in the question names the block that answers it: the retriever has to learn
    which entry a context describes. Gold answers are the linked term as written and the title of the entry it
    links to; with `headword_in_text` each document reads `"<title>: <definition>"` (as a dictionary is read), so
    entry B's block holds its own name and a reader can answer from it. Other blocks that mention the answer count
    as hits too (answer recall, the ORQA/REALM convention).

    The same data gives REALM pre-training inputs: `masked_sentences` are the other (sentence, cross-reference)
    pairs of the corpus, with the reference as the salient span to mask; none of them is a question's sentence.

    Args:
        entries (`Sequence[dict]`): Entries as [`parse_foldoc`] or [`load_foldoc`] return them, links resolved.
        num_questions (`int`, *optional*, defaults to 3000): At most this many questions, at most one per entry,
            drawn at random (every sentence drawn is taken out of the corpus, so drawing all would strip many
            definitions); `None` draws one from every entry that has one.
        seed (`int`, *optional*, defaults to 0): Seed of the draw.
        max_entry_chars (`int`, *optional*): Cut each entry to about this many characters first
            ([`truncate_entry`]) to keep the corpus small; questions come from the kept text only.
        headword_in_text (`bool`, *optional*, defaults to `True`): Start each document's text with its title.
        max_answer_words, min_sentence_words, max_sentence_words (`int`, *optional*): As in
            [`make_link_questions`].

    Returns:
        `dict` with `documents` (`list[dict]`: `title`, `text`, `doc_id` (the title); every entry whose text is
        not empty after the removal), `questions` (`list[dict]`: `id`, `question`, `answers`, `source_title` (A),
        `answer_target` (B), in entry order) and `masked_sentences` (`list[dict]`: `text`, `salient_spans`
        (`[[start, end]]` of the cross-reference), `source_title`, `answer_target`).
    """
    if num_questions is not None and num_questions < 0:
        raise ValueError(f"`num_questions` must be None (one per entry) or >= 0, got {num_questions}.")
    if max_entry_chars is not None and max_entry_chars <= 0:
        raise ValueError(f"`max_entry_chars` must be None (whole entries) or > 0, got {max_entry_chars}.")
    cut = [truncate_entry(entry, max_entry_chars) for entry in entries]
    pairs = make_link_questions(
        cut,
        max_per_entry=None,
        seed=seed,
        max_answer_words=max_answer_words,
        min_sentence_words=min_sentence_words,
        max_sentence_words=max_sentence_words,
        only_resolved_links=True,
        template="{cloze}",
    )
    titles = {entry["title"] for entry in cut}
    # FOLDOC repeats some sentences across entries ("Informal name for one of the four standard references on
    # PostScript."): such a question would find its own sentence in another entry.
    sentence_entries: dict[str, set[str]] = {}
    for entry in cut:
        for start, end in split_sentences(entry["text"]):
            sentence_entries.setdefault(entry["text"][start:end], set()).add(entry["title"])
    text_of = {entry["title"]: entry["text"] for entry in cut}
    by_source: dict[str, list[dict]] = {}
    for pair in pairs:
        target = pair["answer_target"]
        if target is None or target == pair["source_title"] or target not in titles:
            continue
        hint = pair["source_block_hint"]
        sentence = text_of[pair["source_title"]][hint["sentence_start"] : hint["sentence_end"]]
        if len(sentence_entries.get(sentence, ())) > 1:
            continue
        answers = list(pair["answers"])
        if normalize_answer(target) not in {normalize_answer(a) for a in answers}:
            answers.append(target)
        # The question must not name the answer, in either of its forms.
        if has_answer(pair["question"], answers):
            continue
        by_source.setdefault(pair["source_title"], []).append(dict(pair, answers=answers))

    rng = random.Random(seed)
    sources = sorted(by_source)
    rng.shuffle(sources)
    if num_questions is not None:
        sources = sources[:num_questions]
    chosen = {title: rng.choice(by_source[title]) for title in sources}

    removed: dict[str, list[tuple[int, int]]] = {}
    for title, pair in chosen.items():
        hint = pair["source_block_hint"]
        removed.setdefault(title, []).append((hint["sentence_start"], hint["sentence_end"]))
    documents = []
    for entry in cut:
        text = entry["text"]
        spans = removed.get(entry["title"], [])
        for start, end in sorted(spans, reverse=True):
            text = text[:start] + text[end:]
        # Removal leaves doubled spaces and empty lines behind.
        text = "\n".join(" ".join(line.split()) for line in text.split("\n") if line.strip())
        if not text:
            continue
        documents.append(
            {
                "title": entry["title"],
                "text": f"{entry['title']}: {text}" if headword_in_text else text,
                "doc_id": entry["title"],
            }
        )
    in_corpus = {document["title"] for document in documents}
    order = {entry["title"]: i for i, entry in enumerate(cut)}
    questions = [
        {
            "id": pair["id"],
            "question": pair["question"],
            "answers": pair["answers"],
            "source_title": pair["source_title"],
            "answer_target": pair["answer_target"],
        }
        for title in sorted(chosen, key=order.__getitem__)
        for pair in [chosen[title]]
        if pair["answer_target"] in in_corpus
    ]
    question_sentences = {(title, start) for title, spans in removed.items() for start, _ in spans}
    masked = []
    for title, candidates in by_source.items():
        for pair in candidates:
            if (title, pair["source_block_hint"]["sentence_start"]) in question_sentences:
                continue
            cloze, term = pair["question"], pair["answers"][0]
            at = cloze.index(BLANK)
            masked.append(
                {
                    "text": cloze[:at] + term + cloze[at + len(BLANK) :],
                    "salient_spans": [[at, at + len(term)]],
                    "source_title": title,
                    "answer_target": pair["answer_target"],
                }
            )
    return {"documents": documents, "questions": questions, "masked_sentences": masked}
