"""
Turning blocks (and question texts) into embeddings: the block tokenizer, batched embedding and the embedder
fingerprint.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import torch

from ..logging_utils import get_logger
from ..precision import autocast
from ..progress import progress_bar
from ..text.tokenizer_calls import tokenizer_call
from ..text.user_text import check_questions

logger = get_logger(__name__)


def fingerprint_module(module: torch.nn.Module, length: int = 16) -> str:
    """
    Fingerprint of a module's weights: sha256 over its `state_dict()` tensors (name, dtype, shape and raw bytes, in
    sorted key order), truncated to `length` hex digits.

    The retriever records the fingerprint of the embedder that produced its block embeddings; comparing it with the
    current embedder tells whether the index is stale (the embedder was trained since the corpus was embedded).
    """
    digest = hashlib.sha256()
    state_dict = module.state_dict()
    for key in sorted(state_dict):
        tensor = state_dict[key]
        if not isinstance(tensor, torch.Tensor):
            continue
        tensor = tensor.detach().to("cpu").contiguous()
        digest.update(f"{key}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:length]


# REALM models that hold no embedder and whose output is not block embeddings (checked by name: no import of models/).
_NOT_EMBEDDERS = ("RealmReader", "RealmKnowledgeAugEncoder")


def check_embedder_module(embedder) -> None:
    """
    Refuse what cannot embed blocks before any work: not a module, or a model that holds an embedder (a
    `RealmForOpenQA` or `RealmScorer`, whose forward returns no block embeddings) instead of the embedder itself.
    """
    if not isinstance(embedder, torch.nn.Module):
        raise TypeError(
            f"The embedder must be a `RealmEmbedder` (a torch module whose output has `projected_score`), got "
            f"{type(embedder).__name__}."
        )
    if (
        type(embedder).__name__ in _NOT_EMBEDDERS
        and getattr(getattr(embedder, "config", None), "model_type", None) == "realm"
    ):
        # The reader's forward refused with "You have to specify `relevance_score`", which named no embedder.
        raise TypeError(
            f"A {type(embedder).__name__} does not embed blocks: pass the `RealmEmbedder` that built the corpus (on "
            "a `RealmForOpenQA`, `model.index_embedder`)."
        )
    # A whole Open-QA model failed deep in the loop ("'RealmReaderOutput' object has no attribute 'float'").
    for attribute in ("index_embedder", "embedder"):
        inner = getattr(embedder, attribute, None)
        if isinstance(inner, torch.nn.Module) and inner is not embedder:
            raise TypeError(
                f"A {type(embedder).__name__} is not an embedder but holds one: pass `model.{attribute}` (the "
                "embedder whose vectors fill the index)."
            )


def default_block_length(tokenizer, max_length: int | None = None) -> int:
    """`max_length`, or else the tokenizer's `model_max_length` capped at 512 (BERT's position embeddings)."""
    if max_length is not None:
        return int(max_length)
    return min(int(getattr(tokenizer, "model_max_length", 512) or 512), 512)


def tokenize_blocks(
    tokenizer,
    titles: Sequence[str | None] | None,
    texts: Sequence[str],
    max_length: int | None = None,
    padding: bool = False,
    return_tensors: str | None = None,
):
    """
    Tokenize blocks as the index embeds them: `tokenizer(titles, texts, truncation=True, max_length=max_length)`,
    i.e. `[CLS] title [SEP] text [SEP]` (an empty title gives `[CLS] [SEP] text [SEP]`). Every place that embeds a
    block (indexing, re-scoring with the live document embedder, pre-training, ICT) must tokenize it this way, or
    fresh scores and the index disagree for reasons other than training.

    Args:
        tokenizer: A BERT WordPiece tokenizer.
        titles (`Sequence[str]`, *optional*): Block titles (`None` entries, or `None` for all, are empty titles).
        texts (`Sequence[str]`): Block texts.
        max_length (`int`, *optional*): Truncation length; defaults to the tokenizer's `model_max_length` (max 512).
        padding (`bool`, defaults to `False`): Pad to the longest block.
        return_tensors (`str`, *optional*): `"pt"` for tensors.

    Returns:
        `BatchEncoding` with `input_ids`, `attention_mask` and `token_type_ids`.
    """
    texts = list(texts)
    titles = [""] * len(texts) if titles is None else [title or "" for title in titles]
    if len(titles) != len(texts):
        raise ValueError(f"Got {len(titles)} titles for {len(texts)} texts.")
    return tokenizer_call(
        tokenizer,
        titles,
        texts,
        padding=padding,
        truncation=True,
        max_length=default_block_length(tokenizer, max_length),
        return_token_type_ids=True,
        return_tensors=return_tensors,
        verbose=False,
    )


def tokenize_block_texts(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """
    The wordpiece ids of block texts as the reader reads them: `tokenizer(text, add_special_tokens=False)`, without
    the title and untruncated. A BERT WordPiece tokenizer encodes the two segments of a pair separately, so these are
    the ids between the two `[SEP]`s of a `[CLS] question [SEP] text [SEP]` reader pair, before the pair's truncation.
    The corpus stores them (column `text_token_ids`) so that training finds the answers in the searcher beam without
    tokenizing thousands of question/block pairs.

    Args:
        tokenizer: A BERT WordPiece tokenizer (the retriever's).
        texts (`Sequence[str]`): Block texts.

    Returns:
        `list[list[int]]`, one list of ids per text.
    """
    texts = list(texts)
    if not texts:
        return []
    return tokenizer_call(tokenizer, texts, add_special_tokens=False, verbose=False)["input_ids"]


def embed_blocks(
    embedder: torch.nn.Module,
    tokenizer,
    titles: Sequence[str] | None,
    texts: Sequence[str],
    batch_size: int = 64,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    show_progress: bool = True,
    max_length: int | None = None,
) -> torch.FloatTensor:
    """
    Embed `(title, text)` blocks as the legacy REALM document embedder did:
    `embedder(**tokenize_blocks(tokenizer, titles, texts, max_length)).projected_score` (see [`tokenize_blocks`]).

    Blocks are sorted by length (longest first) and batched, so a batch pads only to its own longest block; the
    result is returned in the original order.

    Args:
        embedder (`torch.nn.Module`): A [`RealmEmbedder`] (or any module whose `forward(input_ids, attention_mask,
            token_type_ids)` returns an object with `projected_score` of shape `(batch, dim)`).
        tokenizer: The embedder's tokenizer.
        titles (`Sequence[str]`, *optional*): Block titles (empty strings if `None`).
        texts (`Sequence[str]`): Block texts.
        batch_size (`int`, defaults to 64): Blocks per forward pass.
        device (`str` or `torch.device`, *optional*): Where to run; defaults to the embedder's device. The embedder
            is moved there for the call and moved back afterwards.
        dtype (`str` or `torch.dtype`, *optional*): `"bf16"` (or `"fp16"` on a GPU) runs under autocast where the
            device supports it natively, `"auto"` picks bf16 there; elsewhere fp32, with a warning when bf16 or fp16
            was asked for (see [`~realm_hf.precision.resolve_autocast_dtype`]). `None` is fp32. Embeddings are
            returned in fp32.
        show_progress (`bool`, defaults to `True`): Show a progress bar (unless the Hugging Face libraries' progress
            bars are switched off, see [`~realm_hf.progress.progress_bars_enabled`]).
        max_length (`int`, *optional*): Truncation length; defaults to the tokenizer's `model_max_length` (max 512).

    Returns:
        `torch.FloatTensor` of shape `(len(texts), dim)` on CPU.
    """
    texts = list(texts)
    if not texts:
        raise ValueError("No blocks to embed: the corpus is empty.")
    check_embedder_module(embedder)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"`batch_size` must be a positive integer, got {batch_size!r}.")
    encoded = tokenize_blocks(tokenizer, titles, texts, max_length=max_length)
    keys = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in encoded]
    lengths = np.array([len(ids) for ids in encoded["input_ids"]])
    order = np.argsort(-lengths, kind="stable")

    first_param = next(embedder.parameters(), None)
    model_device = first_param.device if first_param is not None else torch.device("cpu")
    device = torch.device(device) if device is not None else model_device
    # Checked (and a warning given where bf16 is not native) before the embedder moves.
    precision = autocast(device, dtype, "embedding")
    was_training = embedder.training
    moved = device != model_device
    if moved:
        embedder.to(device)
    embedder.eval()
    outputs: list[torch.Tensor] = []
    try:
        with torch.inference_mode(), precision:
            for start in progress_bar(
                range(0, len(texts), batch_size),
                desc="Embedding blocks",
                unit="batch",
                disable=not show_progress,
            ):
                rows = order[start : start + batch_size]
                batch = tokenizer.pad({k: [encoded[k][i] for i in rows] for k in keys}, return_tensors="pt")
                batch = {k: v.to(device) for k, v in batch.items() if k in keys}
                out = embedder(**batch)
                projected = out.projected_score if hasattr(out, "projected_score") else out[0]
                if not isinstance(projected, torch.Tensor) or projected.dim() != 2 or projected.shape[0] != len(rows):
                    # e.g. a plain BertModel: its first output is per token, which FAISS refused much later with
                    # "too many values to unpack".
                    raise TypeError(
                        f"{type(embedder).__name__} does not embed blocks: its output has no `projected_score` "
                        f"and its first output is {_describe_output(projected)}, not one vector per block of shape "
                        f"({len(rows)}, dim). Pass a `RealmEmbedder` (start one from a BERT checkpoint with "
                        "`realm_hf.init_from_bert`)."
                    )
                outputs.append(projected.float().cpu())
    finally:
        if moved:
            embedder.to(model_device)
        embedder.train(was_training)
    sorted_embeddings = torch.cat(outputs)
    embeddings = torch.empty_like(sorted_embeddings)
    embeddings[torch.from_numpy(order)] = sorted_embeddings
    return embeddings


def embed_questions(
    embedder: torch.nn.Module, tokenizer, questions: Sequence[str], batch_size: int = 64
) -> np.ndarray:
    """
    Question embeddings as a REALM model embeds its questions for retrieval: `[CLS] question [SEP]` through the
    question embedder's `projected_score`, in fp32 and eval mode (its mode is restored), on its device. Each question
    is checked first (`user_text.check_questions`: a non-string, an empty question, one with no known wordpiece or one
    longer than the embedder takes is refused, naming its position).

    Returns:
        `np.ndarray` of shape `(len(questions), dim)`, float32.
    """
    check_embedder_module(embedder)
    max_positions = getattr(getattr(embedder, "config", None), "max_position_embeddings", None)
    check_questions(questions, tokenizer, max_positions - 2 if max_positions else 510, max_positions)
    first_param = next(embedder.parameters(), None)
    device = first_param.device if first_param is not None else torch.device("cpu")
    was_training = embedder.training
    embedder.eval()
    outputs = []
    try:
        # fp32 even under an outer autocast: bf16 question vectors retrieve other blocks (see `embed_questions` of
        # `RealmForOpenQA`, whose embeddings these are).
        with torch.inference_mode(), torch.autocast(device.type, enabled=False):
            for start in range(0, len(questions), batch_size):
                encoded = tokenizer_call(
                    tokenizer, list(questions[start : start + batch_size]), padding=True, return_tensors="pt"
                )
                keys = ("input_ids", "attention_mask", "token_type_ids")
                outputs.append(
                    embedder(**{k: v.to(device) for k, v in encoded.items() if k in keys})
                    .projected_score.float()
                    .cpu()
                )
    finally:
        embedder.train(was_training)
    return torch.cat(outputs).numpy()


def _describe_output(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def embedder_dim(embedder) -> int | None:
    """The size of the vectors a REALM embedder makes (`config.retriever_proj_size`), or `None` when it has none."""
    config = getattr(embedder, "config", None)
    dim = getattr(config, "retriever_proj_size", None)
    return int(dim) if dim is not None else None
