"""The command line's readers of questions, QA files and documents (`realm_hf.cli.readers`): each bad file or record
named with its line."""

import json

import pytest

from realm_hf.cli.common import CLIError
from realm_hf.cli.readers import load_documents, load_qa


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
