"""
What every `realm-hf` command shares: running a parsed command (its settings, its module, bad input turned into
`error: ...` and status 2), the error type, status output, looking inside model directories, loading the models the
commands run (the Open-QA model, the embedder that fills an index), and the directories the commands produce.

The entry point, `main`, parses the arguments in the top-level `realm_hf_cli` module (without torch, with the parser of
`realm_hf_cli_parser`) and calls [`run_command`] (`realm_hf.cli.main(argv)` is that entry point, re-exported by the
package). No command module is named `main`: a submodule `realm_hf.cli.main`, once imported, would replace the
package's `main` function with itself.

The output directories (`index`, `convert`) are swapped in whole through realm-hf's one atomic-write path
(`io.staged_saves.replace_directory`, journaled: a killed `--overwrite` leaves the old or the new output); files go
through `io.atomic.atomic_write_text` directly.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import pickle
import re
import sys
import traceback
from collections.abc import Iterable, Iterator
from typing import Any

from realm_hf_cli_parser import EXIT_ERROR, EXIT_OK, is_hub_id  # noqa: F401 (re-exported: statuses, the Hub id rule)

from ..constants import RETRIEVER_SUBFOLDER, TOKENIZER_DIR
from ..io.staged_saves import recover_interrupted_save, replace_directory
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
    # Deferred: the cli package imports nothing heavy at module level (tests/cli/test_cli.py builds the parser without).
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


def check_dtype_option(value: str | None):
    """`--dtype` as the library reads it (`realm_hf.precision.parse_dtype`), or a `CLIError` naming what it takes."""
    from ..precision import parse_dtype  # deferred: it imports torch

    try:
        return parse_dtype(value)
    except ValueError:
        raise CLIError(
            f"--dtype must be fp32, bf16, auto, fp16 (GPUs only) or int8 (CPUs only), got {value!r}."
        ) from None


def check_int8_device(dtype, model) -> None:
    """Refuse `--dtype int8` for a model on a GPU before any question is read (int8 answers on CPUs only)."""
    if dtype == "int8" and model.device.type != "cpu":
        raise CLIError(
            f"--dtype int8 answers on CPUs only, but the model is on {model.device}: add --device cpu, or use "
            "--dtype bf16 or fp16 on a GPU."
        )


def read_json_file(path: str) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def config_of(model_dir: str) -> dict:
    """The `config.json` of a model directory, as a dict."""
    path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(path):
        raise CLIError(f"{model_dir} has no config.json: not a model directory.")
    try:
        config = read_json_file(path)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        # json's own message named neither the file nor what to do ("Expecting property name ...: line 2 column 1").
        raise CLIError(f"{path} is not valid JSON ({err}): restore it from the original save.") from None
    if not isinstance(config, dict):
        raise CLIError(f"{path} holds a JSON {type(config).__name__}, not a model config: restore it.")
    return config


def architecture_of(config: dict) -> str:
    """The first of `config["architectures"]`, or `""`."""
    architectures = config.get("architectures") or []
    return architectures[0] if architectures else ""


def require_local_or_hub(path: str, what: str) -> None:
    if os.path.isfile(path):
        # Else the Hub client reads the path as a repo id and answers "Repo id must be in the form ...".
        raise CLIError(f"{what} {path!r} is a file: give a model directory (with config.json) or a Hub repo id.")
    if not os.path.exists(path) and not is_hub_id(path):
        raise CLIError(f"{what} {path!r} does not exist.")


def hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def load_tokenizer(*candidates: str):
    """The tokenizer of the first directory (or `retriever/tokenizer` subfolder) that has one."""
    from transformers import AutoTokenizer  # deferred: see library_progress_bars

    from ..text.tokenizer_calls import check_vocabulary

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


def _real(path: str) -> str:
    return os.path.realpath(os.path.abspath(path))


def same_path(a: str, b: str) -> bool:
    """Whether `a` and `b` name the same file or folder (through symbolic links, or hard links of existing files)."""
    if _real(a) == _real(b):
        return True
    try:
        return os.path.samefile(a, b)  # hard links
    except OSError:  # one of them does not exist (yet)
        return False


def _is_under(path: str, folder: str) -> bool:
    return _real(path).startswith(_real(folder).rstrip(os.sep) + os.sep)


def check_written_paths(
    outputs: Iterable[tuple[str, str | None]],
    inputs: Iterable[tuple[str, str | None]],
    written_into: Iterable[tuple[str, str | None]] = (),
) -> None:
    """
    Refuse, before anything is read, written or deleted, a path a command writes that would destroy what it reads:
    an output that is an input (through a symbolic or hard link too), an output folder that holds an input (replacing
    the folder deletes it), or an output inside an input folder (a model directory, a saved dataset). Every command
    that writes runs its paths through here.

    Args:
        outputs (`Iterable[tuple[str, str | None]]`): `(option, path)` of each file or folder the command writes or
            replaces whole; `None` paths (options not given) are skipped.
        inputs (`Iterable[tuple[str, str | None]]`): `(what, path)` of each path it reads (`what` names it in the
            error, e.g. `"--model"` or `"the QA file being evaluated"`); paths that do not exist here (a Hub repo id)
            are skipped.
        written_into (`Iterable[tuple[str, str | None]]`, *optional*): `(option, path)` of folders the command saves
            into, replacing only its own entries there (a Trainer's `output_dir`): only being an input is refused.

    Raises:
        [`CLIError`]: naming the output's option and the input it would destroy.
    """
    inputs = [(what, path) for what, path in inputs if path and os.path.exists(path)]
    for option, folder in written_into:
        for what, path in inputs:
            if folder and same_path(folder, path):
                raise CLIError(
                    f"{option} {folder!r} is {what} ({path!r}), which this command reads: saving there would replace "
                    "it. Give another path."
                )
    for option, output in outputs:
        if not output:
            continue
        for what, path in inputs:
            if same_path(output, path):
                raise CLIError(
                    f"{option} {output!r} is {what} ({path!r}), which this command reads: writing there would destroy "
                    "it. Give another path."
                )
            if os.path.isdir(path) and _is_under(output, path):
                raise CLIError(
                    f"{option} {output!r} is inside {what} ({path!r}), which this command reads: give a path outside "
                    "it."
                )
            if _is_under(path, output):
                raise CLIError(
                    f"{option} {output!r} holds {what} ({path!r}), which this command reads: replacing it would "
                    "delete it. Give another path."
                )


@contextlib.contextmanager
def atomic_output_dir(output: str, overwrite: bool = False) -> Iterator[str]:
    """
    Yield a temporary directory; on success it replaces `output` in one journaled swap, on failure it is removed (see
    [`realm_hf.io.staged_saves.replace_directory`]: a run killed half-way through the swap leaves a journal that the
    next run, or a load of `output`, completes). An existing non-empty `output` is refused unless `overwrite`, and is only
    removed after the new one is in place.
    """
    output = os.path.abspath(output)
    parent = os.path.dirname(output)
    if os.path.isdir(parent):
        # A run killed during its swap: `output` is the old or the new directory again before it is judged (only
        # `output`: a journal in the parent naming its siblings is refused).
        recover_interrupted_save(parent, only=os.path.basename(output))
    check_output_dir(output, overwrite)
    with replace_directory(output) as folder:
        yield folder


def check_output_dir(output: str, overwrite: bool) -> None:
    """Refuse a non-directory, or a non-empty directory without `overwrite`."""
    if os.path.exists(output):
        if not os.path.isdir(output):
            raise CLIError(f"{output} exists and is not a directory.")
        if os.listdir(output) and not overwrite:
            raise CLIError(f"{output} already exists and is not empty; pass --overwrite to replace it.")


@contextlib.contextmanager
def reading_weights(path: str) -> Iterator[None]:
    """
    Turn the errors a damaged weights file raises while a model loads into a `CLIError` naming the directory: a
    truncated `model.safetensors` (safetensors' `SafetensorError`), a truncated or foreign `pytorch_model.bin`
    (torch's `RuntimeError` from its zip reader, or a bare `KeyError: 101`), which came out as a traceback or as
    `error: 101`.
    """
    from safetensors import SafetensorError  # deferred: see library_progress_bars

    try:
        yield
    except CLIError:
        raise
    except (SafetensorError, RuntimeError, KeyError, EOFError, pickle.UnpicklingError) as err:
        detail = str(err).splitlines()[0] if str(err) else ""
        raise CLIError(
            f"Could not load the model in {path} ({type(err).__name__}: {detail}). A weights file (model.safetensors "
            "or pytorch_model.bin) that is truncated or damaged fails this way: restore it from the original save, "
            "or download it again."
        ) from err


def load_openqa(path: str, allow_pickle: bool = False, device: str | None = None, need_retriever: bool = True):
    """A `RealmForOpenQA` in eval mode on `device`, refusing a directory that holds another architecture."""
    # deferred: the cli package imports nothing heavy at module level
    from ..models.modeling_openqa import RealmForOpenQA

    require_local_or_hub(path, "Model")
    if os.path.isdir(path):
        found = architecture_of(config_of(path))
        if found and found != "RealmForOpenQA":
            raise CLIError(f"{path} holds a {found}, not a RealmForOpenQA question-answering model.")
    with reading_weights(path):
        model = RealmForOpenQA.from_pretrained(path, allow_pickle=allow_pickle)
    if need_retriever:
        model.require_retriever()  # says what to do (convert, allow_pickle, attach a corpus) when there is none
    model.to(default_device(device))
    return model.eval()


def load_without_retriever(model_class, path: str, **kwargs):
    """
    `model_class.from_pretrained(path)` without loading (or unpickling) the corpus saved with it: for commands that
    need the weights only (an embedder to build an index with, a legacy checkpoint without block records).
    """
    return model_class.from_pretrained(path, load_retriever=False, **kwargs)


# The REALM architectures whose embedder can fill an index ("" : a config that names none, read as an embedder).
_EMBEDDER_ARCHITECTURES = (
    "",
    "RealmEmbedder",
    "RealmScorer",
    "RealmForOpenQA",
    "RealmForPreTraining",
    "RealmForInverseClozeTask",
)


def check_embedder_dir(path: str, what: str = "--model") -> None:
    """
    Refuse, from its `config.json` alone, a directory whose model cannot embed an index (another model type, such as
    a BERT or MiniLM checkpoint, or a REALM class without an embedder): before any document is read.
    """
    config = config_of(path)
    model_type = config.get("model_type")
    if model_type not in (None, "realm"):
        raise CLIError(
            f"{what} {path} holds a `{model_type}` model, not a REALM one. Start a REALM model from it first, e.g. "
            "`realm-hf train` with `init_from_bert` in the config, or `realm_hf.init_from_bert(RealmForOpenQA, "
            f"{path!r})`, then save it and index with that directory."
        )
    found = architecture_of(config)
    if found not in _EMBEDDER_ARCHITECTURES:
        raise CLIError(f"{what} {path} holds a {found}, which has no embedder to build an index with.")


def embedder_from_dir(path: str):
    """The embedder that fills an index, from a REALM model directory: (embedder, description)."""
    check_embedder_dir(path)
    with reading_weights(path):
        return _embedder_from_dir(path, architecture_of(config_of(path)))


def _embedder_from_dir(path: str, found: str):
    from ..models.modeling_embedder import RealmEmbedder, RealmScorer  # deferred: see load_openqa
    from ..models.modeling_openqa import RealmForOpenQA

    if found == "RealmEmbedder" or not found:
        return RealmEmbedder.from_pretrained(path), "embedder"
    if found == "RealmScorer":
        return RealmScorer.from_pretrained(path).embedder, "scorer's embedder"
    if found == "RealmForOpenQA":
        model = load_without_retriever(RealmForOpenQA, path)
        what = "document embedder" if model.index_embedder is model.document_embedder else "question embedder"
        return model.index_embedder, what
    if found == "RealmForPreTraining":
        from ..models.modeling_pretraining import RealmForPreTraining  # deferred: see load_openqa

        return load_without_retriever(RealmForPreTraining, path).index_embedder, "document embedder"
    if found == "RealmForInverseClozeTask":
        from ..models.modeling_ict import RealmForInverseClozeTask  # deferred: see load_openqa

        return RealmForInverseClozeTask.from_pretrained(path).index_embedder, "ICT document embedder"
    raise CLIError(f"{path} holds a {found}, which has no embedder to build an index with.")


def _command(name: str):
    # Only the chosen command's module is imported: the others stay unread.
    return importlib.import_module(f"{__package__}.{name}")


def _warnings_or_realm_hf(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING or record.name.split(".")[0] == "realm_hf"


def run_command(args: argparse.Namespace) -> int:
    """Run the command `args.command` with the parsed `args`. Returns the exit status (0 on success, 2 on bad input)."""
    State.quiet = bool(args.quiet)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s", stream=sys.stderr)
        # A library that sets its own logger to DEBUG (bm25s does, when imported) would print through this handler:
        # below WARNING, only realm-hf's records (governed by transformers' verbosity) reach the terminal.
        logging.getLogger().handlers[0].addFilter(_warnings_or_realm_hf)
    try:
        with library_progress_bars(enabled=not State.quiet):
            return _command(args.command).run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, KeyError, ImportError) as err:
        if args.debug:
            traceback.print_exc()
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"error: {message}", file=sys.stderr)
        return EXIT_ERROR
