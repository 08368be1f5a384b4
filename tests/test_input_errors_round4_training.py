"""
Training data that cannot train, refused when the Trainer is built (reliability, round 4): the Trainers users build
themselves (`RealmOpenQATrainer`, `RealmReaderTrainer`) check their data as the recipes do, and a reader warm-up
example whose answer is not in what the reader reads is said, not trained on at loss 0 in silence.
"""

import logging

import datasets
import pytest
import torch

from realm_hf.training.openqa import BeamAnswerTally, RealmOpenQATrainer, evaluate_openqa
from realm_hf.training.warmups import DataCollatorForReaderWarmup, RealmReaderTrainer
from tests.support.tiny_model import DOCS, build_tiny_model
from tests.training.test_warmups import arguments as warmup_arguments

GOOD = {"question": ["who wrote unix?", "what is a compiler?"], "answers": [["Ken Thompson"], ["program"]]}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny")))[0]


def arguments(tmp_path):
    # One step of two questions, logged (test_warmups' arguments).
    return warmup_arguments(tmp_path, steps=1, batch=2)


@pytest.mark.parametrize(
    "data, message",
    [
        # Before: the stock Trainer's "The model did not return a loss from the inputs" at the first step.
        ({"question": GOOD["question"]}, "The training data has no 'answers' column"),
        # Before: a bare KeyError: 'question' from the collator at the first step.
        ({"q": GOOD["question"], "answers": GOOD["answers"]}, "The training data has no 'question' column"),
        # Before: torch's "num_samples should be a positive integer value, but got num_samples=0".
        ({"question": [], "answers": []}, "The training data is empty"),
    ],
)
def test_openqa_trainer_refuses_data_it_cannot_train_on(tiny, tmp_path, data, message):
    with pytest.raises(ValueError, match=message):
        RealmOpenQATrainer(model=tiny, args=arguments(tmp_path), train_dataset=datasets.Dataset.from_dict(data))


def test_openqa_trainer_checks_its_evaluation_data_too(tiny, tmp_path):
    train = datasets.Dataset.from_dict(GOOD)
    with pytest.raises(ValueError, match="The evaluation data has no 'answers' column"):
        RealmOpenQATrainer(
            model=tiny,
            args=arguments(tmp_path),
            train_dataset=train,
            eval_dataset=train.remove_columns("answers"),
        )


def test_openqa_trainer_accepts_good_data(tiny, tmp_path):
    trainer = RealmOpenQATrainer(model=tiny, args=arguments(tmp_path), train_dataset=datasets.Dataset.from_dict(GOOD))
    assert trainer.train().global_step == 1


def test_evaluation_without_answers_names_the_column(tiny):
    # Before: datasets' "Column 'answers' doesn't exist." with no word of which data or what to do.
    with pytest.raises(ValueError, match="The evaluation data has no 'answers' column .* pass `answers_column`"):
        evaluate_openqa(tiny, datasets.Dataset.from_dict({"question": GOOD["question"]}), show_progress=False)


WARMUP = {
    "question": ["who wrote unix?"],
    "context": ["Unix is an operating system written by Ken Thompson and Dennis Ritchie at Bell Labs."],
    "answers": [["Ken Thompson"]],
}


@pytest.mark.parametrize(
    "drop, message",
    [
        ("context", "The reader warm-up data has no 'context' column"),  # before: KeyError: 'context'
        ("answers", "The reader warm-up data has no 'answers' column"),
    ],
)
def test_reader_trainer_refuses_data_without_its_columns(tiny, tmp_path, drop, message):
    data = datasets.Dataset.from_dict(WARMUP).remove_columns(drop)
    collator = DataCollatorForReaderWarmup(tiny.retriever.tokenizer, max_length=48)
    with pytest.raises(ValueError, match=message):
        RealmReaderTrainer(model=tiny.reader, args=arguments(tmp_path), train_dataset=data, data_collator=collator)


def test_reader_trainer_refuses_empty_data(tiny, tmp_path):
    data = datasets.Dataset.from_dict({k: [] for k in WARMUP})
    collator = DataCollatorForReaderWarmup(tiny.retriever.tokenizer, max_length=48)
    with pytest.raises(ValueError, match="The reader warm-up data is empty"):
        RealmReaderTrainer(model=tiny.reader, args=arguments(tmp_path), train_dataset=data, data_collator=collator)


def test_warmup_examples_without_their_answer_are_said_and_counted(tiny, caplog):
    collator = DataCollatorForReaderWarmup(tiny.retriever.tokenizer, max_length=48)
    answered = {k: v[0] for k, v in WARMUP.items()}
    unanswered = dict(answered, context="Unix is an operating system.")
    with caplog.at_level(logging.WARNING):
        collator([answered, answered])
        assert collator.num_without_answer == 0 and "without its answer" not in caplog.text
        batch = collator([answered, unanswered, unanswered])
    assert collator.num_without_answer == 2
    assert "without its answer in the first 48 wordpieces" in caplog.text and "who wrote unix?" in caplog.text
    # Said once, counted after: a large file of them does not flood the log.
    assert caplog.text.count("without its answer") == 1
    assert batch["has_answers"].any(-1).tolist() == [True, False, False]


def test_beam_answer_tally_logs_the_share_and_warns_once_at_zero(caplog):
    tally = BeamAnswerTally()
    logs = {"loss": 1.0}
    tally.log_into(logs)
    assert "answer_in_beam" not in logs  # nothing counted yet
    tally.add(torch.tensor([True, False]))
    tally.add(torch.tensor([False, False]))
    tally.log_into(logs)
    assert logs["answer_in_beam"] == 0.25
    eval_logs = {"eval_exact_match": 1.0}
    tally.add(torch.tensor([True]))
    tally.log_into(eval_logs)  # not a training log: left alone, the count kept
    assert "answer_in_beam" not in eval_logs
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            logs = {"loss": 0.0}
            tally.add(torch.tensor([False, False, False]))
            tally.log_into(logs)
    assert logs["answer_in_beam"] == 0.0
    assert caplog.text.count("had a gold answer in its retrieved blocks, so the loss is 0") == 1


@pytest.mark.parametrize(
    "answers, share", [([["Ken Thompson"], ["machine code"]], 1.0), ([["zebra"], ["walrus"]], 0.0)]
)
def test_openqa_training_logs_how_many_beams_held_an_answer(tmp_path, answers, share):
    # Every block is retrieved (beam = corpus), so the share is known without the model: answers in DOCS or not.
    model = build_tiny_model(str(tmp_path))[0]
    model.config.searcher_beam_size = len(DOCS)
    args = arguments(tmp_path)
    data = datasets.Dataset.from_dict({"question": GOOD["question"], "answers": answers})
    trainer = RealmOpenQATrainer(model=model, args=args, train_dataset=data)
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [entry["answer_in_beam"] for entry in logged] == [share]
    # Before, a run of answers absent from the corpus trained at loss 0 and said nothing.
    assert (logged[0]["loss"] == 0.0) == (share == 0.0)


def test_retriever_warmup_logs_how_many_beams_held_an_answer(tmp_path):
    from realm_hf.training.recipes import retriever_warmup_trainer

    model = build_tiny_model(str(tmp_path))[0]
    model.config.searcher_beam_size = len(DOCS)
    args = arguments(tmp_path)
    data = datasets.Dataset.from_dict({"question": GOOD["question"], "answers": [["Ken Thompson"], ["zebra"]]})
    trainer = retriever_warmup_trainer(model, args, data)
    trainer.train()
    assert [entry["answer_in_beam"] for entry in trainer.state.log_history if "loss" in entry] == [0.5]
