"""`config.reader_beam_positive`: training reads an answer-holding block from further down the searcher beam.

The model is the tiny legacy fixture of support/legacy_model.py (hidden 32, 2 layers, 12 blocks, searcher beam 6,
reader beam 3, dropout off); each question's answer is a word found only in a block ranked below the reader beam.
"""

import re

import pytest
import torch

from realm_hf import RealmConfig
from realm_hf.models.reader_inputs import build_reader_inputs, positive_block_order, tokenize_answers
from realm_hf.training.openqa import DataCollatorForOpenQA
from tests.support.legacy_model import QUESTIONS, make_model


def test_order_swaps_the_first_answer_holding_block_into_the_last_read_place():
    has = torch.tensor(
        [
            [0, 0, 0, 0, 1, 1],  # needs it: the first holder (place 4) is read in place 2
            [0, 1, 0, 0, 1, 0],  # already reads one: unchanged
            [0, 0, 0, 0, 0, 0],  # none anywhere: unchanged
            [0, 0, 0, 1, 0, 0],  # the first unread place holds it
        ],
        dtype=torch.bool,
    )
    order = positive_block_order(has, reader_beam_size=3)
    assert order.tolist() == [[0, 1, 4, 3, 2, 5], [0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5], [0, 1, 3, 2, 4, 5]]
    # Nothing to do: no reordering at all.
    assert positive_block_order(has[1:3], reader_beam_size=3) is None
    assert positive_block_order(has, reader_beam_size=6) is None


def test_config_checks_and_keeps_the_option(tmp_path):
    with pytest.raises(ValueError, match="reader_beam_positive"):
        RealmConfig(reader_beam_positive="yes")
    config = RealmConfig(reader_beam_positive=True)
    config.save_pretrained(tmp_path)
    assert RealmConfig.from_pretrained(tmp_path).reader_beam_positive is True
    assert RealmConfig().reader_beam_positive is False


def questions_answered_below_the_reader_beam(model):
    """QUESTIONS with each answer replaced by a word of its 5th-ranked block that none of the 4 above it holds."""
    collator = DataCollatorForOpenQA(model.retriever.tokenizer)
    model.eval()
    with torch.no_grad():
        batch = collator(QUESTIONS)
        question = model.embed_questions(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        search = model.retriever.search(question, model.config.searcher_beam_size)
    tokenizer = model.retriever.tokenizer
    questions = []
    for item, row in zip(QUESTIONS, search.blocks):
        for word in re.findall(r"[a-z]{3,}", row[4]["text"].lower()):
            # Where the reader's own matching (wordpieces in the pair) finds it, not only the text.
            found = build_reader_inputs(
                tokenizer,
                [item["question"]],
                [[block["text"] for block in row]],
                tokenize_answers(tokenizer, [[word]]),
                max_length=model.config.reader_seq_len,
            ).has_answers[0]
            if found.tolist()[:5] == [False, False, False, False, True]:
                questions.append({"question": item["question"], "answers": [word]})
                break
    assert len(questions) == len(QUESTIONS)
    return questions, search.block_ids


@pytest.mark.parametrize("train_document_embedder", [False, True])
def test_training_reads_a_positive_from_the_searcher_beam(train_document_embedder):
    model = make_model(train_document_embedder=train_document_embedder)
    questions, block_ids = questions_answered_below_the_reader_beam(model)
    batch = DataCollatorForOpenQA(model.retriever.tokenizer)(questions)
    model.train()

    outputs = {}
    for positive in (False, True):
        model.config.reader_beam_positive = positive
        model.zero_grad(set_to_none=True)
        out = model(**batch)
        out.loss.backward()
        reader_grad = model.reader.qa_outputs.dense_intermediate.weight.grad
        outputs[positive] = (out, None if reader_grad is None else reader_grad.abs().sum().item())

    plain, plain_grad = outputs[False]
    promoted, promoted_grad = outputs[True]
    # REALM's order: no block read holds the answer, so the reader learns nothing from these questions.
    assert not plain.reader_output.reader_correct.any()
    assert torch.equal(plain.reader_output.reader_loss, torch.zeros(len(questions)))
    assert not plain_grad
    # With the option: the first answer-holding block (the 5th) is read in the 3rd place, and the reader learns.
    assert torch.equal(promoted.retrieved_block_ids[:, 2], block_ids[:, 4])
    assert torch.equal(promoted.retrieved_block_ids[:, 4], block_ids[:, 2])
    assert torch.equal(promoted.retrieved_block_ids[:, :2], block_ids[:, :2])
    assert promoted.reader_output.reader_correct[:, 2].any(-1).all()
    assert (promoted.reader_output.reader_loss > 0).all()
    assert promoted_grad > 0
    # The retrieval loss is a marginal over the whole beam: reordering it changes nothing.
    torch.testing.assert_close(promoted.reader_output.retriever_loss, plain.reader_output.retriever_loss)
    # The retrieval scores moved with their blocks.
    torch.testing.assert_close(promoted.retrieved_scores[:, 2], plain.retrieved_scores[:, 4])

    # Evaluation always reads the top blocks.
    model.eval()
    with torch.no_grad():
        model.config.reader_beam_positive = True
        on = model(**batch)
        model.config.reader_beam_positive = False
        off = model(**batch)
    assert torch.equal(on.retrieved_block_ids, off.retrieved_block_ids)
    assert on.predicted_answers == off.predicted_answers
