"""Compute precision: the one rule for when embedding and answering run under bf16 autocast and when in fp32."""

from __future__ import annotations

import contextlib
import functools
import platform

import torch

from .logging_utils import warn

DTYPE_NAMES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
}
_DTYPE_HELP = (
    "use 'fp32', 'bf16', 'fp16' (GPUs only), 'auto' (bf16 where the device runs it natively, fp32 elsewhere), None "
    "(fp32) or torch.float32 / torch.bfloat16 / torch.float16"
)


def parse_dtype(dtype) -> torch.dtype | str | None:
    """
    Check a compute dtype as the user gave it.

    Args:
        dtype (`str`, `torch.dtype` or `None`): `None`, `"auto"`, a name of [`DTYPE_NAMES`] (`"fp32"`, `"bf16"`,
            `"fp16"`, `"bfloat16"`, ..., any case) or `torch.float32` / `torch.bfloat16` / `torch.float16`.

    Returns:
        `None`, `"auto"` or one of the three torch dtypes.

    Raises:
        `ValueError` for anything else, naming the accepted values.
    """
    if dtype is None or isinstance(dtype, torch.dtype) and dtype in DTYPE_NAMES.values():
        return dtype
    if isinstance(dtype, str):
        name = dtype.strip().lower().removeprefix("torch.")
        if name == "auto":
            return "auto"
        if name in DTYPE_NAMES:
            return DTYPE_NAMES[name]
    raise ValueError(f"Unknown dtype {dtype!r}: {_DTYPE_HELP}.")


@functools.lru_cache(maxsize=1)  # the CPU does not change while the process runs
def _cpu_has_native_bf16() -> bool:
    if platform.machine().lower() in ("x86_64", "amd64", "i386", "i686"):
        # oneDNN's own check (`torch.ops.mkldnn._is_mkldnn_bf16_supported`) also says yes on AVX-512 CPUs without
        # the bf16 instructions, where bf16 is emulated and slower than fp32: ask for the instructions themselves.
        checks = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
        if any(check is not None for check in checks):
            return any(bool(check()) for check in checks if check is not None)
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def has_native_bf16(device: str | torch.device = "cpu") -> bool:
    """
    Whether `device` computes in bf16 natively, i.e. bf16 autocast is faster there than fp32: a CPU with AVX512-BF16
    or AMX (elsewhere bf16 is emulated), a CUDA GPU of compute capability 8.0 or newer (Ampere, Hopper, ...).
    """
    device = torch.device(device)
    if device.type == "cpu":
        return _cpu_has_native_bf16()
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return False
        try:
            # Without `including_emulation=False` older GPUs count as bf16-capable (emulated, slow).
            return bool(torch.cuda.is_bf16_supported(including_emulation=False))
        except TypeError:  # torch before 2.3 has no such argument (and no emulation)
            return bool(torch.cuda.is_bf16_supported())
    return False


def resolve_autocast_dtype(dtype, device: str | torch.device, purpose: str = "answering") -> torch.dtype | None:
    """
    The autocast dtype `purpose` runs in on `device`: the single rule every entry point (embedding, `answer()`, the
    pipeline, `realm-hf ask`) applies.

    - `None` or fp32: `None` (no autocast).
    - `"auto"`: bf16 where the device has native bf16 ([`has_native_bf16`]), else `None`, silently.
    - bf16: bf16 where native; on a CPU or GPU without native bf16 a warning, and `None` (bf16 would be slower).
    - fp16: on a GPU fp16; on a CPU a warning and `None` (CPUs have no fast fp16).

    Other device types (e.g. `mps`) get the dtype asked for (`"auto"`: `None`).

    Args:
        dtype (`str`, `torch.dtype` or `None`): See [`parse_dtype`].
        device (`str` or `torch.device`): Where the model runs.
        purpose (`str`, *optional*, defaults to `"answering"`): Named in the warnings.

    Returns:
        `torch.bfloat16`, `torch.float16` or `None` (fp32, no autocast).
    """
    requested = parse_dtype(dtype)
    device = torch.device(device)
    if requested is None or requested == torch.float32:
        return None
    if requested == "auto":
        return torch.bfloat16 if has_native_bf16(device) else None
    if device.type not in ("cpu", "cuda"):
        return requested
    if requested == torch.bfloat16:
        if has_native_bf16(device):
            return torch.bfloat16
        what = (
            "this CPU has neither AVX512-BF16 nor AMX"
            if device.type == "cpu"
            else "this GPU has no native bf16 (compute capability 8.0+)"
        )
        warn(
            f"dtype='bf16' was asked for {purpose}, but {what}: bf16 would be emulated and slower than fp32, so "
            f"{purpose} runs in fp32. Use dtype='auto' to get bf16 only where it is native.",
            UserWarning,
            stacklevel=3,
        )
        return None
    if device.type == "cpu":
        warn(
            f"dtype='fp16' was asked for {purpose} on CPU, which has no fast fp16: {purpose} runs in fp32. Use "
            "dtype='auto' or 'bf16' on CPUs.",
            UserWarning,
            stacklevel=3,
        )
        return None
    return torch.float16


def autocast(device: str | torch.device, dtype, purpose: str = "answering"):
    """
    A context manager that runs `purpose` in the dtype [`resolve_autocast_dtype`] chooses: `torch.autocast` for bf16
    or fp16, nothing for fp32. Checks `dtype` (and warns) when called, not when entered, so callers can call it before
    any model work. Code that needs fp32 under it (retrieval and span logits) promotes to fp32 itself.
    """
    resolved = resolve_autocast_dtype(dtype, device, purpose)
    if resolved is None:
        return contextlib.nullcontext()
    device = torch.device(device)
    try:
        return torch.autocast(device.type, dtype=resolved)
    except RuntimeError as err:
        warn(f"{resolved} autocast is not available on {device} ({err}): {purpose} runs in fp32.", stacklevel=2)
        return contextlib.nullcontext()


__all__ = ["DTYPE_NAMES", "autocast", "has_native_bf16", "parse_dtype", "resolve_autocast_dtype"]
