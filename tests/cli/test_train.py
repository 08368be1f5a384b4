"""`realm-hf train`: fine-tuning (LoRA, warm-ups), pre-training and training from BERT, with the same seed giving the
same run."""

import json
import os

import pytest
import torch

from realm_hf import RealmForOpenQA
from tests.support.cli import QUESTIONS, run
from tests.support.paths import CORPUS_DOCUMENTS, LEGACY, TRAIN_CONFIG_EXAMPLE
from tests.support.tiny_bert import save_tiny_bert


def test_train_finetune_with_lora_from_example_config(converted, tmp_path, capsys):
    qa_file = tmp_path / "train.jsonl"
    rows = [
        {"question": "What is the capital of France?", "answers": ["paris"]},
        {"question": "Which country is Paris in?", "answers": ["france", "europe"]},
    ]
    qa_file.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    output = tmp_path / "run"
    overrides = {
        "model": converted,
        "train_file": qa_file,
        "eval_file": qa_file,
        "training_args.max_steps": 2,
        "training_args.per_device_train_batch_size": 2,
        "training_args.save_strategy": "no",
        "training_args.use_cpu": "true",
        "training_args.learning_rate": 0.01,
        "lora.r": 2,
    }
    argv = ["train", TRAIN_CONFIG_EXAMPLE, "--output-dir", output]
    for key, value in overrides.items():
        argv += ["--set", f"{key}={value}"]
    assert run(*argv) == 0
    assert "eval_exact_match" in capsys.readouterr().out
    results = json.loads((output / "train_results.json").read_text())
    assert results["global_step"] == 2 and "eval_f1" in results and "eval_recall@1" in results
    assert os.path.isfile(output / "adapter" / "adapter_model.safetensors")
    model = RealmForOpenQA.from_pretrained(output)  # the merged model, with its retriever
    assert model.retriever is not None and len(model.retriever) == 12
    assert not any("lora" in name for name, _ in model.named_parameters())
    assert model.answer(QUESTIONS[0])["answer"]


def test_train_pretrain(tmp_path):
    with open(CORPUS_DOCUMENTS) as f:
        documents = [json.loads(line) for line in f][:6]
    (tmp_path / "docs.jsonl").write_text("\n".join(json.dumps(d) for d in documents) + "\n")
    config = {
        "task": "pretrain",
        "legacy_embedder": os.path.join(LEGACY, "embedder"),
        "legacy_encoder": os.path.join(LEGACY, "encoder"),
        "documents": "docs.jsonl",
        "max_block_length": 24,
        "train_from_corpus": True,
        "masking": {"seed": 0},
        "output_dir": "out",
        "training_args": {"max_steps": 2, "per_device_train_batch_size": 2, "save_strategy": "no", "use_cpu": True},
    }
    path = tmp_path / "pretrain.json"
    path.write_text(json.dumps(config))
    assert run("train", path) == 0
    from realm_hf.models.modeling_pretraining import RealmForPreTraining

    model = RealmForPreTraining.from_pretrained(tmp_path / "out")  # output_dir is relative to the config file
    assert model.retriever is not None and len(model.retriever) >= len(documents)
    assert json.loads((tmp_path / "out" / "train_results.json").read_text())["global_step"] == 2
    # realm-hf's pre-training card, with the arguments this run really used.
    card = (tmp_path / "out" / "README.md").read_text()
    assert "library_name: realm-hf" in card and "pipeline_tag: fill-mask" in card
    assert "max_steps" in card and "generated_from_trainer" not in card


def test_train_model_config_sets_training_settings_of_a_saved_model(converted, tmp_path, capsys):
    """`model_config` with `model` was silently ignored; now its training settings apply and anything else is refused."""
    qa_file = tmp_path / "train.jsonl"
    qa_file.write_text(json.dumps({"question": "What is the capital of France?", "answers": ["paris"]}) + "\n")
    output = tmp_path / "run"
    base = ["train", TRAIN_CONFIG_EXAMPLE, "--output-dir", output, "--set", f"model={converted}"]
    base += ["--set", f"train_file={qa_file}", "--set", "eval_file=", "--set", "training_args.max_steps=1"]
    base += ["--set", "training_args.save_strategy=no", "--set", "training_args.use_cpu=true"]
    assert run(*base, "--set", "model_config.hidden_size=64") == 2
    err = capsys.readouterr().err
    assert "hidden_size cannot change a saved model" in err and "init_from_bert" in err
    assert run(*base, "--set", "model_config.reader_beam_positive=maybe") == 2
    assert "reader_beam_positive" in capsys.readouterr().err
    assert run(*base, "--set", "model_config.answer_block_prior=bm25") == 2
    assert "answer_block_prior" in capsys.readouterr().err
    assert not output.exists()

    saved = RealmForOpenQA.from_pretrained(converted).config
    assert saved.reader_beam_positive is False and saved.searcher_beam_size != 4
    assert saved.skip_answers_in_question is False and saved.answer_block_prior == "retrieval"
    settings = ["--set", "model_config.reader_beam_positive=true", "--set", "model_config.searcher_beam_size=4"]
    settings += ["--set", "model_config.skip_answers_in_question=true"]  # an answering setting, saved with the model
    settings += ["--set", "model_config.answer_block_prior=rank"]
    assert run(*base, *settings) == 0
    trained = RealmForOpenQA.from_pretrained(output).config
    assert trained.reader_beam_positive is True and trained.searcher_beam_size == 4
    assert trained.skip_answers_in_question is True and trained.answer_block_prior == "rank"


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A BertForPreTraining directory (hidden 32, 2 layers) with the fixture corpus's wordpiece vocabulary."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert"), max_positions=256)


@pytest.fixture(scope="module")
def seeded_train(tiny_bert, tmp_path_factory):
    """
    `seeded_train(name, seed, **training_args)` runs `realm-hf train` from `init_from_bert` (fresh REALM heads),
    evaluating before the first step (`eval_on_start`) and after the last unless `evaluate=False`, and returns
    `(train_results.json, saved weights)`.
    """
    from safetensors.torch import load_file

    root = tmp_path_factory.mktemp("seeded")
    # One question per fixture document (its last sentence, answered by its title): 44 questions, so that metrics of
    # two differently initialised models are very unlikely to coincide.
    with open(CORPUS_DOCUMENTS) as f:
        documents = [json.loads(line) for line in f]
    qa_file = root / "qa.jsonl"
    qa_file.write_text(
        "".join(
            json.dumps({"question": d["text"].rstrip(".").split(". ")[-1].lower(), "answers": [d["title"]]}) + "\n"
            for d in documents
        )
    )

    def train(name, seed, searcher_beam_size=4, evaluate=True, lora=None, model_config=None, **training_args):
        config = {
            "init_from_bert": str(tiny_bert),
            "model_config": {
                "retriever_proj_size": 16,
                "reader_seq_len": 96,
                "max_block_length": 48,
                "searcher_beam_size": searcher_beam_size,
                "reader_beam_size": 2,
                **(model_config or {}),
            },
            "documents": CORPUS_DOCUMENTS,
            "max_block_length": 48,
            "train_file": str(qa_file),
            "eval_file": str(qa_file) if evaluate else None,
            "output_dir": name,
            "recall_ks": [1, 5, 20],
            "seed": seed,
            "training_args": {
                "max_steps": 2,
                "per_device_train_batch_size": 4,
                "per_device_eval_batch_size": 64,
                "learning_rate": 0.01,
                "eval_on_start": evaluate,
                "save_strategy": "no",
                "use_cpu": True,
                **training_args,
            },
        }
        if lora is not None:
            config["lora"] = lora
        path = root / f"{name}.json"
        path.write_text(json.dumps(config))
        assert run("train", path) == 0
        results = json.loads((root / name / "train_results.json").read_text())
        return results, load_file(str(root / name / "model.safetensors"))

    train.root = root
    return train


def test_train_from_bert_with_lora_trains_the_span_head(seeded_train, tiny_bert):
    from realm_hf import RealmForOpenQA
    from realm_hf.models.initialization import init_from_bert
    from realm_hf.training.recipes import seed_everything

    # The reader reads an answer-holding block of the beam (reader_beam_positive): its span loss is not 0.
    results, weights = seeded_train(
        "lora",
        seed=5,
        evaluate=False,
        searcher_beam_size=40,
        lora={"r": 2},
        model_config={"reader_beam_positive": True},
    )
    assert results["global_step"] == 2
    # The fresh model the run started from (the run seeds before building it): its random span head ...
    seed_everything(5)
    start = init_from_bert(
        RealmForOpenQA,
        str(tiny_bert),
        retriever_proj_size=16,
        reader_seq_len=96,
        max_block_length=48,
        searcher_beam_size=40,
        reader_beam_size=2,
        reader_beam_positive=True,
    ).state_dict()
    head = [key for key in weights if key.startswith("reader.qa_outputs.")]
    assert head and all(key in start for key in head)
    # ... was trained (in full, beside the adapters), and the saved model says its reader was trained.
    assert any(not torch.equal(weights[key], start[key]) for key in head)
    assert json.loads((seeded_train.root / "lora" / "config.json").read_text())["reader_trained"] is True


def _before(results):
    """The metrics of the evaluation before the first step, as train_results.json reports them."""
    first = results["evaluations"][0]
    assert first["step"] == 0
    return {k: v for k, v in first.items() if k.startswith("eval_")}


def test_train_from_bert_initial_metrics_do_not_depend_on_unrelated_settings(seeded_train):
    # Same seed, only searcher_beam_size (a training-time setting) and max_steps differ. The fresh heads
    # were built before any seed was set, so the metrics before the first step differed between the runs.
    small, _ = seeded_train("beam4", seed=7, searcher_beam_size=4, max_steps=1)
    large, _ = seeded_train("beam8", seed=7, searcher_beam_size=8, max_steps=2)
    assert {"eval_exact_match", "eval_f1", "eval_recall@1", "eval_recall@5", "eval_recall@20"} <= set(_before(small))
    assert _before(small) == _before(large)


def test_train_from_bert_same_seed_same_metrics_and_weights(seeded_train):
    first, first_weights = seeded_train("run1", seed=7)
    second, second_weights = seeded_train("run2", seed=7)
    assert first["global_step"] == 2 and [e["step"] for e in first["evaluations"]] == [0, 2]
    assert first == second  # metrics before and after training, and the training loss
    assert first_weights.keys() == second_weights.keys()
    for key, value in first_weights.items():
        assert torch.equal(value, second_weights[key]), key


def test_train_from_bert_seed_sets_the_fresh_heads(seeded_train):
    # With learning rate 0 the saved weights are the initial ones: another seed gives other fresh REALM heads (the
    # retrieval projection, the reader's span scorer), while the weights copied from BERT stay the same.
    seven = seeded_train("seed7", seed=7, evaluate=False, max_steps=1, learning_rate=0.0)[1]
    eight = seeded_train("seed8", seed=8, evaluate=False, max_steps=1, learning_rate=0.0)[1]
    seven_again = seeded_train("seed7-again", seed=7, evaluate=False, max_steps=1, learning_rate=0.0)[1]
    fresh = [k for k in seven if k.startswith("embedder.cls.") or "qa_outputs" in k]
    copied = [k for k in seven if "word_embeddings" in k]
    assert fresh and copied
    assert any(not torch.equal(seven[k], eight[k]) for k in fresh if seven[k].dim() > 1)
    assert all(torch.equal(seven[k], eight[k]) for k in copied)
    assert all(torch.equal(seven[k], seven_again[k]) for k in seven)


def test_train_runs_the_warmups_before_fine_tuning(converted, tmp_path, capsys):
    """`retriever_warmup` and `reader_warmup` run the library's warm-up recipes before Open-QA fine-tuning."""
    qa_file = tmp_path / "train.jsonl"
    rows = [
        {"question": "What is the capital of France?", "answers": ["paris"], "doc_id": 0},
        {"question": "Who created Python?", "answers": ["guido van rossum"], "doc_id": 3},
    ]
    qa_file.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    output = tmp_path / "run"
    base = ["train", TRAIN_CONFIG_EXAMPLE, "--output-dir", output, "--set", f"model={converted}"]
    base += ["--set", f"train_file={qa_file}", "--set", "eval_file=", "--set", "training_args.max_steps=1"]
    base += ["--set", "training_args.save_strategy=no", "--set", "training_args.use_cpu=true"]
    # A bad section is refused before anything trains.
    assert run(*base, "--set", "reader_warmup.max_step=2") == 2
    assert "Unknown reader_warmup option(s): max_step" in capsys.readouterr().err
    assert run(*base, "--set", "retriever_warmup.max_steps=0") == 2
    assert "retriever_warmup.max_steps must be a positive integer" in capsys.readouterr().err
    # The message names the config key the user wrote, not the library's argument behind it.
    assert run(*base, "--set", "reader_warmup.max_steps=1", "--set", "reader_warmup.negatives=-1") == 2
    err = capsys.readouterr().err
    assert "reader_warmup: `negatives` must be a positive integer, got -1" in err and "num_negatives" not in err
    # The fixture corpus is lower case: no salient span to blank, so the reader reads the questions' own blocks.
    warmups = ["--set", "retriever_warmup.max_steps=2", "--set", "retriever_warmup.learning_rate=0.01"]
    warmups += ["--set", "reader_warmup.max_steps=2", "--set", "reader_warmup.learning_rate=0.01"]
    warmups += ["--set", "retriever_warmup.train_sampling_strategy=group_by_length"]
    warmups += ["--set", "reader_warmup.train_sampling_strategy=group_by_length"]
    warmups += ["--set", "reader_warmup.keep_sentence=false", "--set", "reader_warmup.negatives=1"]
    warmups += ["--set", "training_args.learning_rate=0"]  # so only the warm-ups move the weights
    assert run(*base, *warmups) == 0
    before, after = RealmForOpenQA.from_pretrained(converted), RealmForOpenQA.from_pretrained(output)
    changed = lambda a, b: any(not torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))  # noqa: E731
    assert changed(before.embedder, after.embedder) and changed(before.reader, after.reader)


def test_train_output_dir_that_is_a_file_fails_before_training(tmp_path, capsys):
    (tmp_path / "out").write_text("my notes")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model": str(tmp_path), "train_file": "qa.jsonl", "output_dir": "out"}))
    # "[Errno 17] File exists", once training was over.
    assert run("train", path) == 2
    assert f"output_dir {str(tmp_path / 'out')!r} is a file" in capsys.readouterr().err
    assert (tmp_path / "out").read_text() == "my notes"


def test_train_index_factory_string_fails_before_embedding(tiny_dir, docs, tmp_path, capsys, monkeypatch):
    from realm_hf.retrieval import building

    def embed(*args, **kwargs):
        raise AssertionError("the corpus was embedded before the factory string was checked")

    monkeypatch.setattr(building, "split_and_embed", embed)
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"question": "who wrote unix?", "answers": ["ken"]}) + "\n")
    config = {
        "model": str(tiny_dir),
        "train_file": str(qa),
        "documents": str(docs),
        "max_block_length": 64,
        "index": "Nonsense",
        "output_dir": str(tmp_path / "out"),
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert run("train", path) == 2
    assert "index: Invalid FAISS index factory string 'Nonsense'" in capsys.readouterr().err
