"""The `realm-hf train` config file: its keys, reading it with `--set` overrides, and the run's seed."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from .common import CLIError, is_hub_id

# Top-level keys of a training config; values that are paths are resolved against the config file's directory.
TRAIN_KEYS = {
    "task": "finetune (Open-QA, default) or pretrain (REALM masked-LM pre-training)",
    "model": "REALM model directory to start from (RealmForOpenQA for finetune, RealmForPreTraining for pretrain)",
    "init_from_bert": "BERT-layout checkpoint directory to initialise a new model from (instead of `model`)",
    "model_config": "RealmConfig overrides when initialising from BERT (e.g. retriever_proj_size, reader_beam_size)",
    "legacy_embedder": "pretrain: legacy RealmEmbedder/RealmScorer directory (with legacy_encoder)",
    "legacy_encoder": "pretrain: legacy RealmKnowledgeAugEncoder directory",
    "allow_pickle": "allow unpickling a legacy block_records.npy (trusted files only)",
    "corpus": "saved corpus + index directory (RealmRetriever.save_pretrained / realm-hf index)",
    "documents": "documents file(s) (JSONL/CSV/Parquet with title/text) to build the corpus from",
    "text_column": "text column of `documents` (default text)",
    "title_column": "title column of `documents` (default title)",
    "index": "FAISS factory string when building the corpus (default Flat)",
    "max_block_length": "wordpieces per block when building the corpus (default 288)",
    "train_file": "finetune: QA JSONL/CSV/Parquet (question, answers); pretrain: texts (text[, block_id])",
    "eval_file": "held-out file in the same format",
    "train_from_corpus": "pretrain: use the corpus blocks themselves as training texts",
    "question_column": "question column of the QA files (default question)",
    "answers_column": "answers column of the QA files (default answers)",
    "output_dir": "where checkpoints and the final model (with its retriever) go",
    "training_args": "transformers TrainingArguments fields (learning_rate, max_steps, ...)",
    "refresh_steps": "re-index the corpus every N steps with the document embedder (RealmReindexCallback)",
    "reindex_background": "refresh in a background thread while training goes on (default true)",
    "reindex_batch_size": "blocks per embedding batch when re-indexing (default 128)",
    "train_document_embedder": "finetune: train a document embedder too (end-to-end retriever training)",
    "recall_ks": "finetune: recall@k cut-offs for evaluation (default [1, 5])",
    "lora": "finetune: LoRA settings ({r, alpha, dropout, targets, target_modules}); saves adapter/ and merges",
    "embedder_lr_ratio": "pretrain: the embedders' learning rate relative to the encoder's (default 1: one rate)",
    "masking": "pretrain: DataCollatorForSalientSpanMasking options (max_length, mask_rate, seed, ...)",
    "export_components": "pretrain: also write embedder/, encoder/ (legacy layouts) into the output",
    "seed": "random seed, set before the model is built (default: training_args.seed or 42)",
}
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
