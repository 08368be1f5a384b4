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
    with pytest.raises(ValueError, match=r"and 2 more \(`realm_hf.text_inputs.question_problems\("):
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
