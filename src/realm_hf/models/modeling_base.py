"""The base class every REALM model shares (config class, weight initialisation, loading details) and its helpers."""

from __future__ import annotations

import json
import os

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.activations import GELUTanh, NewGELUActivation
from transformers.models.bert.modeling_bert import BertEmbeddings, BertLMPredictionHead

from ..constants import MANIFEST_NAME, RETRIEVER_SUBFOLDER
from ..io.auto_map import model_auto_map, prepare_save, write_auto_module
from ..io.consistent_reads import consistent_read
from ..io.staged_saves import staged_save
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

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        r"""
        transformers' `from_pretrained`, reading a local directory as one save: a save into it that was interrupted
        while its files were being swapped in is completed first (see [`~RealmPreTrainedModel.save_pretrained`]), a
        save in progress is waited for, and its config, weights and tokenizer files must not be links leading out of
        it (see [`realm_hf.io.consistent_reads.consistent_read`]).
        """
        with consistent_read(pretrained_model_name_or_path, kwargs.get("subfolder")):
            _refuse_part_of_a_whole_model(cls, pretrained_model_name_or_path, kwargs.get("subfolder"))
            return super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)

    def save_pretrained(self, save_directory, *args, **kwargs):
        r"""
        transformers' `save_pretrained`, made all-or-nothing: the files are written into a temporary folder inside
        `save_directory` and swapped in under a journal, so that a save killed at any moment leaves exactly the
        previous save or exactly this one (see [`realm_hf.io.staged_saves.staged_save`]). Other files in the directory
        are kept. `config.json` also gets an `auto_map` naming the small `realm_hf_auto.py` written next to it, so that
        transformers' Auto classes used without `import realm_hf` point to realm-hf (see `realm_hf/io/auto_map.py` and
        docs/hub.md).
        """
        self._save_directory(save_directory, args, kwargs)

    def _save_directory(self, save_directory, args, kwargs, retriever=None, write_extra=None) -> None:
        r"""
        Save weights and config (transformers' `save_pretrained` with `args`/`kwargs`), `retriever` in `retriever/`
        and whatever `write_extra(folder)` writes, into `save_directory` all at once or not at all, even if the
        process is killed: see [`realm_hf.io.staged_saves.staged_save`]. The retriever's manifest records the sha256 of
        the weights saved with it, so that weights and index from two different saves are refused at load.

        A `tokenizer=` keyword (not a transformers argument) saves that tokenizer in the same swap, so weights and
        tokenizer are never from two saves; `corpus_format=` (`"arrow"`, the default, or `"parquet"`) is the format
        `retriever`'s corpus is written in. Only what this save writes is replaced (plus weight shards of an earlier
        save that it supersedes); other files in the directory, such as a Trainer's `checkpoint-*` folders, are kept.
        `retriever/` belongs to the model: it is replaced as a whole. Saved without a retriever, a directory keeps the
        one it has.
        """
        # Local imports: retrieval pulls in faiss and datasets.
        from ..retrieval.manifest import rebind_model_files, record_model_files, stale_weight_files
        from ..retrieval.serialization import record_num_blocks

        # Not transformers' arguments: a tokenizer saved in the same all-or-nothing swap as the weights, and the
        # retriever's corpus format (Parquet when pushing to the Hub).
        tokenizer = kwargs.pop("tokenizer", None)
        corpus_format = kwargs.pop("corpus_format", "arrow")
        if corpus_format not in ("arrow", "parquet"):
            raise ValueError(f"corpus_format must be 'arrow' or 'parquet', got {corpus_format!r}.")
        save_directory = os.path.abspath(os.fspath(save_directory))
        if os.path.exists(save_directory) and not os.path.isdir(save_directory):
            # Said here, before any work, rather than as a bare FileExistsError from deep in the staged save.
            raise FileExistsError(
                f"Cannot save the model into {save_directory}: it is a file, not a directory. save_pretrained writes a "
                "directory (created if missing): give a directory path, or move the file away."
            )
        prepare_save(self)
        self.config.auto_map = model_auto_map(self)
        if not kwargs.get("is_main_process", True):
            # The other processes of a distributed save: transformers decides what they write; no retriever.
            super().save_pretrained(save_directory, *args, **kwargs)
            return
        if kwargs.get("push_to_hub"):
            # transformers names the repo after the folder it saves into: the final one, not the staging folder.
            kwargs.setdefault("repo_id", os.path.basename(save_directory))
        retriever_dir = os.path.join(save_directory, RETRIEVER_SUBFOLDER)
        with staged_save(save_directory) as save:
            super().save_pretrained(save.staging, *args, **kwargs)
            write_auto_module(save.staging)
            staged_retriever = os.path.join(save.staging, RETRIEVER_SUBFOLDER)
            rebound, written_store = False, None
            if retriever is not None:
                written_store = retriever.write(
                    staged_retriever, corpus_format, model_files=record_model_files(save.staging)
                )
                # From the corpus as written (the retriever's locked state), not from before: see record_num_blocks.
                record_num_blocks(self.config, save.staging, len(written_store))
            elif os.path.isdir(retriever_dir):
                rebound = rebind_model_files(retriever_dir, staged_retriever, record_model_files(save.staging))
            if write_extra is not None:
                write_extra(save.staging)
            if tokenizer is not None:
                tokenizer.save_pretrained(save.staging)
            written = sorted(os.listdir(save.staging))
            if rebound:
                # Only the kept retriever's manifest changes (it names the new weights), not the folder.
                written = [n for n in written if n != RETRIEVER_SUBFOLDER] + [f"{RETRIEVER_SUBFOLDER}/{MANIFEST_NAME}"]
            save.replace = written
            save.remove = stale_weight_files(save_directory, set(written))
        if retriever is not None:
            retriever.follow_save(written_store, retriever_dir)

    def _card_writer(self, save_directory, retriever=None):
        """
        The `write_extra` of [`~RealmPreTrainedModel._save_directory`] that writes realm-hf's model card into the
        staging folder, from the README now in `save_directory`: its hand-written text is kept, and transformers'
        draft Trainer card there is replaced (see `realm_hf/hub/cards.py`).
        """
        from ..hub.cards import write_model_card  # local import: the card code is needed only when a card is saved

        readme = os.path.join(os.fspath(save_directory), "README.md")

        def write_card(folder):
            existing = None
            if os.path.isfile(readme):
                with open(readme, encoding="utf-8") as f:
                    existing = f.read()
            write_model_card(folder, model=self, retriever=retriever, existing_readme=existing)

        return write_card

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


def encoder_output_kwargs(output_attentions, output_hidden_states) -> dict:
    """
    The `output_attentions` / `output_hidden_states` keyword arguments of a BERT encoder call, with only the ones the
    caller set: an unset flag is left out, so the encoder falls back to its config as transformers' models do.
    """
    kwargs = {}
    if output_attentions is not None:
        kwargs["output_attentions"] = output_attentions
    if output_hidden_states is not None:
        kwargs["output_hidden_states"] = output_hidden_states
    return kwargs


# The REALM models whose saved weights hold other REALM models under a prefix, and the attribute of each part.
_WHOLE_MODELS = {
    "RealmForOpenQA": {"RealmReader": "reader", "RealmEmbedder": "embedder"},
    "RealmForPreTraining": {"RealmEmbedder": "embedder", "RealmKnowledgeAugEncoder": "encoder"},
    "RealmForInverseClozeTask": {"RealmEmbedder": "embedder"},
}


def local_config(path, subfolder: str | None = None) -> dict | None:
    """
    The `config.json` of a local model directory as a dict, or `None` when `path` is not a local directory with a
    readable JSON-object config (transformers reports those when it loads). Never calls the Hub.
    """
    if not isinstance(path, (str, os.PathLike)):
        return None
    config_file = os.path.join(os.fspath(path), subfolder or "", "config.json")
    if not os.path.isfile(config_file):
        return None
    try:
        with open(config_file, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def _refuse_part_of_a_whole_model(cls, path, subfolder=None) -> None:
    """
    Refuse loading one part (a reader, an embedder, ...) from a local directory saved by a model that holds it: its
    weights are named `reader.*`, `embedder.*` there, so transformers found none of the part's own and returned it
    randomly initialised, with only a load report to say so (a silent wrong answer). Local directories only (no Hub
    call here).
    """
    config = local_config(path, subfolder)
    architectures = (config or {}).get("architectures") or []
    if cls.__name__ in architectures:
        return
    for whole in architectures:
        attribute = _WHOLE_MODELS.get(whole, {}).get(cls.__name__)
        if attribute is not None:
            raise ValueError(
                f"{os.fspath(path)} holds a {whole}, not a {cls.__name__}: its {cls.__name__} weights are saved "
                f"under `{attribute}.`, so `{cls.__name__}.from_pretrained` would start a random one. Load the whole "
                f"model and take the part: `{whole}.from_pretrained(path).{attribute}`."
            )


def check_input_shape(name: str, tensor, expected: tuple, meaning: str) -> None:
    """
    Refuse a model input whose shape is not `expected` (`None` entries: any size; a `(">=", n)` entry: at least `n`),
    naming the input and the layout it must have. Mismatched inputs otherwise broadcast in silence (a batch of one
    relevance score added to every question's blocks) or fail deep in torch with sizes that name no argument.
    Metadata only: no device synchronisation.
    """
    if tensor is None:
        return
    shape = tuple(tensor.shape)
    fits = len(shape) == len(expected) and all(
        want is None or (got >= want[1] if isinstance(want, tuple) else got == want)
        for got, want in zip(shape, expected)
    )
    if not fits:
        layout = ", ".join(
            "any" if want is None else (f">= {want[1]}" if isinstance(want, tuple) else str(want)) for want in expected
        )
        raise ValueError(f"`{name}` has shape {shape}, expected ({layout}): {meaning}.")


def check_token_ids(name: str, input_ids, config) -> None:
    """Refuse wordpiece ids that are not integers, or sequences longer than the position embeddings (metadata only)."""
    if input_ids is None:
        return
    if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        # torch's embedding said "Expected tensor for argument #1 'indices' to have one of the following scalar types".
        raise TypeError(f"`{name}` must hold integer wordpiece ids (torch.long), got {input_ids.dtype}.")
    max_positions = getattr(config, "max_position_embeddings", None)
    if input_ids.dim() >= 1 and max_positions is not None and input_ids.shape[-1] > max_positions:
        # BERT failed with "The expanded size of the tensor (100) must match the existing size (64)".
        raise ValueError(
            f"`{name}` has {input_ids.shape[-1]} tokens per sequence, more than the model's "
            f"max_position_embeddings={max_positions}: truncate the inputs (tokenizer `truncation=True, "
            f"max_length={max_positions}`)."
        )
