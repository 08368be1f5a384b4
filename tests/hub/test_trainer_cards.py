"""
The pre-training and ICT Trainers (and their models' saves) write realm-hf's model card, not transformers' draft: the
task described, the recipe and training arguments used, the metrics logged, hand-written text kept.
"""

import pytest
import torch

from realm_hf import RealmTokenizer
from realm_hf.hub.cards import AUTO_END, AUTO_START, parse_card_metadata
from realm_hf.models.modeling_pretraining import RealmForPreTraining
from realm_hf.training import RealmForInverseClozeTask, RealmICTTrainer, RealmPreTrainingTrainer, recipes
from tests.support.hub_server import LfsFile
from tests.support.paths import LEGACY
from tests.support.pretraining import ICT_BLOCKS, embed_corpus, ict_config, make_retriever, tiny_config

# Texts of the tiny corpus of test_pretraining (TEXTS), each with its salient span and the block it was cut from.
EXAMPLES = [
    {"text": "paris is the capital of france .", "salient_spans": [[13, 20]], "block_id": 0},
    {"text": "the cat sat on the mat .", "salient_spans": [[4, 7]], "block_id": 1},
    {"text": "berlin is the capital of germany .", "salient_spans": [[25, 32]], "block_id": 6},
    {"text": "guido van rossum created python .", "salient_spans": [[25, 31]], "block_id": 3},
]
HAND_WRITTEN = "# My REALM run\n\nPre-trained on a laptop; see the notes below."
TRAINER_TAG = "generated_from_trainer"


@pytest.fixture(scope="module")
def tokenizer():
    return RealmTokenizer.from_pretrained(f"{LEGACY}/embedder")


def pretraining_model(tokenizer):
    torch.manual_seed(0)
    model = RealmForPreTraining(tiny_config(tokenizer), tokenizer=tokenizer)
    model.set_retriever(make_retriever(embed_corpus(model, tokenizer), tokenizer))
    return model


def arguments(output_dir, **values):
    values = dict(
        per_device_train_batch_size=2,
        max_steps=2,
        learning_rate=1e-3,
        logging_steps=1,
        use_cpu=True,
        save_strategy="no",
        remove_unused_columns=False,
        disable_tqdm=True,
        **values,
    )
    return recipes.training_arguments(str(output_dir), seed=0, **values)


def pretraining_trainer(model, tokenizer, output_dir, **values):
    collator = recipes.salient_span_collator(tokenizer, seed=0, max_length=32, detect_dates_and_numbers=False)
    return recipes.pretraining_trainer(
        model, arguments(output_dir, **values), EXAMPLES, collator, eval_dataset=EXAMPLES[:2]
    )


def ict_trainer(tokenizer, output_dir, **values):
    torch.manual_seed(0)
    model = RealmForInverseClozeTask(ict_config(tokenizer, share_query_document_embedder=False))
    args = arguments(output_dir, per_device_eval_batch_size=4, **values)
    return recipes.ict_trainer(model, args, ICT_BLOCKS, tokenizer, max_query_length=24, max_block_length=48, seed=0)


def test_pretraining_trainer_create_model_card_is_realm_hf(tokenizer, tmp_path):
    trainer = pretraining_trainer(pretraining_model(tokenizer), tokenizer, tmp_path)
    assert isinstance(trainer, RealmPreTrainingTrainer)
    trainer.train()
    metrics = trainer.evaluate()
    readme = tmp_path / "README.md"
    readme.write_text(HAND_WRITTEN + "\n")  # written by hand before the card
    trainer.create_model_card(dataset_tags="foldoc-links", dataset="FOLDOC links", tags=["mine"])
    card = readme.read_text()
    metadata = parse_card_metadata(card)
    assert metadata["library_name"] == "realm-hf" and metadata["pipeline_tag"] == "fill-mask"
    assert TRAINER_TAG not in metadata["tags"] and {"mine", "realm", "pretraining"} <= set(metadata["tags"])
    assert metadata["datasets"] == ["foldoc-links"] and "license" not in metadata and "base_model" not in metadata
    assert card.startswith("---\n") and HAND_WRITTEN in card and card.count(AUTO_START) == 1
    # What the model is, and the recipe as this Trainer configured it.
    assert "retrieval-augmented masked language model" in card and "*null document*" in card
    assert "| Masking | salient span masking: spans given with the data (`salient_spans`); up to 1 span(s)" in card
    assert "dates and numbers" not in card.split("| Masking |")[1].split("\n")[0]  # turned off above
    assert "| No trivial retrieval | on: the block each input was cut from (`block_id`)" in card
    assert "| Candidates per input (null document included) | 4 |" in card
    assert "| Index refresh | none" in card
    assert "| learning_rate | 0.001 |" in card and "| max_steps | 2 |" in card  # the arguments actually used
    train_loss = next(entry["train_loss"] for entry in trainer.state.log_history if "train_loss" in entry)
    assert f"| Training loss (mean over the run) | {train_loss:.4f}".rstrip("0") in card
    # The masked-LM evaluation loss it logged is the card's result, in model-index.
    (result,) = metadata["model-index"][0]["results"]
    assert result["task"]["type"] == "fill-mask"
    assert result["dataset"] == {"name": "FOLDOC links", "type": "foldoc-links"}
    (loss,) = result["metrics"]
    assert loss["type"] == "loss" and loss["name"] == "Masked-LM loss"
    assert loss["value"] == round(metrics["eval_loss"], 4)
    # The usage snippet loads a pre-training model, not the QA pipeline.
    assert "RealmForPreTraining.from_pretrained" in card and "realm_hf.pipeline" not in card


def test_pretraining_trainer_push_to_hub_uploads_the_realm_hf_card(tokenizer, tmp_path, local_hub):  # noqa: F811
    model = pretraining_model(tokenizer)
    model.config._name_or_path = "google/realm-cc-news-pretrained-encoder"  # as if loaded from that Hub repo
    trainer = pretraining_trainer(model, tokenizer, tmp_path / "out", hub_model_id="realm-test/tiny-pretrained")
    trainer.evaluate()
    trainer.push_to_hub(tags="pushed")
    stored = local_hub.files("realm-test/tiny-pretrained")
    card = local_hub.content(stored["README.md"]).decode()
    metadata = parse_card_metadata(card)
    assert metadata["library_name"] == "realm-hf" and metadata["pipeline_tag"] == "fill-mask"
    assert TRAINER_TAG not in metadata["tags"] and "pushed" in metadata["tags"]
    assert "model-index" not in metadata  # the evaluation set was not named: results in the card's table only
    assert "| (not named) |  | Masked-LM loss |" in card
    assert metadata["base_model"] == "google/realm-cc-news-pretrained-encoder"  # the repo it was loaded from
    assert 'RealmForPreTraining.from_pretrained("realm-test/tiny-pretrained")' in card
    # The model went up with its corpus and index (the weights through LFS), and loads back with them.
    assert isinstance(stored["model.safetensors"], LfsFile) and "retriever/index.faiss" in stored
    # As the card says: from_pretrained of the repo id attaches the corpus saved with the model, as for Open-QA.
    reloaded = RealmForPreTraining.from_pretrained("realm-test/tiny-pretrained")
    assert len(reloaded.retriever) == len(trainer.model.retriever)


def test_pretraining_model_push_to_hub_keeps_the_realm_hf_card(tokenizer, local_hub):  # noqa: F811
    # transformers' own model push_to_hub would upload a generic `library_name: transformers` card.
    pretraining_model(tokenizer).push_to_hub("realm-test/pushed-model", tags=["mine"])
    stored = local_hub.files("realm-test/pushed-model")
    metadata = parse_card_metadata(local_hub.content(stored["README.md"]).decode())
    assert metadata["library_name"] == "realm-hf" and metadata["pipeline_tag"] == "fill-mask"
    assert "mine" in metadata["tags"] and "retriever/index.faiss" in stored


def test_ict_trainer_create_model_card_and_push_to_hub(tokenizer, tmp_path, local_hub):  # noqa: F811
    trainer = ict_trainer(tokenizer, tmp_path / "out", hub_model_id="realm-test/tiny-ict")
    assert isinstance(trainer, RealmICTTrainer)
    trainer.train()
    metrics = trainer.evaluate(eval_dataset=ICT_BLOCKS[:4])
    trainer.push_to_hub(dataset_tags="foldoc-blocks")
    card = local_hub.content(local_hub.files("realm-test/tiny-ict")["README.md"]).decode()
    assert card == (tmp_path / "out" / "README.md").read_text()  # create_model_card's card is what went up
    metadata = parse_card_metadata(card)
    assert metadata["library_name"] == "realm-hf" and metadata["pipeline_tag"] == "feature-extraction"
    assert TRAINER_TAG not in metadata["tags"] and "inverse-cloze-task" in metadata["tags"]
    assert "license" not in metadata and metadata["datasets"] == ["foldoc-blocks"]
    assert "Inverse Cloze Task" in card and "warm start" in card
    assert "| Query sentence removed from its block | with probability 0.9 |" in card
    assert "| Negatives | the other blocks of the batch (2 per device) |" in card
    assert "| Query and document embedders | separate |" in card
    assert "_No corpus is saved with an ICT model:_" in card and "load_ict_embedders" in card
    ((loss,),) = [r["metrics"] for r in metadata["model-index"][0]["results"]]
    assert loss["value"] == round(metrics["eval_loss"], 4) and loss["name"].startswith("ICT loss")


def test_pretraining_save_replaces_the_trainer_draft_card_and_keeps_user_text(tokenizer, tmp_path):
    from transformers import Trainer, TrainingArguments

    model = pretraining_model(tokenizer)
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], save_strategy="no")
    Trainer(model=model, args=args).create_model_card(tags=["kept-tag"], license="mit")  # transformers' draft card
    assert TRAINER_TAG in (tmp_path / "README.md").read_text()
    model.save_pretrained(tmp_path)
    card = (tmp_path / "README.md").read_text()
    metadata = parse_card_metadata(card)
    assert metadata["library_name"] == "realm-hf" and metadata["pipeline_tag"] == "fill-mask"
    assert TRAINER_TAG not in metadata["tags"] and "kept-tag" in metadata["tags"]
    assert metadata["license"] == "mit"  # something the Trainer was told
    assert "model-index" not in metadata  # its `results: []` is not carried over
    assert "generated automatically according to the information the Trainer" not in card
    assert "retrieval-augmented masked language model" in card and "| Blocks | 8 |" in card  # its corpus, saved too
    # Text the user adds around the generated block survives the next save; the block is regenerated.
    front, body = card.split("\n---\n", 1)
    (tmp_path / "README.md").write_text(f"{front}\n---\n\n{HAND_WRITTEN}\n{body}\n## Notes\n\nMy own notes.\n")
    model.save_pretrained(tmp_path)
    again = (tmp_path / "README.md").read_text()
    assert HAND_WRITTEN in again and again.rstrip().endswith("My own notes.")
    assert again.count(AUTO_START) == 1 and again.count(AUTO_END) == 1
    assert parse_card_metadata(again)["license"] == "mit"
    # `model_card=False` leaves the README alone.
    (tmp_path / "README.md").write_text("mine\n")
    model.save_pretrained(tmp_path, model_card=False)
    assert (tmp_path / "README.md").read_text() == "mine\n"


def test_ict_save_pretrained_and_push_to_hub_write_the_ict_card(tokenizer, tmp_path, local_hub):  # noqa: F811
    model = RealmForInverseClozeTask(ict_config(tokenizer))
    model.save_pretrained(tmp_path)
    metadata = parse_card_metadata((tmp_path / "README.md").read_text())
    assert metadata["library_name"] == "realm-hf" and metadata["pipeline_tag"] == "feature-extraction"
    assert RealmForInverseClozeTask.from_pretrained(tmp_path).config.hidden_size == 32
    # transformers' own model push_to_hub would upload a generic `library_name: transformers` card.
    model.push_to_hub("realm-test/pushed-ict", tokenizer=tokenizer)
    stored = local_hub.files("realm-test/pushed-ict")
    metadata = parse_card_metadata(local_hub.content(stored["README.md"]).decode())
    assert metadata["library_name"] == "realm-hf" and metadata["pipeline_tag"] == "feature-extraction"
    assert {"model.safetensors", "config.json", "tokenizer_config.json"} <= set(stored)
