"""The command line's readers of questions, QA files and documents (`realm_hf.cli.readers`): each bad file or record
named with its line."""

import json
import os
import threading

import pytest

from realm_hf.cli.common import CLIError
from realm_hf.cli.readers import load_documents, load_qa, read_questions
from realm_hf.io.json_lines import text_lines


def test_question_file_with_a_byte_order_mark_is_read_as_json_lines(tmp_path):
    from realm_hf.cli.readers import load_qa, read_questions

    path = tmp_path / "questions.txt"
    path.write_bytes(b'\xef\xbb\xbf{"question": "who wrote unix?"}\n{"question": "what is lisp?"}\n')
    assert [item[1] for item in read_questions(file=str(path))] == ["who wrote unix?", "what is lisp?"]
    qa_file = tmp_path / "qa.jsonl"
    qa_file.write_bytes(b'\xef\xbb\xbf{"question": "who wrote unix?", "answers": ["ken"]}\n')
    assert load_qa(str(qa_file), "question", "answers")["question"] == ["who wrote unix?"]


def test_a_directory_given_as_the_question_file_is_named(tmp_path):
    from realm_hf.cli.common import CLIError
    from realm_hf.cli.readers import read_questions

    with pytest.raises(CLIError, match="is a directory.*give a file"):
        read_questions(file=str(tmp_path))


def test_null_document_text_names_file_and_record(tmp_path):
    from realm_hf.cli.common import CLIError
    from realm_hf.cli.readers import load_documents

    path = tmp_path / "docs.jsonl"
    path.write_text('{"title": "a", "text": "one"}\n{"title": "b", "text": null}\n')
    with pytest.raises(CLIError, match=rf"{path}: record 2:.*null"):
        load_documents([str(path)])


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("docs.jsonl", b"", "is empty.*json"),  # datasets answered with a bare StopIteration
        ("docs.jsonl", b"\n  \n\n", "holds only blank lines"),
        ("docs.csv", b"", "is empty.*csv"),
        ("docs.csv", b"title,text\n", "no records.*header"),  # datasets: 'Instruction "train" ...'
        ("docs.parquet", b"", "is empty.*parquet"),
    ],
)
def test_documents_file_without_records_is_named(tmp_path, name, content, message):
    from realm_hf.cli.common import CLIError
    from realm_hf.cli.readers import load_documents

    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(CLIError, match=message) as caught:
        load_documents([str(path)])
    assert str(path) in str(caught.value)


@pytest.mark.parametrize(
    "answers, message",
    [
        (["ken", None], "line 1:.*null"),  # graded against the answer "None"
        ({"answer": "ken"}, "line 1:.*mapping.*'text'"),  # graded against "answer"
        ([True], "line 1:.*bool"),
        ({"text": [["ken"]]}, "line 1:.*list"),
    ],
)
def test_answers_of_the_wrong_type_name_the_line(tmp_path, answers, message):
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({"question": "who wrote unix?", "answers": answers}) + "\n")
    with pytest.raises(CLIError, match=message):
        load_qa(str(path), "question", "answers")


def test_numeric_answers_of_a_csv_are_read_as_text(tmp_path):
    # A column of digits reads as integers (a traceback: 'int' object is not iterable), with an empty cell as floats.
    path = tmp_path / "qa.csv"
    path.write_text("question,answers\nwhen was unix written?,1969\nwhen was python created?,1991\n")
    assert load_qa(str(path), "question", "answers")["answers"] == [["1969"], ["1991"]]
    path.write_text("question,answers,other\nwhen was unix written?,1969,x\nwhen was python created?,,y\n")
    with pytest.raises(CLIError, match="record 2:.*no answer"):
        load_qa(str(path), "question", "answers")
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({"question": "when was unix written?", "answers": {"text": 1969}}) + "\n")
    assert load_qa(str(path), "question", "answers")["answers"] == [["1969"]]


def test_text_column_title_indexes_the_titles(docs):
    # The `text` column was indexed, silently: the text and the default title column were the same name.
    dataset = load_documents([str(docs)], text_column="title")
    assert dataset["text"] == ["Unix", "Python"]
    assert "title" not in dataset.column_names


def test_id_column_title_keeps_the_titles(docs):
    # The titles were renamed to doc_id: every block lost its title.
    dataset = load_documents([str(docs)], id_column="title")
    assert dataset["title"] == ["Unix", "Python"] and dataset["doc_id"] == ["Unix", "Python"]
    assert dataset["text"][0].startswith("Unix was written")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"title_column": "text"}, "--text-column.*--title-column.*'text'"),
        ({"id_column": "text"}, "--id-column.*'text'"),
    ],
)
def test_one_column_for_text_and_title_or_id_is_refused(docs, kwargs, message):
    # datasets' 'Field "text" does not exist in schema' before.
    with pytest.raises(CLIError, match=message):
        load_documents([str(docs)], **kwargs)


SEPARATORS = ["\x0c", "\x0b", "\u2028", "\u2029", "\x85", "\x1c"]


def test_text_lines_split_at_line_breaks_only():
    assert text_lines("a\u2028b\x0cc\r\nd\re\n") == ["a\u2028b\x0cc", "d", "e"]
    assert text_lines("") == [] and text_lines("x") == ["x"] and text_lines("x\n\n") == ["x", ""]


@pytest.mark.parametrize("separator", SEPARATORS)
def test_a_separator_inside_a_question_keeps_it_one_question(tmp_path, separator):
    """A form feed or U+2028 split one question into two (and shifted the line numbers of the rest)."""
    plain = tmp_path / "questions.txt"
    plain.write_text(f"what is{separator}a compiler?\nwho wrote unix?\n", encoding="utf-8")
    items = read_questions(file=str(plain))
    assert [(where, question) for where, question, _ in items] == [
        (f"{plain}, line 1", f"what is{separator}a compiler?"),
        (f"{plain}, line 2", "who wrote unix?"),
    ]
    lines = tmp_path / "questions.jsonl"
    lines.write_text(
        json.dumps({"question": f"what is{separator}a compiler?"}, ensure_ascii=False) + "\nnot json\n",
        encoding="utf-8",
    )
    items = read_questions(file=str(lines))
    assert items[0] == (f"{lines}, line 1", f"what is{separator}a compiler?", None)
    assert items[1][0] == f"{lines}, line 2" and items[1][2].startswith("invalid JSON")


# json.dumps escapes control characters; these three it writes raw, as valid JSON allows.
@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85"])
def test_valid_json_lines_holding_a_separator_are_read_with_their_line_numbers(tmp_path, separator):
    """Valid JSONL with a raw U+2028 in a string was called invalid JSON, at the wrong line."""
    path = tmp_path / "qa.jsonl"
    records = [
        {"question": f"where is{separator}port estrel?", "answers": ["velmora"]},
        {"question": "who founded it?", "answers": ["salt traders"]},
    ]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    assert load_qa(str(path), "question", "answers")["question"] == [r["question"] for r in records]
    path.write_text(path.read_text(encoding="utf-8") + '{"question": "broken"\n', encoding="utf-8")
    with pytest.raises(CLIError, match=r"qa\.jsonl, line 3: invalid JSON"):
        load_qa(str(path), "question", "answers")


def _parquet(path, columns, names=None):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(columns) if names is None else pa.table(list(columns), names=names)
    pq.write_table(table, path)
    return path


def test_a_truncated_parquet_file_is_named_damaged_not_undecodable(tmp_path):
    path = _parquet(tmp_path / "docs.parquet", {"title": ["a", "b"] * 20, "text": [f"text {i}" for i in range(40)]})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    for read in (lambda: load_documents([str(path)]), lambda: load_qa(str(path), "question", "answers")):
        with pytest.raises(
            CLIError, match=r"docs\.parquet is not a readable Parquet file: it is truncated or damaged"
        ) as caught:
            read()
        assert "UTF-8" not in str(caught.value)


def test_empty_and_duplicate_column_parquet_files_are_named(tmp_path):
    import pyarrow as pa

    empty = _parquet(
        tmp_path / "empty.parquet", {"title": pa.array([], pa.string()), "text": pa.array([], pa.string())}
    )
    with pytest.raises(CLIError, match=r"empty\.parquet holds no rows"):
        load_documents([str(empty)])
    twice = _parquet(
        tmp_path / "twice.parquet", [pa.array(["a"]), pa.array(["x"]), pa.array(["y"])], ["title", "text", "text"]
    )
    with pytest.raises(CLIError, match=r"twice\.parquet has the column\(s\) 'text' more than once"):
        load_documents([str(twice)])


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_question_file_is_read_and_a_fifo_data_file_refused(tmp_path):
    """A FIFO (or `--file <(...)`) was reported as a file that "does not exist"."""
    fifo = tmp_path / "questions.fifo"
    os.mkfifo(fifo)

    def write():
        with open(fifo, "w", encoding="utf-8") as f:
            f.write("who wrote unix?\nwhat is a compiler?\n")

    writer = threading.Thread(target=write)
    writer.start()
    try:
        items = read_questions(file=str(fifo))
    finally:
        writer.join(timeout=30)
    assert [question for _, question, _ in items] == ["who wrote unix?", "what is a compiler?"]
    with pytest.raises(CLIError, match="not a regular file"):
        load_qa(str(fifo), "question", "answers")
    with pytest.raises(CLIError, match="not a regular file"):
        load_documents([str(fifo)])
