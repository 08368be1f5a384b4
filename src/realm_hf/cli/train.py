"""
`realm-hf train`: Open-QA fine-tuning or REALM pre-training (with its warm-ups) from a JSON/YAML config file, which
`train_config.py` reads and checks.
"""

from __future__ import annotations

import json
import os

from ..constants import RETRIEVER_SUBFOLDER
from ..io.atomic import atomic_write_text
from .common import (
    EXIT_OK,
    CLIError,
    State,
    check_written_paths,
    info,
    is_hub_id,
    load_tokenizer,
    logger,
    metrics_table,
    normalize_metric_names,
    require_local_or_hub,
)
from .readers import load_documents, load_qa, load_table
from .train_config import WARMUP_TRAINING_ARGS, checked_training_args, load_train_config, resolve_seed


def _seed_run(config: dict) -> int:
    """Seed before any model is built (the shared recipe) and record the seed in `config`."""
    from ..training.recipes import seed_everything  # deferred: the cli package imports nothing heavy at module level

    seed = resolve_seed(config)
    training_seed = (config.get("training_args") or {}).get("seed")
    if training_seed is not None and training_seed != seed:
        logger.warning("seed %s overrides training_args.seed %s.", seed, training_seed)
    config["seed"] = seed
    return seed_everything(seed, full_determinism=bool((config.get("training_args") or {}).get("full_determinism")))


def _training_arguments(config: dict, **defaults):
    from ..training.recipes import training_arguments

    values = {**defaults, **(config.get("training_args") or {})}
    values.setdefault("disable_tqdm", State.quiet)
    values.pop("seed", None)
    values.pop("output_dir", None)
    # The Trainer reseeds with this (before training, and its data order): the same seed the model was built with.
    try:
        return training_arguments(config["output_dir"], resolve_seed(config), **values)
    except ValueError as err:
        raise CLIError(str(err)) from err


# What `model_config` may change on a saved model: how it retrieves and reads while training, not its shape.
_RUNTIME_CONFIG_KEYS = (
    "searcher_beam_size",
    "reader_beam_size",
    "document_gradient_beam_size",
    "reader_beam_positive",
    "retriever_loss",
    "retriever_loss_temperature",
    "rerank_beam_size",
    "skip_answers_in_question",
    "answer_block_prior",
    "no_answer_threshold",
)


def _apply_model_config(model, overrides: dict) -> None:
    """Set `model_config`'s training settings on a model loaded from `model`, checked as `RealmConfig` checks them."""
    if not overrides:
        return
    from ..models.configuration_realm import RealmConfig

    if not isinstance(overrides, dict):
        raise CLIError(f"model_config must be a mapping of config keys to values, got {overrides!r}.")
    fixed = sorted(set(overrides) - set(_RUNTIME_CONFIG_KEYS))
    if fixed:
        raise CLIError(
            f"model_config key(s) {', '.join(fixed)} cannot change a saved model (its weights were trained with "
            f"its own); with `model` only {', '.join(_RUNTIME_CONFIG_KEYS)} can be set. To build a model of another "
            "shape, start from `init_from_bert`."
        )
    try:
        checked = RealmConfig(**{**model.config.to_dict(), **overrides})
    except (TypeError, ValueError) as err:
        raise CLIError(f"model_config: {err}") from err
    for key in overrides:
        setattr(model.config, key, getattr(checked, key))


def _attach_corpus(model, config: dict, embedder, tokenizer) -> None:
    from ..retrieval.retriever import RealmRetriever

    if config.get("corpus") and config.get("documents"):
        raise CLIError("Give either `corpus` (a saved corpus) or `documents` (to build one), not both.")
    if config.get("corpus"):
        if not os.path.isdir(config["corpus"]):
            raise CLIError(f"corpus {config['corpus']!r} is not a directory.")
        model.set_retriever(RealmRetriever.from_pretrained(config["corpus"], embedder=embedder))
    elif config.get("documents"):
        paths = config["documents"] if isinstance(config["documents"], list) else [config["documents"]]
        documents = load_documents(
            paths, text_column=config.get("text_column", "text"), title_column=config.get("title_column", "title")
        )
        from ..retrieval.faiss_build import IndexFactoryError  # deferred: retrieval pulls in faiss and datasets

        info(f"Building the corpus from {len(documents)} documents ...")
        try:
            # The factory string is tried before any block is embedded (`store_from_documents`).
            retriever = RealmRetriever.from_documents(
                documents,
                embedder,
                tokenizer,
                max_block_length=int(config.get("max_block_length", 288)),
                index=config.get("index", "Flat"),
                show_progress=not State.quiet,
            )
        except IndexFactoryError as err:
            raise CLIError(f"index: {err}") from None
        model.set_retriever(retriever)
    if getattr(model, "retriever", None) is None:
        raise CLIError("No corpus: give `corpus` or `documents` in the config, or a `model` saved with a retriever/.")


def _reindex_callback(model, config: dict, train_dataset=None):
    from ..training.recipes import reindex_callback

    sample = int(config.get("staleness_sample") or 0)
    questions = None
    if sample > 0 and train_dataset is not None:
        # The first questions of the training file: the same sample at every refresh, so the values compare.
        questions = list(train_dataset[: min(sample, len(train_dataset))]["question"])
    return reindex_callback(
        model.retriever,
        config.get("refresh_steps"),
        batch_size=int(config.get("reindex_batch_size", 128)),
        background=bool(config.get("reindex_background", True)),
        **({"staleness_questions": questions} if questions else {}),
    )


def _train_finetune(config: dict, args) -> dict:
    from ..models.modeling_openqa import RealmForOpenQA
    from ..training.recipes import evaluation_history, openqa_trainer, set_document_embedder_trainable

    if bool(config.get("model")) == bool(config.get("init_from_bert")):
        raise CLIError("Give exactly one of `model` (a REALM directory) and `init_from_bert` (a BERT directory).")
    if config.get("refresh_steps") and not config.get("train_document_embedder"):
        raise CLIError(
            "refresh_steps re-embeds the corpus with the document embedder, which only changes when it trains: set "
            "train_document_embedder: true (or drop refresh_steps; REALM fine-tuning keeps the index fixed)."
        )
    question_column = config.get("question_column", "question")
    answers_column = config.get("answers_column", "answers")
    if not config.get("train_file"):
        raise CLIError("finetune needs a train_file (JSONL/CSV/Parquet with question and answers).")
    # Read and checked before any model is loaded or corpus embedded: a bad record costs seconds, not the embedding.
    train_dataset = load_qa(config["train_file"], question_column, answers_column)
    eval_dataset = load_qa(config["eval_file"], question_column, answers_column) if config.get("eval_file") else None
    if config.get("model"):
        require_local_or_hub(config["model"], "model")
        model = RealmForOpenQA.from_pretrained(config["model"], allow_pickle=bool(config.get("allow_pickle")))
        _apply_model_config(model, config.get("model_config"))
        tokenizer = None
    else:
        from ..models.initialization import init_from_bert

        model = init_from_bert(RealmForOpenQA, config["init_from_bert"], **(config.get("model_config") or {}))
        tokenizer = load_tokenizer(config["init_from_bert"])
    if config.get("corpus") or config.get("documents"):
        if tokenizer is None:
            tokenizer = model.retriever.tokenizer if model.retriever is not None else load_tokenizer(config["model"])
        _attach_corpus(model, config, model.index_embedder, tokenizer)
    elif model.retriever is None:
        model.require_retriever()
    # Trained end to end, or frozen (a document embedder the model came with too), so the index never goes stale.
    set_document_embedder_trainable(model, bool(config.get("train_document_embedder")))

    training_model = model
    lora = config.get("lora")
    if lora:
        from ..training.lora import add_lora

        if not isinstance(lora, dict):
            lora = {}  # its keys and values were checked when the config was read (train_config.py)
        if config.get("train_document_embedder") and "document_embedder" not in (lora.get("targets") or ()):
            logger.warning(
                "With LoRA only the adapted components train: the document embedder stays frozen unless "
                "lora.targets includes 'document_embedder'."
            )
        training_model = add_lora(model, **lora)
    _warmups(model, config, train_dataset)
    training_args = _training_arguments(config)
    trainer = openqa_trainer(
        training_model,
        training_args,
        train_dataset,
        eval_dataset,
        recall_ks=config.get("recall_ks") or (1, 5),
        reindex=_reindex_callback(model, config, train_dataset),
    )
    info(f"Fine-tuning on {len(train_dataset)} questions; output in {config['output_dir']}.")
    result = trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    metrics = {"train_loss": float(result.training_loss), "global_step": int(result.global_step)}
    if eval_dataset is not None:
        metrics.update(normalize_metric_names(trainer.evaluate()))
        metrics["evaluations"] = [normalize_metric_names(entry) for entry in evaluation_history(trainer)]

    output_dir = config["output_dir"]
    final_model = model
    if lora:
        from ..training.lora import merge_adapter, save_adapter

        save_adapter(training_model, os.path.join(output_dir, "adapter"))
        final_model = merge_adapter(training_model)
    final_model.save_pretrained(output_dir, tokenizer=model.retriever.tokenizer)
    _write_training_card(output_dir, final_model, metrics, training_args, config)
    return metrics


_READER_WARMUP_DATA = ("cloze_per_block", "question_share", "keep_sentence", "negatives")


def _warmups(model, config: dict, train_dataset) -> None:
    """The retriever and reader warm-ups (`retriever_warmup`, `reader_warmup`), run before Open-QA fine-tuning."""
    from ..training.recipes import (
        reader_warmup_examples,
        reader_warmup_trainer,
        retriever_warmup_trainer,
        training_arguments,
    )

    def stage_arguments(key: str, extra: tuple = ()) -> tuple[dict, dict] | None:
        section = config.get(key)
        if not section:
            return None
        if not isinstance(section, dict):
            raise CLIError(f"{key} must be a mapping such as {{max_steps: 200}}, got {section!r}.")
        unknown = sorted(set(section) - set(WARMUP_TRAINING_ARGS) - set(extra))
        if unknown:
            raise CLIError(
                f"Unknown {key} option(s): {', '.join(unknown)} (known: {', '.join(WARMUP_TRAINING_ARGS + extra)})."
            )
        steps = section.get("max_steps")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise CLIError(f"{key}.max_steps must be a positive integer, got {steps!r}.")
        values = checked_training_args({k: section[k] for k in WARMUP_TRAINING_ARGS if k in section}, key)
        values.setdefault("warmup_steps", max(1, steps // 10))
        values.update(
            save_strategy="no",
            disable_tqdm=State.quiet,
            use_cpu=bool((config.get("training_args") or {}).get("use_cpu", False)),
        )
        try:
            args = training_arguments(os.path.join(config["output_dir"], key), resolve_seed(config), **values)
        except ValueError as err:
            raise CLIError(f"{key}: {err}") from err
        return args, {k: section[k] for k in extra if k in section}

    stage = stage_arguments("retriever_warmup")
    if stage is not None:
        info(f"Retriever warm-up: {stage[0].max_steps} steps.")
        retriever_warmup_trainer(model, stage[0], train_dataset).train()
    stage = stage_arguments("reader_warmup", _READER_WARMUP_DATA)
    if stage is not None:
        args, data_options = stage
        questions = []
        if "doc_id" in train_dataset.column_names:
            questions = [
                {"question": q, "answers": [a] if isinstance(a, str) else list(a), "doc_id": d}
                for q, a, d in zip(train_dataset["question"], train_dataset["answers"], train_dataset["doc_id"])
            ]
        try:
            if data_options.get("negatives"):
                # Negatives are searched only for the examples one pass of the warm-up reads.
                data_options.update(
                    model=model,
                    max_examples=args.max_steps * args.per_device_train_batch_size * args.gradient_accumulation_steps,
                )
            examples = reader_warmup_examples(model.retriever, questions, seed=resolve_seed(config), **data_options)
        except ValueError as err:
            raise CLIError(f"reader_warmup: {err}") from err
        info(f"Reader warm-up: {args.max_steps} steps on {len(examples)} examples.")
        reader_warmup_trainer(model, args, examples).train()


def _train_pretrain(config: dict, args) -> dict:
    from ..models.modeling_pretraining import RealmForPreTraining
    from ..training.recipes import (
        evaluation_history,
        pretraining_optimizer,
        pretraining_trainer,
        salient_span_collator,
    )

    sources = [k for k in ("model", "init_from_bert", "legacy_embedder") if config.get(k)]
    if len(sources) != 1:
        raise CLIError("Give exactly one of `model`, `init_from_bert`, or `legacy_embedder` + `legacy_encoder`.")
    overrides = config.get("model_config") or {}
    if config.get("model"):
        model = RealmForPreTraining.from_pretrained(config["model"])
        _apply_model_config(model, overrides)
        tokenizer = load_tokenizer(config["model"])
    elif config.get("init_from_bert"):
        from ..models.initialization import init_from_bert

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
        _attach_corpus(model, config, model.index_embedder, tokenizer)
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
    masking.setdefault("seed", resolve_seed(config))
    try:
        collator = salient_span_collator(tokenizer, **masking)
    except TypeError as err:
        raise CLIError(f"Invalid masking options: {err}") from err
    # The collator reads the raw text, spans and block ids: the Trainer must not drop those columns.
    training_args = _training_arguments(config, remove_unused_columns=False)
    trainer = pretraining_trainer(
        model,
        training_args,
        train_dataset,
        collator,
        eval_dataset,
        reindex=_reindex_callback(model, config),
        optimizer=pretraining_optimizer(
            model, training_args.learning_rate, float(config.get("embedder_lr_ratio", 1.0))
        ),
    )
    info(f"Pre-training on {len(train_dataset)} texts; output in {config['output_dir']}.")
    result = trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    metrics = {"train_loss": float(result.training_loss), "global_step": int(result.global_step)}
    if eval_dataset is not None:
        metrics.update(trainer.evaluate())
        metrics["evaluations"] = evaluation_history(trainer)
    model.save_pretrained(config["output_dir"], tokenizer=tokenizer)
    _write_training_card(config["output_dir"], model, metrics, training_args, config)
    if config.get("export_components"):
        model.export_components(config["output_dir"])
    return metrics


def _write_training_card(output_dir: str, model, metrics: dict, training_args, config: dict) -> None:
    try:
        from ..hub.cards import write_model_card

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
    reads = [
        (f"`{key}`", value)
        for key in (
            "model",
            "train_file",
            "eval_file",
            "corpus",
            "documents",
            "init_from_bert",
            "legacy_embedder",
            "legacy_encoder",
        )
        for value in (config.get(key) if isinstance(config.get(key), list) else [config.get(key)])
    ]
    # The final save replaces the weights, config and retriever/ in output_dir (its other files stay).
    output_dir = config["output_dir"]
    check_written_paths(
        [("output_dir", os.path.join(output_dir, RETRIEVER_SUBFOLDER))],
        reads,
        written_into=[("output_dir", output_dir)],
    )
    # Before anything random: fresh heads, LoRA adapters, the masking collator.
    _seed_run(config)
    if config["task"] == "pretrain":
        metrics = _train_pretrain(config, args)
    else:
        metrics = _train_finetune(config, args)
    metrics_path = os.path.join(config["output_dir"], "train_results.json")
    atomic_write_text(metrics_path, json.dumps(metrics, indent=2) + "\n")
    printable = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
    print(metrics_table({k: float(v) for k, v in printable.items()}))
    info(f"Saved the model and its retriever to {config['output_dir']}.")
    return EXIT_OK
