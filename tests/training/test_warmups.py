"""
The two warm-up recipes before Open-QA fine-tuning (`realm_hf.training.warmups`): their
data, their collator and loss, and that each trains what it should and nothing else, on the tiny legacy fixture.
"""

import logging
import random

import datasets
import pytest
import torch
from transformers import TrainingArguments

from realm_hf import RealmForOpenQA
from realm_hf.metrics import has_answer, normalize_answer
from realm_hf.training.recipes import reader_warmup_examples, reader_warmup_trainer, retriever_warmup_trainer
from realm_hf.training.warmups import (
    BLANK,
    DataCollatorForReaderWarmup,
    RealmReaderTrainer,
    add_retrieved_negatives,
    blank_to_question,
    make_cloze_reading_examples,
    make_gold_block_examples,
    retrieval_loss,
)
from tests.support.paths import LEGACY_OPENQA
from tests.support.tiny_model import DOCS, build_tiny_model

BLOCKS = [
    {
        "doc_id": 1,
        "text": "Port Estrel was founded in 1642 by sailors from Caldera. The harbour faces the Sarrow Sea.",
    },
    {"doc_id": 2, "text": "Mirela Costa designed the Torre Alba lighthouse. She studied in Caldera under Tomas Rinn."},
    {"doc_id": 3, "text": "short."},
]


def tiny_model():
    torch.manual_seed(0)
    model = RealmForOpenQA.from_pretrained(LEGACY_OPENQA, allow_pickle=True)
    model.config.searcher_beam_size = 6
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def arguments(tmp_path, steps, lr=5e-3, batch=4):
    return TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=steps,
        per_device_train_batch_size=batch,
        learning_rate=lr,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        logging_steps=1,
    )


def test_cloze_reading_examples_blank_a_salient_span_of_their_own_block():
    examples = make_cloze_reading_examples(BLOCKS, seed=0, max_per_block=None, question_share=0.0)
    # Two sentences per prose block have a name or number; the one-word block has none.
    assert len(examples) == 4
    for example in examples:
        assert example["context"] in (BLOCKS[0]["text"], BLOCKS[1]["text"])
        answer = example["answers"][0]
        assert example["question"].count(BLANK) == 1
        # Filling the blank gives back a sentence of the block: the block holds the answer where the blank was.
        assert example["question"].replace(BLANK, answer) in example["context"]
        assert not has_answer(example["question"], [answer])
    # With question_share=1 every blank becomes a question phrase.
    for example in make_cloze_reading_examples(BLOCKS, seed=0, question_share=1.0):
        assert BLANK not in example["question"] and example["question"].endswith("?")
    # The draw depends on the seed and the block only.
    assert make_cloze_reading_examples(BLOCKS[:1], seed=3) == make_cloze_reading_examples(BLOCKS[:1], seed=3)


def test_blank_to_question_picks_the_phrase_by_answer_kind():
    rng = random.Random(0)
    for _ in range(5):
        assert blank_to_question("Kubrick directed the film in ___.", "1968", rng) in (
            "Kubrick directed the film in what year?",
            "Kubrick directed the film in when?",
        )
        assert blank_to_question("It has ___ speakers.", "44,000", rng) in (
            "It has how many speakers?",
            "It has what number speakers?",
        )
        assert blank_to_question("___ designed the lighthouse.", "Mirela Costa", rng) in (
            "Who designed the lighthouse?",
            "What designed the lighthouse?",
            "Which designed the lighthouse?",
        )
    assert blank_to_question("She was born on ___.", "12 March 1990", rng) == "She was born on when?"


def test_gold_block_examples_read_the_first_block_of_the_article_holding_the_answer():
    blocks_by_doc = {7: ["Nothing here.", "The answer is Ardon.", "Ardon again."], 8: ["No answer."]}
    questions = [
        {"question": "capital?", "answers": ["Ardon"], "doc_id": 7},
        {"question": "where?", "answers": ["Ardon"], "doc_id": 8},
    ]
    assert make_gold_block_examples(questions, blocks_by_doc) == [
        {"question": "capital?", "context": "The answer is Ardon.", "answers": ["Ardon"]}
    ]


def test_collator_marks_the_answer_span_in_the_block():
    model = tiny_model()
    tokenizer = model.retriever.tokenizer
    collator = DataCollatorForReaderWarmup(tokenizer, max_length=48)
    batch = collator(
        [
            {
                "question": "what is the capital of france?",
                "context": "paris is the capital of france.",
                "answers": ["paris"],
            },
            {
                "question": "who created python?",
                "context": "guido van rossum created python.",
                "answers": ["guido van rossum"],
            },
        ]
    )
    assert batch["input_ids"].shape[:2] == (2, 1) and batch["relevance_score"].shape == (2, 1)
    assert batch["has_answers"].tolist() == [[True], [True]]
    for row, answer in enumerate(["paris", "guido van rossum"]):
        start, end = batch["start_positions"][row, 0, 0], batch["end_positions"][row, 0, 0]
        ids = batch["input_ids"][row, 0, start : end + 1].tolist()
        assert normalize_answer(tokenizer.decode(ids)) == answer
        # The span lies in the block segment, after the question's [SEP].
        assert batch["block_mask"][row, 0, start] and batch["token_type_ids"][row, 0, start] == 1


def test_reader_warmup_trains_the_reader_only(tmp_path):
    model = tiny_model()
    examples = datasets.Dataset.from_list(
        [
            {
                "question": "what is the capital of france?",
                "context": "paris is the capital of france.",
                "answers": ["paris"],
            },
            {
                "question": "what is the capital of england?",
                "context": "london is the capital of england.",
                "answers": ["london"],
            },
            {
                "question": "who created python?",
                "context": "guido van rossum created python in the netherlands.",
                "answers": ["guido van rossum"],
            },
            {
                "question": "what is linux?",
                "context": "linux is an operating system kernel.",
                "answers": ["operating system kernel"],
            },
        ]
    )
    collator = DataCollatorForReaderWarmup(model.retriever.tokenizer, max_length=model.config.reader_seq_len)
    batch = collator(list(examples))
    embedder_before = {k: v.clone() for k, v in model.embedder.state_dict().items()}
    with torch.no_grad():
        loss_before = model.reader(**batch).loss.item()
    trainer = reader_warmup_trainer(model, arguments(tmp_path, steps=20), examples)
    trainer.train()
    with torch.no_grad():
        after = model.reader(**batch)
    assert after.loss.item() < loss_before * 0.5
    # The reader now picks the gold span in every pair.
    assert after.reader_correct.any(-1).all()
    for key, value in model.embedder.state_dict().items():
        assert torch.equal(value, embedder_before[key]), key


def test_reader_warmup_examples_from_a_retriever_skip_held_out_documents(tmp_path):
    from realm_hf import RealmRetriever

    model = tiny_model()
    retriever = RealmRetriever.from_documents(
        BLOCKS, model.embedder, model.retriever.tokenizer, max_block_length=48, show_progress=False
    )
    questions = [{"question": "who founded it?", "answers": ["Caldera"], "doc_id": 1}]
    examples = reader_warmup_examples(retriever, questions, cloze_per_block=None, question_share=0.0)
    contexts = set(examples["context"])
    assert len(examples) == 5  # 4 cloze + 1 gold-block example
    held_out = reader_warmup_examples(retriever, questions, exclude_doc_ids=[1], cloze_per_block=None)
    assert BLOCKS[0]["text"] not in set(held_out["context"]) and BLOCKS[0]["text"] in contexts
    with pytest.raises(ValueError, match="no example"):
        reader_warmup_examples(retriever, [], exclude_doc_ids=[1, 2, 3])


def test_retrieval_loss_is_realms_marginal_over_the_beam():
    model = tiny_model()
    retriever = model.retriever
    tokenizer = retriever.tokenizer
    questions = ["what is the capital of france?", "who created python?"]
    answers = [["paris"], ["guido van rossum"]]
    inputs = tokenizer(questions, padding=True, return_tensors="pt")
    model.eval()
    loss, has = retrieval_loss(model, inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"], answers)
    # By hand: the question vectors against every stored block vector, the top 6, which hold an answer by text.
    with torch.no_grad():
        q = model.embed_questions(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"])
        ids = torch.as_tensor(retriever.store.block_ids).view(1, -1)
        blocks = retriever.store.embeddings(ids)[0]
        texts = retriever.store.texts(ids)[0]
        expected = []
        for i in range(2):
            scores = blocks @ q[i]
            top = scores.topk(6).indices
            correct = torch.tensor([has_answer(texts[j], answers[i]) for j in top.tolist()])
            assert correct.any()
            expected.append(torch.logsumexp(scores[top], 0) - torch.logsumexp(scores[top][correct], 0))
    assert has.tolist() == [True, True]
    assert loss.item() == pytest.approx(torch.stack(expected).mean().item(), rel=1e-5)


def test_retriever_warmup_trains_only_the_question_embedder(tmp_path):
    model = tiny_model()
    model.add_document_embedder()
    model.freeze_document_embedder()
    questions = datasets.Dataset.from_list(
        [
            {"question": "what is the capital of france?", "answers": ["paris"]},
            {"question": "who created python?", "answers": ["guido van rossum"]},
            {"question": "what is the capital of england?", "answers": ["london"]},
            {"question": "what is linux?", "answers": ["operating system"]},
        ]
    )
    tokenizer = model.retriever.tokenizer
    inputs = tokenizer(list(questions["question"]), padding=True, return_tensors="pt")

    def loss():
        with torch.no_grad():
            return retrieval_loss(model, **inputs, answers=list(questions["answers"]))[0].item()

    before = loss()
    reader = {k: v.clone() for k, v in model.reader.state_dict().items()}
    documents = {k: v.clone() for k, v in model.document_embedder.state_dict().items()}
    retriever_warmup_trainer(model, arguments(tmp_path, steps=15, lr=1e-3), questions).train()
    assert loss() < before
    for key, value in model.reader.state_dict().items():
        assert torch.equal(value, reader[key]), key
    for key, value in model.document_embedder.state_dict().items():
        assert torch.equal(value, documents[key]), key


def test_reader_warmup_marks_the_open_qa_models_reader_as_trained(tmp_path):
    # The Trainer holds only `model.reader`; the Open-QA model's config (what is saved) must still say so.
    model = tiny_model()
    model.config.reader_trained = False
    examples = datasets.Dataset.from_list(
        [{"question": "who founded it?", "context": BLOCKS[0]["text"], "answers": ["sailors"]}] * 2
    )
    reader_warmup_trainer(model, arguments(tmp_path, steps=1), examples).train()
    assert model.config.reader_trained is True
    model.save_pretrained(tmp_path / "saved")
    with open(tmp_path / "saved" / "config.json") as f:
        assert '"reader_trained": true' in f.read()


def test_cloze_examples_without_their_sentence_keep_only_answers_the_rest_of_the_block_holds():
    blocks = [
        {
            "text": "Port Estrel was founded in 1642 by sailors from Caldera. Caldera traded with the Sarrow Sea ports. "
            "The town grew after 1642."
        }
    ]
    examples = make_cloze_reading_examples(blocks, seed=0, max_per_block=None, question_share=0.0, keep_sentence=False)
    assert examples
    for example in examples:
        sentence = example["question"].replace(BLANK, example["answers"][0])
        # The question's own sentence is gone from the context, and the answer is still in what is left.
        assert sentence not in example["context"]
        assert sentence in blocks[0]["text"]
        assert has_answer(example["context"], example["answers"])
    # "Port Estrel" occurs only in the removed sentence: never an answer without it.
    assert all(example["answers"] != ["Port Estrel"] for example in examples)


def test_group_by_length_batches_similar_lengths_in_the_warmups(tmp_path):
    model = tiny_model()
    short = [{"question": f"what is item {i}?", "answers": ["paris"]} for i in range(32)]
    long = [
        {
            "question": "which city " + " ".join(["very"] * 30) + f" large item {i} is the capital?",
            "answers": ["paris"],
        }
        for i in range(32)
    ]
    questions = datasets.Dataset.from_list([q for pair in zip(short, long) for q in pair])

    def mixed_batches(trainer):
        # A batch of one short and one long question pads the short one to the long one's length.
        return sum(len(set(batch["attention_mask"].sum(1).tolist())) > 1 for batch in trainer.get_train_dataloader())

    args = arguments(tmp_path, steps=1, batch=2)
    args.train_sampling_strategy = "group_by_length"
    trainer = retriever_warmup_trainer(model, args, questions)
    assert trainer.train_dataset["length"][:2] == [4, 38]
    # transformers' LengthGroupedSampler sorts megabatches of 16 here: at most one mixed batch in each of the four,
    # where a random order mixes about half of the 32 batches.
    assert mixed_batches(trainer) <= 4
    assert mixed_batches(retriever_warmup_trainer(model, arguments(tmp_path, 1, batch=2), questions)) > 8
    # Without grouping the dataset is left as given.
    assert (
        "length" not in retriever_warmup_trainer(model, arguments(tmp_path, 1), questions).train_dataset.column_names
    )


def test_open_qa_fine_tuning_takes_length_grouped_batches_too(tmp_path):
    # The demo gives every stage the same arguments: the Open-QA recipe must add and keep the length column as well.
    from realm_hf.training.recipes import openqa_trainer

    model = tiny_model()
    questions = datasets.Dataset.from_list(
        [{"question": f"what is item {i}?", "answers": ["paris"]} for i in range(4)]
    )
    args = arguments(tmp_path, steps=1, batch=2)
    args.train_sampling_strategy = "group_by_length"
    trainer = openqa_trainer(model, args, questions)
    assert "length" in trainer.train_dataset.column_names
    assert [batch["input_ids"].shape[0] for batch in trainer.get_train_dataloader()] == [2, 2]


def _retriever_over_blocks(model):
    from realm_hf import RealmRetriever

    blocks = BLOCKS[:2] + [
        {"doc_id": 4, "text": "The Sarrow Sea is shallow and cold. Its fishermen sail from Port Estrel in spring."},
        {"doc_id": 5, "text": "Tomas Rinn taught architecture in Caldera for forty years."},
    ]
    retriever = RealmRetriever.from_documents(
        blocks, model.embedder, model.retriever.tokenizer, max_block_length=48, show_progress=False
    )
    model.set_retriever(retriever)
    return retriever


def test_retrieved_negatives_are_the_best_scored_blocks_other_than_the_context():
    model = tiny_model()
    retriever = _retriever_over_blocks(model)
    texts = retriever.corpus["text"]
    examples = [
        {"question": "who designed the torre alba lighthouse?", "context": texts[1], "answers": ["Mirela Costa"]},
        {"question": "when was port estrel founded?", "context": texts[0], "answers": ["1642"]},
    ]
    with_negatives = add_retrieved_negatives(model, examples, num_negatives=2)
    # Ranked by hand: inner products of the question embeddings with every stored block embedding.
    tokenizer = retriever.tokenizer
    embeddings = retriever.store.embeddings(retriever.store.block_ids)
    for example, result in zip(examples, with_negatives):
        encoded = tokenizer([example["question"]], return_tensors="pt")
        with torch.no_grad():
            query = model.eval().embed_questions(**encoded)[0]
        order = torch.argsort(embeddings @ query, descending=True).tolist()
        expected = [texts[i] for i in order if texts[i] != example["context"]][:2]
        assert result["negatives"] == expected
        assert {k: result[k] for k in example} == example  # the example itself is unchanged
    assert "negatives" not in examples[0]  # the caller's examples are not modified


def test_retrieved_negatives_refuse_bad_counts():
    model = tiny_model()
    _retriever_over_blocks(model)
    example = {"question": "who taught in caldera?", "context": "x", "answers": ["Tomas Rinn"]}
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="num_negatives"):
            add_retrieved_negatives(model, [example], num_negatives=bad)
    with pytest.raises(ValueError, match="too few"):
        add_retrieved_negatives(model, [example], num_negatives=4)


def test_negatives_are_read_in_one_beam_and_the_span_loss_is_normalised_over_all_blocks():
    model = tiny_model()
    tokenizer = model.retriever.tokenizer
    collator = DataCollatorForReaderWarmup(tokenizer, max_length=48)
    example = {
        "question": "what is the capital of france?",
        "context": "paris is the capital of france.",
        "answers": ["paris"],
        "negatives": ["berlin is the capital of germany.", "rome is in italy, not in france."],
    }
    batch = collator([example, dict(example, question="which city is the capital of france?")])
    assert batch["input_ids"].shape[:2] == (2, 3) and batch["relevance_score"].shape == (2, 3)
    assert batch["has_answers"].tolist() == [[True, False, False]] * 2
    with torch.no_grad():
        out = model.reader.eval()(**batch)
    logits, correct = out.reader_logits.reshape(2, -1), out.reader_correct.reshape(2, -1)
    assert correct[:, logits.shape[1] // 3 :].sum() == 0  # only spans of the context block are right
    expected = -(torch.logsumexp(logits.masked_fill(~correct, -torch.inf), -1) - torch.logsumexp(logits, -1))
    torch.testing.assert_close(out.reader_loss, expected)
    # The negatives' spans enlarge the normaliser: the loss is higher than reading the context alone.
    alone = model.reader(**collator([{k: v for k, v in example.items() if k != "negatives"}]))
    assert out.reader_loss[0] > alone.reader_loss[0]
    with pytest.raises(ValueError, match="same number of `negatives`"):
        collator([example, {k: v for k, v in example.items() if k != "negatives"}])


def test_reader_warmup_examples_with_negatives_keep_one_pass_and_need_the_model():
    model = tiny_model()
    retriever = _retriever_over_blocks(model)
    questions = [{"question": "who designed the lighthouse?", "answers": ["Mirela Costa"], "doc_id": 2}]
    full = reader_warmup_examples(retriever, questions, cloze_per_block=None, question_share=0.0)
    examples = reader_warmup_examples(
        retriever, questions, cloze_per_block=None, question_share=0.0, negatives=1, model=model, max_examples=3
    )
    assert len(full) > 3 and len(examples) == 3
    assert examples["question"] == full["question"][:3]  # the same shuffle, cut after it
    for row in examples:
        assert len(row["negatives"]) == 1 and row["negatives"][0] != row["context"]
        assert row["negatives"][0] in retriever.corpus["text"]
    with pytest.raises(ValueError, match="pass `model`"):
        reader_warmup_examples(retriever, questions, negatives=1)
    with pytest.raises(ValueError, match="max_examples"):
        reader_warmup_examples(retriever, questions, max_examples=0)


WARMUP = {
    "question": ["who wrote unix?"],
    "context": ["Unix is an operating system written by Ken Thompson and Dennis Ritchie at Bell Labs."],
    "answers": [["Ken Thompson"]],
}


@pytest.mark.parametrize(
    "drop, message",
    [
        ("context", "warm-up data.*'context'"),  # before: KeyError: 'context'
        ("answers", "warm-up data.*'answers'"),
    ],
)
def test_reader_trainer_refuses_data_without_its_columns(tiny, tmp_path, drop, message):
    data = datasets.Dataset.from_dict(WARMUP).remove_columns(drop)
    collator = DataCollatorForReaderWarmup(tiny[0].retriever.tokenizer, max_length=48)
    with pytest.raises(ValueError, match=message):
        RealmReaderTrainer(
            model=tiny[0].reader,
            args=arguments(tmp_path, steps=1, batch=2),
            train_dataset=data,
            data_collator=collator,
        )


def test_reader_trainer_refuses_empty_data(tiny, tmp_path):
    data = datasets.Dataset.from_dict({k: [] for k in WARMUP})
    collator = DataCollatorForReaderWarmup(tiny[0].retriever.tokenizer, max_length=48)
    with pytest.raises(ValueError, match="warm-up data.*empty"):
        RealmReaderTrainer(
            model=tiny[0].reader,
            args=arguments(tmp_path, steps=1, batch=2),
            train_dataset=data,
            data_collator=collator,
        )


def test_warmup_examples_without_their_answer_are_said_and_counted(tiny, caplog):
    collator = DataCollatorForReaderWarmup(tiny[0].retriever.tokenizer, max_length=48)
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


def test_retriever_warmup_logs_how_many_beams_held_an_answer(tmp_path):
    from realm_hf.training.recipes import retriever_warmup_trainer

    model = build_tiny_model(str(tmp_path))[0]
    model.config.searcher_beam_size = len(DOCS)
    args = arguments(tmp_path, steps=1, batch=2)
    data = datasets.Dataset.from_dict(
        {"question": ["who wrote unix?", "what is a compiler?"], "answers": [["Ken Thompson"], ["zebra"]]}
    )
    trainer = retriever_warmup_trainer(model, args, data)
    trainer.train()
    assert [entry["answer_in_beam"] for entry in trainer.state.log_history if "loss" in entry] == [0.5]
