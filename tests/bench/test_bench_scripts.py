"""Smoke tests of the benchmark scripts in bench/: they run end to end at tiny sizes and print their tables.

The fast ones take a few seconds; the comparison against the legacy transformers venv is `slow` and is skipped when
no legacy venv is found.
"""

import json
import os
import re

import pytest

from tests.support.bench import load_script, tiny_bert
from tests.support.paths import FIXTURES


def test_flop_count_of_bert_base_block():
    embed = load_script("embed")
    from realm_hf import RealmConfig

    config = RealmConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
    h, i, s = 768, 3072, 288
    per_layer = 2 * s * (4 * h * h + 2 * h * i) + 4 * s * s * h
    assert embed.flops_per_block(config, s) == 12 * per_layer + 2 * h * h + 2 * h * 128
    assert 51e9 < embed.flops_per_block(config, s) < 53e9


def test_embed_bench_quick_runs(tmp_path, capsys):
    embed = load_script("embed")
    out = tmp_path / "embed.json"
    args = [
        "--quick",
        "--models",
        "minilm",
        "--minilm-weights",
        "random",
        "--seqs",
        "32",
        "--batches",
        "2",
        "--no-bf16",
    ]
    rc = embed.main(args + ["--corpus-blocks", "6", "--json", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| model" in printed and "% of measured peak" in printed
    results = json.loads(out.read_text())["results"]
    assert {r["seq"].split()[-1] for r in results} >= {"32", "order", "length-sorted"}
    assert all(r["blocks_per_s"] > 0 and r["percent_of_peak"] > 0 for r in results)


def test_qa_bench_realm_hf_only_runs(tmp_path, capsys):
    pytest.importorskip("realm_hf.retrieval")
    qa = load_script("qa")
    args = ["--skip-legacy", "--blocks", "120,400", "--block-words", "8,20", "--questions", "6", "--batches", "1,4"]
    args += ["--hidden", "32", "--layers", "1", "--heads", "2", "--span-hidden", "16", "--reader-seq-len", "48"]
    args += ["--embed-max-length", "16", "--hnsw", "", "--warmup", "1", "--threads", "1", "--peak-sizes", "128,256"]
    args += ["--json", str(tmp_path / "qa.json")]
    assert qa.main(args) == 0
    printed = capsys.readouterr().out
    assert "| blocks | implementation" in printed and "questions/s" in printed and "identical vs fp32" in printed
    assert "GFLOP/s" in printed and "% of peak" in printed and "measured peak matmul: fp32" in printed
    assert "goal: bf16 at 400 blocks, batch 4" in printed
    # The profiled pass: every stage of a question, and each model's share of the peak.
    assert "Where one question's time goes (400 blocks, batch 4" in printed and "| reader: encoder" in printed
    assert "fp32 at 400 blocks, batch 4: end to end" in printed and "the reader" in printed
    assert "int8 at 400 blocks, batch 4:" in printed and "the fp32 questions/s" in printed
    # The int8 products' own peak, measured in the same run, bounds the int8 speed-up.
    ceiling = re.search(r"int8 matmul peak is (\d+\.\d+)x its fp32 peak", printed)
    assert ceiling and float(ceiling.group(1)) > 0 and "measured peak matmul: fp32" in printed and "int8 " in printed
    results = json.loads((tmp_path / "qa.json").read_text())["results"]
    dtypes = ("fp32", "bf16", "int8")
    expected = [(blocks, dtype, batch) for blocks in (120, 400) for dtype in dtypes for batch in (1, 4)]
    assert [(r["blocks"], r["dtype"], r["batch"]) for r in results] == expected
    # bf16 and int8 rows are compared with the fp32 answers (reported, not asserted: random weights), fp32 rows are
    # the reference.
    assert all(re.fullmatch(r"\d/6 \(\d+\.\d%\)", r["identical_vs_fp32"]) for r in results if r["dtype"] != "fp32")
    assert all(r["identical_vs_fp32"] == "-" for r in results if r["dtype"] == "fp32")
    assert all(r["achieved_flops"] > 0 and r["percent_of_peak"] > 0 for r in results)
    profiled = [r for r in results if "stage_seconds" in r]
    assert {(r["blocks"], r["dtype"]) for r in profiled} == {(b, d) for b in (120, 400) for d in dtypes}


def test_qa_bench_reader_flops_count_the_span_head_inside_the_block():
    from realm_hf import RealmConfig

    qa = load_script("qa")
    config = RealmConfig(
        hidden_size=64, num_hidden_layers=2, intermediate_size=256, span_hidden_size=32, max_span_width=3
    )
    s, h, i = 20, 64, 256
    encoder = 2 * (2 * s * (4 * h * h + 2 * h * i) + 4 * s * s * h)
    assert qa.encoder_flops(config, s) == encoder
    # A block of 12 wordpieces holds 12 + 11 + 10 spans of width 1-3.
    assert qa.reader_row_flops(config, s, 12) == encoder + 2 * s * h * 2 * 32 + 2 * (12 + 11 + 10) * 32


def test_qa_bench_scores_a_trained_model_in_each_dtype(tmp_path, capsys):
    from tests.support.tiny_model import build_tiny_model, save_tiny_model

    qa = load_script("qa")
    model, tokenizer = build_tiny_model(str(tmp_path))
    path = save_tiny_model(model, tokenizer, tmp_path / "model")
    questions = tmp_path / "questions.jsonl"
    lines = [
        {"question": "who wrote unix?", "answers": ["Ken Thompson"], "title": "Unix"},
        {"question": "what is a compiler?", "answers": ["a program"], "title": "Compiler"},
    ]
    questions.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "quality.json"
    args = ["--model", str(path), "--qa-file", str(questions), "--dtypes", "fp32,int8", "--threads", "1"]
    assert qa.main(args + ["--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| dtype | EM" in printed and "answers identical to fp32" in printed
    results = json.loads(out.read_text())["results"]
    assert [r["dtype"] for r in results] == ["fp32", "int8"] and results[0]["identical_to_fp32"] == 2


def test_gpu_bench_code_path_runs_on_the_cpu(tmp_path, capsys):
    gpu = load_script("gpu")
    out = tmp_path / "gpu.json"
    assert gpu.main(["--device", "cpu", "--quick", "--threads", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| measurement" in printed and "% of peak" in printed and "measured peak matmul: fp32" in printed
    rows = json.loads(out.read_text())["rows"]
    kinds = [row[0] for row in rows]
    assert kinds.count("corpus embedding") == 2 * 3  # two models, fp32/bf16/fp16
    assert "answering" in kinds and kinds.count("training step") == 2
    assert any(row[0].startswith("faiss") for row in rows)
    # faiss-cpu (this machine): the faiss-gpu row says it was not measured and why.
    from realm_hf.retrieval import faiss_ops

    if not faiss_ops.faiss_gpu_available():
        assert any("not measured: the installed faiss has no GPU support" in row[3] for row in rows)


def test_gpu_bench_refuses_cuda_without_a_gpu(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    gpu = load_script("gpu")
    assert gpu.main(["--device", "cuda", "--quick"]) == 2
    assert "torch sees no CUDA GPU" in capsys.readouterr().err


def test_qa_bench_sized_corpus_adds_synthetic_blocks_like_the_real_ones():
    import numpy as np

    qa = load_script("qa")
    rng = np.random.default_rng(0)
    real = (rng.standard_normal((500, 8)) @ rng.standard_normal((8, 8)) + 3.0).astype(np.float32)
    texts = [f"block {i}" for i in range(500)]
    sized_texts, sized = qa.sized_corpus(texts, real, 20_000, seed=0)
    assert sized.shape == (20_000, 8) and sized.dtype == np.float32
    np.testing.assert_array_equal(sized[:500], real)  # the real blocks first, unchanged
    assert sized_texts[:500] == texts and sized_texts[500] is texts[0] and sized_texts[-1] is texts[19_999 % 500]
    synthetic = sized[500:]
    np.testing.assert_allclose(synthetic.mean(0), real.mean(0), atol=0.1)
    np.testing.assert_allclose(np.cov(synthetic, rowvar=False), np.cov(real, rowvar=False), atol=0.5)
    smaller_texts, smaller = qa.sized_corpus(texts, real, 200, seed=0)
    assert smaller_texts == texts[:200] and np.array_equal(smaller, real[:200])


@pytest.mark.slow
def test_qa_bench_matches_legacy(tmp_path, capsys):
    pytest.importorskip("realm_hf.retrieval")
    qa = load_script("qa")
    legacy_python = qa.find_legacy_python(None)
    if legacy_python is None:
        pytest.skip("no legacy transformers 4.57.6 venv (see bench/README.md)")
    args = ["--blocks", "300,3000", "--block-words", "10,40", "--questions", "12", "--batches", "1,4"]
    args += ["--hidden", "64", "--layers", "2", "--heads", "2", "--reader-seq-len", "96", "--embed-max-length", "32"]
    args += ["--threads", "1", "--hnsw", ""]
    # Exit 0: every fp32 answer with the exact index is the legacy one, at both sizes.
    assert qa.main(args + ["--legacy-python", legacy_python]) == 0
    printed = capsys.readouterr().out
    assert printed.count("12/12 (100.0%)") >= 4 and "goal: bf16 at 3,000 blocks" in printed


def test_train_memory_bench_quick_runs(tmp_path, capsys):
    train_memory = load_script("train_memory")
    out = tmp_path / "train_memory.json"
    assert train_memory.main(["--quick", "--threads", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| peak unbounded / bounded" in printed and "cores" in printed
    results = {r["mode"]: r for r in json.loads(out.read_text())["results"]}
    # --quick: batch 2, searcher beam 8, reader beam 2 (the bounded m); unbounded re-embeds the whole beam.
    assert results["bounded"]["blocks_with_gradient"] == 2 * 2
    assert results["unbounded"]["blocks_with_gradient"] == 2 * 8
    assert all(r["peak_gb"] >= r["before_step_gb"] > 0 for r in results.values())
    # The skip rule's estimate: the bounded peak plus the extra blocks at the measured cost per block.
    rows = [
        {"beam": 50, "mode": "bounded", "batch": 8, "k": 50, "blocks_with_gradient": 40, "peak_gb": 3.0},
        {"beam": 50, "mode": "unbounded", "batch": 8, "k": 50, "blocks_with_gradient": 400, "peak_gb": 9.0},
    ]
    larger = {"beam": 200, "mode": "bounded", "batch": 8, "k": 200, "blocks_with_gradient": 40, "peak_gb": 3.1}
    assert train_memory.predict_unbounded_gb(rows, larger) == pytest.approx(3.1 + 6.0 / 360 * 8 * 195)


def test_learning_bench_quick_runs_every_claim(tmp_path, capsys):
    """bench/learning_foldoc.py end to end on a tiny BERT and a slice of the shipped FOLDOC extract."""
    bert = tiny_bert(tmp_path)
    learning = load_script("learning_foldoc")
    out = tmp_path / "learning.json"
    args = ["--quick", "--bert", str(bert), "--foldoc", "extract", "--entries", "300", "--freeze-layers", "1"]
    args += ["--embed-dtype", "fp32", "--output", str(tmp_path / "scratch"), "--json", str(out)]
    assert learning.main(args) == 0
    printed = capsys.readouterr().out
    assert "| claim" in printed
    rows = json.loads(out.read_text())["rows"]
    assert {row["claim"][0] for row in rows} == {"1", "2", "3", "4", "5"}
    assert all(0.0 <= row["after"] <= 1.0 and 0.0 <= row["baseline_value"] <= 1.0 for row in rows)


def test_retrieval_ceiling_bench_quick_runs_every_probe(tmp_path, capsys):
    """bench/retrieval_ceiling_foldoc.py end to end on a tiny BERT and a slice of the shipped FOLDOC extract."""
    bert = tiny_bert(tmp_path)
    ceiling = load_script("retrieval_ceiling_foldoc")
    out = tmp_path / "ceiling.json"
    args = ["--quick", "--bert", str(bert), "--freeze-layers", "1", "--link-freeze-layers", "1", "--dtype", "fp32"]
    assert ceiling.main(args + ["--threads", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| probe |" in printed
    rows = json.loads(out.read_text())["rows"]
    assert [row["probe"][0] for row in rows] == ["s", "A", "B", "C"]
    # B adds corpus link sentences to A's questions; every metric is a fraction of the held-out questions.
    assert 0 < rows[1]["pairs"] < rows[2]["pairs"] == rows[3]["pairs"]
    assert all(0.0 <= row[key] <= 1.0 for row in rows for key in row if "@" in key)
    # Recall can only grow with k.
    assert all(row["answer_recall@1"] <= row["answer_recall@5"] <= row["answer_recall@20"] for row in rows)
    assert all(row["linked_entry@1"] <= row["linked_entry@3"] <= row["linked_entry@20"] for row in rows)


def test_retrieval_ceiling_corpus_questions_blank_the_link_and_never_name_it():
    ceiling = load_script("retrieval_ceiling_foldoc")
    from realm_hf.metrics import has_answer

    text = "A daft way of encoding text with question marks and exclamation marks."
    task = {
        "masked_sentences": [
            # "exclamation mark" blanked; the question still says "exclamation marks": must be skipped.
            {
                "text": text + " See exclamation mark.",
                "salient_spans": [[52, 68]],
                "source_title": "!!!Batch",
                "answer_target": "exclamation mark",
            },
            {"text": text, "salient_spans": [[33, 47]], "source_title": "!!!Batch", "answer_target": "question mark"},
        ]
    }
    questions = ceiling.corpus_link_questions(task, None, seed=0)
    assert len(questions) == 1
    (q,) = questions
    assert q["question"] == "A daft way of encoding text with ___ and exclamation marks."
    assert q["answers"] == ["question marks", "question mark"] and q["exclude_source"]
    assert q["source_title"] == "!!!Batch" and not has_answer(q["question"], q["answers"])


def test_learning_bench_noise_rule():
    learning = load_script("learning_foldoc")
    # 300 questions: 0.30 vs 0.25 is under two standard errors of the difference (~0.073), 0.30 vs 0.15 is not.
    assert learning.within_noise(0.30, 0.25, 300)
    assert not learning.within_noise(0.30, 0.15, 300)
    assert learning.within_noise(0.5, 0.5, 10)


def test_cli_startup_bench_quick_runs(capsys):
    cli_startup = load_script("cli_startup")
    results = cli_startup.main(["--quick"])
    labels = [row["command"] for row in results]
    assert "realm-hf --help" in labels and "realm-hf train --help" in labels
    # Every --help answers with status 0; the usage row (no command) with 2. No timing is asserted.
    assert all(row["exit"] == 0 for row in results if row["command"].endswith("--help"))
    assert "| realm-hf --help" in capsys.readouterr().out


def train_step_args(tmp_path):
    args = ["--quick", "--bert", str(tiny_bert(tmp_path)), "--foldoc", "extract", "--blocks", "150"]
    args += ["--beams", "10,100", "--batch-size", "2", "--max-block-length", "32", "--reader-seq-len", "64"]
    return args + ["--embed-dtype", "fp32", "--threads", "1", "--json", str(tmp_path / "train_step.json")]


def test_train_step_bench_quick_runs(tmp_path, capsys):
    train_step = load_script("train_step")
    assert train_step.main(train_step_args(tmp_path) + ["--skip-legacy"]) == 0
    printed = capsys.readouterr().out
    assert "| training step" in printed and "vs realm-hf beam 10" in printed
    results = json.loads((tmp_path / "train_step.json").read_text())["results"]
    assert [(r["implementation"], r["beam"]) for r in results] == [
        ("realm-hf", 10),
        ("realm-hf", 100),
        ("realm-hf (old corpus)", 100),
    ]
    assert all(r["step_s"] > 0 for r in results)


@pytest.mark.slow
def test_train_step_bench_against_legacy(tmp_path, capsys):
    train_step = load_script("train_step")
    legacy_python = train_step.find_legacy_python(None)
    if legacy_python is None:
        pytest.skip("no legacy transformers 4.57.6 venv (see bench/README.md)")
    assert train_step.main(train_step_args(tmp_path) + ["--legacy-python", legacy_python]) == 0
    assert "| legacy transformers 4.57.6, beam 100" in capsys.readouterr().out
    results = json.loads((tmp_path / "train_step.json").read_text())["results"]
    # Same model, corpus and kind of questions: both sides find answers in the beam at a similar rate.
    assert results[-1]["implementation"] == "legacy" and results[-1]["blocks_with_answer"] >= 0


def test_search_bench_quick_runs(capsys, monkeypatch):
    search = load_script("search")
    # Above this size HNSW is described instead of built (at 13.35M blocks: ~10 GB, far over the 1 GB budget).
    monkeypatch.setattr(search, "HNSW_MAX_BLOCKS", 10_000)
    index_types = "Flat;HNSW32;IVF64,PQ16 nprobe=4,8 rerank=4,50"
    assert search.main(["--quick", "--index-types", index_types, "--legacy-queries", "5"]) == 0
    printed = capsys.readouterr().out
    rows = {line.split(" | ")[0].strip(): line.split(" | ")[1:] for line in printed.splitlines() if " | " in line}
    assert {"legacy einsum+topk (1 question/call)", "Flat", "HNSW32"} <= set(rows)
    for nprobe in (4, 8):
        assert f"IVF64,PQ16 nprobe={nprobe}" in rows
        recalls = [
            float(rows[f"IVF64,PQ16 nprobe={nprobe}{s}"][-1]) for s in ("", " +exact rerank x4", " +exact rerank x50")
        ]
        assert recalls[0] < recalls[2]  # exact re-ranking of more candidates recovers what the codes lose
    assert "HNSW32: not measured:" in printed and "--force-hnsw" in printed
    assert "IVF64,PQ16: resident" in printed and "ids 0.2 MB (8 B/block)" in printed


def test_wikipedia_stages_bench_quick_runs_every_stage(tmp_path, capsys):
    """bench/wikipedia_stages.py on the tiny invented corpus and a tiny BERT: a row per stage (end to end with refresh
    last), both held-out sets."""
    bert = tiny_bert(tmp_path, max_positions=256, seed=0)
    stages = load_script("wikipedia_stages")
    wiki = os.path.join(FIXTURES, "wikipedia")
    out = tmp_path / "stages.json"
    argv = [
        "--quick", "--json", str(out), "--output", str(tmp_path / "run"),
        "--summaries", os.path.join(wiki, "summaries.json"), "--handwritten", os.path.join(wiki, "handwritten.jsonl"),
        "--bert", str(bert), "--max-block-length", "48", "--pca-sample", "64", "--retriever-steps", "1",
        "--retriever-batch-size", "4", "--reader-steps", "1", "--reader-batch-size", "4", "--openqa-steps", "1",
        "--openqa-batch-size", "2", "--searcher-beam", "4", "--eval-questions", "4",
        "--written-train", os.path.join(wiki, "written_train.jsonl"), "--written-dev", "none",
        "--end-to-end-steps", "2", "--end-to-end-refresh-steps", "1", "--curve-every", "1",
    ]  # fmt: skip
    assert stages.main(argv) == 0
    printed = capsys.readouterr().out
    names = ["start (random projection)", "start (PCA projection, the demo's)"]
    names += [
        f"+ {n}" for n in ("retriever warm-up", "reader warm-up", "Open-QA fine-tuning", "end to end with refresh")
    ]
    for name in names:
        assert f"{name:34} generated" in printed and f"{name:34} hand-written" in printed
    # The results file: the stages with their steps and evaluations, and the curve inside the last stage (the stages'
    # ends are their own evaluations: step 4 of 1 + 1 + 1 + 2).
    results = json.loads(out.read_text())
    assert [(s["stage"], s["steps"]) for s in results["stages"]] == [
        ("retriever warm-up", 1), ("reader warm-up", 1), ("Open-QA fine-tuning", 1), ("end to end with refresh", 2)
    ]  # fmt: skip
    assert all(set(s["metrics"]) == {"generated", "hand-written"} for s in results["stages"])
    assert results["after"] == results["stages"][-1]["metrics"]
    assert sorted((p["step"], p["set"]) for p in results["curve"]) == [(4, "generated"), (4, "hand-written")]
    plot = load_script("plot_results").read_results(str(out))
    assert not plot.by_stage and [step for step, _, _ in plot.curve["generated"]] == [0, 1, 2, 3, 4, 5]
    # Refreshed after step 1 and once more at the end, with the final weights.
    assert "Index refreshed 2 times, the last with the weights of step 2." in printed


def test_abstention_bench_quick_prints_answered_share_against_em(tmp_path, capsys):
    """bench/abstention.py on the tiny invented corpus with a tiny random model: a row per threshold and set."""
    wiki = os.path.join(FIXTURES, "wikipedia")
    abstention = load_script("abstention")
    out = tmp_path / "rows.json"
    argv = ["--quick", "--summaries", os.path.join(wiki, "summaries.json"), "--handwritten"]
    argv += [os.path.join(wiki, "handwritten.jsonl"), "--thresholds", "0", "0.5", "1", "--json", str(out)]
    results = abstention.main(argv)
    assert {r["set"] for r in results} <= {"generated", "hand-written"} and results
    for result in results:
        answered = [row["answered"] for row in result["rows"]]
        assert answered[0] == 1.0 and answered == sorted(answered, reverse=True)  # a higher threshold answers less
        assert answered[-1] < 1.0  # no random span reaches probability 1
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert "EM answered" in capsys.readouterr().out


def test_convert_bench_writes_block_records_as_np_save_does(tmp_path):
    """bench/convert.py streams block_records.npy item by item: the bytes must be np.save's (pickle frames, batches)."""
    import io

    import numpy as np

    convert = load_script("convert")
    rng = np.random.default_rng(0)
    for n in (1, 2, 1000, 1001, 2500):
        sizes = rng.integers(2, 3000, n)
        sizes[::97], sizes[1::113], sizes[2::131], sizes[3::50] = 70_000, 255, 256, 0  # unframed, both headers, b""
        items = [bytes(rng.integers(97, 123, s, dtype=np.uint8)) for s in sizes]
        records = np.empty(n, dtype=object)
        records[:] = items
        expected = io.BytesIO()
        np.save(expected, records, allow_pickle=True)
        convert.write_block_records(str(tmp_path / "records.npy"), iter(items), n)
        assert (tmp_path / "records.npy").read_bytes() == expected.getvalue(), n


def test_convert_bench_blocks_have_the_wordpieces_asked(tmp_path):
    import numpy as np
    from transformers import BertTokenizerFast

    convert = load_script("convert")
    vocab, _ = convert.vocab_file()
    lengths = convert.BlockMaker(vocab, 3).lengths(200)
    blocks = convert.BlockMaker(vocab, 3).blocks(200)
    tokenizer = BertTokenizerFast(vocab=vocab)
    counted = [len(ids) for ids in tokenizer([b.decode() for b in blocks], add_special_tokens=False)["input_ids"]]
    assert counted == lengths.tolist()
    assert np.mean(lengths) > 250 and max(lengths) == convert.BLOCK_WORDPIECES


@pytest.mark.slow
def test_convert_bench_runs_at_20000_blocks(tmp_path, capsys):
    convert = load_script("convert")
    out = tmp_path / "convert.json"
    assert convert.main(["--blocks", "20000", "--workdir", str(tmp_path), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| `realm-hf convert` (streamed) |" in printed and "identical" in printed
    results = json.loads(out.read_text())
    assert results["blocks"] == 20000 and results["outputs_identical"] == "identical"
    assert all(run["peak_rss_gb"] > 0 for run in results["runs"])
    assert os.listdir(tmp_path) == ["convert.json"]  # the checkpoint and outputs are deleted


def test_warmup_step_bench_times_both_warmups_at_each_dropout(tmp_path, capsys):
    """bench/warmup_step.py on the tiny invented Wikipedia corpus and a tiny BERT: one row per warm-up and dropout."""
    bert = tiny_bert(tmp_path, max_positions=256, seed=0)
    bench = load_script("warmup_step")
    wiki = os.path.join(FIXTURES, "wikipedia")
    out = tmp_path / "steps.json"
    argv = [
        "--bert", str(bert), "--summaries", os.path.join(wiki, "summaries.json"),
        "--handwritten", os.path.join(wiki, "handwritten.jsonl"), "--max-block-length", "48", "--steps", "1",
        "--reader-batch-size", "2", "--retriever-batch-size", "2", "--searcher-beam", "4", "--json", str(out),
    ]  # fmt: skip
    assert bench.main(argv) == 0
    rows = json.loads(out.read_text())
    assert [(r["stage"], r["dropout"]) for r in rows] == [
        ("reader warm-up", 0.1), ("reader warm-up", 0.0), ("retriever warm-up", 0.1), ("retriever warm-up", 0.0)
    ]  # fmt: skip
    assert all(r["seconds"] > 0 for r in rows)
    assert "| reader warm-up | 2 | 0.0 |" in capsys.readouterr().out
