"""`realm-hf train`: Open-QA fine-tuning or REALM pre-training from a JSON/YAML config."""

from __future__ import annotations

import argparse
import json
import os

from ..common import (
    EXIT_OK,
    CLIError,
    State,
    info,
    is_hub_id,
    load_tokenizer,
    logger,
    metrics_table,
    normalize_metric_names,
    require_local_or_hub,
)
from ..outputs import write_text_atomic
from ..readers import load_documents, load_qa, load_table
from ..train_config import load_train_config, resolve_seed


def _seed_run(config: dict) -> int:
    """
    Seed python, numpy and torch before any model is built (and record the seed in `config`). The Trainer seeds only
    once created, after `init_from_bert` drew the fresh heads and LoRA its adapters: runs of one config diverged.
    """
    from transformers import enable_full_determinism, set_seed

    seed = resolve_seed(config)
    training_seed = (config.get("training_args") or {}).get("seed")
    if training_seed is not None and training_seed != seed:
        logger.warning("seed %s overrides training_args.seed %s.", seed, training_seed)
    config["seed"] = seed
    if (config.get("training_args") or {}).get("full_determinism"):
        enable_full_determinism(seed)
    else:
        set_seed(seed)
    return seed


def _training_arguments(config: dict):
    from transformers import TrainingArguments

    values = dict(config.get("training_args") or {})
    # No experiment trackers unless asked for (they would try to reach the network), and no tqdm in quiet mode.
    values.setdefault("report_to", "none")
    values.setdefault("disable_tqdm", State.quiet)
    # The Trainer reseeds with this (before training, and its data order): the same seed the model was built with.
    values["seed"] = resolve_seed(config)
    values["output_dir"] = config["output_dir"]
    try:
        return TrainingArguments(**values)
    except TypeError as err:
        raise CLIError(f"Invalid training_args: {err}") from err


def _attach_corpus(model, config: dict, embedder, tokenizer) -> None:
    from ...retrieval_realm import RealmRetriever

    if config.get("corpus") and config.get("documents"):
        raise CLIError("Give either `corpus` (a saved corpus) or `documents` (to build one), not both.")
    if config.get("corpus"):
        if not os.path.isdir(config["corpus"]):
            raise CLIError(f"corpus {config['corpus']!r} is not a directory.")
        model.set_retriever(RealmRetriever.from_pretrained(config["corpus"], embedder=embedder))
    elif config.get("documents"):
        paths = config["documents"] if isinstance(config["documents"], list) else [config["documents"]]
        doc_args = argparse.Namespace(
            format="auto",
            split="train",
            text_column=config.get("text_column", "text"),
            title_column=config.get("title_column", "title"),
            id_column=None,
        )
        documents = load_documents(paths, doc_args)
        info(f"Building the corpus from {len(documents)} documents ...")
        model.set_retriever(
            RealmRetriever.from_documents(
                documents,
                embedder,
                tokenizer,
                max_block_length=int(config.get("max_block_length", 288)),
                index=config.get("index", "Flat"),
                show_progress=not State.quiet,
            )
        )
    if getattr(model, "retriever", None) is None:
        raise CLIError("No corpus: give `corpus` or `documents` in the config, or a `model` saved with a retriever/.")


def _reindex_callbacks(model, config: dict) -> list:
    refresh_steps = config.get("refresh_steps")
    if not refresh_steps:
        return []
    from ...training.callbacks import RealmReindexCallback

    return [
        RealmReindexCallback(
            model.retriever,
            refresh_steps=int(refresh_steps),
            batch_size=int(config.get("reindex_batch_size", 128)),
            background=bool(config.get("reindex_background", True)),
        )
    ]


def _evaluations(trainer) -> list[dict]:
    """
    Every evaluation the Trainer logged (`eval_on_start`, `eval_strategy`, the final one), in step order: the metrics
    before the first step are otherwise only printed.
    """
    return [
        {"step": entry.get("step"), **{k: v for k, v in entry.items() if k.startswith("eval_")}}
        for entry in trainer.state.log_history
        if any(k.startswith("eval_") for k in entry)
    ]


def _train_finetune(config: dict, args) -> dict:
    from ...modeling_realm import RealmForOpenQA
    from ...training.openqa import RealmOpenQATrainer

    if bool(config.get("model")) == bool(config.get("init_from_bert")):
        raise CLIError("Give exactly one of `model` (a REALM directory) and `init_from_bert` (a BERT directory).")
    if config.get("refresh_steps") and not config.get("train_document_embedder"):
        raise CLIError(
            "refresh_steps re-embeds the corpus with the document embedder, which only changes when it trains: set "
            "train_document_embedder: true (or drop refresh_steps; REALM fine-tuning keeps the index fixed)."
        )
    if config.get("model"):
        require_local_or_hub(config["model"], "model")
        model = RealmForOpenQA.from_pretrained(config["model"], allow_pickle=bool(config.get("allow_pickle")))
        tokenizer = None
    else:
        from ...initialization import init_from_bert

        model = init_from_bert(RealmForOpenQA, config["init_from_bert"], **(config.get("model_config") or {}))
        tokenizer = load_tokenizer(config["init_from_bert"])
    if config.get("corpus") or config.get("documents"):
        if tokenizer is None:
            tokenizer = model.retriever.tokenizer if model.retriever is not None else load_tokenizer(config["model"])
        embedder = model.document_embedder if model.document_embedder is not None else model.embedder
        _attach_corpus(model, config, embedder, tokenizer)
    elif model.retriever is None:
        model._require_retriever()
    if config.get("train_document_embedder") and model.document_embedder is None:
        model.add_document_embedder()

    question_column = config.get("question_column", "question")
    answers_column = config.get("answers_column", "answers")
    if not config.get("train_file"):
        raise CLIError("finetune needs a train_file (JSONL/CSV/Parquet with question and answers).")
    train_dataset = load_qa(config["train_file"], question_column, answers_column)
    eval_dataset = load_qa(config["eval_file"], question_column, answers_column) if config.get("eval_file") else None

    training_model = model
    lora = config.get("lora")
    if lora:
        from ...peft_utils import add_lora

        if not isinstance(lora, dict):
            lora = {}
        unknown = sorted(set(lora) - {"r", "alpha", "dropout", "targets", "target_modules"})
        if unknown:
            raise CLIError(f"Unknown lora option(s): {', '.join(unknown)}.")
        if config.get("train_document_embedder") and "document_embedder" not in (lora.get("targets") or ()):
            logger.warning(
                "With LoRA only the adapted components train: the document embedder stays frozen unless "
                "lora.targets includes 'document_embedder'."
            )
        training_model = add_lora(model, **lora)
    training_args = _training_arguments(config)
    trainer = RealmOpenQATrainer(
        model=training_model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        recall_ks=tuple(config.get("recall_ks") or (1, 5)),
        callbacks=_reindex_callbacks(model, config),
    )
    info(f"Fine-tuning on {len(train_dataset)} questions; output in {config['output_dir']}.")
    result = trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    metrics = {"train_loss": float(result.training_loss), "global_step": int(result.global_step)}
    if eval_dataset is not None:
        metrics.update(normalize_metric_names(trainer.evaluate()))
        metrics["evaluations"] = [normalize_metric_names(entry) for entry in _evaluations(trainer)]

    output_dir = config["output_dir"]
    final_model = model
    if lora:
        from ...peft_utils import merge_adapter, save_adapter

        save_adapter(training_model, os.path.join(output_dir, "adapter"))
        final_model = merge_adapter(training_model)
    final_model.save_pretrained(output_dir)
    model.retriever.tokenizer.save_pretrained(output_dir)
    _write_training_card(output_dir, final_model, metrics, training_args, config)
    return metrics


def _train_pretrain(config: dict, args) -> dict:
    try:
        from ...modeling_pretraining import RealmForPreTraining
        from ...training.masking import DataCollatorForSalientSpanMasking
    except ImportError as err:
        raise CLIError(f"REALM pre-training is not available in this installation ({err}).") from err
    from transformers import Trainer

    from ...training.callbacks import place_reindex_callbacks_first

    sources = [k for k in ("model", "init_from_bert", "legacy_embedder") if config.get(k)]
    if len(sources) != 1:
        raise CLIError("Give exactly one of `model`, `init_from_bert`, or `legacy_embedder` + `legacy_encoder`.")
    overrides = config.get("model_config") or {}
    if config.get("model"):
        model = RealmForPreTraining.from_pretrained(config["model"])
        tokenizer = load_tokenizer(config["model"])
    elif config.get("init_from_bert"):
        from ...initialization import init_from_bert

        model = init_from_bert(RealmForPreTraining, config["init_from_bert"], **overrides)
        tokenizer = load_tokenizer(config["init_from_bert"])
    else:
        if not config.get("legacy_encoder"):
            raise CLIError("`legacy_embedder` needs `legacy_encoder` too.")
        model = RealmForPreTraining.from_legacy_checkpoints(
            config["legacy_embedder"], config["legacy_encoder"], **overrides
        )
        tokenizer = load_tokenizer(config["legacy_embedder"], config["legacy_encoder"])
    if config.get("corpus") or config.get("documents"):
        _attach_corpus(model, config, model.document_embedder, tokenizer)
    elif model.retriever is None:
        raise CLIError("pretrain needs a corpus: give `corpus` or `documents` in the config.")
    model.tokenizer = tokenizer

    def texts_from(path):
        import datasets

        table = load_table([path])
        if "text" not in table.column_names:
            raise CLIError(f"{path} has no 'text' column (columns: {', '.join(table.column_names)}).")
        keep = [c for c in ("text", "block_id", "salient_spans") if c in table.column_names]
        return table.select_columns(keep) if isinstance(table, datasets.Dataset) else table

    if config.get("train_from_corpus"):
        train_dataset = model.retriever.corpus.select_columns(["text", "block_id"])
    elif config.get("train_file"):
        train_dataset = texts_from(config["train_file"])
    else:
        raise CLIError("pretrain needs a train_file of texts, or train_from_corpus: true.")
    eval_dataset = texts_from(config["eval_file"]) if config.get("eval_file") else None

    masking = dict(config.get("masking") or {})
    masking.setdefault("max_length", int(getattr(model.config, "max_position_embeddings", 512)) // 2)
    # Without a seed the collator's generator draws one from the OS: other masks, other losses on every run.
    masking.setdefault("seed", resolve_seed(config))
    try:
        collator = DataCollatorForSalientSpanMasking(tokenizer, **masking)
    except TypeError as err:
        raise CLIError(f"Invalid masking options: {err}") from err
    training_args = _training_arguments(
        dict(config, training_args={"remove_unused_columns": False, **(config.get("training_args") or {})})
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=collator,
        callbacks=_reindex_callbacks(model, config),
    )
    place_reindex_callbacks_first(trainer)  # so report_to integrations receive the refresh metrics
    info(f"Pre-training on {len(train_dataset)} texts; output in {config['output_dir']}.")
    result = trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    metrics = {"train_loss": float(result.training_loss), "global_step": int(result.global_step)}
    if eval_dataset is not None:
        metrics.update(trainer.evaluate())
        metrics["evaluations"] = _evaluations(trainer)
    model.save_pretrained(config["output_dir"])
    tokenizer.save_pretrained(config["output_dir"])
    if config.get("export_components"):
        model.export_components(config["output_dir"])
    return metrics


def _write_training_card(output_dir: str, model, metrics: dict, training_args, config: dict) -> None:
    try:
        from ...modelcard import write_model_card

        base = config.get("model") or config.get("init_from_bert")
        write_model_card(
            output_dir,
            model=model,
            eval_results={k: v for k, v in metrics.items() if k.startswith("eval_")} or None,
            training_args=training_args,
            base_model=base if base and is_hub_id(base) and not os.path.exists(base) else None,
        )
    except Exception as err:  # the card is a courtesy: the trained model is already saved
        logger.warning("Could not write a model card: %s", err)


def run(args) -> int:
    config = load_train_config(args.config, args.set or [])
    if args.output_dir:
        config["output_dir"] = args.output_dir
    # Fail on a missing file before spending minutes loading models.
    for key in (
        "train_file",
        "eval_file",
        "corpus",
        "documents",
        "init_from_bert",
        "legacy_embedder",
        "legacy_encoder",
    ):
        values = config.get(key)
        for value in values if isinstance(values, list) else [values]:
            if value and not os.path.exists(value):
                raise CLIError(f"{key} {value!r} does not exist.")
    if config.get("model"):
        require_local_or_hub(config["model"], "model")
    # Before anything random: fresh heads, LoRA adapters, the masking collator.
    _seed_run(config)
    if config["task"] == "pretrain":
        metrics = _train_pretrain(config, args)
    else:
        metrics = _train_finetune(config, args)
    metrics_path = os.path.join(config["output_dir"], "train_results.json")
    write_text_atomic(metrics_path, json.dumps(metrics, indent=2) + "\n")
    printable = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
    print(metrics_table({k: float(v) for k, v in printable.items()}))
    info(f"Saved the model and its retriever to {config['output_dir']}.")
    return EXIT_OK
