"""
A Trainer checkpoint's training state without pickle, and which checkpoints can be resumed from.

- The state files: an optimizer's, scheduler's or scaler's `state_dict()` and the RNG states, each one safetensors file
  ([`save_state`], [`load_state`]): the tensors as tensors, the rest as JSON in the file's metadata, every size in it
  bounded by the file.
- The checks on resume: a checkpoint torn by a kill ([`torn_checkpoint_problem`], [`last_whole_checkpoint`]) and an
  optimizer state saved for other parameters ([`check_optimizer_state`]).
"""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import safetensors.torch
import torch

from ..logging_utils import get_logger

logger = get_logger(__name__)

__all__ = [
    "OPTIMIZER_STATE",
    "RNG_STATE",
    "SCALER_STATE",
    "SCHEDULER_STATE",
    "STATE_SUFFIX",
    "check_optimizer_state",
    "has_any",
    "last_whole_checkpoint",
    "load_state",
    "rng_states",
    "save_state",
    "set_rng_states",
    "torn_checkpoint_problem",
]

#: The checkpoint files of the training state (one safetensors file each; the non-tensor part of the state is JSON in
#: the file's metadata). transformers writes `optimizer.pt`, `scheduler.pt`, `scaler.pt` and `rng_state.pth`.
OPTIMIZER_STATE, SCHEDULER_STATE, SCALER_STATE, RNG_STATE = "optimizer", "scheduler", "scaler", "rng_state"
STATE_SUFFIX = ".safetensors"
_STATE_KEY = "realm_hf_state"


def _encode(value: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    # JSON for the structure, a reference for each tensor; tuples, non-string keys and arrays are tagged so that
    # loading gives back what `load_state_dict` / `random.setstate` / `np.random.set_state` expect.
    if isinstance(value, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = value.detach().cpu().contiguous()
        return {"__type__": "tensor", "key": key}
    if isinstance(value, np.ndarray):
        return {"__type__": "ndarray", "dtype": str(value.dtype), "shape": list(value.shape), "data": value.tolist()}
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, tuple):
        return {"__type__": "tuple", "items": [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and "__type__" not in value:
            return {k: _encode(v, tensors, f"{where}.{k}") for k, v in value.items()}
        return {
            "__type__": "dict",
            "items": [[_encode(k, tensors, where), _encode(v, tensors, f"{where}[{k!r}]")] for k, v in value.items()],
        }
    raise TypeError(
        f"{where} is a {type(value).__name__}, which realm-hf cannot save without pickle (tensors, arrays, numbers, "
        "strings, lists, tuples and dicts only)."
    )


def _saved_array(value: dict) -> np.ndarray:
    # The dtype comes from the file: a structured or sub-array dtype (e.g. "(1000,1000,1000)f8") would make a few
    # bytes of JSON allocate gigabytes. Arrays of a training state are plain numbers (numpy's RNG state: uint32).
    dtype = np.dtype(value["dtype"])
    if dtype.kind not in "biuf" or dtype.shape or dtype.itemsize > 16:
        raise ValueError(f"an array of dtype {value['dtype']!r}, which no training state holds")
    shape = value["shape"]
    if not isinstance(shape, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
    ):
        raise ValueError(f"an array of shape {shape!r}")
    # The data is all in the JSON: its length bounds the array, and the shape must account for exactly that.
    data = np.array(value["data"], dtype=dtype)
    return data.reshape(shape)


def _decode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    kind = value.get("__type__")
    if kind is None:
        return {k: _decode(v, tensors) for k, v in value.items()}
    if kind == "tensor":
        return tensors[value["key"]]
    if kind == "ndarray":
        return _saved_array(value)
    if kind == "tuple":
        return tuple(_decode(v, tensors) for v in value["items"])
    if kind == "dict":
        return {_decode(k, tensors): _decode(v, tensors) for k, v in value["items"]}
    raise ValueError(f"Unknown entry type {kind!r} in a saved training state.")


def save_state(state: Any, path: str) -> None:
    """
    Save a nested training state (an optimizer's, scheduler's or scaler's `state_dict()`, RNG states) to one
    safetensors file at `path`, without pickle: the tensors as tensors, everything else as JSON in the file's metadata.
    Written to a temporary file and renamed, so a kill leaves the old file or the new one.
    """
    tensors: dict[str, torch.Tensor] = {}
    tree = _encode(state, tensors, os.path.basename(path))
    partial = f"{path}.partial"
    safetensors.torch.save_file(tensors, partial, metadata={_STATE_KEY: json.dumps(tree)})
    os.replace(partial, path)


def load_state(path: str, device: str | torch.device = "cpu") -> Any:
    """
    Read back a training state written by [`save_state`], its tensors on `device`. A damaged file (truncated,
    edited, another kind of file) raises a `ValueError` that names it and says what to do.
    """
    try:
        with safetensors.safe_open(path, framework="pt", device=str(device)) as f:
            metadata = f.metadata() or {}
            tensors = {key: f.get_tensor(key) for key in f.keys()}
        if _STATE_KEY not in metadata:
            raise ValueError(f"no {_STATE_KEY!r} metadata: not a training state saved by realm-hf")
        return _decode(json.loads(metadata[_STATE_KEY]), tensors)
    except (safetensors.SafetensorError, ValueError, KeyError, TypeError, AttributeError, OSError) as err:
        if isinstance(err, FileNotFoundError):
            raise
        raise ValueError(
            f"{path} is damaged ({type(err).__name__}: {err}), so this checkpoint cannot be resumed from: resume from "
            "an earlier checkpoint, or delete this checkpoint folder."
        ) from None


def rng_states() -> dict[str, Any]:
    # The states transformers' `_save_rng_state` saves, for the devices this machine has.
    states = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.random.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any], path: str) -> None:
    try:
        _apply_rng_states(states)
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise ValueError(
            f"{path} does not hold the random-number states of a checkpoint ({type(err).__name__}: {err}): resume from "
            "an earlier checkpoint, or delete this file to resume without restoring them."
        ) from None


def _apply_rng_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.random.set_rng_state(states["cpu"])
    if torch.cuda.is_available() and "cuda" in states:
        cuda = states["cuda"]
        if isinstance(cuda, (list, tuple)) and len(cuda) == torch.cuda.device_count():
            torch.cuda.random.set_rng_state_all(cuda)
        elif isinstance(cuda, torch.Tensor):
            torch.cuda.random.set_rng_state(cuda)


def has_any(folder: str, names: Sequence[str]) -> bool:
    return any(os.path.isfile(os.path.join(folder, name)) for name in names)


#: The files of a model save in a checkpoint, one of which a whole checkpoint holds.
_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "adapter_model.safetensors",
    "adapter_model.bin",
)


def torn_checkpoint_problem(checkpoint: str) -> str | None:
    """
    Why `checkpoint` (a Trainer's `checkpoint-N` folder) cannot be resumed from, or `None`: a missing folder, no
    `trainer_state.json` (which a checkpoint save writes last: its absence means the save was killed), an unreadable
    one, or no weights.
    """
    if not os.path.isdir(checkpoint):
        return "it is not a folder."
    state = os.path.join(checkpoint, "trainer_state.json")
    if not os.path.isfile(state):
        return (
            "it has no trainer_state.json, the file a checkpoint save writes last: the save was interrupted (killed) "
            "and the checkpoint is incomplete. Resume from an earlier checkpoint (or with resume_from_checkpoint=True, "
            "which skips it), and delete this folder."
        )
    try:
        with open(state, encoding="utf-8") as f:
            if not isinstance(json.load(f), dict):
                raise ValueError("not a JSON object")
    except (OSError, UnicodeDecodeError, ValueError) as err:
        return f"its trainer_state.json cannot be read ({err}): the checkpoint is damaged. Resume from another one."
    if not has_any(checkpoint, _WEIGHT_FILES):
        return (
            f"it holds no model weights ({', '.join(_WEIGHT_FILES[::2])}): the checkpoint is incomplete. Resume from an "
            "earlier one."
        )
    return None


def last_whole_checkpoint(output_dir: str) -> str:
    """
    The last `checkpoint-N` folder of `output_dir` that can be resumed from (see [`torn_checkpoint_problem`]); later
    ones torn by a kill are skipped with a warning naming them. Raises a `ValueError` when there is none.
    """
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR  # local: the Trainer's naming only

    pattern = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")
    found = []
    if os.path.isdir(output_dir):
        found = [(int(m.group(1)), name) for name in os.listdir(output_dir) if (m := pattern.match(name))]
    for _, name in sorted(found, reverse=True):
        path = os.path.join(output_dir, name)
        problem = torn_checkpoint_problem(path)
        if problem is None:
            return path
        logger.warning("Skipping %s for resume: %s", path, problem)
    raise ValueError(
        f"No checkpoint to resume from in {output_dir}"
        + (" (every checkpoint there is incomplete; see the warnings above)." if found else ".")
    )


def check_optimizer_state(optimizer: torch.optim.Optimizer, state: dict, path: str) -> None:
    """
    Refuse an optimizer state saved for other parameters (a model of another size, other trainable parameters) with
    a `ValueError` naming `path`: `load_state_dict` checks the number of parameters only, and moments of another
    shape fail later, or broadcast in silence.
    """
    try:
        saved_groups, saved_state = state["param_groups"], state["state"]
        saved_ids = [i for group in saved_groups for i in group["params"]]
    except (KeyError, TypeError) as err:
        raise ValueError(
            f"{path} is not an optimizer state ({type(err).__name__}: {err}): the checkpoint is damaged."
        ) from None
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if len(saved_ids) != len(params) or len(saved_groups) != len(optimizer.param_groups):
        raise ValueError(
            f"{path} holds the optimizer state of {len(saved_ids)} parameters in {len(saved_groups)} group(s), but this "
            f"run trains {len(params)} in {len(optimizer.param_groups)}: the checkpoint is from another model or "
            "another set of trainable parameters. Resume with the model and settings it was saved with."
        )
    for index, param in zip(saved_ids, params):
        for name, value in (saved_state.get(index) or {}).items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and tuple(value.shape) != tuple(param.shape):
                raise ValueError(
                    f"{path}: the optimizer's {name!r} of parameter {index} has shape {tuple(value.shape)}, but the "
                    f"model's parameter has {tuple(param.shape)}: the checkpoint is from a model of another size "
                    "(config). Resume with the model it was saved from, or start a new run."
                )
