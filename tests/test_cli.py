"""The `realm-hf` command line: every subcommand on the tiny legacy fixture model and the test corpus.

Commands run in-process through `main([...])` (fast: no interpreter start-up); one subprocess checks the installed
console script. `push` and `convert <hub id>` run against the in-process Hub server of tests/hub_server.py (HTTP on
127.0.0.1), and their offline errors with `HF_HUB_OFFLINE=1`; no test reaches the real Hub.
"""

import csv
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from realm_hf import RealmForOpenQA
from realm_hf.cli import load_train_config, main

HERE = os.path.dirname(__file__)
LEGACY = os.path.join(HERE, "fixtures", "legacy")
LEGACY_OPENQA = os.path.join(LEGACY, "openqa")
DOCUMENTS = os.path.join(HERE, "fixtures", "corpus", "documents.jsonl")
EXAMPLE_CONFIG = os.path.join(HERE, "..", "examples", "train_config_example.json")
QUESTIONS = ["what is the capital of france?", "which country is paris in?", "where is the capital of england?"]


def run(*argv):
    return main(["-q", *map(str, argv)])


@pytest.fixture(scope="module")
def legacy_model():
    return RealmForOpenQA.from_pretrained(LEGACY_OPENQA, allow_pickle=True).eval()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    output = tmp_path_factory.mktemp("convert") / "realm-openqa"
    assert run("convert", LEGACY_OPENQA, output, "--allow-pickle") == 0
    return output


def test_console_script_help():
    script = os.path.join(os.path.dirname(sys.executable), "realm-hf")
    command = [script] if os.path.exists(script) else [sys.executable, "-m", "realm_hf.cli"]
    result = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for name in ("index", "ask", "train", "evaluate", "convert", "push"):
        assert name in result.stdout


def test_python_m_realm_hf_cli_still_works():
    # The old route through the package (slow: `import realm_hf` loads torch) runs the same parser.
    result = subprocess.run(
        [sys.executable, "-m", "realm_hf.cli", "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: realm-hf")


# The console script named in setup.cfg, run in a fresh interpreter the way `realm-hf` runs it: `--help` of the
# command and of every subcommand, `--version` and a usage error must not import realm_hf (whose `__init__` registers
# the Auto classes, loading torch and transformers) nor anything heavy. Deterministic, unlike a timing assertion;
# bench/cli_startup.py prints the times.
_ENTRY_POINT_PROBE = """
import contextlib, importlib, io, json, sys
module_name, function_name = sys.argv[1].split(":")
main = getattr(importlib.import_module(module_name), function_name)
statuses = []
for argv in (["--help"], ["index", "--help"], ["ask", "--help"], ["train", "--help"], ["evaluate", "--help"],
             ["convert", "--help"], ["push", "--help"], ["--version"], [], ["push", "some/dir"]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        statuses.append(main(argv))
heavy = ("realm_hf", "torch", "transformers", "datasets", "faiss", "numpy", "peft", "huggingface_hub", "yaml")
print(json.dumps({"statuses": statuses, "heavy": sorted(name for name in heavy if name in sys.modules)}))
"""


def console_script_entry_point() -> str:
    import configparser

    setup = configparser.ConfigParser()
    setup.read(os.path.join(HERE, "..", "setup.cfg"))
    scripts = dict(
        line.split("=", 1) for line in setup["options.entry_points"]["console_scripts"].strip().splitlines()
    )
    return scripts["realm-hf "].strip()


def test_help_of_every_command_imports_neither_realm_hf_nor_torch():
    entry_point = console_script_entry_point()
    result = subprocess.run(
        [sys.executable, "-c", _ENTRY_POINT_PROBE, entry_point], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    probe = json.loads(result.stdout)
    assert probe["heavy"] == [], f"{entry_point} imports {probe['heavy']} before running a command"
    assert probe["statuses"] == [0] * 8 + [2, 2]


# Bad option values, answered by the console script before any command imports realm_hf or torch.
_EARLY_CHECK_PROBE = """
import contextlib, io, json, sys
from realm_hf_cli import main
model, documents = sys.argv[1], sys.argv[2]
results = []
for argv in (
    ["ask", "q", "--model", model, "--top-k", "0"],
    ["ask", "q", "--model", model, "--batch-size", "0"],
    ["serve", model, "--port", "99999"],
    ["serve", model, "--concurrency", "0"],
    ["evaluate", documents, "--model", model, "--ks", "5", "0"],
    ["evaluate", documents, "--model", model, "--limit", "0"],
    ["index", documents, "--model", model, "--output", model + "-x", "--text-column", "body"],
    ["index", documents, "--model", model, "--output", model + "-x", "--id-column", "uid"],
    ["index", documents, "--model", model, "--output", model + "-x", "--max-block-length", "4"],
):
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        results.append([main(argv), err.getvalue()])
heavy = ("realm_hf", "torch", "transformers", "datasets")
print(json.dumps({"results": results, "heavy": sorted(name for name in heavy if name in sys.modules)}))
"""


def test_bad_option_values_are_named_before_anything_heavy_is_imported(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    documents = tmp_path / "docs.jsonl"
    documents.write_text(json.dumps({"title": "T", "text": "some text", "id": 1}) + "\n")
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([os.path.join(HERE, "..", "src"), os.environ.get("PYTHONPATH", "")])
    )
    result = subprocess.run(
        [sys.executable, "-c", _EARLY_CHECK_PROBE, str(model), str(documents)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    probe = json.loads(result.stdout)
    assert probe["heavy"] == []
    expected = [
        "--top-k must be at least 1, got 0",
        "--batch-size must be at least 1, got 0",
        "--port must be from 0 to 65535, got 99999",
        "--concurrency must be at least 1, got 0",
        "--ks must be positive integers, got [5, 0]",
        "--limit must be at least 1, got 0",
        "The documents have no text column 'body' (",
        "The documents have no id column 'uid' (",
        "--max-block-length must be at least 8 wordpieces, got 4",
    ]
    for (status, err), message in zip(probe["results"], expected):
        assert status == 2 and err.startswith("error: ") and message in err, (message, err)
    assert "columns title, text, id); choose one with --text-column" in probe["results"][6][1]


@pytest.mark.parametrize("command", ["index", "ask", "train", "evaluate", "convert", "push"])
def test_subcommand_help_has_examples(command, capsys):
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: realm-hf " + command)
    assert "examples:" in out


def test_version_is_the_package_version(capsys):
    import realm_hf

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"realm-hf {realm_hf.__version__}"


def test_usage_errors_exit_2(capsys):
    assert main([]) == 2
    assert main(["push", "some/dir"]) == 2  # --repo-id missing
    assert "--repo-id" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------------ convert


def test_convert_refuses_pickle_and_writes_nothing(tmp_path, capsys):
    output = tmp_path / "out"
    assert run("convert", LEGACY_OPENQA, output) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ")
    assert "pickle" in err and "arbitrary code" in err and "--allow-pickle" in err
    assert os.listdir(tmp_path) == []


def test_converted_model_answers_exactly_as_legacy(converted, legacy_model):
    files = [os.path.join(root, f) for root, _, names in os.walk(converted) for f in names]
    assert os.path.isfile(converted / "model.safetensors")
    assert os.path.isfile(converted / "retriever" / "index.faiss")
    assert not [f for f in files if f.endswith((".bin", ".npy", ".pkl", ".pt", ".pth"))]
    assert not [f for f in os.listdir(converted.parent) if f.startswith(".")]  # no temporary directories left
    model = RealmForOpenQA.from_pretrained(converted).eval()
    for got, expected in zip(model.answer(QUESTIONS), legacy_model.answer(QUESTIONS)):
        assert got["answer"] == expected["answer"]
        assert (got["start"], got["end"]) == (expected["start"], expected["end"])
        assert got["block"]["block_id"] == expected["block"]["block_id"]
        assert [b["block_id"] for b in got["retrieved"]] == [b["block_id"] for b in expected["retrieved"]]
        assert got["score"] == pytest.approx(expected["score"], abs=1e-5)


def test_convert_never_clobbers_without_overwrite(tmp_path, capsys):
    output = tmp_path / "taken"
    output.mkdir()
    (output / "keep.txt").write_text("mine")
    assert run("convert", os.path.join(LEGACY, "reader"), output) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert os.listdir(output) == ["keep.txt"]
    # A non-OpenQA legacy directory converts through AutoModel; --overwrite swaps the new directory in.
    assert run("convert", os.path.join(LEGACY, "reader"), output, "--overwrite") == 0
    assert not os.path.exists(output / "keep.txt")
    from realm_hf import RealmReader

    converted = RealmReader.from_pretrained(output)
    reference = RealmReader.from_pretrained(os.path.join(LEGACY, "reader"))
    assert os.path.isfile(output / "model.safetensors")
    for key, value in reference.state_dict().items():
        assert torch.equal(converted.state_dict()[key], value), key


def test_convert_hub_id_offline_says_it_cannot(tmp_path, capsys):
    assert run("convert", "google/realm-orqa-nq-openqa", tmp_path / "out", "--allow-pickle") == 2
    err = capsys.readouterr().err
    assert "HF_HUB_OFFLINE" in err and "local directory" in err
    assert not os.path.exists(tmp_path / "out")


# ---------------------------------------------------------------------------------------------------------- ask


def test_ask_json_has_provenance(converted, legacy_model, capsys):
    assert run("ask", *QUESTIONS[:2], "--model", converted, "--json", "--top-k", "2") == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["question"] for r in records] == [QUESTIONS[0]] * 2 + [QUESTIONS[1]] * 2
    assert [r["rank"] for r in records] == [1, 2, 1, 2]
    for record in records:
        assert set(record) >= {"answer", "score", "start", "end", "block"}
        block = record["block"]
        assert set(block) >= {"block_id", "title", "text", "retrieval_score"} and "id" not in block
        assert block["text"][record["start"] : record["end"]] == record["answer"]
    expected = legacy_model.answer(QUESTIONS[:2])
    assert [r["answer"] for r in records if r["rank"] == 1] == [e["answer"] for e in expected]
    assert [r["block"]["block_id"] for r in records if r["rank"] == 1] == [e["block"]["block_id"] for e in expected]


def test_ask_text_from_file(converted, tmp_path, capsys):
    questions = tmp_path / "questions.txt"
    questions.write_text(f"{QUESTIONS[0]}\n\n{json.dumps({'question': QUESTIONS[1]})}\n")
    assert run("ask", "--file", questions, "--model", converted) == 0
    out = capsys.readouterr().out
    assert out.count("Q: ") == 2 and out.count("A: ") == 2
    assert "[source: (block 9)]" in out


def test_ask_with_context_reads_only_the_context(converted, capsys):
    context = "paris is the capital of france."
    assert run("ask", "what is the capital of france?", "--context", context, "--model", converted, "--json") == 0
    record = json.loads(capsys.readouterr().out)
    assert record["block"]["block_id"] is None and record["block"]["text"] == context  # the context, no corpus block
    assert context[record["start"] : record["end"]] == record["answer"]


def test_ask_no_answer_threshold(converted, legacy_model, capsys):
    best = legacy_model.answer(QUESTIONS[0])
    above = f"{min(1.0, best['score'] + 1e-3):.6f}"
    assert run("ask", QUESTIONS[0], "--model", converted, "--no-answer-threshold", above) == 0
    out = capsys.readouterr().out
    assert "A: " not in out and f"(no answer: the best span's probability {best['score']:.3f} is under" in out
    assert run("ask", QUESTIONS[0], "--model", converted, "--no-answer-threshold", above, "--json") == 0
    record = json.loads(capsys.readouterr().out)
    assert (record["answer"], record["block"], record["rank"]) == ("", None, 1)
    assert record["score"] == pytest.approx(best["score"], abs=1e-5)
    assert run("ask", QUESTIONS[0], "--model", converted, "--no-answer-threshold", "0", "--json") == 0
    assert json.loads(capsys.readouterr().out)["answer"] == best["answer"]
    # Not a probability: refused when the arguments are parsed, before the model loads.
    for bad in ("1.5", "-0.1", "high", "nan"):
        assert run("ask", QUESTIONS[0], "--model", converted, "--no-answer-threshold", bad) == 2
        assert "--no-answer-threshold" in capsys.readouterr().err


def test_ask_bad_input(converted, tmp_path, capsys):
    assert run("ask", "   ", "--model", converted) == 2
    assert "Empty question" in capsys.readouterr().err
    assert run("ask", "why?", "--model", tmp_path / "missing") == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["--debug", "ask", "why?", "--model", str(tmp_path / "missing")]) == 2
    assert "Traceback" in capsys.readouterr().err
    # A legacy directory without --allow-pickle says how to get a usable model.
    assert run("ask", "why?", "--model", LEGACY_OPENQA) == 2
    assert "realm-hf convert" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------------- evaluate


def test_evaluate_known_answers(converted, legacy_model, tmp_path, capsys):
    predicted = [r["answer"] for r in legacy_model.answer(QUESTIONS)]
    qa_file = tmp_path / "qa.jsonl"
    rows = [
        {"question": QUESTIONS[0], "answers": [predicted[0].upper(), "paris"]},  # EM after normalisation
        {"question": QUESTIONS[1], "answers": "france"},  # retrieved at rank 1, not predicted
        {"question": QUESTIONS[2], "answers": ["london"]},  # never retrieved
    ]
    qa_file.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    metrics_file = tmp_path / "metrics.json"
    predictions = tmp_path / "predictions.jsonl"
    assert (
        run(
            "evaluate",
            qa_file,
            "--model",
            converted,
            "--ks",
            1,
            2,
            50,
            "--output",
            metrics_file,
            "--predictions",
            predictions,
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "exact_match" in out and "recall@1" in out
    metrics = json.loads(metrics_file.read_text())
    assert metrics["exact_match"] == pytest.approx(100 / 3)
    assert metrics["num_questions"] == 3
    # Top blocks: q0 -> [9 "france is a country ...", 0 "paris is the capital ..."]; q1 -> block 9 (has "france").
    assert metrics["recall@1"] == pytest.approx(2 / 3)
    assert metrics["recall@2"] == pytest.approx(2 / 3)
    assert "recall@50" not in metrics  # more than the 12 blocks of the corpus
    lines = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert [line["exact_match"] for line in lines] == [1.0, 0.0, 0.0]


def test_evaluate_ranking_metrics_and_trec_run_file(converted, legacy_model, tmp_path, capsys):
    from realm_hf.metrics import answer_mrr_at_k, answer_ndcg_at_k

    qa_file = tmp_path / "qa.jsonl"
    rows = [
        {"id": "q-paris", "question": QUESTIONS[0], "answers": ["paris"]},
        {"id": "q france", "question": QUESTIONS[1], "answers": "france"},
        {"question": QUESTIONS[2], "answers": ["london"]},  # no id: its number in the file
    ]
    qa_file.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    metrics_file, run_file = tmp_path / "metrics.json", tmp_path / "run.trec"
    argv = ["evaluate", qa_file, "--model", converted, "--ks", 1, 3, "--output", metrics_file]
    assert run(*argv, "--run-file", run_file, "--run-tag", "dense") == 0
    assert "mrr@3" in capsys.readouterr().out
    metrics = json.loads(metrics_file.read_text())
    # The model's own retrieval (Flat: exact), down to the deepest k.
    legacy_model.config.reader_beam_size, beam = 3, legacy_model.config.reader_beam_size
    try:
        retrieved = [r["retrieved"] for r in legacy_model.answer(QUESTIONS)]
    finally:
        legacy_model.config.reader_beam_size = beam
    texts, golds = [[b["text"] for b in blocks] for blocks in retrieved], [r["answers"] for r in rows]
    golds = [[g] if isinstance(g, str) else g for g in golds]
    for name, value in {**answer_mrr_at_k(texts, golds, [1, 3]), **answer_ndcg_at_k(texts, golds, [1, 3])}.items():
        assert metrics[name.removeprefix("answer_")] == pytest.approx(value), name
    assert 0.0 < metrics["mrr@3"] <= metrics["recall@3"]
    # qid Q0 block_id rank score tag, best first, three blocks a question.
    lines = [line.split() for line in run_file.read_text().splitlines()]
    assert [line[0] for line in lines] == ["q-paris"] * 3 + ["q_france"] * 3 + ["3"] * 3
    flat = [block for blocks in retrieved for block in blocks]
    for line, block in zip(lines, flat, strict=True):
        assert (line[1], line[5]) == ("Q0", "dense") and int(line[2]) == block["block_id"]
        assert float(line[4]) == pytest.approx(block["retrieval_score"], abs=1e-4)
    assert [int(line[3]) for line in lines] == [1, 2, 3] * 3
    # A run file over the QA file or another output, or a tag of two words: refused before the model loads.
    assert run(*argv, "--run-file", metrics_file) == 2
    assert "--output and --run-file both name" in capsys.readouterr().err
    assert run("evaluate", qa_file, "--model", converted, "--run-file", run_file, "--run-tag", "my run") == 2
    assert "--run-tag must be one word" in capsys.readouterr().err


def test_trec_run_lines_keep_the_retrievers_order():
    from realm_hf.cli.evaluate import trec_run_lines

    assert trec_run_lines(["1"], [[(4, 2.5), (7, 1.0)]], "t") == ["1 Q0 4 1 2.500000 t", "1 Q0 7 2 1.000000 t"]
    # Scores that do not fall with the rank (a fused order): 1/rank, which trec_eval reads in the same order.
    assert trec_run_lines(["1"], [[(4, 1.0), (7, 2.5)]], "t") == ["1 Q0 4 1 1.000000 t", "1 Q0 7 2 0.500000 t"]


def test_evaluate_csv_and_missing_column(converted, tmp_path, capsys):
    qa_file = tmp_path / "qa.csv"
    with open(qa_file, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["q", "golds"])
        writer.writerow([QUESTIONS[1], "europe|france"])
    assert (
        run(
            "evaluate", qa_file, "--model", converted, "--question-column", "q", "--answers-column", "golds", "--ks", 1
        )
        == 0
    )
    assert "recall@1" in capsys.readouterr().out
    assert run("evaluate", qa_file, "--model", converted) == 2
    assert "no question column 'question'" in capsys.readouterr().err


# -------------------------------------------------------------------------------------------------------- index


def test_index_builds_corpus_and_attaches_it(converted, tmp_path, capsys):
    from realm_hf.retrieval.retriever import RealmRetriever

    corpus_dir = tmp_path / "corpus"
    assert run("index", DOCUMENTS, "--model", converted, "--max-block-length", 32, "--output", corpus_dir) == 0
    retriever = RealmRetriever.from_pretrained(corpus_dir)
    with open(DOCUMENTS) as f:
        documents = [json.loads(line) for line in f]
    assert len(retriever) >= len(documents)
    assert retriever.max_block_length == 32
    assert "source" in retriever.corpus.column_names  # metadata columns are kept
    assert set(retriever.corpus["title"]) == {d["title"] for d in documents}

    # Not over an existing corpus without --overwrite.
    assert run("index", DOCUMENTS, "--model", converted, "--output", corpus_dir) == 2
    assert "--overwrite" in capsys.readouterr().err

    # Attach to a copy of the model: it then answers from the new corpus, with titles as provenance.
    model_dir = tmp_path / "model"
    shutil.copytree(converted, model_dir)
    assert run("index", DOCUMENTS, "--attach-to", model_dir, "--max-block-length", 32, "--overwrite") == 0
    model = RealmForOpenQA.from_pretrained(model_dir)
    assert len(model.retriever) == len(retriever)
    capsys.readouterr()
    assert run("ask", "who designed the torre alba lighthouse?", "--model", model_dir, "--json") == 0
    record = json.loads(capsys.readouterr().out)
    assert record["block"]["title"] in {d["title"] for d in documents}


def test_index_csv_columns(converted, tmp_path, capsys):
    docs = tmp_path / "docs.csv"
    with open(docs, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["headline", "body", "url"])
        writer.writerow(["Paris", "paris is the capital of france.", "http://a"])
        writer.writerow(["Berlin", "berlin is the capital of germany.", "http://b"])
    assert run("index", docs, "--model", converted, "--output", tmp_path / "c1") == 2
    assert "no text column 'text'" in capsys.readouterr().err and not os.path.exists(tmp_path / "c1")
    assert (
        run(
            "index",
            docs,
            "--model",
            converted,
            "--text-column",
            "body",
            "--title-column",
            "headline",
            "--max-block-length",
            32,
            "--output",
            tmp_path / "c2",
        )
        == 0
    )
    from realm_hf.retrieval.retriever import RealmRetriever

    retriever = RealmRetriever.from_pretrained(tmp_path / "c2")
    assert retriever.corpus["title"] == ["Paris", "Berlin"]
    assert retriever.corpus["url"] == ["http://a", "http://b"]


# -------------------------------------------------------------------------------------------------------- train


def test_index_bad_jsonl_names_file_and_line(converted, tmp_path, capsys):
    documents = tmp_path / "docs.jsonl"
    documents.write_text('{"title": "a", "text": "fine"}\n{"title": "b", "text": \n')
    assert run("index", documents, "--model", converted, "--output", tmp_path / "out") == 2
    assert f"{documents}, line 2: invalid JSON" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_example_config_parses():
    config = load_train_config(EXAMPLE_CONFIG)
    assert config["task"] == "finetune"
    assert os.path.isabs(config["train_file"]) and os.path.isabs(config["output_dir"])
    assert "learning_rate" in config["training_args"]


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
    argv = ["train", EXAMPLE_CONFIG, "--output-dir", output]
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
    with open(DOCUMENTS) as f:
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
    base = ["train", EXAMPLE_CONFIG, "--output-dir", output, "--set", f"model={converted}"]
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


def test_train_config_errors(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("task: finetune\noutput_dir: out\nlerning_rate: 0.1\n")
    assert run("train", path) == 2
    assert "unknown config key(s) lerning_rate" in capsys.readouterr().err
    path.write_text("task: finetune\noutput_dir: out\nmodel: does-not-exist/\ntrain_file: nope.jsonl\n")
    assert run("train", path) == 2
    err = capsys.readouterr().err
    assert "train_file" in err and "does not exist" in err
    assert run("train", tmp_path / "missing.yaml") == 2


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A BertForPreTraining directory (hidden 32, 2 layers) with the fixture corpus's wordpiece vocabulary."""
    from test_pretraining import tiny_bert_config
    from transformers import BertForPreTraining

    from realm_hf import RealmTokenizer

    path = tmp_path_factory.mktemp("tiny_bert")
    tokenizer = RealmTokenizer(vocab=os.path.join(HERE, "fixtures", "corpus", "vocab.txt"))
    torch.manual_seed(0)
    config = tiny_bert_config(tokenizer)
    config.max_position_embeddings = 256
    BertForPreTraining(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


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
    with open(DOCUMENTS) as f:
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
            "documents": DOCUMENTS,
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
    # The issue: same seed, only searcher_beam_size (a training-time setting) and max_steps differ. The fresh heads
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


# --------------------------------------------------------------------------------------------------------- push


@pytest.fixture
def local_hub(tmp_path, monkeypatch):
    """The in-process Hub server of tests/hub_server.py, with huggingface_hub pointed at it (online), a fresh cache."""
    hub_server = pytest.importorskip("hub_server")
    with hub_server.LocalHub() as hub:
        hub_server.point_clients_at(monkeypatch, hub.url, str(tmp_path / "hf-cache"))
        monkeypatch.setenv("HF_TOKEN", hub_server.TOKEN)  # never leaves 127.0.0.1
        yield hub
        assert not hub.unauthorized


def _repo_files(hub, repo_type, repo_id):
    repo = hub.repos[(repo_type, repo_id)]
    return repo["commits"][repo["branches"]["main"]]


def test_push_model_and_corpus_repo_through_a_local_hub(converted, legacy_model, local_hub):
    assert run("push", converted, "--repo-id", "realm-test/cli", "--corpus-repo-id", "realm-test/cli-corpus") == 0
    model_files = _repo_files(local_hub, "model", "realm-test/cli")
    corpus_files = _repo_files(local_hub, "dataset", "realm-test/cli-corpus")
    assert {"config.json", "model.safetensors", "README.md"} <= set(model_files)
    assert not any(name.startswith("retriever/") for name in model_files)  # the corpus lives in the dataset repo
    assert {"retriever_manifest.json", "index.faiss"} <= set(corpus_files)
    config = json.loads(model_files["config.json"])
    assert config["retriever_repo_id"] == "realm-test/cli-corpus" and config["retriever_revision"]
    # The pushed model loads from the Hub (following the corpus reference) and answers as the legacy model does.
    model = RealmForOpenQA.from_pretrained("realm-test/cli").eval()
    assert [r["answer"] for r in model.answer(QUESTIONS)] == [r["answer"] for r in legacy_model.answer(QUESTIONS)]


def test_convert_downloads_a_hub_checkpoint(local_hub, tmp_path, legacy_model):
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo("google-test/realm-tiny-openqa")
    api.upload_folder(repo_id="google-test/realm-tiny-openqa", folder_path=LEGACY_OPENQA)
    output = tmp_path / "converted"
    assert run("convert", "google-test/realm-tiny-openqa", output, "--allow-pickle") == 0
    model = RealmForOpenQA.from_pretrained(output).eval()
    assert [r["answer"] for r in model.answer(QUESTIONS)] == [r["answer"] for r in legacy_model.answer(QUESTIONS)]


def test_push_offline_is_a_clear_error(converted, capsys):
    assert os.environ.get("HF_HUB_OFFLINE") == "1"  # set by conftest: no Hub in tests
    assert run("push", converted, "--repo-id", "me/realm-test", "--corpus-repo-id", "me/corpus") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: Cannot push") and "HF_HUB_OFFLINE" in err


def test_train_runs_the_warmups_before_fine_tuning(converted, tmp_path, capsys):
    """`retriever_warmup` and `reader_warmup` run the library's warm-up recipes before Open-QA fine-tuning."""
    qa_file = tmp_path / "train.jsonl"
    rows = [
        {"question": "What is the capital of France?", "answers": ["paris"], "doc_id": 0},
        {"question": "Who created Python?", "answers": ["guido van rossum"], "doc_id": 3},
    ]
    qa_file.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    output = tmp_path / "run"
    base = ["train", EXAMPLE_CONFIG, "--output-dir", output, "--set", f"model={converted}"]
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


def test_the_console_script_and_the_commands_share_their_exit_statuses():
    import realm_hf_cli
    from realm_hf.cli import common

    assert (realm_hf_cli.EXIT_OK, realm_hf_cli.EXIT_ERROR) == (common.EXIT_OK, common.EXIT_ERROR)


def test_package_main_stays_the_entry_point_after_a_command_ran(tmp_path):
    # A submodule named `realm_hf.cli.main` replaced the package's `main` function once a command had run.
    import realm_hf.cli
    import realm_hf_cli

    assert realm_hf.cli.main(["-q", "evaluate", str(tmp_path / "missing.jsonl"), "--model", str(tmp_path)]) == 2
    assert realm_hf.cli.main is realm_hf_cli.main
    assert realm_hf.cli.main(["-q", "evaluate", str(tmp_path / "missing.jsonl"), "--model", str(tmp_path)]) == 2
