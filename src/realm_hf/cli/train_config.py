"""
The `realm-hf train` config file: the keys it may hold and their types, reading it (JSON or YAML) with `--set`
overrides, and the run's seed. Every value is checked when the file is read, before any model loads or document is
read, so that a typo fails in a second, not after the corpus is embedded.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Sequence

from realm_hf_cli_parser import TRAIN_KEYS  # defined with the parser, whose `train --help` lists them

from .common import CLIError, is_hub_id

# The TrainingArguments a warm-up section (`retriever_warmup`, `reader_warmup`) may set.
WARMUP_TRAINING_ARGS = (
    "max_steps",
    "per_device_train_batch_size",
    "learning_rate",
    "warmup_steps",
    "weight_decay",
    "train_sampling_strategy",
)

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
        config["training_args"] = checked_training_args(config["training_args"], f"{path}: training_args")
    for key in ("retriever_warmup", "reader_warmup"):  # their shape and max_steps are checked where they run
        section = config.get(key)
        if isinstance(section, dict):
            values = {k: v for k, v in section.items() if k in WARMUP_TRAINING_ARGS and k != "max_steps"}
            checked_training_args(values, f"{path}: {key}")
    output_dir = config["output_dir"]
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        # Else the run trained first and then failed to save ("[Errno 17] File exists").
        raise CLIError(f"{path}: output_dir {output_dir!r} is a file: give a directory.")


#: The keys of the config's `lora:` section (the arguments of `realm_hf.training.lora.add_lora` it passes on).
LORA_KEYS = ("r", "alpha", "dropout", "targets", "target_modules", "modules_to_save")
_LORA_SYNONYMS = {
    "rank": "r",
    "lora_r": "r",
    "lora_alpha": "alpha",
    "lora_dropout": "dropout",
    "components": "targets",
}
_ATTENTION_PROJECTIONS = ("query", "key", "value", "dense")


def _check_lora(lora: dict, path: str) -> None:
    unknown = sorted(set(lora) - set(LORA_KEYS))
    if unknown:
        # peft's own names first (`lora_alpha`), then spelling.
        close = _LORA_SYNONYMS.get(unknown[0]) or next(
            iter(difflib.get_close_matches(unknown[0], LORA_KEYS, n=1)), None
        )
        hint = f" (did you mean lora.{close}?)" if close else ""
        raise CLIError(
            f"{path}: unknown lora option(s) {', '.join(unknown)}{hint}; lora takes {', '.join(LORA_KEYS)}."
        )
    for key, ok, what in (
        ("r", _is_int, "an integer"),
        ("alpha", lambda v: _is_int(v) or isinstance(v, float), "a number"),
        ("dropout", lambda v: not isinstance(v, bool) and isinstance(v, (int, float)), "a number"),
        ("targets", lambda v: isinstance(v, list) and all(isinstance(t, str) for t in v), "a list of names"),
        ("target_modules", lambda v: isinstance(v, list) and all(isinstance(t, str) for t in v), "a list of names"),
        ("modules_to_save", lambda v: isinstance(v, list) and all(isinstance(t, str) for t in v), "a list of names"),
    ):
        if key in lora and not ok(lora[key]):
            raise CLIError(f"{path}: lora.{key} must be {what}, got {lora[key]!r}.")
    unknown_projections = sorted(set(lora.get("target_modules") or ()) - set(_ATTENTION_PROJECTIONS))
    if unknown_projections:
        raise CLIError(
            f"{path}: lora.target_modules {unknown_projections} are not attention projections: use "
            f"{', '.join(_ATTENTION_PROJECTIONS)}."
        )
    from ..training.lora import check_lora_options  # the values add_lora takes, checked before any model loads

    try:
        check_lora_options(**{key: lora[key] for key in ("r", "alpha", "dropout") if key in lora})
    except ValueError as err:
        raise CLIError(f"{path}: lora: {err}") from None


def checked_training_args(values: dict, where: str) -> dict:
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
