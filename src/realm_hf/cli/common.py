"""What every `realm-hf` command shares: the error type, status output and looking inside model directories."""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Iterator
from typing import Any

from realm_hf_cli_parser import EXIT_ERROR, EXIT_OK, is_hub_id  # noqa: F401 (re-exported: statuses, the Hub id rule)

from ..constants import RETRIEVER_SUBFOLDER, TOKENIZER_DIR
from ..logging_utils import get_logger

logger = get_logger("realm_hf.cli")


class CLIError(ValueError):
    """Bad input to a command: reported as `error: <message>` with exit status 2."""


class State:
    """Process-wide settings of the running command (set once by `main`)."""

    quiet = False


def info(message: str) -> None:
    """Print a status message, unless `--quiet`."""
    # Progress and status go to stderr so that stdout carries only results (e.g. `ask --json | jq`).
    if not State.quiet:
        print(message, file=sys.stderr, flush=True)


def progress(iterable, **kwargs):
    """A progress bar on stderr, silent under `--quiet` and when the Hugging Face libraries' bars are switched off."""
    # Deferred: the cli package imports nothing heavy at module level (realm_hf.progress imports datasets).
    from ..progress import progress_bar

    disable = kwargs.pop("disable", False)
    return progress_bar(iterable, disable=State.quiet or disable, file=sys.stderr, **kwargs)


@contextlib.contextmanager
def library_progress_bars(enabled: bool) -> Iterator[None]:
    """Silence datasets' and transformers' own progress bars for `--quiet`, restoring them afterwards."""
    if enabled:
        yield
        return
    # Deferred: the cli package imports nothing heavy at module level (tests/test_cli.py builds the parser without).
    import datasets
    from transformers.utils import logging as hf_logging

    datasets_were_on = datasets.is_progress_bar_enabled()
    transformers_were_on = hf_logging.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if datasets_were_on:
            datasets.enable_progress_bars()
        if transformers_were_on:
            hf_logging.enable_progress_bar()


def default_device(device: str | None) -> str:
    """`device` if given and usable here (else a `CLIError` that says why), else `cuda` when available, else `cpu`."""
    import torch  # deferred: see library_progress_bars

    if not device:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError) as err:
        raise CLIError(f"--device {device!r} is not a device torch knows ({err}); use cpu, cuda or cuda:N.") from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            reason = "this torch was built without CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise CLIError(f"--device {device}: {reason}. Use --device cpu (or leave --device out).")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise CLIError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) here.")
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise CLIError(f"--device {device}: MPS is not available here. Use --device cpu (or leave --device out).")
    return device


def read_json_file(path: str) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def config_of(model_dir: str) -> dict:
    """The `config.json` of a model directory, as a dict."""
    path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(path):
        raise CLIError(f"{model_dir} has no config.json: not a model directory.")
    return read_json_file(path)


def architecture_of(config: dict) -> str:
    """The first of `config["architectures"]`, or `""`."""
    architectures = config.get("architectures") or []
    return architectures[0] if architectures else ""


def require_local_or_hub(path: str, what: str) -> None:
    if not os.path.exists(path) and not is_hub_id(path):
        raise CLIError(f"{what} {path!r} does not exist.")


def hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def load_tokenizer(*candidates: str):
    """The tokenizer of the first directory (or `retriever/tokenizer` subfolder) that has one."""
    from transformers import AutoTokenizer  # deferred: see library_progress_bars

    from ..models.tokenization_realm import check_vocabulary

    errors = []
    for candidate in candidates:
        if not candidate:
            continue
        for path in (
            candidate,
            os.path.join(candidate, RETRIEVER_SUBFOLDER, TOKENIZER_DIR),
            os.path.join(candidate, "tokenizer"),
        ):
            if os.path.isdir(path) and any(
                os.path.exists(os.path.join(path, name))
                for name in ("tokenizer_config.json", "vocab.txt", "tokenizer.json")
            ):
                try:
                    tokenizer = AutoTokenizer.from_pretrained(path)
                    check_vocabulary(tokenizer, path)
                    return tokenizer
                except (OSError, ValueError) as err:
                    errors.append(f"{path}: {err}")
        if not os.path.isdir(candidate) and is_hub_id(candidate):
            tokenizer = AutoTokenizer.from_pretrained(candidate)
            check_vocabulary(tokenizer, candidate)
            return tokenizer
    detail = f" ({'; '.join(errors)})" if errors else ""
    raise CLIError(f"No tokenizer found in {', '.join(c for c in candidates if c)}{detail}.")


def normalize_metric_names(metrics: dict[str, float]) -> dict[str, float]:
    """Report retrieval recall as `recall@k` whatever its source called it."""
    # Retrieval recall may come back as "answer_recall@k" (or prefixed twice); report it as "recall@k" everywhere.
    normalized = {}
    for name, value in metrics.items():
        match = re.match(r"^(.*?)(?:answer_)?recall@.*?(\d+)$", name)
        normalized[f"{match.group(1)}recall@{match.group(2)}" if match else name] = value
    return normalized


def metrics_table(metrics: dict[str, float]) -> str:
    """A two-column `metric  value` text table (EM/F1 with 2 decimals, recall with 4)."""

    def fmt(name: str, value: float) -> str:
        if name.removeprefix("eval_") in ("exact_match", "f1"):
            return f"{value:.2f}"
        if float(value).is_integer():
            return str(int(value))
        return f"{value:.4f}"

    rows = [(name, fmt(name, value)) for name, value in metrics.items()]
    width = max(len("metric"), *(len(name) for name, _ in rows))
    value_width = max(len("value"), *(len(value) for _, value in rows))
    lines = [f"{'metric':<{width}}  {'value':>{value_width}}", f"{'-' * width}  {'-' * value_width}"]
    lines += [f"{name:<{width}}  {value:>{value_width}}" for name, value in rows]
    return "\n".join(lines)
