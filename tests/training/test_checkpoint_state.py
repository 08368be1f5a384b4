"""
A checkpoint's training state without pickle (`training/checkpoint_state.py`): what a state file holds comes back with
its types, what it cannot hold is refused naming the entry, and a damaged file is named with what to do, without its
JSON sizing any array.
"""

import json

import numpy as np
import pytest
import torch

from realm_hf.training.checkpoint_state import load_state, save_state


def test_state_round_trip_keeps_types(tmp_path):
    import random

    state = {
        "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.arange(4.0)}},
        "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0], "foreach": None, "eps": float("inf")}],
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    save_state(state, str(tmp_path / "s.safetensors"))
    back = load_state(str(tmp_path / "s.safetensors"))
    assert list(back["state"]) == [0] and torch.equal(back["state"][0]["exp_avg"], torch.arange(4.0))
    assert back["param_groups"][0]["betas"] == (0.9, 0.999) and back["param_groups"][0]["eps"] == float("inf")
    assert back["python"] == state["python"]
    assert back["numpy"][0] == "MT19937" and np.array_equal(back["numpy"][1], state["numpy"][1])
    assert back["numpy"][1].dtype == state["numpy"][1].dtype


def test_unsupported_state_is_a_clear_error(tmp_path):
    with pytest.raises(TypeError, match=r"optimizer\.safetensors\.param_groups\[0\]\.fn.*builtin_function_or_method"):
        save_state({"param_groups": [{"fn": len}]}, str(tmp_path / "optimizer.safetensors"))


@pytest.mark.parametrize("damage", ["truncate", "garbage", "missing-tensor"])
def test_damaged_state_files_are_named_with_what_to_do(tmp_path, damage):
    path = tmp_path / "optimizer.safetensors"
    save_state({"state": {0: {"exp_avg": torch.ones(3)}}, "param_groups": [{"params": [0]}]}, str(path))
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) - 5])
    elif damage == "garbage":
        path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json here}")
    else:
        import safetensors.torch

        safetensors.torch.save_file(
            {}, str(path), metadata={"realm_hf_state": '{"a": {"__type__": "tensor", "key": "t9"}}'}
        )
    with pytest.raises(ValueError, match=r"optimizer\.safetensors is damaged.*earlier checkpoint"):
        load_state(str(path))


def test_the_json_of_a_state_cannot_request_a_huge_array(tmp_path):
    """A 40-byte entry asked numpy for an 8 GB array (a sub-array dtype)."""
    import safetensors.torch

    path = tmp_path / "rng_state.safetensors"
    for dtype in ["(1000,1000,1000)f8", "V8000000000", "S800000000", "O"]:
        tree = {"__type__": "ndarray", "dtype": dtype, "shape": [1], "data": [0]}
        safetensors.torch.save_file({}, str(path), metadata={"realm_hf_state": json.dumps(tree)})
        with pytest.raises(ValueError, match="rng_state.safetensors is damaged"):
            load_state(str(path))
