"""
The model card of a trained model follows the Hub's conventions, read back with huggingface_hub (offline): licence,
base model, datasets, `model-index` results on the held-out set, what it is for and what limits it, how to load it.

`ModelCard.validate()` asks the Hub's API; here the same card goes through the library's own parsers
(`ModelCard.load`, `ModelCardData`, `model_index_to_eval_results`) and the metadata rules of the Hub's model card
specification (https://huggingface.co/docs/hub/model-cards) that can be checked without it.
"""

import re

import datasets
import pytest
from huggingface_hub import ModelCard, ModelCardData
from huggingface_hub.repocard_data import model_index_to_eval_results
from test_training import QUESTIONS, make_model, training_args

from realm_hf.hub.cards import extract_code_blocks
from realm_hf.training.openqa import RealmOpenQATrainer

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
        train_dataset=datasets.Dataset.from_list(QUESTIONS),
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
    assert set(by_metric) == {"exact_match", "f1", "recall@1", "recall@5"}
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
