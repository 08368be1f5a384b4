"""The base class every REALM model shares (config class, weight initialisation, loading details) and its helpers."""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.activations import GELUTanh, NewGELUActivation
from transformers.models.bert.modeling_bert import BertEmbeddings, BertLMPredictionHead

from .auto_map import model_auto_map, prepare_save, write_auto_module
from .configuration_realm import RealmConfig


class RealmPreTrainedModel(PreTrainedModel):
    """Base class of the REALM models: weight initialisation, config class and loading details."""

    config_class = RealmConfig
    base_model_prefix = "realm"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _no_split_modules = ["BertEmbeddings", "BertLayer"]
    # Old checkpoints may carry the (non-persistent nowadays) position_ids buffer.
    _keys_to_ignore_on_load_unexpected = [r"position_ids"]
    # Our losses are means (the legacy ones) and ignore `num_items_in_batch`: without this, `Trainer` sees `**kwargs`
    # in `forward`, assumes a summed loss and multiplies it by the number of processes under DDP.
    accepts_loss_kwargs = False

    def save_pretrained(self, save_directory, *args, **kwargs):
        """
        [`~transformers.PreTrainedModel.save_pretrained`], plus an `auto_map` in `config.json` and the small
        `realm_hf_auto.py` it names, so that transformers' Auto classes used without `import realm_hf` point to realm-hf
        (see `realm_hf/auto_map.py` and docs/hub.md).
        """
        prepare_save(self)
        self.config.auto_map = model_auto_map(self)
        result = super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            write_auto_module(save_directory)
        return result

    def post_init(self):
        super().post_init()
        _fuse_gelu_new(self)

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, BertLMPredictionHead):
            module.bias.zero_()
        elif isinstance(module, BertEmbeddings):
            module.position_ids.copy_(torch.arange(module.position_ids.shape[-1]).expand((1, -1)))
            module.token_type_ids.zero_()

    @staticmethod
    def _flatten_inputs(*inputs):
        """Flatten `(batch, num_candidates, seq)` tensors to `(batch * num_candidates, seq)`."""
        return [t.reshape(-1, t.shape[-1]) if t is not None and t.dim() > 2 else t for t in inputs]


def _fuse_gelu_new(model: nn.Module) -> None:
    """
    REALM's configs use `gelu_new`, which transformers computes as five separate element-wise tensor ops in Python;
    `gelu(approximate="tanh")` is the same function in one fused kernel (a fifth of the reader's CPU time at batch 16).
    """
    for module in model.modules():
        for name, child in module.named_children():
            if isinstance(child, NewGELUActivation):
                setattr(module, name, GELUTanh())


def _encoder_kwargs(output_attentions, output_hidden_states):
    kwargs = {}
    if output_attentions is not None:
        kwargs["output_attentions"] = output_attentions
    if output_hidden_states is not None:
        kwargs["output_hidden_states"] = output_hidden_states
    return kwargs
