"""
The training examples run end to end on a tiny BERT: `examples/finetune_openqa.py` (Trainer),
`examples/finetune_openqa_accelerate.py` (plain Accelerate loop, one process) and `examples/pretrain_realm.py`
(ICT warm start, then REALM pre-training on FOLDOC), each with the index refreshed while training goes on.

They are run in-process through their `main(argv)`; what they save is loaded back and checked (weights, corpus and
index that belong together, refreshes recorded), so a broken example fails here rather than in a user's hands.
`examples/demo_foldoc.py` is README's main job, run by `make demo` on the real MiniLM weights.
"""

import json
import os
import sys

import pytest
import torch

from realm_hf import RealmForOpenQA
from realm_hf.retrieval.refresh import embed_corpus, is_stale
from tests.support.paths import EXAMPLES, FIXTURES
from tests.support.tiny_bert import save_tiny_bert

# Facts from tests/fixtures/corpus/documents.jsonl, each answer written in its document.
QUESTIONS = [
    ("when was port estrel founded?", ["1642"]),
    ("which sea is velmora island in?", ["Sarrow Sea"]),
    ("who designed the torre alba lighthouse?", ["Mirela Costa"]),
    ("who created the quillon programming language?", ["Anneke Vos"]),
    ("where was anneke vos born?", ["Utrecht"]),
    ("what is the package manager of quillon?", ["Quire"]),
    ("who is the hopper prize named after?", ["Grace Hopper"]),
    ("what does tern collect?", ["garbage"]),
]


@pytest.fixture(scope="module")
def examples_on_path():
    sys.path.insert(0, EXAMPLES)  # finetune_openqa_accelerate imports finetune_openqa as its recipe
    yield
    sys.path.remove(EXAMPLES)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A BertForPreTraining checkpoint directory (hidden 32, 2 layers) with the 600-wordpiece fixture vocabulary."""
    # The examples pair 32-48 wordpiece inputs with 48-64 wordpiece blocks.
    return str(save_tiny_bert(tmp_path_factory.mktemp("tiny_bert"), max_positions=256))


@pytest.fixture(scope="module")
def qa_files(tmp_path_factory):
    path = tmp_path_factory.mktemp("qa")
    for name, rows in (("train", QUESTIONS), ("eval", QUESTIONS[:4])):
        with open(path / f"{name}.jsonl", "w") as f:
            for question, answers in rows:
                f.write(json.dumps({"question": question, "answers": answers}) + "\n")
    return str(path / "train.jsonl"), str(path / "eval.jsonl")


def finetune_args(tiny_bert, qa_files, output_dir):
    train_file, eval_file = qa_files
    return [
        "--init-from-bert", tiny_bert,
        "--corpus", os.path.join(FIXTURES, "corpus", "documents.jsonl"),
        "--train-file", train_file,
        "--eval-file", eval_file,
        "--max-block-length", "48",
        "--reader-seq-len", "96",
        "--train-document-embedder",
        "--refresh-steps", "2",
        "--max-steps", "4",
        "--batch-size", "2",
        "--logging-steps", "2",
        "--output-dir", str(output_dir),
    ]  # fmt: skip


def check_saved_openqa_model(output_dir):
    with open(os.path.join(output_dir, "results.json")) as f:
        results = json.load(f)
    assert results["steps"] == 4 and results["mode"] == "end to end"
    # Refreshes snapshot at steps 2 and 4; the last one is swapped in at the end of training, before saving.
    assert [r["reindex/snapshot_step"] for r in results["refreshes"]] == [2.0, 4.0]
    assert {"exact_match", "f1"} <= set(results["after"])
    model = RealmForOpenQA.from_pretrained(os.path.join(output_dir, "model")).eval()
    retriever = model.retriever
    assert is_stale(retriever, model.document_embedder) is False
    # The saved index is the corpus embedded by the saved (trained) document embedder: re-embedding reproduces it.
    block_ids = retriever.store.block_ids[:8]
    saved = retriever.store.embeddings(block_ids).clone()
    embed_corpus(retriever, model.document_embedder, show_progress=False)
    torch.testing.assert_close(retriever.store.embeddings(block_ids), saved, atol=1e-4, rtol=0)
    answers = model.answer([q for q, _ in QUESTIONS[:2]])
    assert len(answers) == 2 and all(a["retrieved"] for a in answers)


def test_finetune_openqa_trainer_example(examples_on_path, tiny_bert, qa_files, tmp_path):
    import finetune_openqa

    assert finetune_openqa.main(finetune_args(tiny_bert, qa_files, tmp_path)) == 0
    check_saved_openqa_model(tmp_path)


def test_finetune_openqa_accelerate_example(examples_on_path, tiny_bert, qa_files, tmp_path):
    import finetune_openqa_accelerate

    assert finetune_openqa_accelerate.main(finetune_args(tiny_bert, qa_files, tmp_path)) == 0
    check_saved_openqa_model(tmp_path)


def test_pretrain_realm_example(examples_on_path, tiny_bert, tmp_path):
    import pretrain_realm

    from realm_hf.models.modeling_pretraining import RealmForPreTraining

    argv = [
        "--bert", tiny_bert,
        "--entries", "40",
        "--max-block-length", "48",
        "--max-input-length", "32",
        "--ict-steps", "3",
        "--ict-batch-size", "4",
        "--steps", "4",
        "--batch-size", "2",
        "--refresh-steps", "2",
        "--embedder-lr-ratio", "0.1",
        "--output", str(tmp_path),
    ]  # fmt: skip
    assert pretrain_realm.main(argv) == 0
    model = RealmForPreTraining.from_pretrained(tmp_path)
    assert model.retriever is not None and len(model.retriever) > 0
    # The components a user takes on to Open-QA fine-tuning (the legacy checkpoint layout).
    assert {"embedder", "encoder"} <= set(os.listdir(tmp_path / "components"))


def test_pretraining_optimizer_scales_the_embedders_only(examples_on_path, tiny_bert):
    import argparse

    import pretrain_realm

    from realm_hf.models.initialization import init_from_bert
    from realm_hf.models.modeling_pretraining import RealmForPreTraining

    model = init_from_bert(RealmForPreTraining, tiny_bert, retriever_proj_size=8, num_candidates=2)
    args = argparse.Namespace(learning_rate=1e-3, embedder_lr_ratio=0.1)
    optimizer = pretrain_realm.pretraining_optimizer(model, args)
    encoder_group, embedder_group = optimizer.param_groups
    assert encoder_group["lr"] == pytest.approx(1e-3) and embedder_group["lr"] == pytest.approx(1e-4)
    encoder_ids = {id(p) for p in model.encoder.parameters()}
    assert all(id(p) in encoder_ids for p in encoder_group["params"])
    assert not any(id(p) in encoder_ids for p in embedder_group["params"])
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert {id(p) for g in optimizer.param_groups for p in g["params"]} == trainable
    args.embedder_lr_ratio = 1.0
    assert pretrain_realm.pretraining_optimizer(model, args) is None  # Trainer's own optimizer


def test_wikipedia_demo_weighs_read_blocks_by_rank_only_with_the_hybrid_retrieval(examples_on_path):
    import demo_wikipedia

    options = demo_wikipedia.model_options
    assert options(demo_wikipedia.parse_args([]))["answer_block_prior"] == "rank"
    assert options(demo_wikipedia.parse_args(["--retrieval", "dense"]))["answer_block_prior"] == "retrieval"


def test_wikipedia_demo_warms_the_retriever_up_by_default_only_for_dense_retrieval(examples_on_path):
    import demo_wikipedia

    assert demo_wikipedia.parse_args([]).retriever_steps == 0
    assert demo_wikipedia.parse_args(["--retrieval", "dense"]).retriever_steps == 200
    assert demo_wikipedia.parse_args(["--retriever-steps", "50"]).retriever_steps == 50
    assert demo_wikipedia.parse_args(["--retrieval", "dense", "--retriever-steps", "0"]).retriever_steps == 0


def test_wikipedia_demo_splits_right_answers_by_whether_the_answer_is_the_articles_title(examples_on_path):
    import demo_wikipedia

    questions = [
        {"title": "Alfred Hitchcock", "answers": ["Alfred Hitchcock", "Hitchcock"]},  # the title, among others
        {"title": "Riddle", "answers": ["riddle"]},  # the title, up to case
        {"title": "Campbell's Soup Cans", "answers": ["32"]},
        {"title": "Kingdom of Germany", "answers": ["Treaty of Verdun"]},
    ]
    predictions = ["hitchcock", "Puzzle", "32", None]  # None: a question that could not be answered
    assert demo_wikipedia.right_by_answer_kind(questions, predictions) == {
        "title": {"right": 1, "questions": 2},
        "in-text": {"right": 1, "questions": 2},
    }
    with pytest.raises(ValueError, match="4 questions but 3 predictions"):
        demo_wikipedia.right_by_answer_kind(questions, predictions[:3])


def test_wikipedia_demo_refuses_a_dropout_outside_0_to_1(examples_on_path, capsys):
    import demo_wikipedia

    for bad in ("1.5", "-0.1"):
        with pytest.raises(SystemExit):
            demo_wikipedia.parse_args(["--dropout", bad])
        assert "--dropout must be in [0, 1)" in capsys.readouterr().err
    assert demo_wikipedia.parse_args(["--dropout", "0.1"]).dropout == 0.1


def test_wikipedia_demo_runs_end_to_end_on_a_tiny_corpus(tiny_bert, tmp_path, capsys, examples_on_path):
    """README's main job (`make demo`), on the tiny invented corpus and a tiny BERT: every stage runs and is saved."""
    import demo_wikipedia

    wiki = os.path.join(FIXTURES, "wikipedia")
    argv = [
        "--output", str(tmp_path), "--summaries", os.path.join(wiki, "summaries.json"),
        "--handwritten", os.path.join(wiki, "handwritten.jsonl"), "--bert", tiny_bert,
        "--max-block-length", "48", "--retriever-steps", "2", "--retriever-batch-size", "4",
        "--reader-steps", "2", "--reader-batch-size", "4", "--openqa-steps", "1", "--openqa-batch-size", "2",
        "--searcher-beam", "4", "--eval-questions", "4", "--show", "2",
        "--written-train", os.path.join(wiki, "written_train.jsonl"), "--curve-every", "2",
    ]  # fmt: skip
    # Two hand-written questions leave one held-out article to the written dev set.
    argv[argv.index("--handwritten") + 1] = os.path.join(wiki, "handwritten_two.jsonl")
    argv += ["--written-dev", os.path.join(wiki, "written_dev.jsonl")]
    assert demo_wikipedia.main(argv) == 0
    out = capsys.readouterr().out
    assert "Generated held-out questions" in out and "Hand-written held-out questions" in out
    assert "Written dev questions (2, held-out articles" in out
    assert "of 2 answered right with the right source article" in out
    model_dir = tmp_path / "realm-wikipedia"
    results = json.loads((model_dir / "demo_results.json").read_text())
    assert [s["stage"] for s in results["stages"]] == ["retriever warm-up", "reader warm-up", "Open-QA fine-tuning"]
    assert set(results["after"]) == {"generated", "hand-written", "dev"}
    assert set(results["before"]) == {"generated", "hand-written"}  # the dev set is scored after training only
    # --curve-every 2 over 2 + 2 + 1 steps: every set at steps 2 and 4; step 5 is the evaluation after training.
    assert sorted((p["step"], p["set"]) for p in results["curve"]) == [
        (step, name) for step in (2, 4) for name in sorted(("generated", "hand-written", "dev"))
    ]
    assert all(0 <= p["exact_match"] <= 100 and 0 <= p["recall@5"] <= 1 for p in results["curve"])
    # Right answers split by the kind of answer add up to the set's EM, and are printed.
    for name, size in results["num_held_out"].items():
        after = results["after"][name]
        kinds = after["right_by_answer_kind"]
        assert kinds["title"]["questions"] + kinds["in-text"]["questions"] == size
        assert kinds["title"]["right"] + kinds["in-text"]["right"] == round(after["exact_match"] * size / 100)
    assert "whose answer is in its text" in out
    card = (model_dir / "README.md").read_text()
    assert "CC BY-SA 4.0" in card and "cc-by-sa-4.0" in card
    model = RealmForOpenQA.from_pretrained(model_dir)
    assert len(model.retriever) >= 12
    # The demo trains without dropout (--dropout 0 by default): the saved model says so.
    assert model.config.hidden_dropout_prob == 0.0 and model.config.attention_probs_dropout_prob == 0.0
    # The default answering retrieval is hybrid, and the saved model brings its BM25 index back.
    assert model.retriever.store.sparse is not None and model.retriever.store.sparse.mode == "rrf"
    # ... and its answers weigh the read blocks by their place in that fused order, which the card records.
    assert model.config.answer_block_prior == "rank"
    assert "their place in the fused order" in card
    # A second run reuses the saved model and answers again.
    assert demo_wikipedia.main(argv[:6]) == 0
    assert "Reusing the model saved" in capsys.readouterr().out


def test_wikipedia_demo_learning_curve_leaves_each_module_training_as_it_was(examples_on_path, tmp_path):
    """The reader warm-up trains `model.reader` alone: an evaluation in it must not switch the reader to eval mode."""
    from types import SimpleNamespace

    import demo_wikipedia

    from tests.support.tiny_model import build_tiny_model

    model, _ = build_tiny_model(str(tmp_path))
    model.eval()
    model.reader.train()
    sets = {"held-out": demo_wikipedia.qa_dataset([{"question": "who wrote unix?", "answers": ["ken thompson"]}])}
    points = []
    callback = demo_wikipedia.learning_curve_callback(model, sets, every=2, offset=10, last_step=16, points=points)
    for step in (1, 2, 3, 4, 6):
        callback.on_step_end(None, SimpleNamespace(global_step=step), None)
    # Every 2 steps of the stage, counted from the job's step 10; the job's last step (16) is left out.
    assert [p["step"] for p in points] == [12, 14]
    assert all(p["set"] == "held-out" for p in points)
    assert model.reader.training and not model.training and not model.query_embedder.training


def test_wikipedia_demo_refuses_a_negative_curve_period(examples_on_path, capsys):
    import demo_wikipedia

    with pytest.raises(SystemExit):
        demo_wikipedia.parse_args(["--curve-every", "-1"])
    assert "--curve-every must be 0 or a positive number of steps" in capsys.readouterr().err


def test_quickstart_model_script_trains_saves_and_answers(examples_on_path, tiny_bert, tmp_path, capsys):
    """examples/quickstart_model.py (`make quickstart`) on the invented Wikipedia fixture and a tiny BERT."""
    import quickstart_model

    from realm_hf import RealmForOpenQA

    output = tmp_path / "quickstart"
    wiki = os.path.join(FIXTURES, "wikipedia", "summaries.json")
    argv = ["--output", str(output), "--summaries", wiki, "--bert", str(tiny_bert), "--articles", "6"]
    argv += ["--reader-steps", "2", "--batch-size", "2", "--max-block-length", "48", "--check-questions", "3"]
    assert quickstart_model.main(argv) == 0
    out = capsys.readouterr().out
    assert "Own training questions answered exactly:" in out and "of 3" in out
    model = RealmForOpenQA.from_pretrained(output)
    assert model.config.reader_trained is True and len(model.retriever) >= 6  # its reader trained, its corpus saved
    assert quickstart_model.main(argv) == 0  # a second run reuses the saved model
    assert "Own training questions" not in capsys.readouterr().out


def test_accelerate_example_warns_when_fewer_processes_start_than_asked():
    sys.path.insert(0, EXAMPLES)
    try:
        from finetune_openqa_accelerate import fewer_processes_than_asked
    finally:
        sys.path.pop(0)
    # `accelerate launch --cpu --num_processes 2`: one process, MASTER_PORT set for the two asked, no WORLD_SIZE.
    warning = fewer_processes_than_asked(1, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    assert warning and "only this one started" in warning and "--multi_gpu" in warning
    assert fewer_processes_than_asked(1, {}) is None  # plain `python script.py`
    assert fewer_processes_than_asked(2, {"MASTER_PORT": "29500", "WORLD_SIZE": "2"}) is None
