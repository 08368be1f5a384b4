"""Bad input at every entry point: undecodable text, bad items in a batch, question types, and messages.

The rules live in `realm_hf.text.user_text`; these tests check that `answer()`, the pipeline, `realm-hf ask`, `realm-hf
train`/`index`, the Open-QA collator and evaluation, and corpus building all follow them. The tiny model is the one of
support/tiny_model.py (hidden 32, 2 layers, 6 blocks, `max_position_embeddings=64`).
"""

import io
import json
import sys

import datasets
import numpy as np
import pytest
import torch

import realm_hf
from realm_hf.cli import main
from realm_hf.constants import MANIFEST_NAME
from realm_hf.retrieval.retriever import RealmRetriever
from realm_hf.training.openqa import DataCollatorForOpenQA, evaluate_openqa
from tests.support.tiny_model import QUESTIONS

LATIN1_QUESTION = "caf\udce9 who wrote unix?"  # b"caf\xe9 ..." read with errors="surrogateescape"
LONG_QUESTION = "who wrote unix? " * 20  # 80 wordpieces: over the default limit of 64 and the model's 62


@pytest.fixture(scope="module")
def qa(tiny):
    return realm_hf.pipeline("question-answering", model=tiny[0])


def ask(*argv):
    return main(["-q", "ask", *map(str, argv)])


# ------------------------------------------------------------------------------------------------------------------
# Undecodable text (surrogate escapes): refused with a clear error everywhere, never a tokenizers TypeError
# ------------------------------------------------------------------------------------------------------------------


def test_undecodable_question_is_refused_by_answer_and_pipeline(tiny, qa):
    model = tiny[0]
    for call in (lambda: model.answer(LATIN1_QUESTION), lambda: qa(LATIN1_QUESTION)):
        with pytest.raises(ValueError, match=r"not valid UTF-8 .*b'caf\\xe9.*re-encode"):
            call()
    with pytest.raises(ValueError, match=r"context .*not valid UTF-8"):
        qa(QUESTIONS[0], context="caf\udce9 is a word")


def test_cli_undecodable_argument_is_an_error_line_not_a_traceback(tiny, capsys):
    assert ask(LATIN1_QUESTION, "--model", tiny[2]) == 2
    err = capsys.readouterr().err
    assert "error: argument 1: The question holds bytes that are not valid UTF-8" in err
    assert "Traceback" not in err


def test_cli_stdin_with_latin1_line_answers_the_others(tiny, capsys, monkeypatch):
    monkeypatch.setattr(
        sys, "stdin", io.TextIOWrapper(io.BytesIO(b"who wrote unix?\ncaf\xe9?\nwhat is a compiler?\n"))
    )
    assert ask("--file", "-", "--model", tiny[2], "--json") == 2
    captured = capsys.readouterr()
    answered = [json.loads(line)["question"] for line in captured.out.splitlines()]
    assert answered == ["who wrote unix?", "what is a compiler?"]
    assert "error: <stdin>, line 2: The question holds bytes that are not valid UTF-8" in captured.err


def test_documents_with_undecodable_text_are_refused(tiny):
    model, tokenizer, _ = tiny
    documents = [{"title": "Cafe", "text": "fine text"}, {"title": "Caf\udce9", "text": "a cafe"}]
    with pytest.raises(ValueError, match="Document 1's title.*not valid UTF-8"):
        RealmRetriever.from_documents(documents, model.embedder, tokenizer, max_block_length=32, show_progress=False)


def test_cli_document_files_name_the_line_of_bad_text(tiny, tmp_path, capsys):
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(b'{"title": "a", "text": "fine"}\n{"title": "b", "text": "caf\xe9"}\n')
    escaped = tmp_path / "escaped.jsonl"
    escaped.write_text('{"title": "a", "text": "fine"}\n{"title": "b", "text": "caf\\udce9"}\n')
    typed = tmp_path / "typed.jsonl"
    typed.write_text('{"title": "a", "text": "fine"}\n{"title": "b", "text": 5}\n')
    expected = {
        latin1: f"{latin1}, line 2: not valid UTF-8",
        escaped: f"{escaped}, line 2: a string holds bytes that are not valid UTF-8",
        typed: f"{typed}: record 2: the text is of type int, not text",
    }
    for path, message in expected.items():
        out = tmp_path / f"out-{path.stem}"
        assert (
            main(["-q", "index", str(path), "--model", tiny[2], "--output", str(out), "--max-block-length", "32"]) == 2
        )
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
        assert not out.exists()


def test_training_readers_refuse_undecodable_questions(tiny, tmp_path):
    from realm_hf.cli.readers import load_qa

    path = tmp_path / "train.jsonl"
    path.write_text(
        '{"question": "who wrote unix?", "answers": ["ken"]}\n\n{"question": "caf\\udce9?", "answers": ["x"]}\n'
    )
    with pytest.raises(ValueError, match=rf"{path}, line 3:.*not valid UTF-8"):
        load_qa(str(path), "question", "answers")
    collator = DataCollatorForOpenQA(tiny[1])
    with pytest.raises(ValueError, match="not valid UTF-8"):
        collator([{"question": LATIN1_QUESTION, "answers": ["ken"]}])


# ------------------------------------------------------------------------------------------------------------------
# One bad question in a batch
# ------------------------------------------------------------------------------------------------------------------


def test_answer_names_every_bad_item_before_any_work(tiny):
    with pytest.raises(ValueError, match=r"2 of 4 questions.*questions\[1\]: Empty.*questions\[3\]"):
        tiny[0].answer([QUESTIONS[0], "  ", QUESTIONS[1], "\u200b"])


def test_cli_ask_file_prints_what_it_answered_and_reports_bad_lines(tiny, tmp_path, capsys):
    path = tmp_path / "questions.txt"
    lines = [QUESTIONS[0], '{"question": ', "\U0001f600\U0001f600", LONG_QUESTION.strip(), "", QUESTIONS[1]]
    path.write_text("\n".join(lines) + "\n")
    assert ask("--file", path, "--model", tiny[2], "--batch-size", "1") == 2
    captured = capsys.readouterr()
    assert [line[3:] for line in captured.out.splitlines() if line.startswith("Q: ")] == [QUESTIONS[0], QUESTIONS[1]]
    assert captured.out.count("A: ") == 2
    for number, reason in ((2, "invalid JSON"), (3, "has no word the model's vocabulary knows"), (4, "longer than")):
        assert f"error: {path}, line {number}: " in captured.err and reason in captured.err
    assert "3 of 5 questions not answered" in captured.err


def test_collator_cuts_over_long_training_questions(tiny):
    tokenizer = tiny[1]
    collator = DataCollatorForOpenQA(tokenizer, max_question_length=4)
    batch = collator(
        [{"question": "who wrote unix? and when?", "answers": ["ken"]}, {"question": "who?", "answers": ["x"]}]
    )
    assert batch["input_ids"].shape[1] == 4 + 2  # [CLS] + 4 wordpieces + [SEP]
    assert batch["questions"] == ["who wrote unix?", "who?"]  # the text is cut where the wordpieces are
    assert collator.num_truncated == 1


def test_train_refuses_bad_training_data_before_embedding_the_corpus(tiny, tmp_path, capsys, monkeypatch):
    embedded = []
    monkeypatch.setattr(RealmRetriever, "from_documents", classmethod(lambda cls, *a, **k: embedded.append(1)))
    (tmp_path / "docs.jsonl").write_text(json.dumps({"title": "Unix", "text": "Unix was written by Ken."}) + "\n")
    (tmp_path / "train.jsonl").write_text(
        json.dumps({"question": "who wrote unix?", "answers": ["ken"]})
        + "\n"
        + json.dumps({"question": " ", "answers": ["x"]})
        + "\n"
    )
    config = {
        "task": "finetune",
        "model": tiny[2],
        "documents": "docs.jsonl",
        "train_file": "train.jsonl",
        "output_dir": "out",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["-q", "train", str(tmp_path / "config.json")]) == 2
    assert f"{tmp_path / 'train.jsonl'}, line 2: Empty question" in capsys.readouterr().err
    assert not embedded


def test_train_runs_with_an_over_long_training_question(tiny, tmp_path, capsys):
    rows = [
        {"question": LONG_QUESTION, "answers": ["ken thompson"]},
        {"question": QUESTIONS[1], "answers": ["a program"]},
    ]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    config = {
        "task": "finetune",
        "model": tiny[2],
        "train_file": "train.jsonl",
        "eval_file": "train.jsonl",
        "output_dir": "out",
        "training_args": {"max_steps": 1, "per_device_train_batch_size": 2, "save_strategy": "no", "use_cpu": True},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["-q", "train", str(tmp_path / "config.json")]) == 0
    results = json.loads((tmp_path / "out" / "train_results.json").read_text())
    assert results["global_step"] == 1 and "eval_exact_match" in results


def test_evaluation_scores_unanswerable_questions_as_wrong(tiny):
    model = tiny[0]
    dataset = datasets.Dataset.from_dict(
        {"question": [QUESTIONS[0], "\U0001f600", LONG_QUESTION], "answers": [["ken"], ["x"], ["ken"]]}
    )
    metrics = evaluate_openqa(model, dataset, recall_ks=(1,), show_progress=False, return_predictions=True)
    predictions = metrics["predictions"]
    assert len(predictions) == 3 and predictions[1] == ""
    assert predictions[0] == model.answer(QUESTIONS[0])["answer"]
    assert predictions[2]  # cut to the model's length and answered


# ------------------------------------------------------------------------------------------------------------------
# What answer() takes
# ------------------------------------------------------------------------------------------------------------------


def test_answer_takes_question_dicts_like_the_pipeline(tiny):
    model = tiny[0]
    expected = model.answer(QUESTIONS[0])
    got = model.answer({"question": QUESTIONS[0]})
    assert got["question"] == QUESTIONS[0] and got["answer"] == expected["answer"]
    assert [r["answer"] for r in model.answer([{"question": QUESTIONS[0]}, QUESTIONS[1]])] == [
        expected["answer"],
        model.answer(QUESTIONS[1])["answer"],
    ]
    with pytest.raises(ValueError, match="takes no `context`"):
        model.answer({"question": QUESTIONS[0], "context": "Unix was written by Ken."})


@pytest.mark.parametrize(
    "bad, message",
    [
        (b"who wrote unix?", "string.*got bytes.*decode"),
        (42, "string.*\\{'question': ...\\} dict.*list.*got int"),
        ([QUESTIONS[0], None], r"questions\[1\]:.*string.*NoneType"),
        ({"query": QUESTIONS[0]}, "needs a `question` key"),
    ],
)
def test_answer_refuses_other_types_naming_them(tiny, bad, message):
    with pytest.raises(ValueError, match=message):
        tiny[0].answer(bad)


# ------------------------------------------------------------------------------------------------------------------
# Messages that say what to do
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("question", ["\u200b\u200b", "\U0001f600", "\u200d\U0001f600\u200d"])
def test_questions_without_known_wordpieces_are_refused(tiny, qa, question):
    for call in (lambda: tiny[0].answer(question), lambda: qa(question)):
        with pytest.raises(ValueError, match="no word.*vocabulary"):
            call()


def test_question_length_over_the_model_positions_is_a_clear_error(tiny, qa):
    with pytest.raises(ValueError, match="limit of 62.*max_position_embeddings=64"):
        tiny[0].answer(LONG_QUESTION, max_question_length=200)
    with pytest.raises(ValueError, match=r"longer than the limit of 62"):
        qa(LONG_QUESTION, max_question_length=200)
    # The forward pass itself refuses what its position embeddings cannot take.
    tokenizer = tiny[1]
    with pytest.raises(ValueError, match="max_position_embeddings=64"):
        tiny[0](**tokenizer([LONG_QUESTION], return_tensors="pt"))


def test_batch_sizes_must_be_positive(tiny):
    model, tokenizer, _ = tiny
    with pytest.raises(ValueError, match="`batch_size`.*positive integer.*0"):
        model.answer(QUESTIONS[0], batch_size=0)
    with pytest.raises(ValueError, match="`batch_size`.*positive integer.*0"):
        RealmRetriever.from_documents(
            [{"text": "a text"}], model.embedder, tokenizer, max_block_length=32, batch_size=0
        )


def test_non_integer_manifest_field_names_the_file(tiny, tmp_path):
    retriever = tiny[0].retriever
    retriever.save_pretrained(tmp_path / "retriever")
    manifest_path = tmp_path / "retriever" / MANIFEST_NAME
    manifest = json.loads(manifest_path.read_text())
    manifest["num_blocks"] = "six"
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=rf"{manifest_path}.*`num_blocks`.*integer.*'six'"):
        RealmRetriever.from_pretrained(tmp_path / "retriever")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cli_device_cuda_without_cuda(tiny, capsys):
    assert ask(QUESTIONS[0], "--model", tiny[2], "--device", "cuda") == 2
    err = capsys.readouterr().err
    assert "error: --device cuda:" in err and "--device cpu" in err and "Traceback" not in err
    assert ask(QUESTIONS[0], "--model", tiny[2], "--device", "toaster") == 2
    assert "error: --device 'toaster' is not a device torch knows" in capsys.readouterr().err


def test_duplicate_doc_ids_are_refused_at_build_and_add(tiny):
    model, tokenizer, _ = tiny
    build = dict(max_block_length=32, show_progress=False)
    with pytest.raises(ValueError, match="Documents 0 and 2.*same doc_id 'a'"):
        RealmRetriever.from_documents(
            [{"doc_id": "a", "text": "one"}, {"doc_id": "b", "text": "two"}, {"doc_id": "a", "text": "three"}],
            model.embedder,
            tokenizer,
            **build,
        )
    # A document without an id gets its position, which another document already took as its id.
    with pytest.raises(ValueError, match="Documents 0 and 1.*same doc_id 1.*position"):
        RealmRetriever.from_documents(
            [{"doc_id": 1, "text": "one"}, {"text": "two"}], model.embedder, tokenizer, **build
        )
    retriever = RealmRetriever.from_documents(
        [{"doc_id": "a", "text": "one"}, {"doc_id": "b", "text": "two"}], model.embedder, tokenizer, **build
    )
    with pytest.raises(ValueError, match=r"already has.*doc_id \['a'\]"):
        retriever.add_documents([{"doc_id": "c", "text": "new"}, {"doc_id": "a", "text": "again"}], model.embedder)
    assert len(retriever) == 2
    retriever.remove_documents("a")
    assert retriever.store.texts([1]) == ["two"] and len(retriever) == 1


NO_CONTENT = "no content word"


# '?' is in the tiny vocabulary, Hebrew is not ([UNK]); [MASK] [SEP] [CLS] are special tokens.
@pytest.mark.parametrize("question", ["???", "?", "\u05de\u05d4 \u05d6\u05d4 ?", "[MASK] [SEP] [CLS]", "[UNK] ?"])
def test_questions_of_punctuation_and_special_tokens_are_refused(tiny, qa, question):
    for call in (lambda: tiny[0].answer(question), lambda: qa(question)):
        with pytest.raises(ValueError, match=NO_CONTENT):
            call()


def test_a_question_with_one_content_word_is_answered(tiny):
    assert tiny[0].answer("unix ???")["answer"]


def test_every_bad_question_is_named(tiny):
    questions = [QUESTIONS[0]] + [""] * 7
    with pytest.raises(ValueError) as err:
        tiny[0].answer(questions)
    message = str(err.value)
    assert "7 of 8 questions cannot be answered" in message and "more" not in message
    assert all(f"questions[{i}]" in message for i in range(1, 8))


def test_past_a_hundred_positions_the_message_says_how_to_list_them(tiny):
    with pytest.raises(ValueError, match=r"and 2 more.*`realm_hf.text.user_text.question_problems\("):
        tiny[0].answer([""] * 107)


@pytest.mark.parametrize(
    "context, message",
    [
        ("\x00\x00\x00", "Empty context"),
        ("\u200b \x00", "Empty context"),
        (b"Unix is an operating system.", r"context.*string.*bytes.*decode"),
        (3, "context.*string.*int"),
    ],
)
def test_contexts_that_are_no_text_are_refused(qa, context, message):
    with pytest.raises(ValueError, match=message):
        qa(QUESTIONS[0], context=context)


def test_k_top_k_and_num_blocks_take_numpy_integers_and_refuse_bools_floats_and_zero(tiny, qa):
    model = tiny[0]
    retriever = model.retriever
    query = torch.randn(1, retriever.embedding_dim)
    for bad in (True, 2.7, 0):
        with pytest.raises(ValueError, match=rf"`k`.*positive integer.*{bad!r}"):
            retriever.search(query, k=bad)
        with pytest.raises(ValueError, match=rf"`top_k`.*positive integer.*{bad!r}"):
            qa(QUESTIONS[0], top_k=bad)
        with pytest.raises(ValueError, match=rf"`num_blocks`.*positive integer.*{bad!r}"):
            model.answer(QUESTIONS[0], num_blocks=bad)
    assert retriever.search(query, k=np.int64(2)).block_ids.shape == (1, 2)
    assert len(qa(QUESTIONS[0], top_k=np.int64(2))) == 2
    assert len(model.answer(QUESTIONS[0], num_blocks=np.int64(2))["retrieved"]) == 2
