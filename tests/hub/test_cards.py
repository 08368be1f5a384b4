"""Model cards: YAML metadata with evaluation results, corpus facts, kept hand-written text, a usage snippet that runs."""

import contextlib
import io
import json
import os
import re
import shutil

import datasets
import pytest
import yaml
from huggingface_hub import ModelCard, ModelCardData
from huggingface_hub.repocard_data import model_index_to_eval_results

from realm_hf.hub.card_content import corpus_info
from realm_hf.hub.cards import (
    AUTO_END,
    AUTO_START,
    USAGE_MODEL_PLACEHOLDER,
    extract_code_blocks,
    generate_corpus_card,
    generate_model_card,
    parse_card_metadata,
    write_model_card,
)
from realm_hf.training.openqa import RealmOpenQATrainer
from tests.support.legacy_model import QUESTIONS as LEGACY_QUESTIONS
from tests.support.legacy_model import make_model, training_args
from tests.support.paths import REPO
from tests.support.tiny_model import DOCS, build_tiny_model, save_tiny_model

FOLDOC_SET = {"name": "FOLDOC links", "type": "foldoc-links", "split": "test"}
EVAL = {"eval_exact_match": 40.4, "eval_f1": 46.25, "recall@5": 61.0, "exact_match_count": 4, "total": 10}


def _front_matter(card):
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("\n---\n", 1)[0][4:])


def test_yaml_metadata_parses_and_carries_eval_results(tiny):
    card = generate_model_card(
        tiny[0],
        eval_results=EVAL,
        base_model="google/realm-cc-news-pretrained-embedder",
        datasets=["foldoc-links"],
        eval_dataset={"name": "FOLDOC links", "type": "foldoc-links", "split": "test"},
        model_id="realm-test/tiny",
        language="en",
        tags=["foldoc"],
        license="cc-by-sa-4.0",
    )
    metadata = _front_matter(card)
    assert metadata == parse_card_metadata(card)
    assert metadata["library_name"] == "realm-hf"
    assert metadata["pipeline_tag"] == "question-answering"
    assert metadata["license"] == "cc-by-sa-4.0"
    assert metadata["language"] == ["en"]
    assert {"realm", "retrieval-augmented", "open-domain-qa", "foldoc"} <= set(metadata["tags"])
    assert metadata["datasets"] == ["foldoc-links"]
    assert metadata["base_model"] == "google/realm-cc-news-pretrained-embedder"
    (index,) = metadata["model-index"]
    assert index["name"] == "tiny"
    (result,) = index["results"]
    assert result["task"]["type"] == "question-answering"
    assert result["dataset"] == {"name": "FOLDOC links", "type": "foldoc-links", "split": "test"}
    metrics = {m["type"]: m["value"] for m in result["metrics"]}
    assert metrics == {"exact_match": 40.4, "f1": 46.25, "recall@5": 61.0}  # counts and totals are not metrics
    # The evaluation table says the same.
    assert "| FOLDOC links | test | Exact Match | 40.4 |" in card
    assert "| FOLDOC links | test | Recall@5 | 61 |" in card


def test_several_evaluation_sets(tiny):
    results = [
        {"dataset": {"name": "NQ", "type": "nq_open", "split": "validation"}, "metrics": {"exact_match": 38.2}},
        {"dataset": {"name": "WQ", "type": "web_questions", "split": "test"}, "metrics": {"exact_match": 40.7}},
    ]
    metadata = parse_card_metadata(generate_model_card(tiny[0], eval_results=results))
    assert [r["dataset"]["type"] for r in metadata["model-index"][0]["results"]] == ["nq_open", "web_questions"]
    with pytest.raises(ValueError, match="metrics"):
        generate_model_card(tiny[0], eval_results=[{"dataset": {"name": "x"}}])


def test_corpus_training_and_versions_sections(tiny, tmp_path):
    model, tokenizer, _ = tiny
    path = save_tiny_model(model, tokenizer, tmp_path / "model")
    write_model_card(path, model=model, retriever=model.retriever, training_args={"learning_rate": 3e-5, "seed": 7})
    card = open(os.path.join(path, "README.md")).read()
    info = corpus_info(model.retriever)
    assert info["num_blocks"] == len(DOCS) and info["index_type"] == "Flat" and info["dim"] == 16
    assert f"| Blocks | {len(DOCS)} |" in card
    assert "| FAISS index | `Flat` |" in card
    assert "| Embedding dimension | 16 |" in card
    assert "| Index file size |" in card  # from the saved manifest
    assert "| Corpus format | Arrow |" in card
    assert "| learning_rate | 3e-05 |" in card and "| seed | 7 |" in card
    for package in ("realm-hf", "transformers", "torch", "datasets", "faiss"):
        assert f"- {package} " in card
    assert "RealmForOpenQA" in card and "hidden size 32" in card


def test_training_arguments_object(tiny, tmp_path):
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), learning_rate=1e-4, num_train_epochs=3, report_to=[])
    card = generate_model_card(tiny[0], training_args=args)
    assert "| learning_rate | 0.0001 |" in card and "| num_train_epochs | 3 |" in card
    assert "| output_dir |" not in card  # only the settings that describe training
    # With max_steps, Trainer ignores the epoch count: the card must not claim it.
    args = TrainingArguments(output_dir=str(tmp_path), num_train_epochs=3, max_steps=200, report_to=[])
    card = generate_model_card(tiny[0], training_args=args)
    assert "| max_steps | 200 |" in card and "num_train_epochs" not in card


def test_hand_written_text_and_metadata_survive_resaves(tiny, tmp_path):
    model = tiny[0]
    path = str(tmp_path)
    write_model_card(
        path, model=model, eval_results={"exact_match": 30.0}, model_id="realm-test/tiny", license="apache-2.0"
    )
    readme = os.path.join(path, "README.md")
    card = open(readme).read()
    # A person edits the card: prose above and below the generated block, a changed and an added metadata key.
    front, body = card.split("\n---\n", 1)
    front = front.replace("license: apache-2.0", "license: mit") + "\nlanguage:\n- en\nco2_eq_emissions: 1.5"
    card = front + "\n---\n\n# Notes from the authors\n\nTrained on a laptop.\n" + body + "\n## Limitations\n\nTiny.\n"
    open(readme, "w").write(card)

    # Re-save with new evaluation results and again without any.
    write_model_card(
        path, model=model, eval_results={"exact_match": 35.5}, eval_dataset=FOLDOC_SET, model_id="realm-test/tiny"
    )
    write_model_card(path, model=model, model_id="realm-test/tiny")
    card = open(readme).read()
    metadata = parse_card_metadata(card)
    assert metadata["license"] == "mit"  # edited by hand: kept
    assert metadata["language"] == ["en"] and metadata["co2_eq_emissions"] == 1.5  # added by hand: kept
    assert metadata["library_name"] == "realm-hf"
    # Generated and untouched: updated by the second save, carried over by the third (which had no results).
    assert metadata["model-index"][0]["results"][0]["metrics"][0]["value"] == 35.5
    assert "| Exact Match | 35.5 |" in card
    assert card.index("Trained on a laptop.") < card.index(AUTO_START) < card.index(AUTO_END) < card.index("Tiny.")
    assert (
        card.count(AUTO_START) == 1 and card.count("Trained on a laptop.") == 1 and card.count("## Limitations") == 1
    )
    assert not [name for name in os.listdir(path) if name != "README.md"]  # atomic write left no temp file


def test_deleted_generated_key_stays_deleted(tiny, tmp_path):
    path = str(tmp_path)
    write_model_card(path, model=tiny[0], license="apache-2.0")
    readme = os.path.join(path, "README.md")
    card = open(readme).read().replace("license: apache-2.0\n", "")
    open(readme, "w").write(card)
    write_model_card(path, model=tiny[0], license="apache-2.0")
    assert "license" not in parse_card_metadata(open(readme).read())


def test_existing_readme_without_markers_is_kept(tiny):
    existing = "---\nlicense: other\ntags:\n- mine\n---\n# My model\n\nWritten by hand.\n"
    card = generate_model_card(tiny[0], existing_readme=existing)
    metadata = parse_card_metadata(card)
    assert metadata["license"] == "other" and metadata["tags"] == ["mine"]
    assert metadata["pipeline_tag"] == "question-answering"
    assert card.index("Written by hand.") < card.index(AUTO_START)
    # Regenerating from that card does not duplicate anything.
    again = generate_model_card(tiny[0], existing_readme=card)
    assert again.count("Written by hand.") == 1 and again.count(AUTO_START) == 1


def test_usage_snippet_runs(tiny):
    model, _, path = tiny
    card = generate_model_card(model, example_question="who wrote unix?")
    (snippet,) = extract_code_blocks(card, "python")
    assert USAGE_MODEL_PLACEHOLDER in snippet
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(snippet.replace(USAGE_MODEL_PLACEHOLDER, path), "<model card>", "exec"), {})
    lines = output.getvalue().strip().splitlines()
    assert len(lines) == 4  # the answer, then three candidates
    titles = {title for title, _ in DOCS}
    assert lines[0].split()[-1] in titles
    # Each candidate with its block's id: the schema's `block_id` (the card's example once read an alias, `id`).
    assert all(0 <= int(line.split()[-1]) < len(DOCS) for line in lines[1:])
    assert '["block"]["block_id"]' in snippet and '["id"]' not in snippet


def test_template_is_the_documented_one():
    packaged = os.path.join(REPO, "src", "realm_hf", "templates", "model_card.md")
    documented = os.path.join(REPO, "model_cards", "README_TEMPLATE.md")
    assert open(packaged).read() == open(documented).read()


def test_card_without_model_or_corpus():
    card = generate_model_card()
    assert parse_card_metadata(card)["library_name"] == "realm-hf"
    assert "No corpus was saved" in card


def test_corpus_card(tiny):
    card = generate_corpus_card(tiny[0].retriever, repo_id="realm-test/corpus", license="cc-by-sa-4.0")
    metadata = parse_card_metadata(card)
    assert metadata["license"] == "cc-by-sa-4.0"
    assert {"realm", "faiss"} <= set(metadata["tags"])
    assert metadata["size_categories"] == ["n<1K"]
    assert f"| Blocks | {len(DOCS)} |" in card
    assert 'set_retriever_reference(model.config, "realm-test/corpus")' in card
    kept = generate_corpus_card(tiny[0].retriever, existing_readme=card.replace(AUTO_END, AUTO_END + "\n\nMine.\n"))
    assert kept.count("Mine.") == 1


# --------------------------------------------------------------------------------------------------------------------
# The card is realm-hf's wherever it is written: huggingface_hub's ModelCard, the Trainer, config.json
# --------------------------------------------------------------------------------------------------------------------

QUESTIONS = [
    {"question": "who wrote unix?", "answers": ["Ken Thompson"]},
    {"question": "what is a compiler?", "answers": ["a program"]},
]


def test_license_and_datasets_only_when_known(tiny):
    card = generate_model_card(tiny[0], eval_results={"exact_match": 30.0, "f1": 41.0})
    metadata = parse_card_metadata(card)
    # Nobody chose a license or named an evaluation set: neither is invented.
    assert "license" not in metadata and "datasets" not in metadata and "model-index" not in metadata
    assert "| (not named) |  | Exact Match | 30 |" in card  # the results are still in the card's table
    assert "not in the `model-index` metadata" in card


def test_card_is_a_huggingface_hub_model_card(tiny):
    from huggingface_hub import ModelCard

    card = generate_model_card(tiny[0], eval_results=EVAL, eval_dataset=FOLDOC_SET, model_id="realm-test/tiny")
    parsed = ModelCard(card)
    assert str(parsed) == card  # the library's own serialisation, unchanged by a round trip
    results = {r.metric_type: r for r in parsed.data.eval_results}
    assert set(results) == {"exact_match", "f1", "recall@5"}
    assert results["f1"].metric_value == 46.25 and results["f1"].dataset_type == "foldoc-links"
    assert results["f1"].dataset_split == "test" and results["f1"].task_type == "question-answering"


def _trainer(model, output_dir, hub_model_id=None, **kwargs):
    import datasets
    from transformers import TrainingArguments

    from realm_hf.training.openqa import RealmOpenQATrainer

    args = TrainingArguments(
        output_dir=str(output_dir), report_to=[], disable_tqdm=True, save_strategy="no", hub_model_id=hub_model_id
    )
    return RealmOpenQATrainer(model=model, args=args, eval_dataset=datasets.Dataset.from_list(QUESTIONS), **kwargs)


def test_trainer_create_model_card_is_realm_hf_and_survives_saves(tmp_path):
    model, tokenizer = build_tiny_model(str(tmp_path))
    trainer = _trainer(model, tmp_path / "out", recall_ks=(1, 3))
    metrics = trainer.evaluate()
    trainer.save_model()
    trainer.create_model_card(dataset_tags="foldoc-links", dataset="FOLDOC links", tags=["mine"])
    readme = tmp_path / "out" / "README.md"
    card = readme.read_text()
    metadata = parse_card_metadata(card)
    assert metadata["library_name"] == "realm-hf" and "generated_from_trainer" not in metadata["tags"]
    assert "mine" in metadata["tags"] and metadata["datasets"] == ["foldoc-links"] and "license" not in metadata
    (result,) = metadata["model-index"][0]["results"]
    assert result["dataset"] == {"name": "FOLDOC links", "type": "foldoc-links"}
    logged = {m["type"]: m["value"] for m in result["metrics"]}
    assert logged == {k[len("eval_") :]: round(v, 4) for k, v in metrics.items() if k != "epoch"}
    assert "| learning_rate |" in card  # the Trainer's arguments
    # The next save keeps all of it (it is realm-hf's generated card, not hand-written text to wrap).
    model.save_pretrained(tmp_path / "out")
    again = readme.read_text()
    assert parse_card_metadata(again)["model-index"] == metadata["model-index"]
    assert again.count(AUTO_START) == 1 and "| learning_rate |" in again


def test_trainer_push_to_hub_uploads_the_realm_hf_card(tmp_path, monkeypatch):
    import transformers.trainer

    uploaded = {}

    class FakeApi:
        def upload_folder(self, *, folder_path, **kwargs):
            uploaded["files"] = sorted(os.listdir(folder_path))
            uploaded["readme"] = open(os.path.join(folder_path, "README.md")).read()

    monkeypatch.setattr(transformers.trainer, "hf_api", lambda: FakeApi())
    model, _ = build_tiny_model(str(tmp_path))
    trainer = _trainer(model, tmp_path / "out", hub_model_id="realm-test/tiny")
    trainer.hub_model_id = "realm-test/tiny"  # what init_hf_repo sets once it has created the repo
    trainer.evaluate()
    trainer.push_to_hub(dataset_tags="foldoc-links")
    metadata = parse_card_metadata(uploaded["readme"])
    assert metadata["library_name"] == "realm-hf" and "generated_from_trainer" not in metadata["tags"]
    assert metadata["model-index"][0]["name"] == "tiny"
    assert {m["type"] for m in metadata["model-index"][0]["results"][0]["metrics"]} >= {"exact_match", "f1"}
    assert 'model="realm-test/tiny"' in uploaded["readme"]  # the usage snippet names the repo
    assert "retriever" in uploaded["files"]


def test_transformers_trainer_card_is_replaced_not_kept_as_hand_written(tiny, tmp_path):
    from transformers import Trainer, TrainingArguments

    model = tiny[0]
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], save_strategy="no")
    Trainer(model=model, args=args).create_model_card(tags=["kept-tag"], license="mit")  # transformers' draft card
    assert "generated_from_trainer" in (tmp_path / "README.md").read_text()
    model.save_pretrained(tmp_path)
    card = (tmp_path / "README.md").read_text()
    metadata = parse_card_metadata(card)
    assert metadata["library_name"] == "realm-hf"
    assert "generated_from_trainer" not in metadata["tags"] and "kept-tag" in metadata["tags"]
    assert metadata["license"] == "mit"  # something the Trainer was told
    assert "model-index" not in metadata  # its `results: []` is not carried over
    assert "generated automatically according to the information the Trainer" not in card
    assert card.index("---") == 0 and card.count(AUTO_START) == 1


def test_num_block_records_is_the_corpus_size_after_every_save(tmp_path):
    model, tokenizer = build_tiny_model(str(tmp_path))
    model.config.num_block_records = 13353718  # RealmConfig's default: REALM's Wikipedia
    model.save_pretrained(tmp_path / "model")
    assert json.load(open(tmp_path / "model" / "config.json"))["num_block_records"] == len(DOCS)
    model.retriever.add_documents(
        [{"title": "Pascal", "text": "Pascal is a language designed by Niklaus Wirth."}],
        model.embedder,
        show_progress=False,
    )
    model.save_pretrained(tmp_path / "model")
    assert json.load(open(tmp_path / "model" / "config.json"))["num_block_records"] == len(DOCS) + 1


# --------------------------------------------------------------------------------------------------------------------
# Loading a saved directory with transformers alone (without `import realm_hf`): auto_map -> realm_hf_auto.py
# --------------------------------------------------------------------------------------------------------------------

_WITHOUT_REALM_HF = r"""
import json, sys
from transformers import AutoConfig, AutoModel, AutoTokenizer, pipeline

path = sys.argv[1]
loaders = {
    "AutoConfig": lambda trust: AutoConfig.from_pretrained(path, trust_remote_code=trust),
    "AutoModel": lambda trust: AutoModel.from_pretrained(path, trust_remote_code=trust),
    "AutoTokenizer": lambda trust: AutoTokenizer.from_pretrained(path, trust_remote_code=trust),
    "pipeline": lambda trust: pipeline("realm-question-answering", model=path, trust_remote_code=trust),
}


def attempt(load, trust):
    try:
        obj = load(trust)
        return "ok " + type(obj).__module__ + "." + type(obj).__name__
    except Exception as err:
        return f"{type(err).__name__}: {err}"


sys.modules["realm_hf"] = None  # first as if realm-hf were not installed
out = {"missing": {f"{name}/{trust}": attempt(load, trust) for trust in (False, True) for name, load in loaders.items()}}
del sys.modules["realm_hf"]  # then installed, still not imported by the caller
out["installed"] = {name: attempt(load, True) for name, load in loaders.items()}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def without_realm_hf(tiny, tmp_path_factory):
    """What transformers alone does with a saved directory, in a fresh interpreter that never imports realm_hf."""
    import subprocess
    import sys

    tmp = tmp_path_factory.mktemp("no-realm-hf")
    script = tmp / "load.py"
    script.write_text(_WITHOUT_REALM_HF)
    env = dict(os.environ, HF_MODULES_CACHE=str(tmp / "modules"), HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, str(script), tiny[2]], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_loading_without_realm_hf_names_realm_hf(tiny, without_realm_hf):
    path = tiny[2]
    config = json.load(open(os.path.join(path, "config.json")))
    assert config["auto_map"]["AutoConfig"] == "realm_hf_auto.RealmConfig"
    assert json.load(open(os.path.join(path, "tokenizer_config.json")))["auto_map"]["AutoTokenizer"][0] == (
        "realm_hf_auto.RealmTokenizer"
    )
    assert len(without_realm_hf["missing"]) == 8
    for key, outcome in without_realm_hf["missing"].items():
        assert "upgrade transformers" not in outcome and "TokenizersBackend" not in outcome, (key, outcome)
        if key.endswith("/True"):  # the saved module runs and says what to do
            assert outcome.startswith("ImportError"), (key, outcome)
            assert "realm-hf" in outcome and "pip install realm-hf" in outcome and "import realm_hf" in outcome
        else:  # transformers will not run it unasked: it asks for trust_remote_code=True
            assert outcome.startswith("ValueError") and "trust_remote_code=True" in outcome, (key, outcome)


def test_trust_remote_code_loads_through_the_installed_realm_hf(without_realm_hf):
    assert without_realm_hf["installed"] == {
        "AutoConfig": "ok realm_hf.models.configuration_realm.RealmConfig",
        "AutoModel": "ok realm_hf.models.modeling_openqa.RealmForOpenQA",
        "AutoTokenizer": "ok realm_hf.models.tokenization_realm.RealmTokenizer",
        "pipeline": "ok realm_hf.pipelines.question_answering.RealmQuestionAnsweringPipeline",
    }


def test_a_trust_remote_code_load_does_not_copy_realm_hf_source_on_the_next_save(tiny, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny[2], trust_remote_code=True)
    assert type(tokenizer)._auto_class == "AutoTokenizer"  # transformers registered the class it ran remotely
    tokenizer.save_pretrained(tmp_path)
    assert sorted(name for name in os.listdir(tmp_path) if name.endswith(".py")) == ["realm_hf_auto.py"]
    config = json.load(open(tmp_path / "tokenizer_config.json"))
    assert config["auto_map"] == {"AutoTokenizer": ["realm_hf_auto.RealmTokenizer", None]}


def test_which_code_runs_with_realm_hf_imported(tiny, tmp_path):
    """
    As docs/hub.md says: with `import realm_hf`, AutoConfig and AutoModel use the registered classes and
    never run the folder's realm_hf_auto.py; AutoTokenizer with `trust_remote_code=True` runs it (transformers prefers
    a tokenizer's `auto_map` to a registered class), and realm-hf's own file then gives realm-hf's RealmTokenizer.
    """
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from realm_hf import RealmConfig, RealmForOpenQA, RealmTokenizer

    path = tmp_path / "which-code-model"  # a name of its own: transformers caches a module by its folder's name
    shutil.copytree(tiny[2], path)
    marker = tmp_path / "ran"
    with open(path / "realm_hf_auto.py", "a") as f:
        f.write(f"\nopen({str(marker)!r}, 'a').write('ran\\n')\n")
    ran = lambda: marker.read_text().count("ran") if marker.exists() else 0  # noqa: E731

    assert type(AutoConfig.from_pretrained(path, trust_remote_code=True)) is RealmConfig
    assert type(AutoModel.from_pretrained(path, trust_remote_code=True)) is RealmForOpenQA
    assert isinstance(AutoTokenizer.from_pretrained(path), RealmTokenizer)
    assert type(RealmTokenizer.from_pretrained(path)) is RealmTokenizer
    assert ran() == 0
    assert isinstance(AutoTokenizer.from_pretrained(path, trust_remote_code=True), RealmTokenizer)
    assert ran() == 1


# --------------------------------------------------------------------------------------------------------------------
# The card of a trained model against the Hub's conventions, read back with huggingface_hub (offline): licence, base
# model, datasets, `model-index` results on the held-out set, uses and limits, how to load it. `ModelCard.validate()`
# asks the Hub's API; here the card goes through the library's own parsers (`ModelCard.load`, `ModelCardData`,
# `model_index_to_eval_results`) and the rules of the Hub's model card specification
# (https://huggingface.co/docs/hub/model-cards) that hold without it.
# --------------------------------------------------------------------------------------------------------------------
HELD_OUT = [
    {"question": "What is the capital of Italy?", "answers": ["rome"]},
    {"question": "Who wrote the Python language?", "answers": ["guido van rossum"]},
]
HELD_OUT_SET = {"name": "Tiny capitals QA", "type": "realm-hf/tiny-capitals-qa", "split": "validation"}
HUB_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")
LICENSE_ID = re.compile(r"^[a-z0-9][a-z0-9.+-]*$")


def hub_metadata_problems(metadata: dict) -> list[str]:
    """The Hub specification's rules for model card metadata that hold without asking the Hub."""
    problems = []
    license = metadata.get("license")
    if not isinstance(license, str) or not LICENSE_ID.match(license):
        problems.append(f"license {license!r}: a Hub licence identifier (e.g. apache-2.0, cc-by-sa-4.0)")
    if license == "other" and not (metadata.get("license_name") and metadata.get("license_link")):
        problems.append("license other needs license_name and license_link")
    for key in ("base_model", "datasets"):
        values = metadata.get(key)
        values = [values] if isinstance(values, str) else values
        if not values or not all(isinstance(v, str) and HUB_ID.match(v) for v in values):
            problems.append(f"{key} {metadata.get(key)!r}: Hub ids")
    if not isinstance(metadata.get("tags"), list) or not all(isinstance(t, str) for t in metadata["tags"]):
        problems.append("tags: a list of strings")
    for entry in metadata.get("model-index") or [{}]:
        if not entry.get("name") or not entry.get("results"):
            problems.append("model-index: each entry has a name and results")
        for result in entry.get("results", []):
            if not result.get("task", {}).get("type"):
                problems.append("model-index: a result without task.type")
            if not {"type", "name"} <= set(result.get("dataset", {})):
                problems.append("model-index: a result whose dataset lacks type or name")
            for metric in result.get("metrics", []):
                if not metric.get("type") or not isinstance(metric.get("value"), (int, float)):
                    problems.append(f"model-index: metric {metric} without a type or a numeric value")
    return problems


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny REALM model fine-tuned for a few steps, evaluated on a held-out set, saved with its card."""
    out = tmp_path_factory.mktemp("trained")
    model = make_model(train_document_embedder=False)
    trainer = RealmOpenQATrainer(
        model=model,
        args=training_args(out, max_steps=3),
        train_dataset=datasets.Dataset.from_list(LEGACY_QUESTIONS),
        eval_dataset=datasets.Dataset.from_list(HELD_OUT),
        recall_ks=(1, 5),
    )
    trainer.train()
    metrics = trainer.evaluate()
    trainer.save_model()
    trainer.create_model_card(
        license="apache-2.0",
        finetuned_from="google/realm-orqa-nq-openqa",
        dataset_tags=["realm-hf/tiny-capitals-qa"],
        eval_dataset=HELD_OUT_SET,
        model_name="realm-tiny-capitals",
    )
    return out, metrics


def test_the_card_reads_back_through_huggingface_hub(trained):
    out, _ = trained
    card = ModelCard.load(out / "README.md")
    assert str(ModelCard(card.content)) == card.content  # the library's serialisation, unchanged by a round trip
    metadata = card.data.to_dict()
    ModelCardData(**metadata)  # the library's own checks of the metadata and of model-index
    assert hub_metadata_problems(metadata) == []
    assert metadata["license"] == "apache-2.0" and metadata["base_model"] == "google/realm-orqa-nq-openqa"
    assert metadata["datasets"] == ["realm-hf/tiny-capitals-qa"]
    assert metadata["library_name"] == "realm-hf" and metadata["pipeline_tag"] == "question-answering"


def test_model_index_holds_the_held_out_results(trained):
    out, metrics = trained
    card = ModelCard.load(out / "README.md")
    name, results = model_index_to_eval_results(card.data.to_dict()["model-index"])
    assert name == "realm-tiny-capitals"
    by_metric = {r.metric_type: r for r in results}
    # Every held-out metric the evaluation reports, the ranking ones (MRR, nDCG) beside recall.
    assert set(by_metric) == {"exact_match", "f1", "recall@1", "recall@5", "mrr@1", "mrr@5", "ndcg@1", "ndcg@5"}
    for key, result in by_metric.items():
        assert result.metric_value == pytest.approx(metrics[f"eval_{key}"], abs=1e-4)
        assert (result.dataset_type, result.dataset_name, result.dataset_split) == (
            HELD_OUT_SET["type"],
            HELD_OUT_SET["name"],
            "validation",
        )
        assert result.task_type == "question-answering"


def test_the_card_says_what_it_is_for_what_limits_it_and_how_to_load_it(trained):
    out, _ = trained
    text = (out / "README.md").read_text(encoding="utf-8")
    for heading in ("## Uses", "## Bias, Risks, and Limitations", "## Usage", "## Evaluation", "## Knowledge corpus"):
        assert text.count(f"\n{heading}\n") == 1, heading
    uses = text.split("## Uses\n", 1)[1].split("\n## ", 1)[0]
    limits = text.split("## Bias, Risks, and Limitations\n", 1)[1].split("\n## ", 1)[0]
    assert "Out of scope" in uses and "source" in uses
    assert "score" in limits and "licence" in limits
    (snippet,) = extract_code_blocks(text, "python")
    assert 'realm_hf.pipeline("question-answering", model=' in snippet
    assert "never trained" not in text  # the Trainer's first step marked the reader trained


def test_a_card_linked_out_of_the_save_folder_is_not_copied(tiny, tmp_path):
    """A README.md linking to a file outside the folder had that file's text copied into the new card."""
    model = tiny[0]
    secret = tmp_path / "private-notes.md"
    secret.write_text("# Notes\n\nSECRET-TEXT-OUTSIDE-THE-FOLDER\n")
    target = tmp_path / "linked-card-model"
    target.mkdir()
    os.symlink(secret, target / "README.md")
    model.save_pretrained(target)
    card = (target / "README.md").read_text()
    assert not (target / "README.md").is_symlink()
    assert "SECRET-TEXT-OUTSIDE-THE-FOLDER" not in card and "realm" in card.lower()
    assert secret.read_text() == "# Notes\n\nSECRET-TEXT-OUTSIDE-THE-FOLDER\n"
    # The same through the card writer alone.
    os.remove(target / "README.md")
    os.symlink(secret, target / "README.md")
    write_model_card(str(target), model=model, retriever=model.retriever)
    assert "SECRET-TEXT-OUTSIDE-THE-FOLDER" not in (target / "README.md").read_text()
