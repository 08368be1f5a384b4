"""REALM model configuration."""

from __future__ import annotations

import numbers

from transformers import PreTrainedConfig

from ..io.consistent_reads import consistent_read


class RealmConfig(PreTrainedConfig):
    r"""
    Configuration of the REALM models ([`RealmEmbedder`], [`RealmScorer`], [`RealmKnowledgeAugEncoder`],
    [`RealmReader`], [`RealmForOpenQA`] and the pre-training heads). Every field of the legacy
    `transformers.RealmConfig` is kept under the same name, so a legacy `config.json` (e.g. from
    `google/realm-orqa-nq-openqa`) loads unchanged.

    Args:
        vocab_size (`int`, *optional*, defaults to 30522):
            Vocabulary size of the BERT encoders.
        hidden_size (`int`, *optional*, defaults to 768):
            Dimension of the encoder layers and the pooler layer.
        retriever_proj_size (`int`, *optional*, defaults to 128):
            Dimension of the retriever (embedder) projection, i.e. of the MIPS index.
        num_hidden_layers (`int`, *optional*, defaults to 12):
            Number of hidden layers in each BERT encoder.
        num_attention_heads (`int`, *optional*, defaults to 12):
            Number of attention heads for each attention layer.
        num_candidates (`int`, *optional*, defaults to 8):
            Number of retrieved documents per input in pre-training ([`RealmScorer`], [`RealmKnowledgeAugEncoder`]),
            the null document included.
        intermediate_size (`int`, *optional*, defaults to 3072):
            Dimension of the feed-forward layers.
        hidden_act (`str`, *optional*, defaults to `"gelu_new"`):
            Activation function of the encoders.
        hidden_dropout_prob (`float`, *optional*, defaults to 0.1):
            Dropout probability of the fully connected layers.
        attention_probs_dropout_prob (`float`, *optional*, defaults to 0.1):
            Dropout ratio of the attention probabilities.
        max_position_embeddings (`int`, *optional*, defaults to 512):
            Maximum sequence length.
        type_vocab_size (`int`, *optional*, defaults to 2):
            Vocabulary size of `token_type_ids`.
        initializer_range (`float`, *optional*, defaults to 0.02):
            Standard deviation of the truncated normal initializer.
        layer_norm_eps (`float`, *optional*, defaults to 1e-12):
            Epsilon of the encoder layer norms.
        span_hidden_size (`int`, *optional*, defaults to 256):
            Dimension of the reader's span representations.
        max_span_width (`int`, *optional*, defaults to 10):
            Maximum answer span width, in wordpieces.
        reader_layer_norm_eps (`float`, *optional*, defaults to 1e-3):
            Epsilon of the reader's span layer norm.
        reader_beam_size (`int`, *optional*, defaults to 5):
            Number of retrieved blocks the reader reads per question.
        reader_seq_len (`int`, *optional*, defaults to 320):
            Maximum length of a question + block reader input (288 block wordpieces + 32 for the question).
        num_block_records (`int`, *optional*, defaults to 13353718):
            Number of blocks in the knowledge corpus (informational; the corpus itself lives in the retriever).
        searcher_beam_size (`int`, *optional*, defaults to 5000):
            Number of blocks retrieved per question during training, for the retriever's marginal loss. At
            inference `reader_beam_size` blocks are retrieved.
        document_gradient_beam_size (`int`, *optional*):
            [`RealmForOpenQA`] with a trainable document embedder only: how many of the top blocks of each question's
            searcher beam are re-embedded with gradient while training. The rest of the beam is scored with the
            index's stored (detached) embeddings, so that the memory of a training step does not grow with
            `searcher_beam_size` (REALM back-propagates into the document embedder through 8 candidates in
            pre-training). Defaults to `reader_beam_size`; a value of at least `searcher_beam_size` re-embeds the
            whole beam, and `0` none (the loss then does not reach the document embedder).
        reader_beam_positive (`bool`, *optional*, defaults to `False`):
            [`RealmForOpenQA`] training only: when none of a question's `reader_beam_size` top blocks holds an answer
            but a lower-ranked block of its searcher beam does, the best-ranked such block takes the reader beam's
            last place for that step, so the reader learns from every question whose searcher beam holds an answer,
            not only from those the retriever already ranks well (as DPR trains its reader on a positive passage drawn
            from the retrieved ones). The retrieval loss, a marginal over the whole searcher beam, is unchanged;
            evaluation and inference always read the top blocks. `False` is REALM's fine-tuning.
        retriever_loss (`str`, *optional*, defaults to `"marginal"`):
            [`RealmForOpenQA`] training only: the retriever's loss. `"marginal"` is REALM's (-log of the retrieval
            probability of the searcher-beam blocks that hold an answer); `"emdr2"` (Sachan et al., 2021),
            `"perplexity_distillation"` and `"attention_distillation"` (Izacard et al., 2022, Atlas) take their target
            from the reader over the blocks it reads (`realm_hf.models.retriever_losses`, docs/training.md). Attention
            distillation needs the reader's attention probabilities: eager attention
            (`model.set_attn_implementation("eager")`).
        retriever_loss_temperature (`float`, *optional*, defaults to 1.0):
            Temperature θ of the retriever's distribution softmax(s / θ) in the two distillation losses.
        rerank_beam_size (`int`, *optional*):
            [`RealmForOpenQA`] with a document embedder only: over-retrieve this many blocks from the (possibly stale)
            index, re-embed them with the current document embedder and keep the best-scored `k` (Atlas's
            re-ranking), in training and at inference. Costs one document-embedder pass over this many blocks per
            question. `None` (default): the index's top `k` are used as they are.
        skip_answers_in_question (`bool`, *optional*, defaults to `False`):
            Answering only ([`RealmForOpenQA.answer`], the question-answering pipeline, `realm-hf ask`,
            `evaluate_openqa`): rank after every other candidate each answer that is a phrase of the question itself
            (its words, SQuAD-normalised, appear in the question next to each other and in the same order), such as
            "Carolingian Empire" for "which treaty split the carolingian empire in 843". A reader that is unsure
            answers with the subject of the block it reads, and that subject is often named in the question. The
            answer's words alone are not enough ("Kuwait City" for "the capital and largest city of Kuwait" stays).
            `False` is REALM's answer, the best span as scored; keep it for questions that offer a choice ("X or Y?").
        answer_block_prior (`str`, *optional*, defaults to `"retrieval"`):
            Answering only (as `skip_answers_in_question`): how the blocks read for a question are weighed against
            each other, the log p(z|x) added to each span's score. `"retrieval"` is REALM's, the retrieval scores
            (question · block inner products); `"rank"` is the block's place in the retriever's order, log p(z|x) =
            -rank + const, for a retriever whose order the inner products do not follow, such as hybrid retrieval's
            BM25 + dense reciprocal-rank fusion (`retriever.use_bm25(mode="rrf")`), where the inner products would
            undo the fusion when the reader picks a block. Training always uses the retrieval scores.
        no_answer_threshold (`float`, *optional*):
            Answering only (as `skip_answers_in_question`): the span probability (an answer's `score`) under which
            [`RealmForOpenQA.answer`], the question-answering pipeline, `realm-hf ask` and `realm-hf serve` return "no
            answer" (`answer` `""`, `block` `None`) instead of the best span. `None` (default) is REALM's behaviour:
            always the best span. A per-call `no_answer_threshold` (or the pipeline's `handle_impossible_answer`)
            overrides it; `bench/abstention.py` measures the answered share against the EM of what is answered for
            a few thresholds, from which a model's own is chosen.
        retriever_pooling (`str`, *optional*, defaults to `"cls"`):
            How the embedders turn an encoded text into the vector they project: `"cls"`, REALM's [CLS] pooler
            output (dense + tanh), or `"mean"`, the mean of the last hidden states over the attention mask, the
            pooling sentence encoders such as all-MiniLM-L6-v2 were trained with ([`init_from_bert`] picks it when
            the checkpoint's sentence-transformers pooling config says so). Legacy checkpoints use `"cls"`.
        reader_trained (`bool`, *optional*, defaults to `True`):
            Whether the reader's span head has been trained. [`init_from_bert`] sets it to `False` (the span scorer
            starts random, so answers are arbitrary spans), and a model that says `False` warns when it is loaded and
            when it answers. Training that updates the reader sets it back to `True`: [`RealmOpenQATrainer`] (hence
            `realm-hf train` and the recipes) does so at its first optimizer step; in a loop of your own set
            `model.config.reader_trained = True`. Checkpoints without the field (legacy ones) count as trained.
        base_model (`str`, *optional*):
            The Hub id of the checkpoint the model was initialised from ([`init_from_bert`]'s `base_model`, or its
            checkpoint directory when that is a Hub id); model cards list it as their `base_model`.

    Example:

    ```python
    >>> from realm_hf import RealmConfig, RealmEmbedder

    >>> configuration = RealmConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37)
    >>> model = RealmEmbedder(configuration)
    ```"""

    model_type = "realm"

    def __init__(
        self,
        vocab_size=30522,
        hidden_size=768,
        retriever_proj_size=128,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_candidates=8,
        intermediate_size=3072,
        hidden_act="gelu_new",
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        max_position_embeddings=512,
        type_vocab_size=2,
        initializer_range=0.02,
        layer_norm_eps=1e-12,
        span_hidden_size=256,
        max_span_width=10,
        reader_layer_norm_eps=1e-3,
        reader_beam_size=5,
        reader_seq_len=320,
        num_block_records=13353718,
        searcher_beam_size=5000,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        tie_word_embeddings=True,
        **kwargs,
    ):
        # Sizes are checked where they enter (a config.json among them), naming the field: they failed deep inside
        # torch or transformers ("integer modulo by zero", "empty(): argument 'size' failed to unpack").
        _check_size_fields(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            retriever_proj_size=retriever_proj_size,
            num_hidden_layers=num_hidden_layers,
            num_attention_heads=num_attention_heads,
            num_candidates=num_candidates,
            intermediate_size=intermediate_size,
            max_position_embeddings=max_position_embeddings,
            type_vocab_size=type_vocab_size,
            span_hidden_size=span_hidden_size,
        )
        # Common config
        self.vocab_size = vocab_size
        self.max_position_embeddings = max_position_embeddings
        self.hidden_size = hidden_size
        self.retriever_proj_size = retriever_proj_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_candidates = num_candidates
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.initializer_range = initializer_range
        self.type_vocab_size = type_vocab_size
        self.layer_norm_eps = layer_norm_eps
        self.pad_token_id = pad_token_id
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.tie_word_embeddings = tie_word_embeddings

        # Reader config: checked here, where a wrong value enters, instead of failing deep in a forward pass.
        _check_reader_fields(reader_beam_size, max_span_width, reader_seq_len, searcher_beam_size)
        self.span_hidden_size = span_hidden_size
        self.max_span_width = max_span_width
        self.reader_layer_norm_eps = reader_layer_norm_eps
        self.reader_beam_size = reader_beam_size
        self.reader_seq_len = reader_seq_len

        # Retrieval config
        self.num_block_records = num_block_records
        self.searcher_beam_size = searcher_beam_size
        # Not a constructor argument of the legacy config: read from kwargs so positional callers keep their order.
        document_gradient_beam_size = kwargs.pop("document_gradient_beam_size", None)
        if document_gradient_beam_size is not None and (
            isinstance(document_gradient_beam_size, bool)
            or not isinstance(document_gradient_beam_size, int)
            or document_gradient_beam_size < 0
        ):
            raise ValueError(
                "`document_gradient_beam_size` must be None (= `reader_beam_size`) or an integer >= 0, got "
                f"{document_gradient_beam_size!r}."
            )
        self.document_gradient_beam_size = document_gradient_beam_size
        self.reader_beam_positive = _pop_flag(kwargs, "reader_beam_positive", False)
        self.retriever_loss = _pop_choice(kwargs, "retriever_loss", "marginal", RETRIEVER_LOSSES)
        temperature = kwargs.pop("retriever_loss_temperature", 1.0)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
            raise ValueError(f"`retriever_loss_temperature` must be a number > 0, got {temperature!r}.")
        self.retriever_loss_temperature = float(temperature)
        rerank_beam_size = kwargs.pop("rerank_beam_size", None)
        if rerank_beam_size is not None and (
            isinstance(rerank_beam_size, bool) or not isinstance(rerank_beam_size, int) or rerank_beam_size < 1
        ):
            raise ValueError(f"`rerank_beam_size` must be None or a positive integer, got {rerank_beam_size!r}.")
        self.rerank_beam_size = rerank_beam_size
        self.skip_answers_in_question = _pop_flag(kwargs, "skip_answers_in_question", False)
        self.answer_block_prior = _pop_choice(kwargs, "answer_block_prior", "retrieval", ANSWER_BLOCK_PRIORS)
        self.no_answer_threshold = check_no_answer_threshold(kwargs.pop("no_answer_threshold", None))
        self.retriever_pooling = _pop_choice(kwargs, "retriever_pooling", "cls", RETRIEVER_POOLING_MODES)
        self.reader_trained = _pop_flag(kwargs, "reader_trained", True)
        base_model = kwargs.pop("base_model", None)
        if base_model is not None and not isinstance(base_model, str):
            raise ValueError(f"`base_model` must be a Hub model id (a string) or None, got {base_model!r}.")
        self.base_model = base_model

        # Fields transformers 5's BERT blocks read; the base config no longer carries them. REALM's encoders are
        # always bidirectional encoders without cross-attention or a KV cache.
        self.is_decoder = kwargs.pop("is_decoder", False)
        self.add_cross_attention = kwargs.pop("add_cross_attention", False)
        self.use_cache = kwargs.pop("use_cache", False)
        self.classifier_dropout = kwargs.pop("classifier_dropout", None)
        self.position_embedding_type = kwargs.pop("position_embedding_type", "absolute")
        # RealmForOpenQA only: a trainable document embedder for end-to-end retriever training (see
        # `RealmForOpenQA.add_document_embedder`). Legacy checkpoints have none: the index was precomputed.
        self.use_document_embedder = kwargs.pop("use_document_embedder", False)
        self.max_block_length = kwargs.pop("max_block_length", 288)

        super().__init__(**kwargs)

    @classmethod
    def get_config_dict(cls, pretrained_model_name_or_path, **kwargs):
        """
        As [`~transformers.PreTrainedConfig.get_config_dict`], but a checkpoint of another model type is an error.

        transformers only warns and then builds a REALM model with every weight freshly initialised, which answers
        nonsense without failing. A BERT checkpoint is a valid starting point, through `init_from_bert`.

        A local directory is read as one save, as the models and the tokenizer read it (see
        [`realm_hf.io.consistent_reads.consistent_read`]): an interrupted save is completed, a save in progress waited
        for, and a `config.json` that is a link leading out of the directory is refused.
        """
        with consistent_read(pretrained_model_name_or_path, kwargs.get("subfolder")):
            config_dict, kwargs = super().get_config_dict(pretrained_model_name_or_path, **kwargs)
        model_type = config_dict.get("model_type")
        if model_type is not None and model_type != cls.model_type:
            hint = (
                " To start REALM from BERT-family weights, use `realm_hf.models.initialization.init_from_bert(RealmForOpenQA, "
                f"{str(pretrained_model_name_or_path)!r})` (or the REALM class you need)."
                if model_type in _BERT_FAMILY
                else ""
            )
            raise ValueError(
                f"{pretrained_model_name_or_path} holds a `{model_type}` model, not a REALM one (config.json "
                f"model_type `{model_type}`, expected `{cls.model_type}`), so its weights would not be loaded.{hint}"
            )
        return config_dict, kwargs


#: The fields that size a REALM model's weights (each an integer >= 1).
SIZE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "retriever_proj_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_candidates",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
    "span_hidden_size",
)


def _check_size_fields(**sizes) -> None:
    for name, value in sizes.items():
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
            raise ValueError(f"`{name}` must be an integer of at least 1 (a size of the model), got {value!r}.")


def _check_reader_fields(reader_beam_size, max_span_width, reader_seq_len, searcher_beam_size) -> None:
    """Refuse reader and searcher sizes no forward pass can run with, naming the field and what is valid."""

    def is_int(value) -> bool:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)

    for name, value, meaning in (
        ("reader_beam_size", reader_beam_size, "the number of retrieved blocks the reader reads per question"),
        ("searcher_beam_size", searcher_beam_size, "the number of blocks retrieved per training question"),
        ("max_span_width", max_span_width, "the widest answer span, in wordpieces, that the reader scores"),
    ):
        if not is_int(value) or value < 1:
            raise ValueError(f"`{name}` ({meaning}) must be an integer of at least 1, got {value!r}.")
    # [CLS] question [SEP] block [SEP] with one wordpiece each, and room for the widest span.
    minimum = max(_MIN_READER_SEQ_LEN, max_span_width)
    if not is_int(reader_seq_len) or reader_seq_len < minimum:
        raise ValueError(
            f"`reader_seq_len` (the wordpieces of one [CLS] question [SEP] block [SEP] reader input) must be an integer "
            f"of at least {minimum} (at least {_MIN_READER_SEQ_LEN}, and at least max_span_width={max_span_width}, "
            f"the widest span scored), got {reader_seq_len!r}. REALM reads 320 (288-wordpiece blocks)."
        )


def check_no_answer_threshold(value, name: str = "no_answer_threshold") -> float | None:
    """
    `value` as a `float` in [0, 1] (a span probability), or `None`; else a `ValueError` naming `name`. 0 never
    abstains; `True` is refused (it would silently mean 1, abstaining on every question).
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) <= 1.0:
        raise ValueError(
            f"`{name}` must be a span probability from 0 to 1 (answers scored under it become 'no answer'; 0 never "
            f"abstains), got {value!r}."
        )
    return float(value)


def _pop_flag(kwargs: dict, name: str, default: bool) -> bool:
    """`kwargs[name]` (removed) or `default`, checked to be a bool."""
    value = kwargs.pop(name, default)
    if not isinstance(value, bool):
        raise ValueError(f"`{name}` must be True or False, got {value!r}.")
    return value


def _pop_choice(kwargs: dict, name: str, default: str, choices: tuple) -> str:
    """`kwargs[name]` (removed) or `default`, checked to be one of `choices`."""
    value = kwargs.pop(name, default)
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {', '.join(map(repr, choices))}, got {value!r}.")
    return value


# [CLS] q [SEP] b [SEP]: the shortest reader input that holds a question wordpiece and a block wordpiece.
_MIN_READER_SEQ_LEN = 5


# REALM's marginal likelihood, then its successors' (`retriever_losses.py`; kept here so the config imports no torch).
RETRIEVER_LOSSES = ("marginal", "emdr2", "attention_distillation", "perplexity_distillation")

# "cls": REALM's pooler output on [CLS]; "mean": masked mean of the last hidden states (sentence-transformers).
RETRIEVER_POOLING_MODES = ("cls", "mean")

# How answering weighs the read blocks: REALM's retrieval scores, or the retriever's order (`answer_block_prior`).
ANSWER_BLOCK_PRIORS = ("retrieval", "rank")

# Checkpoints `init_from_bert` can start REALM from (BERT layout: `embeddings`, `encoder.layer.N`, WordPiece).
_BERT_FAMILY = {"bert"}


__all__ = ["RealmConfig", "check_no_answer_threshold"]
