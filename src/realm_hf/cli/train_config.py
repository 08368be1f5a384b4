"""The `realm-hf train` config file: its keys, reading it with `--set` overrides, and the run's seed."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from realm_hf_cli_parser import TRAIN_KEYS  # defined with the parser, whose `train --help` lists them

from .common import CLIError, is_hub_id

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

    if not os.path.isfile(path):
        raise CLIError(f"Config file {path!r} does not exist.")
    with open(path, encoding="utf-8") as f:
        text = f.read()
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
    return config


def resolve_seed(config: dict) -> int:
    """The run's seed: `seed`, else `training_args.seed`, else 42 (TrainingArguments' default)."""
    training_seed = (config.get("training_args") or {}).get("seed")
    seed = config.get("seed")
    seed = seed if seed is not None else training_seed if training_seed is not None else 42
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise CLIError(f"seed must be an integer, got {seed!r}.")
    return seed
