"""Silent wrong results and unhelpful errors found by the third reliability round (issue 25).

Each test failed before its fix: a question without a content word, a context that is no text, integer arguments,
NaN reader weights, a tokenizer without its vocabulary, doc_id types, damaged corpora, config values, the CLI's
readers and the legacy retriever API. The tiny model is the one of test_pipeline.py (hidden 32, 2 layers, 6 blocks,
`reader_seq_len=48`, `max_position_embeddings=64`).
"""

import numpy as np
import pytest
import torch
from test_pipeline import QUESTIONS, build_tiny_model

import realm_hf
from realm_hf.training.openqa import DataCollatorForOpenQA, check_training_questions

NO_CONTENT = "has no content word the model's vocabulary knows"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("round3")
    model, tokenizer = build_tiny_model(str(tmp))
    return model, tokenizer


@pytest.fixture(scope="module")
def qa(tiny):
    return realm_hf.pipeline("question-answering", model=tiny[0])


# ------------------------------------------------------------------------------------------------------------------
# Questions: at least one content wordpiece, everywhere (text_inputs.py)
# ------------------------------------------------------------------------------------------------------------------


# '?' is in the tiny vocabulary, Hebrew is not ([UNK]); [MASK] [SEP] [CLS] are special tokens.
@pytest.mark.parametrize("question", ["???", "?", "\u05de\u05d4 \u05d6\u05d4 ?", "[MASK] [SEP] [CLS]", "[UNK] ?"])
def test_questions_of_punctuation_and_special_tokens_are_refused(tiny, qa, question):
    for call in (lambda: tiny[0].answer(question), lambda: qa(question)):
        with pytest.raises(ValueError, match=NO_CONTENT):
            call()


def test_a_question_with_one_content_word_is_answered(tiny):
    assert tiny[0].answer("unix ???")["answer"]


def test_training_questions_without_content_fail_before_training(tiny):
    dataset = __import__("datasets").Dataset.from_dict(
        {"question": [QUESTIONS[0], "\U0001f600", "???"], "answers": [["ken"], ["x"], ["y"]]}
    )
    with pytest.raises(ValueError, match=r"2 bad training question\(s\): record 2: .*no word.*record 3: .*no content"):
        check_training_questions(dataset, tiny[1])
    # The Trainer API without the recipe's check: the collator refuses the batch, nothing trains on it.
    with pytest.raises(ValueError, match="no word the model's vocabulary knows"):
        DataCollatorForOpenQA(tiny[1])([{"question": "\U0001f600", "answers": ["x"]}])


def test_every_bad_question_is_named(tiny):
    questions = [QUESTIONS[0]] + [""] * 7
    with pytest.raises(ValueError) as err:
        tiny[0].answer(questions)
    message = str(err.value)
    assert "7 of 8 questions cannot be answered" in message and "more" not in message
    assert all(f"questions[{i}]" in message for i in range(1, 8))


def test_past_a_hundred_positions_the_message_says_how_to_list_them(tiny):
    with pytest.raises(ValueError, match=r"and 2 more \(`realm_hf.text.user_text.question_problems\("):
        tiny[0].answer([""] * 107)


# ------------------------------------------------------------------------------------------------------------------
# Contexts (pipeline)
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "context, message",
    [
        ("\x00\x00\x00", "Empty context"),
        ("\u200b \x00", "Empty context"),
        (b"Unix is an operating system.", r"A context must be a string, got bytes \(decode bytes first"),
        (3, "A context must be a string, got int"),
    ],
)
def test_contexts_that_are_no_text_are_refused(qa, context, message):
    with pytest.raises(ValueError, match=message):
        qa(QUESTIONS[0], context=context)


def test_question_too_long_to_read_with_a_context_is_a_clear_error(qa):
    question = "who wrote unix " * 15  # 45 wordpieces: [CLS] q [SEP] [SEP] leaves no room in 48
    with pytest.raises(ValueError, match=r"has 45 wordpieces.*reader_seq_len=48.*at most 44"):
        qa(question, context="Unix was written by Ken.")
    assert qa("who wrote unix " * 14 + "?", context="Unix was written by Ken.")["answer"]


# ------------------------------------------------------------------------------------------------------------------
# Integer arguments: one check (numpy integers in, bools and floats out)
# ------------------------------------------------------------------------------------------------------------------


def test_integer_arguments(tiny, qa):
    model = tiny[0]
    retriever = model.retriever
    query = torch.randn(1, retriever.embedding_dim)
    for bad in (True, 2.7, 0):
        with pytest.raises(ValueError, match=rf"`k` must be a positive integer, got {bad!r}"):
            retriever.search(query, k=bad)
        with pytest.raises(ValueError, match=rf"`top_k` must be a positive integer, got {bad!r}"):
            qa(QUESTIONS[0], top_k=bad)
        with pytest.raises(ValueError, match=rf"`num_blocks` must be a positive integer, got {bad!r}"):
            model.answer(QUESTIONS[0], num_blocks=bad)
    assert retriever.search(query, k=np.int64(2)).block_ids.shape == (1, 2)
    assert len(qa(QUESTIONS[0], top_k=np.int64(2))) == 2
    assert len(model.answer(QUESTIONS[0], num_blocks=np.int64(2))["retrieved"]) == 2


# ------------------------------------------------------------------------------------------------------------------
# NaN reader weights: an error, not "no answer"
# ------------------------------------------------------------------------------------------------------------------


def test_nan_reader_weights_are_an_error_not_an_empty_answer(tmp_path):
    model, _ = build_tiny_model(str(tmp_path))
    with torch.no_grad():
        model.reader.qa_outputs.dense_output.weight.fill_(float("nan"))
    qa = realm_hf.pipeline("question-answering", model=model)
    for call in (
        lambda: model.answer(QUESTIONS[0]),
        lambda: qa(QUESTIONS[0]),
        lambda: qa(QUESTIONS[0], context="Unix was written by Ken."),
    ):
        with pytest.raises(ValueError, match="The reader's span scores are NaN"):
            call()


# ------------------------------------------------------------------------------------------------------------------
# A tokenizer without its vocabulary is an error, not 5 special tokens that make every word [UNK]
# ------------------------------------------------------------------------------------------------------------------


def test_tokenizer_without_vocabulary_names_the_missing_file(tiny, tmp_path):
    from transformers import AutoTokenizer

    from realm_hf import RealmTokenizer

    with pytest.raises(OSError, match=r"the folder .* has no tokenizer.json or vocab.txt.*every word would become"):
        RealmTokenizer.from_pretrained(tmp_path)
    with pytest.raises(OSError, match=r"'google/realm-cc-news-pretrained-openqa' is not a local folder.*HF_HUB_OFF"):
        RealmTokenizer.from_pretrained("google/realm-cc-news-pretrained-openqa")
    saved = tmp_path / "tokenizer"
    tiny[1].save_pretrained(saved)
    assert len(AutoTokenizer.from_pretrained(saved)) == len(tiny[1])
    (saved / "tokenizer.json").unlink()  # tokenizer_config.json names RealmTokenizer: AutoTokenizer resolves to it
    with pytest.raises(OSError, match="has no tokenizer.json or vocab.txt"):
        AutoTokenizer.from_pretrained(saved)


def test_cli_tokenizer_lookup_refuses_a_folder_without_vocabulary(tmp_path):
    from realm_hf.cli.common import CLIError, load_tokenizer

    # A plain BERT tokenizer config (not realm-hf's class) and no vocabulary file.
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "BertTokenizer"}')
    with pytest.raises(CLIError, match="has no tokenizer.json or vocab.txt"):
        load_tokenizer(str(tmp_path))


# ------------------------------------------------------------------------------------------------------------------
# Config values: named where they enter (RealmConfig), not as a torch or FAISS error later
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("reader_beam_size", 0, r"`reader_beam_size` \(the number of retrieved blocks .*at least 1, got 0"),
        ("reader_beam_size", -3, r"`reader_beam_size` .* at least 1, got -3"),
        ("searcher_beam_size", 2.5, r"`searcher_beam_size` .* at least 1, got 2.5"),
        ("max_span_width", 0, r"`max_span_width` \(the widest answer span.*at least 1, got 0"),
        ("reader_seq_len", 3, r"`reader_seq_len` .* at least 10 .*max_span_width=10.*got 3"),
    ],
)
def test_config_values_name_the_field(field, value, message):
    from realm_hf import RealmConfig

    with pytest.raises(ValueError, match=message):
        RealmConfig(**{field: value})


def test_config_json_with_a_bad_value_names_the_field_at_load(tmp_path):
    from realm_hf import RealmConfig

    RealmConfig(reader_seq_len=64, max_span_width=4).save_pretrained(tmp_path)
    text = (tmp_path / "config.json").read_text().replace('"max_span_width": 4', '"max_span_width": 0')
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ValueError, match="`max_span_width`"):
        RealmConfig.from_pretrained(tmp_path)


# ------------------------------------------------------------------------------------------------------------------
# Documents: one doc_id type per corpus, empty texts named, damaged corpora refused at load
# ------------------------------------------------------------------------------------------------------------------

BUILD = dict(max_block_length=32, show_progress=False)


def test_one_doc_id_type_per_corpus(tiny):
    from realm_hf.retrieval.retriever import RealmRetriever

    model, tokenizer = tiny
    with pytest.raises(ValueError, match=r"Documents 0 and 1 have doc_ids of different types \(str '3'"):
        RealmRetriever.from_documents(
            [{"doc_id": 3, "text": "one"}, {"doc_id": "3", "text": "two"}], model.embedder, tokenizer, **BUILD
        )
    with pytest.raises(ValueError, match=r"Document 0's doc_id is \[1\] \(list\): a doc_id is an integer or a str"):
        RealmRetriever.from_documents([{"doc_id": [1], "text": "one"}], model.embedder, tokenizer, **BUILD)
    retriever = RealmRetriever.from_documents(
        [{"doc_id": np.int64(3), "text": "three"}, {"doc_id": 4, "text": "four"}], model.embedder, tokenizer, **BUILD
    )
    with pytest.raises(ValueError, match=r"doc_id '3' is a str, but this corpus's doc_ids are integers.*int\('3'\)"):
        retriever.add_documents([{"doc_id": "3", "text": "another three"}], model.embedder)
    with pytest.raises(ValueError, match=r"doc_id '3' is a str, but this corpus's doc_ids are integers"):
        retriever.remove_documents("3")
    with pytest.raises(ValueError, match=r"doc_ids\[0\] is \[3\] \(list\)"):
        retriever.remove_documents([[3]])
    assert len(retriever) == 2
    retriever.remove_documents(np.int64(3))
    assert retriever.store.texts(retriever.store.block_ids.tolist()) == ["four"]

    named = RealmRetriever.from_documents([{"doc_id": "a", "text": "one"}], model.embedder, tokenizer, **BUILD)
    with pytest.raises(ValueError, match=r"doc_id 7 is a int, but this corpus's doc_ids are strings.*str\(7\)"):
        named.add_documents([{"doc_id": 7, "text": "seven"}], model.embedder)
    assert len(named) == 1


def test_documents_without_text_are_named_in_a_warning(tiny, caplog):
    from realm_hf.retrieval.retriever import RealmRetriever

    model, tokenizer = tiny
    documents = [{"doc_id": 1, "text": ""}, {"doc_id": 2, "text": "two"}, {"doc_id": 3, "text": " \x00 "}]
    with caplog.at_level("WARNING", logger="realm_hf"):
        retriever = RealmRetriever.from_documents(documents, model.embedder, tokenizer, **BUILD)
    assert "2 document(s) have no text and are left out of the corpus" in caplog.text
    assert "doc_id [1, 3]" in caplog.text
    assert len(retriever) == 1


def _rewrite_corpus(directory, change):
    """Replace a saved retriever's corpus by `change(corpus)` and re-record its files, as a damaged save would be."""
    import json
    import shutil

    import datasets

    from realm_hf.constants import MANIFEST_NAME
    from realm_hf.retrieval.manifest import record_files

    corpus = change(datasets.load_from_disk(str(directory / "corpus")))
    corpus.save_to_disk(str(directory / "new_corpus"))
    shutil.rmtree(directory / "corpus")
    (directory / "new_corpus").rename(directory / "corpus")
    manifest = json.loads((directory / MANIFEST_NAME).read_text())
    manifest["files"] = record_files(str(directory))
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest))


def test_damaged_corpora_are_refused_at_load(tiny, tmp_path):
    import datasets

    from realm_hf.retrieval.retriever import RealmRetriever

    retriever = tiny[0].retriever
    numbers = tmp_path / "numbers"
    retriever.save_pretrained(numbers)
    _rewrite_corpus(numbers, lambda c: c.map(lambda _, i: {"text": i}, with_indices=True, remove_columns=["text"]))
    with pytest.raises(ValueError, match="The corpus's `text` column holds int64, not strings"):
        RealmRetriever.from_pretrained(numbers)

    short = tmp_path / "short"
    retriever.save_pretrained(short)
    unsized = datasets.Sequence(datasets.Value("float32"))  # a schema without a length, as Parquet gives
    _rewrite_corpus(
        short, lambda c: c.map(lambda row: {"embeddings": row["embeddings"][:8]}).cast_column("embeddings", unsized)
    )
    with pytest.raises(ValueError, match="The corpus embeddings have dimension 8 but the index has 16"):
        RealmRetriever.from_pretrained(short)


# ------------------------------------------------------------------------------------------------------------------
# The legacy retriever API (code ported from transformers 4)
# ------------------------------------------------------------------------------------------------------------------

# transformers v4.41 tests/models/realm/test_retrieval_realm.py: its vocabulary and block records.
LEGACY_VOCAB = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]", "test", "question", "this", "is", "the", "first"]
LEGACY_VOCAB += ["second", "third", "fourth", "fifth", "record", "want", "##want", "##ed", "wa", "un", "runn"]
LEGACY_VOCAB += ["##ing", ",", "low", "lowest"]
LEGACY_RECORDS = [f"This is the {n} record" for n in ("first", "second", "third", "fourth", "fifth")]
LEGACY_RECORDS.append("This is a longer longer longer record")


@pytest.fixture
def legacy_retriever(tmp_path):
    from realm_hf import RealmTokenizer
    from realm_hf.retrieval.retriever import RealmRetriever

    (tmp_path / "vocab.txt").write_text("".join(token + "\n" for token in LEGACY_VOCAB))
    tokenizer = RealmTokenizer.from_pretrained(tmp_path)
    embeddings = np.random.default_rng(0).standard_normal((len(LEGACY_RECORDS), 4)).astype(np.float32)
    return RealmRetriever.from_embeddings(embeddings, LEGACY_RECORDS, tokenizer=tokenizer)


def test_transformers_test_retrieve_passes(legacy_retriever):
    """transformers' own `test_retrieve`, against the legacy retriever call (it failed on `special_tokens_mask`)."""
    from realm_hf import RealmConfig
    from realm_hf.retrieval.legacy import legacy_retriever_call

    retriever, config = legacy_retriever, RealmConfig(num_block_records=5)
    tokenizer = retriever.tokenizer
    retrieved_block_ids = np.array([0, 3], dtype=np.int64)
    question_input_ids = tokenizer(["Test question"]).input_ids
    answer_ids = tokenizer(
        ["the fourth"], add_special_tokens=False, return_token_type_ids=False, return_attention_mask=False
    ).input_ids
    has_answers, start_pos, end_pos, concat_inputs = legacy_retriever_call(
        retriever,
        retrieved_block_ids,
        question_input_ids,
        answer_ids=answer_ids,
        max_length=config.reader_seq_len,
        return_tensors="np",
    )
    assert len(has_answers) == len(start_pos) == len(end_pos) == 2
    for key in ("input_ids", "attention_mask", "token_type_ids", "special_tokens_mask"):
        assert concat_inputs[key].shape == (2, 10)
    assert tokenizer.convert_ids_to_tokens(concat_inputs.input_ids[1]) == [
        "[CLS]", "test", "question", "[SEP]", "this", "is", "the", "fourth", "record", "[SEP]"
    ]  # fmt: skip
    assert concat_inputs.special_tokens_mask[1].tolist() == [1, 0, 0, 1, 0, 0, 0, 0, 0, 1]


def test_transformers_test_block_has_answer_passes(legacy_retriever):
    from realm_hf.retrieval.legacy import legacy_retriever_call

    tokenizer = legacy_retriever.tokenizer
    answer_ids = tokenizer(
        ["the fourth", "longer longer"],
        add_special_tokens=False,
        return_token_type_ids=False,
        return_attention_mask=False,
    ).input_ids
    has_answers, start_pos, end_pos, _ = legacy_retriever_call(
        legacy_retriever,
        np.array([0, 3, 5]),
        tokenizer(["Test question"]).input_ids,
        answer_ids=answer_ids,
        max_length=320,
        return_tensors="np",
    )
    assert has_answers == [False, True, True]
    assert start_pos == [[-1, -1, -1], [6, -1, -1], [6, 7, 8]]
    assert end_pos == [[-1, -1, -1], [7, -1, -1], [7, 8, 9]]


def test_legacy_positional_constructor_says_what_replaces_it(legacy_retriever):
    from realm_hf.retrieval.retriever import RealmRetriever

    records = np.array([text.encode() for text in LEGACY_RECORDS], dtype=object)
    with pytest.raises(TypeError, match=r"transformers 4 constructor.*from_legacy.*from_documents"):
        RealmRetriever(records, legacy_retriever.tokenizer)


def test_legacy_keyword_constructor_says_what_replaces_it_too(legacy_retriever):
    """`RealmRetriever(block_records=..., tokenizer=...)` gets the positional form's message, not Python's own."""
    from realm_hf.retrieval.retriever import RealmRetriever

    records = np.array([text.encode() for text in LEGACY_RECORDS], dtype=object)
    with pytest.raises(TypeError, match=r"transformers 4 constructor.*from_legacy.*from_documents"):
        RealmRetriever(block_records=records, tokenizer=legacy_retriever.tokenizer)
    # Any other unknown keyword is still refused by name, and the parts are required.
    with pytest.raises(TypeError, match="unexpected keyword argument.*colour"):
        RealmRetriever(legacy_retriever.corpus, legacy_retriever.store.index.index, colour="red")
    with pytest.raises(TypeError, match="needs a `corpus`"):
        RealmRetriever(tokenizer=legacy_retriever.tokenizer)


# ------------------------------------------------------------------------------------------------------------------
# The CLI's readers and outputs
# ------------------------------------------------------------------------------------------------------------------


def test_question_file_with_a_byte_order_mark_is_read_as_json_lines(tmp_path):
    from realm_hf.cli.readers import load_qa, read_questions

    path = tmp_path / "questions.txt"
    path.write_bytes(b'\xef\xbb\xbf{"question": "who wrote unix?"}\n{"question": "what is lisp?"}\n')
    assert [item[1] for item in read_questions(file=str(path))] == ["who wrote unix?", "what is lisp?"]
    qa_file = tmp_path / "qa.jsonl"
    qa_file.write_bytes(b'\xef\xbb\xbf{"question": "who wrote unix?", "answers": ["ken"]}\n')
    assert load_qa(str(qa_file), "question", "answers")["question"] == ["who wrote unix?"]


def test_cli_names_a_directory_given_as_a_file(tmp_path):
    from realm_hf.cli.common import CLIError
    from realm_hf.cli.readers import read_questions

    with pytest.raises(CLIError, match="is a directory: give a file of questions"):
        read_questions(file=str(tmp_path))


def test_cli_null_document_text_names_file_and_record(tmp_path):
    from realm_hf.cli.common import CLIError
    from realm_hf.cli.readers import load_documents

    path = tmp_path / "docs.jsonl"
    path.write_text('{"title": "a", "text": "one"}\n{"title": "b", "text": null}\n')
    with pytest.raises(CLIError, match=rf"{path}: record 2: the text is missing \(null\)"):
        load_documents([str(path)])


def test_cli_evaluate_output_directory_is_named_before_any_work(tmp_path, capsys):
    from realm_hf.cli import main

    qa_file = tmp_path / "qa.jsonl"
    qa_file.write_text('{"question": "who wrote unix?", "answers": ["ken"]}\n')
    model = tmp_path / "not-a-model"
    model.mkdir()  # exists, so the early path check passes: the output is refused before the model is read
    status = main(["-q", "evaluate", str(qa_file), "--model", str(model), "--output", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 2 and f"--output {str(tmp_path)!r} is a directory: give a file name" in err


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("docs.jsonl", b"", "is empty: give a json file"),  # datasets answered with a bare StopIteration
        ("docs.jsonl", b"\n  \n\n", "holds only blank lines"),
        ("docs.csv", b"", "is empty: give a csv file"),
        ("docs.csv", b"title,text\n", r"no records \(a header only\?\)"),  # datasets: 'Instruction "train" ...'
        ("docs.parquet", b"", "is empty: give a parquet file"),
    ],
)
def test_cli_documents_file_without_records_is_named(tmp_path, name, content, message):
    from realm_hf.cli.common import CLIError
    from realm_hf.cli.readers import load_documents

    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(CLIError, match=message) as caught:
        load_documents([str(path)])
    assert str(path) in str(caught.value)


def test_cli_model_given_as_a_file_is_named(tmp_path, capsys):
    from realm_hf.cli import main

    model = tmp_path / "model.safetensors"
    model.write_bytes(b"not a directory")
    status = main(["-q", "ask", "--model", str(model), "who wrote unix?"])
    err = capsys.readouterr().err
    # Before: the Hub client's "Repo id must be in the form 'repo_name' or 'namespace/repo_name'".
    assert status == 2 and f"Model {str(model)!r} is a file: give a model directory" in err
