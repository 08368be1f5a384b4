"""Input readers of the commands: document tables, QA files and question lists, with errors naming file and line."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

from ..io.json_lines import json_lines, text_lines
from ..text.user_text import question_text_problems, undecodable_text_problem
from .common import CLIError, logger

_DOCUMENT_SUFFIXES = {
    ".jsonl": "json",
    ".json": "json",
    ".ndjson": "json",
    ".csv": "csv",
    ".tsv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
# Columns the retriever computes itself: a documents file must not bring its own.
_RESERVED_DOCUMENT_COLUMNS = ("block_id", "char_start", "char_end", "embeddings")


def file_format(path: str, fmt: str = "auto") -> str:
    if fmt != "auto":
        return fmt
    if os.path.isdir(path):
        return "dataset"
    suffix = os.path.splitext(path.lower().removesuffix(".gz"))[1]
    if suffix not in _DOCUMENT_SUFFIXES:
        raise CLIError(
            f"Cannot tell the format of {path!r} from its extension; use .jsonl, .csv or .parquet, a saved `datasets` "
            "directory, or pass --format."
        )
    return _DOCUMENT_SUFFIXES[suffix]


def load_table(paths: Sequence[str], fmt: str = "auto", split: str = "train"):
    """A `datasets.Dataset` from JSONL/CSV/Parquet files (all of one format) or one `save_to_disk` directory."""
    import datasets  # deferred: the cli package imports nothing heavy at module level
    import pyarrow as pa  # deferred: see above

    for path in paths:
        if not os.path.exists(path):
            raise CLIError(f"Input {path!r} does not exist.")
        if not os.path.isfile(path) and not os.path.isdir(path):
            # A pipe or device: datasets' readers seek, and a FIFO blocks until a writer comes.
            raise CLIError(
                f"Input {path!r} is not a regular file (a pipe, FIFO or device): save the data to a file and give "
                "that file."
            )
    formats = {file_format(path, fmt) for path in paths}
    if len(formats) > 1:
        raise CLIError(f"Input files mix formats ({', '.join(sorted(formats))}); give files of one format.")
    kind = formats.pop()
    if kind == "dataset":
        if len(paths) != 1:
            raise CLIError("Give a single saved dataset directory (or data files).")
        loaded = datasets.load_from_disk(paths[0])
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise CLIError(f"{paths[0]} holds splits {sorted(loaded)}; choose one with --split.")
            loaded = loaded[split]
        return loaded
    for path in paths:
        _check_not_empty(path, kind)
        if kind == "parquet":
            _check_parquet(path)
    kwargs = {"sep": "\t"} if kind == "csv" and all(p.lower().endswith(".tsv") for p in paths) else {}
    try:
        loaded = datasets.load_dataset(kind, data_files=list(paths), split="train", **kwargs)
        # Arrow's JSON reader keeps bytes that are not UTF-8 in its strings, which fail only when a row is read.
        loaded.data.table.validate(full=True)
        return loaded
    except (UnicodeDecodeError, pa.ArrowInvalid) as err:
        if kind in ("json", "csv"):  # text formats only: a Parquet file is binary
            for path in paths:
                _check_utf8(path)  # names the file and line
        raise CLIError(f"Could not read {', '.join(paths)} as {kind}: {err}") from err
    except datasets.exceptions.DatasetGenerationError as err:
        if kind in ("json", "csv"):
            for path in paths:
                _check_utf8(path)
        if kind == "json":
            for path in paths:
                _check_json_lines(path)  # names the file and line that datasets' error leaves out
        cause = err.__cause__ or err
        raise CLIError(f"Could not read {', '.join(paths)} as {kind}: {cause}") from err
    except ValueError as err:
        if "corresponds to no data" not in str(err):
            raise
        # datasets' words for files that parse to no row at all (a CSV of a header only).
        raise CLIError(f"{', '.join(paths)}: no records (a header only?): give at least one row.") from None


def _check_parquet(path: str) -> None:
    """
    Raise a `CLIError` for a Parquet file that is truncated or damaged, has no rows, or has a column twice: from its
    footer, before datasets reads it (it called a truncated file not UTF-8, and the others failed inside Arrow).
    """
    import pyarrow.parquet as pq  # deferred: see load_table

    try:
        metadata = pq.ParquetFile(path).metadata
        names = metadata.schema.to_arrow_schema().names
    except Exception as err:  # noqa: BLE001 - Arrow raises ArrowInvalid, OSError or others for a damaged footer
        raise CLIError(
            f"{path} is not a readable Parquet file: it is truncated or damaged ({err}). Copy or write it again."
        ) from None
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise CLIError(
            f"{path} has the column(s) {', '.join(map(repr, twice))} more than once: give each column one name (rename "
            "or drop the copies)."
        )
    if metadata.num_rows == 0:
        raise CLIError(f"{path} holds no rows (columns: {', '.join(names)}): give a file with at least one record.")


def _check_not_empty(path: str, kind: str) -> None:
    """Raise a `CLIError` for a data file with nothing in it, which datasets' readers answer with a bare
    `StopIteration` (JSON lines) or an error that does not name the file."""
    if os.path.getsize(path) == 0:
        raise CLIError(f"{path} is empty: give a {kind} file with at least one record.")
    if kind in ("json", "csv") and not path.lower().endswith(".gz"):
        with open(path, "rb") as f:
            # Whitespace only (blank lines): as empty as a file of no bytes. Read in chunks: files can be large.
            while chunk := f.read(1 << 16):
                if chunk.strip():
                    return
        raise CLIError(f"{path} holds only blank lines: give a {kind} file with at least one record.")


def _check_utf8(path: str) -> None:
    """Raise a `CLIError` naming the first line of a text file that is not valid UTF-8 (gzip files are left to
    their reader)."""
    if path.lower().endswith(".gz"):
        return
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as err:
                raise CLIError(
                    f"{path}, line {number}: not valid UTF-8 (byte {line[err.start : err.start + 1]!r} at column "
                    f"{err.start + 1}): re-encode the file as UTF-8, e.g. `iconv -f latin1 -t utf-8 in > out`."
                ) from None


def _read_text(path: str) -> str:
    """A UTF-8 text file's content; bytes that are not UTF-8 raise a `CLIError` naming the file and line."""
    _check_utf8(path)
    # utf-8-sig: a byte-order mark (Windows editors write one) is not part of the first record.
    with open(path, encoding="utf-8-sig") as f:
        return f.read()


def _string_problem(record) -> str | None:
    """Why one of the strings of a parsed JSON record is not valid Unicode (a lone surrogate escape), or `None`."""
    values = record.values() if isinstance(record, dict) else record if isinstance(record, list) else [record]
    for value in values:
        if isinstance(value, str):
            problem = undecodable_text_problem(value)
        elif isinstance(value, (dict, list)):
            problem = _string_problem(value)
        else:
            continue
        if problem:
            return problem
    return None


def _check_json_lines(path: str) -> None:
    """Raise a `CLIError` naming the first line of a JSON-lines file that is not a JSON object of valid strings."""
    with open(path, encoding="utf-8") as f:
        if f.read(1024).lstrip().startswith("["):
            return  # a JSON array, not JSON lines: datasets' own error says what is wrong
        f.seek(0)
        for number, record in json_lines(f, path, CLIError):
            if not isinstance(record, dict):
                raise CLIError(f"{path}, line {number}: expected a JSON object, got {type(record).__name__}.")
            problem = _string_problem(record)
            if problem:
                raise CLIError(f"{path}, line {number}: a string {problem}.")


def load_documents(
    paths: Sequence[str],
    text_column: str = "text",
    title_column: str | None = "title",
    id_column: str | None = None,
    fmt: str = "auto",
    split: str = "train",
):
    """
    Documents as a `datasets.Dataset` with `text`, `title` (and `doc_id`, metadata) columns, renamed from the user's
    column names. A missing default `title` column is fine (blocks get no title); any other missing column is an error.

    Args:
        paths (`Sequence[str]`): JSONL/JSON, CSV/TSV or Parquet files of one format, or one saved dataset directory.
        text_column (`str`, *optional*, defaults to `"text"`): The document text.
        title_column (`str`, *optional*, defaults to `"title"`): The title; `None`: no titles.
        id_column (`str`, *optional*): Kept as `doc_id` (used by `RealmRetriever.remove_documents`).
        fmt (`str`, *optional*, defaults to `"auto"`): `json`, `csv`, `parquet` or `dataset`; `auto` goes by extension.
        split (`str`, *optional*, defaults to `"train"`): The split of a saved `DatasetDict`.
    """
    dataset = load_table(paths, fmt, split)
    columns = dataset.column_names
    if text_column not in columns:
        raise CLIError(
            f"The documents have no text column {text_column!r} (columns: {', '.join(columns)}); "
            "choose one with --text-column."
        )
    if title_column is not None and title_column not in columns:
        if title_column != "title":
            raise CLIError(f"The documents have no title column {title_column!r} (columns: {', '.join(columns)}).")
        title_column = None
    if id_column and id_column not in columns:
        raise CLIError(f"The documents have no id column {id_column!r} (columns: {', '.join(columns)}).")
    # One column named for two roles: the renames below would map it once, silently (`--text-column title` indexed
    # the `text` column; `--id-column title` left every block without its title; `--title-column text` and
    # `--id-column text` failed inside datasets with 'Field "text" does not exist in schema').
    if title_column is not None and title_column == text_column:
        if title_column != "title":
            raise CLIError(
                f"--text-column and --title-column both name the column {text_column!r}: give the title column "
                "another name, or leave --title-column out."
            )
        title_column = None  # the default title column is the text asked for: the blocks get no title
    if id_column and id_column == text_column:
        raise CLIError(
            f"--id-column names the text column {text_column!r}: give a column of document ids (or leave it out to "
            "number the documents by position)."
        )
    copy_id = bool(id_column) and id_column == title_column  # the title is also the id: kept as both
    renames = {text_column: "text"}
    if title_column:
        renames[title_column] = "title"
    if id_column and not copy_id:
        renames[id_column] = "doc_id"
    targets = set(renames.values()) | ({"doc_id"} if copy_id else set())
    dropped = [c for c in columns if c not in renames and (c in targets or c in _RESERVED_DOCUMENT_COLUMNS)]
    if dropped:
        logger.warning("Ignoring document column(s) %s: the corpus computes or renames them.", ", ".join(dropped))
        dataset = dataset.remove_columns(dropped)
    renames = {old: new for old, new in renames.items() if old != new}
    if renames:
        dataset = dataset.rename_columns(renames)
    if copy_id:
        dataset = dataset.add_column("doc_id", dataset["title"])
    if len(dataset) == 0:
        raise CLIError(f"No documents in {', '.join(paths)}.")
    for column in ("text", "title"):
        if column == "text" and dataset.data.column("text").null_count:
            # A null text in a string column (`"text": null` in JSON, an empty Parquet cell).
            row = dataset["text"].index(None)
            raise CLIError(
                f"{', '.join(paths)}: record {row + 1}: the text is missing (null): give every document text."
            )
        if column in dataset.column_names and getattr(dataset.features[column], "dtype", None) != "string":
            # Mixed types in a JSON file (a number where text should be): name where, not "Document 17".
            for row, value in enumerate(dataset[column]):
                if not (isinstance(value, str) or (column == "title" and value is None)):
                    raise CLIError(
                        f"{', '.join(paths)}: record {row + 1}: the {column} is of type {type(value).__name__}, not text."
                    )
    return dataset


def _answer_text(value) -> str | None:
    """One gold answer as text: a string, or a number (a CSV cell of digits reads as one); `None` for a missing value.
    Anything else raises a `TypeError` saying what it is (`str()` turned `null` into the answer "None")."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if value is None:
            return None
        raise TypeError(f"an answer is of type {type(value).__name__}, not text")
    if isinstance(value, float):
        if value != value:  # NaN: an empty cell of a numeric CSV column
            return None
        if value.is_integer():
            return str(int(value))  # 1991, not "1991.0", from a numeric column with empty cells
    return str(value)


def _answers_list(value, separator: str | None) -> list[str]:
    """The gold answers of one record. Raises a `TypeError` for a value that is no answer (a number list item is
    fine; `null` items, booleans and mappings without `text` are not)."""
    if value is None:
        return []
    if not isinstance(value, (str, dict, list, tuple)):
        text = _answer_text(value)
        return [] if text is None else [text]
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                parsed = json.loads(text)
            except json.JSONDecodeError:
                parsed = None
            if isinstance(parsed, list):
                return _answer_items(parsed)
        if separator:
            return [part.strip() for part in value.split(separator) if part.strip()]
        return [value]
    if isinstance(value, dict):
        if "text" not in value:
            # Iterating the mapping made its keys the answers: {"answer": "Paris"} was graded against "answer".
            raise TypeError(
                f"the answers are a mapping without 'text' (keys: {', '.join(map(str, value))}); give a list of "
                'strings, a string or SQuAD\'s {"text": [...]}'
            )
        return _answers_list(value["text"], separator)  # SQuAD-style {"text": [...], "answer_start": [...]}
    return _answer_items(value)


def _answer_items(values) -> list[str]:
    answers = []
    for item in values:
        text = _answer_text(item)
        if text is None:
            raise TypeError("an answer in the list is null")
        answers.append(text)
    return answers


def load_qa(path: str, question_column: str, answers_column: str | None, separator: str | None = "|", fmt="auto"):
    """A QA file as a `datasets.Dataset` with `question` and (when asked for) `answers` (a list of strings)."""
    import datasets  # deferred: see load_table

    if not os.path.exists(path):
        raise CLIError(f"QA file {path!r} does not exist.")
    if not os.path.isfile(path) and not os.path.isdir(path):
        # Read twice (the UTF-8 check, then the records): a pipe would block on the second read.
        raise CLIError(f"QA file {path!r} is not a regular file (a pipe, FIFO or device): save it to a file first.")
    kind = file_format(path, fmt)
    places = None  # where each record is, for errors: "line N" of a JSON-lines file, else "record N"
    if kind == "json":
        rows = []
        text = _read_text(path)
        stripped = text.lstrip()
        if stripped.startswith("["):  # a JSON array rather than JSON lines
            try:
                rows = json.loads(text)
            except json.JSONDecodeError as err:
                raise CLIError(f"{path}: invalid JSON: {err}") from err
        else:
            places = []
            for number, row in json_lines(text_lines(text), path, CLIError):
                rows.append(row)
                places.append(f"line {number}")
        for number, row in enumerate(rows, 1):
            if not isinstance(row, dict):
                where = places[number - 1] if places else f"record {number}"
                raise CLIError(f"{path}, {where}: expected a JSON object with {question_column!r}.")
        columns = sorted({key for row in rows for key in row})
        get = lambda column: [row.get(column) for row in rows]  # noqa: E731
    else:
        table = load_table([path], kind)
        columns = table.column_names
        get = lambda column: table[column] if column in columns else [None] * len(table)  # noqa: E731
    if question_column not in columns:
        raise CLIError(f"{path} has no question column {question_column!r} (columns: {', '.join(columns)}).")
    questions = get(question_column)
    for row, problem in question_text_problems(questions)[:1]:
        where = places[row] if places else f"record {row + 1}"
        raise CLIError(f"{path}, {where}: {problem}.")
    data = {"question": list(questions)}
    if answers_column is not None:
        if answers_column not in columns:
            raise CLIError(f"{path} has no answers column {answers_column!r} (columns: {', '.join(columns)}).")
        answers = []
        for number, value in enumerate(get(answers_column), 1):
            try:
                answers.append(_answers_list(value, separator))
            except TypeError as err:  # a traceback before, or a gold answer "None"
                where = places[number - 1] if places else f"record {number}"
                raise CLIError(
                    f"{path}, {where}: {err}: give each answer as a string (column {answers_column!r})."
                ) from None
        for number, golds in enumerate(answers, 1):
            where = places[number - 1] if places else f"record {number}"
            if not any(g.strip() for g in golds):
                raise CLIError(f"{path}, {where}: no answer given for {data['question'][number - 1]!r}.")
            for gold in golds:
                problem = undecodable_text_problem(gold)
                if problem:
                    raise CLIError(f"{path}, {where}: the answer {problem}.")
        data["answers"] = answers
    if "doc_id" in columns:  # the document that answers each question: the reader warm-up reads its block
        data["doc_id"] = list(get("doc_id"))
    if "id" in columns:  # the question's own id: `evaluate --run-file` writes it as the TREC query id
        data["id"] = [None if value is None else str(value) for value in get("id")]
    if not data["question"]:
        raise CLIError(f"{path} holds no questions.")
    return datasets.Dataset.from_dict(data)


def read_questions(questions: Sequence[str] = (), file: str | None = None) -> list[tuple[str, str | None, str | None]]:
    """
    The questions given as arguments, then those of `file`: one per line, or JSON lines with a `question` string
    (`.jsonl`/`.json` files, or lines starting with `{`); `-` reads stdin.

    Returns one `(where, question, problem)` per question in order: `where` names it (`argument 2`, `file, line 7`)
    and a line that cannot be read (invalid JSON, no `question` string) comes with `question=None` and the reason,
    so the other questions are still answered. Bytes that are not UTF-8 are kept as surrogates
    (`errors="surrogateescape"`, as Python reads argv) for the question checks to report with their line.
    """
    items = [(f"argument {number}", question, None) for number, question in enumerate(questions or [], 1)]
    if file:
        if file == "-":
            stdin = getattr(sys.stdin, "buffer", None)
            text = stdin.read().decode("utf-8", "surrogateescape") if stdin is not None else sys.stdin.read()
            name = "<stdin>"
        else:
            if os.path.isdir(file):
                raise CLIError(
                    f"Question file {file!r} is a directory: give a file of questions (one per line, or JSONL)."
                )
            if not os.path.exists(file):
                raise CLIError(f"Question file {file!r} does not exist.")
            # A pipe is read as it comes (`--file <(grep ... questions.txt)`, a FIFO): it is read once, in order.
            with open(file, encoding="utf-8", errors="surrogateescape") as f:
                text = f.read()
            name = file
        # A byte-order mark (Windows editors write one) is not part of the first question: `{"question": ...}` after
        # one is still a JSON line.
        text = text.removeprefix("\ufeff")
        as_json = name.lower().endswith((".jsonl", ".json", ".ndjson"))
        for number, line in enumerate(text_lines(text), 1):
            where = f"{name}, line {number}"
            line = line.strip()
            if not line:
                continue
            if as_json or line.startswith("{"):
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    items.append((where, None, f"invalid JSON: {err.msg}"))
                    continue
                if isinstance(record, str):
                    items.append((where, record, None))
                elif isinstance(record, dict) and isinstance(record.get("question"), str):
                    items.append((where, record["question"], None))
                else:
                    items.append((where, None, "expected a JSON object with a 'question' string"))
            else:
                items.append((where, line, None))
    if not items:
        raise CLIError("No questions: give them as arguments or with --file (one per line, or JSONL with 'question').")
    return items
