"""Papercuts an experienced Hugging Face user hit (issue 27, part 3), one test (or a few) per fix."""

import logging
import os
import subprocess
import sys

import datasets
import pytest
import torch
from transformers import TrainingArguments

from realm_hf import RealmForOpenQA

HERE = os.path.dirname(__file__)
LEGACY_OPENQA = os.path.join(HERE, "fixtures", "legacy", "openqa")
QUESTIONS = [
    {"question": "What is the capital of France?", "answers": ["paris"]},
    {"question": "Who created the Python language?", "answers": ["guido van rossum", "guido"]},
]


def legacy_model():
    torch.manual_seed(0)
    model = RealmForOpenQA.from_pretrained(LEGACY_OPENQA, allow_pickle=True)
    model.config.searcher_beam_size = 6
    return model


def untrained_warnings(caplog):
    return [r for r in caplog.records if "reader was never trained" in r.getMessage()]


# ------------------------------------------------------------------------------------------- the untrained reader


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A BertForPreTraining directory (hidden 32, 2 layers) with the legacy fixture's vocabulary."""
    from test_pretraining import tiny_bert_config
    from transformers import BertForPreTraining

    from realm_hf import RealmTokenizer

    path = tmp_path_factory.mktemp("tiny_bert")
    tokenizer = RealmTokenizer.from_pretrained(LEGACY_OPENQA)
    torch.manual_seed(0)
    BertForPreTraining(tiny_bert_config(tokenizer)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_init_from_bert_records_an_untrained_reader_and_no_local_path(tiny_bert):
    from realm_hf.models.initialization import init_from_bert
    from realm_hf.models.modeling_pretraining import RealmForPreTraining

    model = init_from_bert(RealmForOpenQA, tiny_bert, retriever_proj_size=8, span_hidden_size=8)
    assert model.config.reader_trained is False
    assert model.config.base_model is None  # a local path is not a Hub id, and would leak into published configs
    named = init_from_bert(RealmForOpenQA, tiny_bert, base_model="google/bert_uncased_L-2_H-128_A-2")
    assert named.config.base_model == "google/bert_uncased_L-2_H-128_A-2"
    # A model without a reader has nothing untrained to report.
    assert init_from_bert(RealmForPreTraining, tiny_bert, retriever_proj_size=8).config.reader_trained is True


def test_untrained_reader_warns_at_load_and_answer_and_in_card(tiny_bert, tmp_path, caplog):
    from huggingface_hub import ModelCard

    from realm_hf import RealmRetriever, RealmTokenizer
    from realm_hf.models.initialization import init_from_bert

    model = init_from_bert(
        RealmForOpenQA, tiny_bert, retriever_proj_size=8, span_hidden_size=8, base_model="org/tiny-bert"
    )
    tokenizer = RealmTokenizer.from_pretrained(tiny_bert)
    documents = [{"title": "Paris", "text": "Paris is the capital of France."}]
    model.set_retriever(RealmRetriever.from_documents(documents, model.embedder, tokenizer, show_progress=False))
    with caplog.at_level(logging.WARNING):
        model.answer("what is the capital of france?")
        model.answer("what is the capital of france?")
    assert len(untrained_warnings(caplog)) == 1  # once per model, not once per call
    model.save_pretrained(tmp_path / "m")
    card = ModelCard.load(tmp_path / "m" / "README.md")
    assert "reader was never trained" in card.text
    assert card.data.base_model == "org/tiny-bert"
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        reloaded = RealmForOpenQA.from_pretrained(tmp_path / "m")
    assert reloaded.config.reader_trained is False
    assert len(untrained_warnings(caplog)) == 1
    caplog.clear()
    import realm_hf

    with caplog.at_level(logging.WARNING):
        realm_hf.pipeline("question-answering", model=RealmForOpenQA.from_pretrained(tmp_path / "m"))
    assert untrained_warnings(caplog)


def test_legacy_checkpoint_counts_as_trained(caplog):
    with caplog.at_level(logging.WARNING):
        model = legacy_model()
        model.answer("what is the capital of france?")
    assert model.config.reader_trained is True
    assert not untrained_warnings(caplog)


def test_openqa_trainer_marks_the_reader_trained(tmp_path):
    from realm_hf.training.openqa import RealmOpenQATrainer

    model = legacy_model()
    model.config.reader_trained = False  # as after init_from_bert
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=2, report_to=[], use_cpu=True,
        disable_tqdm=True, save_strategy="no",
    )  # fmt: skip
    trainer = RealmOpenQATrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(QUESTIONS))
    trainer.train()
    assert model.config.reader_trained is True


def test_frozen_reader_is_not_marked_trained():
    from realm_hf.training.openqa import mark_reader_trained

    model = legacy_model()
    model.config.reader_trained = False
    model.reader.requires_grad_(False)
    assert mark_reader_trained(model) is False and model.config.reader_trained is False
    model.reader.requires_grad_(True)
    assert mark_reader_trained(model) is True and model.config.reader_trained is True


# ------------------------------------------------------------------------------- datasets' cache and the saved folder


def test_map_and_filter_on_a_loaded_corpus_leave_the_saved_folder_clean(tmp_path):
    legacy_model().save_pretrained(tmp_path / "m")
    corpus_dir = tmp_path / "m" / "retriever" / "corpus"
    before = sorted(os.listdir(corpus_dir))
    model = RealmForOpenQA.from_pretrained(tmp_path / "m")
    datasets.enable_caching()  # the suite disables it (conftest); a user's session has it on
    try:
        corpus = model.retriever.corpus
        mapped = corpus.map(lambda row: {"length": len(row["text"])})
        kept = corpus.filter(lambda row: "paris" in row["text"].lower())
        assert mapped.cache_files and kept.cache_files  # datasets did cache them, on disk ...
        assert all(not f["filename"].startswith(str(corpus_dir)) for f in mapped.cache_files + kept.cache_files)
    finally:
        datasets.disable_caching()
    assert sorted(os.listdir(corpus_dir)) == before  # ... but not in the saved folder
    assert len(mapped) == len(corpus) and 0 < len(kept) < len(corpus)
    reloaded = RealmForOpenQA.from_pretrained(tmp_path / "m")
    assert reloaded.retriever.corpus["text"] == corpus["text"]


# ------------------------------------------------------------------------------------------ logging and progress bars


@pytest.fixture
def transformers_verbosity():
    from transformers.utils import logging as transformers_logging

    before = transformers_logging.get_verbosity()
    yield transformers_logging
    transformers_logging.set_verbosity(before)
    logging.getLogger("realm_hf").setLevel(logging.NOTSET)


def ivf_warnings(caplog):
    from realm_hf.retrieval.faiss_build import adjust_factory_for_size

    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        adjust_factory_for_size("IVF64,Flat", 100)  # too few vectors: warns once
        logging.getLogger("realm_hf.retrieval.faiss_build").info("an info record")
    return [r.levelname for r in caplog.records if r.name.startswith("realm_hf")]


def test_realm_hf_loggers_follow_transformers_verbosity(transformers_verbosity, caplog):
    transformers_verbosity.set_verbosity_warning()
    assert ivf_warnings(caplog) == ["WARNING"]
    transformers_verbosity.set_verbosity_error()
    assert ivf_warnings(caplog) == []
    transformers_verbosity.set_verbosity_info()
    assert ivf_warnings(caplog) == ["WARNING", "INFO"]
    # A level set on realm-hf's own logger governs realm-hf alone ...
    logging.getLogger("realm_hf").setLevel(logging.ERROR)
    assert ivf_warnings(caplog) == []
    # ... and one set on a module's logger governs that module.
    transformers_verbosity.set_verbosity_warning()
    logging.getLogger("realm_hf").setLevel(logging.NOTSET)
    index_logger = logging.getLogger("realm_hf.retrieval.faiss_build")
    before = index_logger.level
    index_logger.setLevel(logging.INFO)
    try:
        assert ivf_warnings(caplog) == ["WARNING", "INFO"]
    finally:
        index_logger.setLevel(before)
    assert ivf_warnings(caplog) == ["WARNING"]


def test_realm_hf_warnings_follow_transformers_verbosity(transformers_verbosity):
    import warnings

    from realm_hf.precision import resolve_autocast_dtype

    with pytest.warns(UserWarning, match="no fast fp16"):
        resolve_autocast_dtype("fp16", "cpu", "answering")
    transformers_verbosity.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_autocast_dtype("fp16", "cpu", "answering") is None


def test_import_changes_no_global_logging():
    probe = (
        "import logging\n"
        "root = logging.getLogger()\n"
        "before = (root.level, list(root.handlers))\n"
        "import realm_hf, realm_hf.training\n"
        "from transformers.utils import logging as tl\n"
        "assert (root.level, list(root.handlers)) == before, (root.level, root.handlers)\n"
        "assert tl.get_verbosity() == logging.WARNING\n"
        "assert logging.getLogger('realm_hf').level == logging.NOTSET and not logging.getLogger('realm_hf').handlers\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "TRANSFORMERS_VERBOSITY"}
    # A fresh interpreter (what import does is the question); it imports torch, so it may be slow on a busy machine.
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(("value", "drawn"), [("1", False), ("true", False), ("0", True), (None, True)])
def test_tqdm_disable_silences_realm_hf_bars(monkeypatch, value, drawn):
    import io

    import huggingface_hub.utils

    from realm_hf.progress import progress_bar

    huggingface_hub.utils.enable_progress_bars()  # an earlier test may have left a switch off
    if value is None:
        monkeypatch.delenv("TQDM_DISABLE", raising=False)
    else:
        monkeypatch.setenv("TQDM_DISABLE", value)
    stream = io.StringIO()
    for _ in progress_bar(range(3), desc="Embedding blocks", file=stream):
        pass
    assert ("Embedding blocks" in stream.getvalue()) is drawn


def test_ivf_fallback_warns_once_and_consistently(caplog):
    import numpy as np

    from realm_hf.retrieval.faiss_build import build_index_from_matrix

    embeddings = np.random.default_rng(0).standard_normal((12, 8)).astype("float32")
    with caplog.at_level(logging.WARNING):
        _, factory = build_index_from_matrix("IVF64,Flat", embeddings, np.arange(12, dtype="int64"), None)
    messages = [r.getMessage() for r in caplog.records if "inverted lists" in r.getMessage()]
    assert factory == "IVF1,Flat"
    assert len(messages) == 1, messages
    assert "'IVF64,Flat' has 64 inverted lists" in messages[0] and "using 'IVF1,Flat' instead" in messages[0]


# ------------------------------------------------------------------------------------------------------------ the CLI


def test_cli_suggests_the_close_option(capsys):
    from realm_hf_cli import main

    assert main(["ask", "who?", "--model", LEGACY_OPENQA, "--top_k", "3"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --top_k" in err and "(did you mean --top-k?)" in err
    assert "usage: realm-hf ask" in err  # the command's usage, not the top-level one
    assert main(["evaluate", "qa.jsonl", "--model", LEGACY_OPENQA, "--answer-column", "a"]) == 2
    assert "(did you mean --answers-column?)" in capsys.readouterr().err


_NO_TORCH_PROBE = """
import sys
import realm_hf_cli
status = realm_hf_cli.main(sys.argv[1:])
print(status, "torch" in sys.modules)
"""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["ask", "who?", "--model", "does-not-exist/"], "Model 'does-not-exist/' does not exist."),
        (["evaluate", "missing.jsonl", "--model", "x"], "QA file 'missing.jsonl' does not exist."),
        (["ask", "who?", "--model", "nobody/no-such-model"], "HF_HUB_OFFLINE is set"),
        (["index", "missing.jsonl", "--model", "m", "--output", "o"], "Input 'missing.jsonl' does not exist."),
    ],
)
def test_cli_reports_a_missing_path_before_importing_torch(tmp_path, argv, message):
    import realm_hf_cli

    # This checkout's script (PYTHONPATH may be relative, and the probe runs in tmp_path), an empty Hub cache.
    source = os.path.dirname(os.path.abspath(realm_hf_cli.__file__))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"), "PYTHONPATH": source}
    result = subprocess.run(
        [sys.executable, "-c", _NO_TORCH_PROBE, *argv], capture_output=True, text=True, env=env, cwd=tmp_path,
        timeout=300,
    )  # fmt: skip
    assert result.stdout.split() == ["2", "False"], result.stderr
    assert message in result.stderr


def test_cli_index_refuses_a_non_realm_model_before_reading_documents(tiny_bert, tmp_path, capsys):
    from realm_hf_cli import main

    documents = tmp_path / "docs.jsonl"
    documents.write_text('{"title": "a", "text": "b"}\nnot json at all\n')  # reading it would fail on line 2
    assert main(["index", str(documents), "--model", str(tiny_bert), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "holds a `bert` model, not a REALM one" in err and "init_from_bert" in err
    assert "line 2" not in err and not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------------------------------------- metrics


def _squad_v11_f1(prediction, ground_truth):
    # SQuAD v1.1's official evaluate-v1.1.py `f1_score`, as published (normalisation aside), as the oracle.
    import collections

    from realm_hf.metrics import normalize_answer

    prediction_tokens = normalize_answer(prediction).split()
    ground_truth_tokens = normalize_answer(ground_truth).split()
    common = collections.Counter(prediction_tokens) & collections.Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    return (2 * precision * recall) / (precision + recall)


@pytest.mark.parametrize(
    ("prediction", "gold"),
    [("", ""), ("the", "a"), ("", "dog"), ("dog", ""), ("dog dog dog", "dog"), ("Paris France", "Paris"), ("a", "b")],
)
def test_f1_matches_squad_v11_by_default(prediction, gold):
    from realm_hf.metrics import compute_qa_metrics, f1_score

    assert f1_score(prediction, [gold]) == pytest.approx(_squad_v11_f1(prediction, gold))
    assert compute_qa_metrics([prediction], [[gold]])["f1"] == pytest.approx(100 * _squad_v11_f1(prediction, gold))


def test_empty_answers_score_by_squad_v2_only_when_asked(monkeypatch):
    from realm_hf.metrics import compute_qa_metrics, load_realm_qa_metric

    assert compute_qa_metrics([""], [[""]]) == {"exact_match": 100.0, "f1": 0.0, "exact_match_count": 1, "total": 1}
    assert compute_qa_metrics([""], [[""]], squad_v2=True)["f1"] == 100.0
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    metric = load_realm_qa_metric()
    assert metric.compute(predictions=[""], references=[[""]])["f1"] == 0.0
    assert metric.compute(predictions=[""], references=[[""]], squad_v2=True)["f1"] == 100.0


# ---------------------------------------------------------------------------------------------------------- the Hub


def test_trainer_push_uploads_json_arguments_and_explains_data_files_once(tmp_path, monkeypatch, caplog):
    import json
    import warnings

    from hub_server import TOKEN, LocalHub, point_clients_at

    from realm_hf.training.openqa import RealmOpenQATrainer

    with LocalHub() as hub:
        point_clients_at(monkeypatch, hub.url, str(tmp_path / "hf-cache"))
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        model = legacy_model()
        args = TrainingArguments(
            output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=2, report_to=[], use_cpu=True,
            disable_tqdm=True, save_strategy="no", hub_model_id="realm-test/trained",
        )  # fmt: skip
        trainer = RealmOpenQATrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(QUESTIONS))
        trainer.train()
        with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO):
            warnings.simplefilter("always")
            logging.getLogger("realm_hf").setLevel(logging.INFO)
            try:
                trainer.push_to_hub()
            finally:
                logging.getLogger("realm_hf").setLevel(logging.NOTSET)
        files = set(hub.files("realm-test/trained"))
        reloaded = RealmForOpenQA.from_pretrained("realm-test/trained")
        assert reloaded.retriever.corpus["text"] == model.retriever.corpus["text"]
    assert "training_args.json" in files and "training_args.bin" not in files
    # The corpus went up as Parquet shards, as model.push_to_hub writes it, and the repo loads.
    corpus = [name for name in files if name.startswith("retriever/corpus/")]
    assert any(name.endswith(".parquet") for name in corpus) and not any(name.endswith(".arrow") for name in corpus)
    assert not any(name.endswith((".bin", ".pt", ".pkl", ".pickle", ".pth")) for name in files), files
    assert not [w for w in caught if "about to commit a data file" in str(w.message)]
    assert len([r for r in caplog.records if "corpus data file(s)" in r.getMessage()]) == 1
    assert json.loads((tmp_path / "out" / "training_args.json").read_text())["max_steps"] == 1


# ----------------------------------------------------------------------------------------------------------- the API


def test_save_pretrained_onto_a_file_says_so(tmp_path):
    target = tmp_path / "model.bin"
    target.write_bytes(b"not a directory")
    with pytest.raises(FileExistsError, match="it is a file, not a directory"):
        legacy_model().save_pretrained(target)
    assert target.read_bytes() == b"not a directory"


def test_pipeline_without_a_retriever_says_what_is_missing():
    import realm_hf

    model = RealmForOpenQA.from_pretrained(LEGACY_OPENQA, load_retriever=False)
    with pytest.raises(ValueError, match=r"no retriever \(no corpus and index attached.*set_retriever"):
        realm_hf.pipeline("question-answering", model=model)


def test_answer_top_k_matches_the_pipeline():
    import realm_hf

    model = legacy_model()
    question = "what is the capital of france?"
    best = model.answer(question)
    top = model.answer(question, top_k=3)
    piped = realm_hf.pipeline("question-answering", model=model)(question, top_k=3)
    assert isinstance(top, list) and 1 <= len(top) <= 3
    keys = ("answer", "score", "logit", "start", "end", "block")
    assert [{k: a[k] for k in keys} for a in top] == [{k: a[k] for k in keys} for a in piped]
    # The first of the top k is answer()'s best answer; texts are distinct, scores best first.
    assert {k: top[0][k] for k in keys} == {k: best[k] for k in keys}
    assert len({a["answer"].lower() for a in top}) == len(top)
    assert [a["score"] for a in top] == sorted((a["score"] for a in top), reverse=True)
    assert all(a["question"] == question and a["retrieved"] == best["retrieved"] for a in top)
    batch = model.answer([question, "who created python?"], top_k=2)
    assert len(batch) == 2 and all(isinstance(answers, list) for answers in batch)
    with pytest.raises(ValueError, match="top_k"):
        model.answer(question, top_k=0)


# ------------------------------------------------------------------------------------------ multi-process teardown


def test_reindex_callback_destroys_its_groups_and_two_processes_exit_five_times(tmp_path):
    import json

    script = os.path.join(HERE, "scripts", "teardown_worker.py")
    out = tmp_path / "teardown.json"
    env = dict(os.environ, ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1")
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    launcher += ["--main_process_port", "29523", "--num_machines", "1", "--mixed_precision", "no"]
    launcher += ["--dynamo_backend", "no"]
    # A hang at exit shows as the timeout.
    result = subprocess.run([*launcher, script, str(out)], env=env, timeout=900, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["world_size"] == 2
    assert report["after_close"] == [report["baseline"]] * 5  # each round's two gloo groups were destroyed


def test_accelerate_example_warns_when_fewer_processes_start_than_asked():
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
    try:
        from finetune_openqa_accelerate import fewer_processes_than_asked
    finally:
        sys.path.pop(0)
    # `accelerate launch --cpu --num_processes 2`: one process, MASTER_PORT set for the two asked, no WORLD_SIZE.
    warning = fewer_processes_than_asked(1, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    assert warning and "only this one started" in warning and "--multi_gpu" in warning
    assert fewer_processes_than_asked(1, {}) is None  # plain `python script.py`
    assert fewer_processes_than_asked(2, {"MASTER_PORT": "29500", "WORLD_SIZE": "2"}) is None
