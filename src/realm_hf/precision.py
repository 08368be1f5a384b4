"""
Compute precision: the one rule for when embedding and answering run under bf16 autocast and when in fp32, and int8
answering on CPUs (an int8 copy of the reader's encoder, never the model's own weights).
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import itertools
import platform
import warnings

import torch
from torch import nn

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
#: Names of int8 answering (`answer(dtype="int8")`): int8 linear layers in the reader's encoder, CPUs only.
INT8_NAMES = ("int8", "qint8")
_DTYPE_HELP = (
    "use 'fp32', 'bf16', 'fp16' (GPUs only), 'int8' (answering on CPUs only), 'auto' (bf16 where the device runs it "
    "natively, fp32 elsewhere), None (fp32) or torch.float32 / torch.bfloat16 / torch.float16 / torch.qint8"
)


def parse_dtype(dtype) -> torch.dtype | str | None:
    """
    Check a compute dtype as the user gave it.

    Args:
        dtype (`str`, `torch.dtype` or `None`): `None`, `"auto"`, `"int8"`, a name of [`DTYPE_NAMES`] (`"fp32"`,
            `"bf16"`, `"fp16"`, `"bfloat16"`, ..., any case) or `torch.float32` / `torch.bfloat16` /
            `torch.float16` / `torch.qint8` (or `torch.int8`, read as int8 answering).

    Returns:
        `None`, `"auto"`, `"int8"` or one of the three torch float dtypes.

    Raises:
        `ValueError` for anything else, naming the accepted values.
    """
    if dtype is None or isinstance(dtype, torch.dtype) and dtype in DTYPE_NAMES.values():
        return dtype
    if dtype in (torch.qint8, torch.int8):
        return "int8"
    if isinstance(dtype, str):
        name = dtype.strip().lower().removeprefix("torch.")
        if name == "auto":
            return "auto"
        if name in INT8_NAMES:
            return "int8"
        if name in DTYPE_NAMES:
            return DTYPE_NAMES[name]
    raise ValueError(f"Unknown dtype {dtype!r}: {_DTYPE_HELP}.")


def check_int8(device: str | torch.device, purpose: str = "answering") -> None:
    """
    Refuse int8 where it does not run: anything but answering (an index embedded in int8 would no longer match the
    questions' fp32 vectors, and training needs float weights), and any device but a CPU (torch's dynamic int8
    kernels are CPU kernels).

    Raises:
        `ValueError` saying what to use instead.
    """
    if purpose != "answering":
        raise ValueError(
            f"dtype='int8' is for answering only (an int8 copy of the reader's linear layers); {purpose} runs in "
            f"'fp32', 'bf16' or 'auto'."
        )
    device = torch.device(device)
    if device.type != "cpu":
        raise ValueError(
            f"dtype='int8' answers on CPUs only (torch's dynamic int8 quantization has CPU kernels only), but the model "
            f"is on {device}: on a GPU use dtype='bf16' or 'fp16', or move the model to the CPU (`model.to('cpu')`)."
        )


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

    - int8: `None` (no autocast: [`autocast`] turns int8 answering on instead); refused with a `ValueError` on any
      device but a CPU and for any purpose but answering ([`check_int8`]).

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
    if requested == "int8":
        check_int8(device, purpose)
        return None  # activations stay fp32: the int8 copies quantize them per call (see `int8_answering`)
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
    or fp16, int8 answering ([`int8_answering`]) for int8, nothing for fp32. Checks `dtype` (and warns) when called,
    not when entered, so callers can call it before any model work. Code that needs fp32 under it (retrieval and span
    logits) promotes to fp32 itself.
    """
    resolved = resolve_autocast_dtype(dtype, device, purpose)
    if parse_dtype(dtype) == "int8":
        return int8_answering()
    if resolved is None:
        return contextlib.nullcontext()
    device = torch.device(device)
    try:
        return torch.autocast(device.type, dtype=resolved)
    except RuntimeError as err:
        warn(f"{resolved} autocast is not available on {device} ({err}): {purpose} runs in fp32.", stacklevel=2)
        return contextlib.nullcontext()


# Whether the current call answers with an int8 copy of the reader: a context variable, so that concurrent calls
# (threads of `realm-hf serve`) each answer in the dtype they asked for, and the model itself never changes.
_INT8_ANSWERING = contextvars.ContextVar("realm_hf_int8_answering", default=False)


class int8_answering:  # noqa: N801 (used as a function: `with int8_answering():`, as `torch.autocast`)
    """
    Answer with int8 linear layers for the duration of a `with` block (what `answer(dtype="int8")` enters): a model
    that reads [`int8_answering_active`] runs an int8 copy of its reader ([`quantize_linear_layers`]). Reusable and
    re-entrant, as `torch.autocast` is: `answer()` enters the same one once per batch.
    """

    def __init__(self):
        self._tokens = []

    def __enter__(self):
        self._tokens.append(_INT8_ANSWERING.set(True))
        return self

    def __exit__(self, *exc):
        _INT8_ANSWERING.reset(self._tokens.pop())


def int8_answering_active() -> bool:
    """Whether the calling code runs inside [`int8_answering`]."""
    return _INT8_ANSWERING.get()


def _quantize_dynamic():
    # torch's own dynamic quantization: fbgemm/x86 int8 kernels in eager mode, no extra dependency. torchao, its
    # successor, ran the same layers many times slower than fp32 on a CPU in eager mode (bench/README.md).
    quantization = getattr(getattr(torch, "ao", None), "quantization", None)
    quantize_dynamic = getattr(quantization, "quantize_dynamic", None)
    if quantize_dynamic is None:
        raise RuntimeError(
            f"dtype='int8' needs torch.ao.quantization.quantize_dynamic, which torch {torch.__version__} does not "
            "have: answer in 'fp32' (or 'bf16' where native), or install a torch release that has it (2.13 does)."
        )
    return quantize_dynamic, quantization.per_channel_dynamic_qconfig


def quantize_linear_layers(module: nn.Module, submodules: tuple[str, ...] | None = None) -> nn.Module:
    """
    An int8 copy of `module`: each `nn.Linear` inside it (inside the named `submodules` only, if given) becomes a
    dynamically quantized int8 layer (int8 weights per output channel, activations quantized per call); every other
    tensor is shared with `module`, not copied. `module` and its weights are left as they were, so saving the model
    still writes its float weights.

    Args:
        module (`nn.Module`): E.g. a `RealmReader`.
        submodules (`tuple[str, ...]`, *optional*): Names of the submodules whose linear layers are quantized (e.g.
            `("realm",)`, the BERT encoder); the others keep their float layers.

    Returns:
        `nn.Module` in evaluation mode, for inference on a CPU.
    """
    quantize_dynamic, qconfig = _quantize_dynamic()
    shared = {id(t): t for t in itertools.chain(module.parameters(), module.buffers())}
    quantized = copy.deepcopy(module, memo=shared)
    prefixes = tuple(f"{name}." for name in submodules) if submodules is not None else ("",)
    # The linear layers by name: a submodule's name alone would also give its embeddings a qconfig, which dynamic
    # quantization does not take.
    spec = {
        name: qconfig
        for name, layer in quantized.named_modules()
        if isinstance(layer, nn.Linear) and f"{name}.".startswith(prefixes)
    }
    with warnings.catch_warnings():
        # torch announces that torch.ao.quantization moves to torchao; the kernels it runs are unchanged.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=r".*quantize_per_(tensor|channel).*")
        quantize_dynamic(quantized, spec, dtype=torch.qint8, inplace=True)
    return quantized.eval()


__all__ = [
    "DTYPE_NAMES",
    "INT8_NAMES",
    "autocast",
    "check_int8",
    "has_native_bf16",
    "int8_answering",
    "int8_answering_active",
    "parse_dtype",
    "quantize_linear_layers",
    "resolve_autocast_dtype",
]
