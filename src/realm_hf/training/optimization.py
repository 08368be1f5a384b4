"""Optimizers for REALM's parts that start from different places and so want different learning rates."""

from __future__ import annotations

import torch
from torch import nn


def two_rate_adamw(
    model: nn.Module, fast_module: nn.Module, learning_rate: float, other_lr_ratio: float, weight_decay: float = 0.01
) -> torch.optim.AdamW:
    """
    AdamW with `fast_module`'s trainable parameters at `learning_rate` and every other trainable parameter of `model`
    at `learning_rate * other_lr_ratio`.

    A head that starts from scratch (the reader's span scorer when fine-tuning from a BERT checkpoint, the encoder's
    masked-LM head from one without it) needs a high rate; embedders that already retrieve (pre-trained, or after the
    ICT warm start) are scrambled by that rate on a small, noisy batch.

    Args:
        model (`nn.Module`): The whole model.
        fast_module (`nn.Module`): The part of `model` trained at `learning_rate` (e.g. `model.reader`).
        learning_rate (`float`): Its learning rate.
        other_lr_ratio (`float`): The other parameters' learning rate relative to `learning_rate`.
        weight_decay (`float`, *optional*, defaults to 0.01): For both groups.

    Returns:
        `torch.optim.AdamW` with two parameter groups, `fast_module`'s first; pass it to `Trainer(optimizers=(opt,
        None))` and the Trainer's schedule scales both.
    """
    fast = [p for p in fast_module.parameters() if p.requires_grad]
    fast_ids = {id(p) for p in fast}
    others = [p for p in model.parameters() if p.requires_grad and id(p) not in fast_ids]
    return torch.optim.AdamW(
        [{"params": fast, "lr": learning_rate}, {"params": others, "lr": learning_rate * other_lr_ratio}],
        weight_decay=weight_decay,
    )
