"""Model cards: YAML metadata with evaluation results, corpus facts, kept hand-written text, a usage snippet that runs."""

import contextlib
import io
import os

import pytest
import yaml
from test_pipeline import DOCS, build_tiny_model, save_tiny_model

from realm_hf.modelcard import (
    AUTO_END,
    AUTO_START,
    USAGE_MODEL_PLACEHOLDER,
    corpus_info,
    extract_code_blocks,
    generate_corpus_card,
    generate_model_card,
    parse_card_metadata,
    write_model_card,
)

EVAL = {"eval_exact_match": 40.4, "eval_f1": 46.25, "recall@5": 61.0, "exact_match_count": 4, "total": 10}
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("card")
    model, tokenizer = build_tiny_model(str(tmp))
    path = save_tiny_model(model, tokenizer, tmp / "model")
    return model, tokenizer, path


def _front_matter(card):
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("\n---\n", 1)[0][4:])


def test_yaml_metadata_parses_and_carries_eval_results(saved):
    card = generate_model_card(
        saved[0],
        eval_results=EVAL,
        base_model="google/realm-cc-news-pretrained-embedder",
        datasets=["foldoc-links"],
        eval_dataset={"name": "FOLDOC links", "type": "foldoc-links", "split": "test"},
        model_id="realm-test/tiny",
        language="en",
        tags=["foldoc"],
    )
    metadata = _front_matter(card)
    assert metadata == parse_card_metadata(card)
    assert metadata["library_name"] == "realm-hf"
    assert metadata["pipeline_tag"] == "question-answering"
    assert metadata["license"] == "apache-2.0"
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


def test_several_evaluation_sets(saved):
    results = [
        {"dataset": {"name": "NQ", "type": "nq_open", "split": "validation"}, "metrics": {"exact_match": 38.2}},
        {"dataset": {"name": "WQ", "type": "web_questions", "split": "test"}, "metrics": {"exact_match": 40.7}},
    ]
    metadata = parse_card_metadata(generate_model_card(saved[0], eval_results=results))
    assert [r["dataset"]["type"] for r in metadata["model-index"][0]["results"]] == ["nq_open", "web_questions"]
    with pytest.raises(ValueError, match="metrics"):
        generate_model_card(saved[0], eval_results=[{"dataset": {"name": "x"}}])


def test_corpus_training_and_versions_sections(saved, tmp_path):
    model, tokenizer, _ = saved
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


def test_training_arguments_object(saved, tmp_path):
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), learning_rate=1e-4, num_train_epochs=3, report_to=[])
    card = generate_model_card(saved[0], training_args=args)
    assert "| learning_rate | 0.0001 |" in card and "| num_train_epochs | 3 |" in card
    assert "| output_dir |" not in card  # only the settings that describe training
    # With max_steps, Trainer ignores the epoch count: the card must not claim it.
    args = TrainingArguments(output_dir=str(tmp_path), num_train_epochs=3, max_steps=200, report_to=[])
    card = generate_model_card(saved[0], training_args=args)
    assert "| max_steps | 200 |" in card and "num_train_epochs" not in card


def test_hand_written_text_and_metadata_survive_resaves(saved, tmp_path):
    model = saved[0]
    path = str(tmp_path)
    write_model_card(path, model=model, eval_results={"exact_match": 30.0}, model_id="realm-test/tiny")
    readme = os.path.join(path, "README.md")
    card = open(readme).read()
    # A person edits the card: prose above and below the generated block, a changed and an added metadata key.
    front, body = card.split("\n---\n", 1)
    front = front.replace("license: apache-2.0", "license: mit") + "\nlanguage:\n- en\nco2_eq_emissions: 1.5"
    card = front + "\n---\n\n# Notes from the authors\n\nTrained on a laptop.\n" + body + "\n## Limitations\n\nTiny.\n"
    open(readme, "w").write(card)

    # Re-save with new evaluation results and again without any.
    write_model_card(path, model=model, eval_results={"exact_match": 35.5}, model_id="realm-test/tiny")
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


def test_deleted_generated_key_stays_deleted(saved, tmp_path):
    path = str(tmp_path)
    write_model_card(path, model=saved[0])
    readme = os.path.join(path, "README.md")
    card = open(readme).read().replace("license: apache-2.0\n", "")
    open(readme, "w").write(card)
    write_model_card(path, model=saved[0])
    assert "license" not in parse_card_metadata(open(readme).read())


def test_existing_readme_without_markers_is_kept(saved):
    existing = "---\nlicense: other\ntags:\n- mine\n---\n# My model\n\nWritten by hand.\n"
    card = generate_model_card(saved[0], existing_readme=existing)
    metadata = parse_card_metadata(card)
    assert metadata["license"] == "other" and metadata["tags"] == ["mine"]
    assert metadata["pipeline_tag"] == "question-answering"
    assert card.index("Written by hand.") < card.index(AUTO_START)
    # Regenerating from that card does not duplicate anything.
    again = generate_model_card(saved[0], existing_readme=card)
    assert again.count("Written by hand.") == 1 and again.count(AUTO_START) == 1


def test_usage_snippet_runs(saved):
    model, _, path = saved
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


def test_template_is_the_documented_one():
    packaged = os.path.join(REPO_ROOT, "src", "realm_hf", "templates", "model_card.md")
    documented = os.path.join(REPO_ROOT, "model_cards", "README_TEMPLATE.md")
    assert open(packaged).read() == open(documented).read()


def test_card_without_model_or_corpus():
    card = generate_model_card()
    assert parse_card_metadata(card)["library_name"] == "realm-hf"
    assert "No corpus was saved" in card


def test_corpus_card(saved):
    card = generate_corpus_card(saved[0].retriever, repo_id="realm-test/corpus", license="cc-by-sa-4.0")
    metadata = parse_card_metadata(card)
    assert metadata["license"] == "cc-by-sa-4.0"
    assert {"realm", "faiss"} <= set(metadata["tags"])
    assert metadata["size_categories"] == ["n<1K"]
    assert f"| Blocks | {len(DOCS)} |" in card
    assert 'set_retriever_reference(model.config, "realm-test/corpus")' in card
    kept = generate_corpus_card(saved[0].retriever, existing_readme=card.replace(AUTO_END, AUTO_END + "\n\nMine.\n"))
    assert kept.count("Mine.") == 1
