"""Inverse Cloze Task warm start: collator statistics, in-batch loss, training, hand-over to pre-training."""

import os

import pytest
import torch

from realm_hf import RealmEmbedder, RealmTokenizer
from realm_hf.models.modeling_ict import RealmForInverseClozeTask
from realm_hf.models.modeling_pretraining import RealmForPreTraining
from realm_hf.training.ict import DataCollatorForInverseClozeTask, split_sentences
from tests.support.paths import LEGACY
from tests.support.pretraining import ICT_BLOCKS, ict_config


@pytest.fixture(scope="module")
def tokenizer():
    return RealmTokenizer.from_pretrained(os.path.join(LEGACY, "embedder"))


def test_split_sentences():
    assert split_sentences("A b. C d? E f! G") == ["A b.", "C d?", "E f!", "G"]
    assert split_sentences('He said "hi." Then left.') == ['He said "hi."', "Then left."]
    assert split_sentences("version 1.5 is out") == ["version 1.5 is out"]
    assert split_sentences("") == []


def test_collator_removes_query_sentence_about_ninety_percent(tokenizer):
    collator = DataCollatorForInverseClozeTask(tokenizer, remove_sentence_prob=0.9, seed=0)
    draws = 3000
    removed = 0
    for i in range(draws):
        example = ICT_BLOCKS[i % len(ICT_BLOCKS)]
        sentences = collator.sentences_of(example)
        pair = collator.build_pair(example)
        assert pair["query"] in sentences
        assert pair["query"] == sentences[pair["query_index"]]
        assert pair["title"] == example["title"]
        if pair["removed"]:
            removed += 1
            assert pair["block"].split(". ") != sentences
            assert pair["query"] not in pair["block"].replace(pair["query"] + " ", "", 0)
            assert pair["block"] == " ".join(s for j, s in enumerate(sentences) if j != pair["query_index"])
        else:
            assert pair["block"] == " ".join(sentences)
    # Binomial(3000, 0.9): standard deviation ~0.0055; a tolerant bound of ~4.5 sigma.
    assert 0.875 < removed / draws < 0.925


def test_collator_batches_are_seeded_and_shaped(tokenizer):
    examples = [dict(block, block_id=i) for i, block in enumerate(ICT_BLOCKS[:4])]
    first = DataCollatorForInverseClozeTask(tokenizer, max_query_length=12, max_block_length=20, seed=3)(examples)
    second = DataCollatorForInverseClozeTask(tokenizer, max_query_length=12, max_block_length=20, seed=3)(examples)
    for key in first:
        assert torch.equal(first[key], second[key]), key
    assert first["input_ids"].shape[0] == 4 and first["input_ids"].shape[1] <= 12
    assert first["block_input_ids"].shape[0] == 4 and first["block_input_ids"].shape[1] <= 20
    assert first["block_id"].tolist() == [0, 1, 2, 3]
    # Blocks are [CLS] title [SEP] text [SEP], as the retriever embeds them.
    title_ids = tokenizer("paris", add_special_tokens=False)["input_ids"]
    assert first["block_input_ids"][0, : 2 + len(title_ids)].tolist() == [
        tokenizer.cls_token_id,
        *title_ids,
        tokenizer.sep_token_id,
    ]
    # One-sentence blocks keep their sentence, and `sentences` may be given directly.
    pair = DataCollatorForInverseClozeTask(tokenizer, seed=0).build_pair({"sentences": ["only one."]})
    assert pair["query"] == "only one." and pair["block"] == "only one." and not pair["removed"]


def test_in_batch_loss_and_duplicate_blocks(tokenizer):
    torch.manual_seed(0)
    model = RealmForInverseClozeTask(ict_config(tokenizer)).eval()
    batch = DataCollatorForInverseClozeTask(tokenizer, seed=0)(ICT_BLOCKS[:4])
    out = model(**batch)
    assert out.logits.shape == (4, 4)
    expected = torch.nn.functional.cross_entropy(out.query_embeddings @ out.block_embeddings.T, torch.arange(4))
    assert torch.allclose(out.loss, expected)
    # Rows 0 and 2 from one block: neither is the other's negative.
    out = model(**batch, block_id=torch.tensor([7, 1, 7, 2]))
    assert out.logits[0, 2] < -1e30 and out.logits[2, 0] < -1e30 and out.logits[0, 0] > -1e30


@pytest.fixture
def one_thread():
    # Tiny matrices: a second thread only adds contention on a shared machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("share", [False, True])
def test_ict_loss_decreases(tokenizer, share, one_thread):
    torch.manual_seed(0)
    # A wider initialisation than BERT's 0.02: tiny random encoders otherwise embed every text almost alike and
    # the in-batch softmax sits at log(8) for many steps before it moves.
    config = ict_config(tokenizer, share_query_document_embedder=share, initializer_range=0.2)
    model = RealmForInverseClozeTask(config)
    assert (model.query_embedder is model.embedder) == share
    collator = DataCollatorForInverseClozeTask(tokenizer, max_query_length=24, max_block_length=40, seed=0)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    losses = []
    for _ in range(30):
        loss = model(**collator(ICT_BLOCKS)).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first * 0.75, losses


def test_export_embedders_initialise_pretraining(tokenizer, tmp_path):
    torch.manual_seed(0)
    ict = RealmForInverseClozeTask(ict_config(tokenizer, share_query_document_embedder=False))
    paths = ict.export_embedders(tmp_path / "ict")
    assert torch.equal(
        RealmEmbedder.from_pretrained(paths["query_embedder"]).cls.dense.weight, ict.query_embedder.cls.dense.weight
    )
    separate = RealmForPreTraining(ict_config(tokenizer, share_query_document_embedder=False))
    separate.load_ict_embedders(tmp_path / "ict")
    shared = RealmForPreTraining(ict_config(tokenizer)).load_ict_embedders(ict)
    for name in ("embedder", "query_embedder"):
        source = getattr(ict, name).state_dict()
        for key, value in getattr(separate, name).state_dict().items():
            assert torch.equal(value, source[key]), (name, key)
    # Shared: the document embedder (the one that builds the index) wins.
    assert torch.equal(shared.embedder.cls.dense.weight, ict.embedder.cls.dense.weight)
    # A saved ICT model directory works too.
    ict.save_pretrained(tmp_path / "ict_model")
    again = RealmForPreTraining(ict_config(tokenizer, share_query_document_embedder=False))
    again.load_ict_embedders(tmp_path / "ict_model")
    assert torch.equal(again.query_embedder.cls.dense.weight, ict.query_embedder.cls.dense.weight)


def test_ict_with_trainer(tokenizer, tmp_path):
    from transformers import Trainer, TrainingArguments

    torch.manual_seed(0)
    model = RealmForInverseClozeTask(ict_config(tokenizer))
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        max_steps=2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    collator = DataCollatorForInverseClozeTask(tokenizer, max_query_length=24, max_block_length=48, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=ICT_BLOCKS, data_collator=collator)
    assert trainer.train().global_step == 2
    assert "eval_loss" in trainer.evaluate(eval_dataset=ICT_BLOCKS[:4])


@pytest.mark.parametrize("source", ["model", "exported"])
def test_pretraining_takes_the_pooling_its_ict_embedders_were_trained_with(tokenizer, tmp_path, source):
    torch.manual_seed(0)
    ict = RealmForInverseClozeTask(
        ict_config(tokenizer, share_query_document_embedder=False, retriever_pooling="mean")
    ).eval()
    model = RealmForPreTraining(ict_config(tokenizer, share_query_document_embedder=False))
    assert model.config.retriever_pooling == "cls"
    if source == "exported":
        ict.export_embedders(tmp_path / "ict")
        model.load_ict_embedders(tmp_path / "ict")
    else:
        model.load_ict_embedders(ict)
    model.eval()
    ids = torch.tensor([[2, 5, 6, 7, 3]])
    with torch.no_grad():
        for name in ("embedder", "query_embedder"):
            assert getattr(model, name).config.retriever_pooling == "mean"
            # The same vectors as in ICT, which they would not be under [CLS] pooling.
            assert torch.allclose(getattr(model, name)(ids).projected_score, getattr(ict, name)(ids).projected_score)
