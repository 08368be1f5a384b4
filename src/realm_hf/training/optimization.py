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


def freeze_lower_layers(model: nn.Module, num_layers: int) -> nn.Module:
    """
    Freeze the embeddings and the bottom `num_layers` transformer layers of every BERT encoder inside `model` (the
    question and document embedders, the reader, the knowledge-augmented encoder), leaving the upper layers and the
    heads trainable.

    On a CPU this is what makes REALM training affordable: no backward pass through the bottom of each encoder
    (about half a step's cost with 4 of 6 layers frozen), at little cost in accuracy for a short run.

    Args:
        model (`nn.Module`): A REALM model (or any module holding `BertModel`s).
        num_layers (`int`): Bottom layers to freeze in each encoder (0 freezes only the embeddings).

    Returns:
        `nn.Module`: `model`.
    """
    from transformers import BertModel

    if num_layers < 0:
        raise ValueError(f"`num_layers` must be >= 0, got {num_layers}.")
    for module in model.modules():
        if isinstance(module, BertModel):
            module.embeddings.requires_grad_(False)
            for layer in module.encoder.layer[:num_layers]:
                layer.requires_grad_(False)
    return model
