"""LoRA through peft: trains only adapters, saves them as safetensors, reloads and merges with identical outputs."""

import os
import re

import pytest
import torch
from safetensors.torch import load_file

from realm_hf import RealmForOpenQA, RealmReader
from realm_hf.training.lora import (
    add_lora,
    load_adapter,
    lora_parameter_names,
    lora_target_regex,
    merge_adapter,
    save_adapter,
)
from realm_hf.training.openqa import DataCollatorForOpenQA
from tests.support.paths import LEGACY

LEGACY_OPENQA = os.path.join(LEGACY, "openqa")

QUESTIONS = [
    {"question": "What is the capital of France?", "answers": ["paris"]},
    {"question": "Who created the Python language?", "answers": ["guido van rossum", "guido"]},
    {"question": "Which country is Paris in?", "answers": ["france", "europe"]},
]
ASK = ["what is the capital of france?", "which country is paris in?", "who created python?"]


def no_dropout(model):
    # Deterministic training steps: the fixture config has dropout 0.1.
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def load_base():
    return no_dropout(RealmForOpenQA.from_pretrained(LEGACY_OPENQA, allow_pickle=True)).eval()


def answers_of(model):
    return [(r["answer"], r["block"]["block_id"], r["score"]) for r in model.answer(ASK)]


def assert_same_answers(got, expected, atol):
    assert [a for a, _, _ in got] == [a for a, _, _ in expected]
    assert [b for _, b, _ in got] == [b for _, b, _ in expected]
    for (_, _, score), (_, _, ref) in zip(got, expected):
        assert abs(score - ref) <= atol, (score, ref)


def test_target_regex_selects_reader_and_question_embedder_attention():
    model = load_base()
    model.add_document_embedder()  # must not be matched by "embedder"
    pattern = lora_target_regex(model)
    names = [name for name, _ in model.named_modules() if re.fullmatch(pattern, name)]
    assert sorted(names) == sorted(
        f"{component}.realm.encoder.layer.{layer}.attention.self.{proj}"
        for component in ("reader", "embedder")
        for layer in range(model.config.num_hidden_layers)
        for proj in ("query", "value")
    )
    # Other components and projections on request; unknown names are refused clearly.
    assert re.fullmatch(
        lora_target_regex(model, ("document_embedder",), ("key", "dense")),
        "document_embedder.realm.encoder.layer.1.attention.output.dense",
    )
    with pytest.raises(ValueError, match="no component 'retriever'"):
        lora_target_regex(model, ("retriever",))
    with pytest.raises(ValueError, match="Unknown attention projection"):
        lora_target_regex(model, target_modules=("query", "ffn"))


def test_lora_on_reader_alone_starts_as_identity():
    from safetensors.torch import load_file as load

    reader = RealmReader.from_pretrained(os.path.join(LEGACY, "reader")).eval()
    tensors = load(os.path.join(LEGACY, "reader", "expected_outputs.safetensors"))
    inputs = dict(
        input_ids=tensors["input_ids"],
        attention_mask=tensors["attention_mask"],
        token_type_ids=tensors["token_type_ids"],
        relevance_score=tensors["relevance_score"],
        block_mask=tensors["block_mask"],
    )
    with torch.no_grad():
        before = reader(**inputs).reader_logits.clone()
    peft_reader = add_lora(reader, targets=("reader",), r=4)
    names = lora_parameter_names(peft_reader)
    assert len(names) == 2 * 2 * 2  # layers x (query, value) x (A, B)
    assert all("lora_" in name and ".attention.self." in name for name in names)
    with torch.no_grad():
        after = peft_reader(**inputs).reader_logits
    # LoRA's B matrices start at zero: the adapted model begins exactly where the base model is.
    torch.testing.assert_close(after, before, atol=0, rtol=0)


def test_lora_trains_saves_reloads_and_merges(tmp_path):
    model = load_base()
    base_answers = answers_of(model)
    base_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    peft_model = add_lora(model, r=4, alpha=8)

    # The wrapped model keeps the REALM surface: retriever, answer(), forward kwargs.
    assert peft_model.retriever is model.retriever
    trainable = lora_parameter_names(peft_model)
    assert trainable and all("lora_A" in n or "lora_B" in n for n in trainable)
    assert {n.split(".realm.")[0].split(".")[-1] for n in trainable} == {"reader", "embedder"}
    assert not any("document_embedder" in n for n in trainable)

    collator = DataCollatorForOpenQA(peft_model.retriever.tokenizer)
    batch = collator(QUESTIONS)
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=2e-2)
    peft_model.train()
    losses = []
    for _ in range(4):
        out = peft_model(**batch)  # `questions` and `answers` pass through to RealmForOpenQA.forward
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(out.loss.item())
    peft_model.eval()
    assert losses[-1] != pytest.approx(losses[0], abs=1e-4)
    assert losses[-1] < losses[0]

    # Only LoRA weights changed: every base weight is bit-identical.
    base_now = peft_model.get_base_model().state_dict()
    for key, value in base_state.items():
        peft_key = key.replace(".query.", ".query.base_layer.").replace(".value.", ".value.base_layer.")
        current = base_now[peft_key] if peft_key in base_now and "attention.self" in key else base_now[key]
        assert torch.equal(current, value), key
    assert any(p.abs().sum() > 0 for n, p in peft_model.named_parameters() if "lora_B" in n)
    trained_answers = answers_of(peft_model)
    assert trained_answers != base_answers

    # Save: adapter config + safetensors, nothing pickled, only LoRA tensors.
    adapter_dir = tmp_path / "adapter"
    save_adapter(peft_model, adapter_dir)
    files = sorted(os.listdir(adapter_dir))
    assert "adapter_config.json" in files and "adapter_model.safetensors" in files
    assert not [f for f in files if f.endswith((".bin", ".pt", ".pth", ".pkl", ".npy"))]
    saved = load_file(adapter_dir / "adapter_model.safetensors")
    assert saved and all("lora_" in key for key in saved)
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".adapter")]  # no temporary leftovers

    # Reload onto a fresh base model: the same answers and scores.
    reloaded = load_adapter(load_base(), adapter_dir)
    assert reloaded.retriever is not None
    assert_same_answers(answers_of(reloaded), trained_answers, atol=1e-5)
    assert not any(p.requires_grad for p in reloaded.parameters())

    # Merge: a plain RealmForOpenQA with folded weights and the same outputs.
    merged = merge_adapter(reloaded)
    assert type(merged) is RealmForOpenQA
    assert not any("lora_" in name for name, _ in merged.named_parameters())
    assert merged.retriever is not None
    merged_answers = answers_of(merged)
    assert_same_answers(merged_answers, trained_answers, atol=1e-4)

    # ... which saves and loads like any model, retriever included.
    merged.save_pretrained(tmp_path / "merged")
    assert os.path.isfile(tmp_path / "merged" / "model.safetensors")
    again = RealmForOpenQA.from_pretrained(tmp_path / "merged").eval()
    assert_same_answers(answers_of(again), merged_answers, atol=1e-5)


def test_lora_model_trains_with_realm_openqa_trainer(tmp_path):
    import datasets
    from transformers import TrainingArguments

    from realm_hf.training.openqa import RealmOpenQATrainer

    model = load_base()
    peft_model = add_lora(model, r=2)
    dataset = datasets.Dataset.from_list(QUESTIONS)
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        per_device_eval_batch_size=4,
        max_steps=2,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = RealmOpenQATrainer(model=peft_model, args=args, train_dataset=dataset, eval_dataset=dataset)
    base_before = model.reader.qa_outputs.dense_output.weight.detach().clone()
    result = trainer.train()
    assert result.global_step == 2
    assert torch.equal(model.reader.qa_outputs.dense_output.weight, base_before)
    metrics = trainer.evaluate()
    assert "eval_exact_match" in metrics and "eval_f1" in metrics


def fresh_reader_model():
    """The fixture model as `init_from_bert` leaves a reader: its span head never trained (random)."""
    model = load_base()
    torch.manual_seed(0)
    for module in model.reader.qa_outputs.modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.LayerNorm)):
            module.reset_parameters()
    model.config.reader_trained = False
    return model


def train_steps(peft_model, tmp_path, steps=2):
    import datasets
    from transformers import TrainingArguments

    from realm_hf.training.openqa import RealmOpenQATrainer

    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        max_steps=steps,
        learning_rate=1e-2,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = RealmOpenQATrainer(model=peft_model, args=args, train_dataset=datasets.Dataset.from_list(QUESTIONS))
    return trainer.train()


def test_lora_on_a_never_trained_reader_trains_its_span_head_in_full(tmp_path):
    model = fresh_reader_model()
    start = {k: v.detach().clone() for k, v in model.reader.qa_outputs.state_dict().items()}
    peft_model = add_lora(model, r=2)
    trainable = lora_parameter_names(peft_model)
    # The adapters, and the whole span head (peft's modules_to_save), as a new task head trains in peft.
    assert any("lora_" in name for name in trainable)
    head = [name for name in trainable if "qa_outputs" in name]
    assert head and all("modules_to_save" in name for name in head)
    assert peft_model.peft_config["default"].modules_to_save == ["qa_outputs"]
    assert train_steps(peft_model, tmp_path).global_step == 2
    assert model.config.reader_trained is True  # the span head trained
    save_adapter(peft_model, tmp_path / "adapter")
    assert any("qa_outputs" in key for key in load_file(str(tmp_path / "adapter" / "adapter_model.safetensors")))
    merged = merge_adapter(peft_model)
    trained = merged.reader.qa_outputs.state_dict()
    assert set(trained) == set(start)  # the head is a plain module again, with the trained weights
    assert any(not torch.equal(trained[k], start[k]) for k in start)
    merged.save_pretrained(tmp_path / "merged")
    assert RealmForOpenQA.from_pretrained(tmp_path / "merged").config.reader_trained is True


def test_a_frozen_span_head_of_a_never_trained_reader_is_refused_or_not_marked_trained(tmp_path):
    from realm_hf.training.openqa import mark_reader_trained

    with pytest.raises(ValueError, match="modules_to_save") as refused:
        add_lora(fresh_reader_model(), r=2, modules_to_save=[])
    assert "qa_outputs" in str(refused.value) and "reader_trained=False" in str(refused.value)
    assert add_lora(fresh_reader_model(), r=2, modules_to_save=["reader.qa_outputs"])  # named by its path: fine
    # Adapters on the attention alone (a reader already trained, the flag cleared by hand): not a trained span head.
    model = load_base()
    peft_model = add_lora(model, r=2)
    assert not any("qa_outputs" in name for name in lora_parameter_names(peft_model))
    model.config.reader_trained = False
    assert mark_reader_trained(peft_model) is False and model.config.reader_trained is False
    train_steps(peft_model, tmp_path, steps=1)
    assert model.config.reader_trained is False


def test_bad_adapter_inputs_are_refused(tmp_path):
    model = load_base()
    with pytest.raises(ValueError, match="peft model"):
        save_adapter(model, tmp_path / "x")
    with pytest.raises(ValueError, match="peft model"):
        merge_adapter(model)
    with pytest.raises(OSError, match="adapter_config.json"):
        load_adapter(model, tmp_path)
    with pytest.raises(ValueError, match="rank `r`"):
        add_lora(model, r=0)
    with pytest.raises(ValueError, match="`alpha`"):
        add_lora(model, alpha=0)
    with pytest.raises(ValueError, match="`dropout`"):
        add_lora(model, dropout=1.0)
