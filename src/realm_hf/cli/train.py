"""
`realm-hf train`: Open-QA fine-tuning or REALM pre-training from a JSON/YAML config, and that config file (its keys,
reading it with `--set` overrides, the run's seed).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from realm_hf_cli_parser import TRAIN_KEYS  # defined with the parser, whose `train --help` lists them

from ..file_utils import atomic_write_text
from .common import (
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
from .readers import load_documents, load_qa, load_table


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
        from ..retrieval.index import new_index  # local import: retrieval pulls in faiss and datasets

        try:
            # An empty index of this factory string: a typo fails now, not after the whole corpus is embedded.
            new_index(config.get("index", "Flat"), embedder.config.retriever_proj_size)
        except ValueError as err:
            raise CLIError(f"index: {err}") from None
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


_WARMUP_ARGS = (
    "max_steps",
    "per_device_train_batch_size",
    "learning_rate",
    "warmup_steps",
    "weight_decay",
    "train_sampling_strategy",
)
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
        unknown = sorted(set(section) - set(_WARMUP_ARGS) - set(extra))
        if unknown:
            raise CLIError(
                f"Unknown {key} option(s): {', '.join(unknown)} (known: {', '.join(_WARMUP_ARGS + extra)})."
            )
        steps = section.get("max_steps")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise CLIError(f"{key}.max_steps must be a positive integer, got {steps!r}.")
        values = _checked_training_args({k: section[k] for k in _WARMUP_ARGS if k in section}, key)
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


_MODEL_KEYS = ("model", "init_from_bert", "legacy_embedder", "legacy_encoder")
_PATH_KEYS = (
    "model",
    "init_from_bert",
    "legacy_embedder",
    "legacy_encoder",
    "corpus",
    "documents",
    "train_file",
    "eval_file",
    "output_dir",
)


def load_train_config(path: str, overrides: Sequence[str] = ()) -> dict:
    """
    Read a `realm-hf train` config (JSON, or YAML for `.yaml`/`.yml`), resolve its relative paths against the config
    file's directory, apply `--set KEY=VALUE` overrides (values parsed as YAML; dotted keys reach into
    `training_args`, `lora`, ...) and check the keys.
    """
    import yaml

    if os.path.isdir(path):
        raise CLIError(f"Config file {path!r} is a directory: give a .json, .yaml or .yml file.")
    if not os.path.isfile(path):
        raise CLIError(f"Config file {path!r} does not exist.")
    try:
        with open(path, encoding="utf-8-sig") as f:
            text = f.read()
    except UnicodeDecodeError as err:  # the error named neither the file nor what to do
        raise CLIError(
            f"{path}: not valid UTF-8 (byte {err.object[err.start : err.start + 1]!r} at offset {err.start}): save the "
            "config as UTF-8."
        ) from None
    try:
        if path.lower().endswith((".yaml", ".yml")):
            config = yaml.safe_load(text)
        else:
            config = json.loads(text)
    except (yaml.YAMLError, json.JSONDecodeError) as err:
        raise CLIError(f"{path}: cannot parse the config: {err}") from err
    if not isinstance(config, dict):
        raise CLIError(f"{path}: the config must be a mapping of keys to values.")
    base = os.path.dirname(os.path.abspath(path))

    def resolve(value, may_be_hub_id: bool):
        if isinstance(value, list):
            return [resolve(v, may_be_hub_id) for v in value]
        if not isinstance(value, str) or not value:
            return value
        if value.startswith("~") or os.path.isabs(value):
            return os.path.expanduser(value)
        candidate = os.path.normpath(os.path.join(base, value))
        # A model may be a Hub id ("google/realm-..."): kept as is unless a local path of that name exists.
        if may_be_hub_id and not os.path.exists(candidate) and is_hub_id(value):
            return value
        return candidate

    for key in _PATH_KEYS:
        if config.get(key) is not None:
            config[key] = resolve(config[key], may_be_hub_id=key in _MODEL_KEYS)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise CLIError(f"--set expects KEY=VALUE, got {item!r}.")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        if isinstance(value, bool) and raw.strip().lower() not in ("true", "false"):
            value = raw  # YAML 1.1 reads `no`/`yes`/`on`/`off` as booleans: save_strategy=no means "no"
        target = config
        parts = key.split(".")
        for part in parts[:-1]:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                raise CLIError(f"--set {key}: {part} is not a mapping.")
        target[parts[-1]] = value
    unknown = sorted(set(config) - set(TRAIN_KEYS))
    if unknown:
        raise CLIError(
            f"{path}: unknown config key(s) {', '.join(unknown)}; known keys: {', '.join(sorted(TRAIN_KEYS))}."
        )
    task = config.setdefault("task", "finetune")
    if task not in ("finetune", "pretrain"):
        raise CLIError(f"{path}: task must be 'finetune' or 'pretrain', got {task!r}.")
    if not config.get("output_dir"):
        raise CLIError(f"{path}: output_dir is required.")
    check_config_values(config, path)
    return config


# The types of the config's values, checked when the file is read: a wrong type either failed much later with a
# traceback (`model: 5`, `training_args: 5`, `lora: {r: "8"}`, `training_args.max_steps: "100"`), with a message that
# named no key (`invalid literal for int() with base 10: 'abc'`), or was taken silently (`recall_ks: [0]`,
# `train_document_embedder: "false"`, which is true, `lora: [..]`, read as the default LoRA).
_STRING_KEYS = ("text_column", "title_column", "question_column", "answers_column", "index")
_BOOL_KEYS = (
    "allow_pickle",
    "train_from_corpus",
    "train_document_embedder",
    "reindex_background",
    "export_components",
)
# key: (the smallest value, whether null is allowed)
_INT_KEYS = {
    "refresh_steps": (1, True),
    "reindex_batch_size": (1, False),
    "staleness_sample": (0, True),
    "max_block_length": (8, False),
}
_MAPPING_KEYS = ("training_args", "model_config", "masking")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_config_values(config: dict, path: str = "config") -> None:
    """Raise a `CLIError` naming the key for a config value of the wrong type or out of range."""
    for key in _PATH_KEYS:
        value = config.get(key)
        if value is None:
            continue
        if key == "documents" and isinstance(value, list):
            if not value or not all(isinstance(v, str) and v for v in value):
                raise CLIError(
                    f"{path}: documents must be a file path or a non-empty list of file paths, got {value!r}."
                )
        elif not isinstance(value, str):
            raise CLIError(f"{path}: {key} must be a path (a string), got {value!r}.")
    for key in _STRING_KEYS:
        if config.get(key) is not None and not isinstance(config[key], str):
            raise CLIError(f"{path}: {key} must be a string, got {config[key]!r}.")
    for key in _BOOL_KEYS:
        if config.get(key) is not None and not isinstance(config[key], bool):
            raise CLIError(f"{path}: {key} must be true or false, got {config[key]!r}.")
    for key, (minimum, nullable) in _INT_KEYS.items():
        value = config.get(key)
        if value is None and (nullable or key not in config):
            continue
        if not _is_int(value) or value < minimum:
            raise CLIError(f"{path}: {key} must be an integer of at least {minimum}, got {value!r}.")
    ratio = config.get("embedder_lr_ratio")
    if ratio is not None and (isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not ratio > 0):
        raise CLIError(f"{path}: embedder_lr_ratio must be a positive number, got {ratio!r}.")
    ks = config.get("recall_ks")
    if ks is not None and (not isinstance(ks, list) or not ks or not all(_is_int(k) and k >= 1 for k in ks)):
        raise CLIError(f"{path}: recall_ks must be a list of positive integers such as [1, 5], got {ks!r}.")
    for key in _MAPPING_KEYS:
        if config.get(key) is not None and not isinstance(config[key], dict):
            raise CLIError(f"{path}: {key} must be a mapping of names to values, got {config[key]!r}.")
    lora = config.get("lora")
    if lora is not None and lora is not False:
        if lora is not True and not isinstance(lora, dict):
            raise CLIError(
                f"{path}: lora must be true (the default LoRA) or a mapping such as {{r: 8}}, got {lora!r}."
            )
        _check_lora(lora if isinstance(lora, dict) else {}, path)
    if config.get("training_args"):
        config["training_args"] = _checked_training_args(config["training_args"], f"{path}: training_args")
    for key in ("retriever_warmup", "reader_warmup"):  # their shape and max_steps are checked where they run
        section = config.get(key)
        if isinstance(section, dict):
            values = {k: v for k, v in section.items() if k in _WARMUP_ARGS and k != "max_steps"}
            _checked_training_args(values, f"{path}: {key}")
    output_dir = config["output_dir"]
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        # Else the run trained first and then failed to save ("[Errno 17] File exists").
        raise CLIError(f"{path}: output_dir {output_dir!r} is a file: give a directory.")


def _check_lora(lora: dict, path: str) -> None:
    for key, ok, what in (
        ("r", _is_int, "an integer"),
        ("alpha", lambda v: _is_int(v) or isinstance(v, float), "a number"),
        ("dropout", lambda v: not isinstance(v, bool) and isinstance(v, (int, float)), "a number"),
        ("targets", lambda v: isinstance(v, list) and all(isinstance(t, str) for t in v), "a list of names"),
        ("target_modules", lambda v: isinstance(v, list) and all(isinstance(t, str) for t in v), "a list of names"),
    ):
        if key in lora and not ok(lora[key]):
            raise CLIError(f"{path}: lora.{key} must be {what}, got {lora[key]!r}.")


def _checked_training_args(values: dict, where: str) -> dict:
    """
    `training_args` with the types `TrainingArguments` declares (it checks none: `max_steps: "100"` failed inside the
    Trainer with a traceback). A number written so that YAML reads it as a string (`learning_rate: 3e-5`, YAML 1.1)
    is taken as the number; `max_steps: 0` (or below -1, its "not set") is refused, where transformers trained the
    default 3 epochs.
    """
    import dataclasses
    import types
    import typing

    from transformers import TrainingArguments  # deferred: the cli package imports nothing heavy at module level

    hints = typing.get_type_hints(TrainingArguments)
    names = {field.name for field in dataclasses.fields(TrainingArguments)}
    checked = dict(values)
    for key, value in values.items():
        if key not in names or value is None:
            continue  # an unknown key is named by TrainingArguments itself
        hint = hints.get(key)
        optional = typing.get_origin(hint) in (typing.Union, types.UnionType)
        kinds = set(typing.get_args(hint)) - {type(None)} if optional else {hint}
        if kinds == {bool}:
            if not isinstance(value, bool):
                raise CLIError(f"{where}.{key} must be true or false, got {value!r}.")
        elif kinds == {int}:
            if not _is_int(value):
                raise CLIError(f"{where}.{key} must be an integer, got {value!r}.")
        elif kinds == {float}:
            if isinstance(value, str):
                try:
                    value = checked[key] = float(value)
                except ValueError:
                    pass
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise CLIError(f"{where}.{key} must be a number, got {value!r}.")
    steps = checked.get("max_steps")
    if _is_int(steps) and (steps == 0 or steps < -1):
        raise CLIError(
            f"{where}.max_steps must be a positive number of steps (or -1: train num_train_epochs epochs), got {steps}."
        )
    for key in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
        if _is_int(checked.get(key)) and checked[key] < 1:
            raise CLIError(f"{where}.{key} must be at least 1, got {checked[key]}.")
    return checked


def resolve_seed(config: dict) -> int:
    """The run's seed: `seed`, else `training_args.seed`, else 42 (TrainingArguments' default)."""
    training_seed = (config.get("training_args") or {}).get("seed")
    seed = config.get("seed")
    seed = seed if seed is not None else training_seed if training_seed is not None else 42
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise CLIError(f"seed must be an integer, got {seed!r}.")
    return seed
