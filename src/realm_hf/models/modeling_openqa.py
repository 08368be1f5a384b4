"""
End-to-end open-domain QA: `RealmForOpenQA` (retrieve, then read) and `answer()`, with its own document embedder for
end-to-end retriever training (top blocks re-embedded with gradient, stored vectors for the rest of the beam) and
Atlas's re-ranking of an over-retrieved beam (`config.rerank_beam_size`).
"""

from __future__ import annotations

import contextlib
import copy
import threading

import torch

from ..logging_utils import get_logger
from ..precision import autocast, check_int8, int8_answering_active, quantize_linear_layers
from ..retrieval.encoding import tokenize_blocks
from ..text.tokenizer_calls import tokenizer_call
from ..text.user_text import as_question_list, check_max_question_length, check_positive_int, check_questions
from .configuration_realm import RealmConfig
from .modeling_base import RealmPreTrainedModel
from .modeling_embedder import RealmEmbedder
from .modeling_reader import RealmReader
from .openqa_answers import (
    RealmForOpenQAOutput,
    answer_block_logits,
    best_answer,
    best_spans,
    check_finite_reader_logits,
    collect_answers,
    read_results,
    resolve_no_answer_threshold,
)
from .provenance import block_provenance
from .reader_inputs import (
    build_beam_reader_inputs,
    drop_unfilled_blocks,
    normalize_answer_ids,
    positive_block_order,
    tokenize_answers,
)
from .retriever_losses import apply_retriever_loss, needs_reader_attentions
from .retriever_owner import RetrieverOwnerMixin

logger = get_logger(__name__)

# Guards the count of `RealmForOpenQA.evaluating` callers (one lock for all models: held for a few attribute writes).
_MODE_LOCK = threading.Lock()
# Guards the building of a model's int8 copies (one lock for all models: concurrent first int8 calls build them once).
_INT8_LOCK = threading.Lock()


class RealmForOpenQA(RetrieverOwnerMixin, RealmPreTrainedModel):
    r"""
    End-to-end open-domain question answering: p(y|x) = sum over the top-k blocks z of p(y|z,x) p(z|x).

    The question is embedded with the question embedder (`query_embedder`, stored as `embedder` as in the legacy
    checkpoints), the top blocks are found by maximum inner product search in the `retriever`'s index (the corpus and
    index live outside the model weights), and `reader` scores answer spans in each (question, block) pair. Answers a
    whole batch of questions in one call. `document_embedder` is the model's own block embedder when it trains one
    end to end ([`~RealmForOpenQA.add_document_embedder`]), else `None`: the index was embedded outside the model.

    Args:
        config ([`RealmConfig`]): Model configuration.
        retriever ([`RealmRetriever`], *optional*):
            The knowledge corpus and its index: anything that satisfies the [`Retriever`] contract
            ([`RealmRetriever`], [`ShardedRealmRetriever`]).

    Example:

    ```python
    >>> from realm_hf import RealmForOpenQA, RealmTokenizer

    >>> model = RealmForOpenQA.from_pretrained("path/to/realm-model")  # loads the saved corpus + index too
    >>> tokenizer = RealmTokenizer.from_pretrained("path/to/realm-model")
    >>> questions = ["who wrote the art of computer programming?", "what is a compiler?"]
    >>> outputs = model(**tokenizer(questions, padding=True, return_tensors="pt"), questions=questions)
    >>> outputs.predicted_answers, outputs.retrieved_blocks[0][0]["title"]
    ```"""

    _tied_weights_keys = {
        "embedder.cls.predictions.decoder.bias": "embedder.cls.predictions.bias",
        "reader.cls.predictions.decoder.bias": "reader.cls.predictions.bias",
    }
    # The legacy port kept the whole corpus embedding matrix as a model buffer; it now belongs to the retriever.
    _keys_to_ignore_on_load_unexpected = [r"position_ids", r"^block_emb$"]
    # Blocks per document-embedder call when retrieved blocks are re-embedded with gradient (end-to-end training):
    # caps the size of one call's activations; an attribute, not a config field, as results change only by rounding.
    document_embedding_chunk_size = 64

    def __init__(self, config: RealmConfig, retriever=None):
        super().__init__(config)
        self.embedder = RealmEmbedder(config)
        self.reader = RealmReader(config)
        self.document_embedder = RealmEmbedder(config) if getattr(config, "use_document_embedder", False) else None
        self.set_retriever(retriever)
        self.post_init()

    def get_input_embeddings(self):
        """The question embedder's word embeddings (what PEFT and `resize_token_embeddings` look for)."""
        return self.query_embedder.get_input_embeddings()

    @property
    def query_embedder(self) -> RealmEmbedder:
        """The question embedder, `embedder` (the name its weights carry in every REALM Open-QA checkpoint)."""
        return self.embedder

    @property
    def index_embedder(self) -> RealmEmbedder:
        """
        The embedder that fills the index (what a re-index embeds the corpus with): the model's own
        `document_embedder` when it trains one end to end, else the question embedder (REALM's fine-tuning starts both
        from the same pre-trained weights, and keeps the index fixed).
        """
        return self.document_embedder if self.document_embedder is not None else self.query_embedder

    @property
    def searcher_beam_size(self) -> int:
        """Blocks retrieved per question: `searcher_beam_size` while training, `reader_beam_size` otherwise."""
        if self.training:
            return self.config.searcher_beam_size
        return self.config.reader_beam_size

    # ------------------------------------------------------------------------ end-to-end retriever training

    def add_document_embedder(self, embedder: RealmEmbedder | None = None, trainable: bool = True) -> RealmEmbedder:
        r"""
        Give the model its own document embedder, for end-to-end retriever training.

        By default REALM fine-tuning keeps the document embedder frozen: the index holds precomputed block
        embeddings and only the question embedder and reader train. With a document embedder, the top
        `config.document_gradient_beam_size` retrieved blocks of each question (default: the reader beam) are
        re-embedded in the forward pass while training, so the retrieval loss reaches the document side too; the
        rest of the searcher beam is scored with the index's stored embeddings. [`RealmReindexCallback`] refreshes
        the index with its weights.

        Args:
            embedder ([`RealmEmbedder`], *optional*):
                Initial weights, e.g. the pre-trained document embedder that built the index. Defaults to a copy of
                the question embedder (they start equal in REALM's fine-tuning from pre-training).
            trainable (`bool`, *optional*, defaults to `True`): Leave its parameters trainable.
        """
        embedder = copy.deepcopy(self.query_embedder) if embedder is None else embedder
        embedder.requires_grad_(trainable)
        self.document_embedder = embedder
        self.config.use_document_embedder = True
        return embedder

    def freeze_document_embedder(self) -> None:
        """Stop training the document embedder (the paper's fine-tuning setting); the index then stays fresh."""
        if self.document_embedder is not None:
            self.document_embedder.requires_grad_(False)

    def _trains_document_embedder(self) -> bool:
        return (
            self.document_embedder is not None
            and self.training
            and torch.is_grad_enabled()
            and any(p.requires_grad for p in self.document_embedder.parameters())
        )

    def _embed_blocks(self, tokenizer, blocks: list[list[dict]]) -> torch.Tensor:
        """
        Embed retrieved blocks with the live document embedder (with gradient): `[batch, n, proj]` for `n` blocks
        per question. One tokenization for all of them (as the index was embedded), then the embedder runs over
        `document_embedding_chunk_size` blocks at a time: that caps the transient memory of one call (attention
        scores, feed-forward activations); what backward keeps still grows with the number of blocks, which
        `config.document_gradient_beam_size` bounds.
        """
        flat = [block for row in blocks for block in row]
        # The same tokenization and truncation as the index was embedded with.
        encoded = tokenize_blocks(
            tokenizer,
            [block.get("title") for block in flat],
            [block["text"] for block in flat],
            max_length=getattr(self.retriever, "max_block_length", None),
            padding=True,
            return_tensors="pt",
        ).to(self.document_embedder.device)
        chunk = max(1, int(self.document_embedding_chunk_size))
        embeddings = torch.cat(
            [
                self.document_embedder(
                    **{key: value[start : start + chunk] for key, value in encoded.items()}, return_dict=True
                ).projected_score
                for start in range(0, len(flat), chunk)
            ]
        )
        return embeddings.view(len(blocks), len(blocks[0]), -1)

    def _document_gradient_beam_size(self, k: int, reader_beam_size: int | None = None) -> int:
        """
        Blocks per question re-embedded with gradient while the document embedder trains:
        `config.document_gradient_beam_size` (default: the blocks read, `config.reader_beam_size` unless the call
        says otherwise), at most `k` (the searcher beam).
        """
        m = getattr(self.config, "document_gradient_beam_size", None)
        if m is None:
            m = self.config.reader_beam_size if reader_beam_size is None else reader_beam_size
        return max(0, min(int(m), k))

    def _training_block_embeddings(
        self, tokenizer, search, question_projection, reader_beam_size: int | None = None
    ) -> torch.Tensor:
        """
        Block embeddings `[batch, k, proj]` for the relevance scores while the document embedder trains: fresh ones
        (with gradient) for the first `document_gradient_beam_size` blocks of each question's beam, the index's
        stored ones (no gradient) for the rest.
        """
        k = search.block_ids.shape[1]
        m = self._document_gradient_beam_size(k, reader_beam_size)
        device = question_projection.device
        fresh = self._embed_blocks(tokenizer, [row[:m] for row in search.blocks]).to(device) if m else None
        if fresh is not None and m == k:
            return fresh
        # The top blocks carry the gradient into the document side (REALM's pre-training back-propagates through 8
        # candidates); the stored vectors still give the rest of the beam its place in the retrieval marginal,
        # without activations kept for backward.
        stored = search.block_embeddings[:, m:].to(
            device, fresh.dtype if fresh is not None else question_projection.dtype
        )
        return stored if fresh is None else torch.cat([fresh, stored], dim=1)

    def _search_blocks(
        self,
        retriever,
        tokenizer,
        question_embeddings: torch.Tensor,
        k: int,
        questions=None,
        return_token_ids: bool = False,
        filter=None,
    ):
        """
        The top `k` blocks of each question (among those `filter` lets through) with their embeddings (and, on
        request, token ids; with the question texts, a hybrid retriever adds its BM25 candidates): the index's own
        top `k`, or, with
        `config.rerank_beam_size = L`, the best `k` of the index's top `L` re-scored with the current document
        embedder (Atlas's re-ranking: a stale index over-retrieves, the live embedder orders). The re-scored blocks
        carry their fresh embeddings (no gradient) and scores; evaluation and training alike.
        """
        beam = getattr(self.config, "rerank_beam_size", None)
        search_options = {"return_embeddings": True, "return_token_ids": return_token_ids, "questions": questions}
        if filter is not None:
            search_options["filter"] = filter  # a retriever without filters (sharded) refuses it by name
        if beam is None:
            return retriever.search(question_embeddings, k, **search_options)
        if self.document_embedder is None:
            raise ValueError(
                f"`config.rerank_beam_size={beam}` re-scores retrieved blocks with the model's document embedder, "
                "but the model has none: add one with `model.add_document_embedder()` (end-to-end training), or set "
                "`rerank_beam_size` to None (a frozen index needs no re-ranking)."
            )
        search = retriever.search(question_embeddings, min(max(beam, k), len(retriever)), **search_options)
        with torch.no_grad():
            fresh = self._embed_blocks(tokenizer, search.blocks).to(question_embeddings.device)
            scores = torch.einsum("bd,bkd->bk", question_embeddings.float(), fresh.float())
        # Blocks the index could not fill (-1) stay last.
        scores = scores.masked_fill(search.block_ids.to(scores.device) < 0, float("-inf"))
        order = scores.topk(min(k, scores.shape[1]), dim=1).indices
        reranked = search.reordered(order)  # ids, blocks and token ids in the new order
        reranked.scores = scores.gather(1, order)
        reranked.block_embeddings = fresh.gather(1, order.unsqueeze(-1).expand(-1, -1, fresh.shape[-1]))
        return reranked

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        r"""
        Load the model and the knowledge corpus saved with it (see [`RetrieverOwnerMixin.from_pretrained`] for the
        `retriever`, `load_retriever`, `allow_pickle` and `verify_checksums` arguments); warns when the reader was
        never trained ([`~RealmForOpenQA.warn_if_reader_untrained`]).
        """
        loaded = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        (loaded[0] if isinstance(loaded, tuple) else loaded).warn_if_reader_untrained()
        return loaded

    def warn_if_reader_untrained(self) -> bool:
        """
        Warn (once per model) when `config.reader_trained` says the reader's span head was never trained, as after
        [`init_from_bert`]: its answers are then arbitrary spans. Returns whether the reader is untrained.
        """
        if getattr(self.config, "reader_trained", True):
            return False
        if not getattr(self, "_warned_untrained_reader", False):
            self._warned_untrained_reader = True
            logger.warning(
                "This RealmForOpenQA's reader was never trained (config.reader_trained=False, e.g. fresh from "
                "init_from_bert): its span head is random, so its answers are arbitrary spans of the retrieved blocks. "
                "Fine-tune it first (RealmOpenQATrainer or `realm-hf train`); after training it in a loop of your own, "
                "set `model.config.reader_trained = True`."
            )
        return True

    def answering_modules(self) -> tuple[RealmEmbedder, RealmReader]:
        """
        The question embedder and reader that the current call runs: the model's own, or, inside int8 answering
        (`answer(dtype="int8")`, [`~realm_hf.precision.int8_answering`]), the model's question embedder and an int8
        copy of its reader whose BERT encoder has int8 linear layers ([`~realm_hf.precision.quantize_linear_layers`]).
        The question embedder stays fp32, as under bf16: retrieval separates blocks by score differences that int8
        question vectors lose (on bench/qa.py's model an int8 question embedder changed half the answers, an int8
        reader alone 4 of 64), for a few % of the time. The span scorer stays fp32 too. The copy shares every other
        tensor with the model, is built on the first int8 call and again after the weights change (training,
        `load_state_dict`, a move to another device), and is never saved: `save_pretrained` writes the float weights.
        """
        if not int8_answering_active():
            return self.query_embedder, self.reader
        if self.training:
            raise ValueError(
                "int8 is for answering only: call `model.eval()` (or answer with `model.answer`, which does) first."
            )
        check_int8(self.device)  # also when the context was entered by hand, not through `answer(dtype=...)`
        # In-place updates (an optimizer step, `load_state_dict`) bump a tensor's version, a move changes its address.
        key = tuple((p.data_ptr(), p._version) for p in self.reader.parameters())
        with _INT8_LOCK:
            cached = self.__dict__.get("_int8_reader")
            if cached is None or cached[0] != key:
                # Kept outside the module tree (a tuple, not a submodule): never in `state_dict` or a saved model.
                cached = (key, quantize_linear_layers(self.reader, ("realm",)))
                self.__dict__["_int8_reader"] = cached
        return self.query_embedder, cached[1]

    def embed_questions(self, input_ids, attention_mask=None, token_type_ids=None) -> torch.FloatTensor:
        """Question embeddings, shape `(batch_size, retriever_proj_size)`; in fp32 outside training, even under autocast."""
        # Searching many blocks separates scores finer than bf16 resolves: bf16 question vectors retrieved other blocks
        # than fp32 for most questions of bench/qa.py. One short question costs about 1% of reading its blocks.
        precision = contextlib.nullcontext() if self.training else torch.autocast(input_ids.device.type, enabled=False)
        with precision:
            return self.answering_modules()[0](
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, return_dict=True
            ).projected_score

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        answer_ids: list | None = None,
        answers: list[list[str]] | None = None,
        questions: list[str] | None = None,
        num_blocks: int | None = None,
        filter=None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> tuple | RealmForOpenQAOutput:
        r"""
        input_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`):
            Tokenized questions.
        answer_ids (`list`, *optional*):
            Gold answers as wordpiece ids: one list of answers (each a list of ids) per question. For a single
            question the legacy form `[answer][token]` is accepted too.
        answers (`list[list[str]]`, *optional*):
            Gold answers as strings, one list per question (alternative to `answer_ids`).
        questions (`list[str]`, *optional*):
            Question texts; if omitted they are decoded from `input_ids` (as the legacy port did).
        num_blocks (`int`, *optional*, defaults to `config.reader_beam_size`):
            Blocks the reader reads per question in this call; in evaluation mode also the blocks retrieved (in
            training mode `config.searcher_beam_size` are retrieved for the retrieval loss). A per-call argument: the
            config is never changed, so concurrent calls with different values do not interfere.
        filter (`dict` or `callable`, *optional*):
            Retrieve only blocks whose metadata match, as `retriever.search(filter=...)` takes it
            (`{"topic": "science"}`, `{"year": [1999, 2000]}`, a callable over a block). Fewer matching blocks than
            the beam are read as they are; a question for which the search finds none raises a `ValueError`.

        Returns:
            [`RealmForOpenQAOutput`]
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        if num_blocks is not None:
            num_blocks = check_positive_int(num_blocks, "num_blocks")
        reader_beam_size = self.config.reader_beam_size if num_blocks is None else num_blocks
        retriever = self.require_retriever()
        tokenizer = retriever.tokenizer
        if input_ids is None:
            raise ValueError("`input_ids` (the tokenized questions) are required.")
        batch_size = input_ids.shape[0]
        max_positions = getattr(self.config, "max_position_embeddings", None)
        if max_positions is not None and input_ids.shape[-1] > max_positions:
            # Caught here, not as a tensor-size error deep in the embeddings.
            raise ValueError(
                f"The tokenized questions are {input_ids.shape[-1]} wordpieces long (with special tokens), more than "
                f"the model's config.max_position_embeddings={max_positions}: shorten them (`max_question_length` "
                f"of at most {max_positions - 2})."
            )
        if questions is None:
            questions = [tokenizer.decode(ids, skip_special_tokens=True) for ids in input_ids]
        if len(questions) != batch_size:
            raise ValueError(f"Got {len(questions)} question texts for {batch_size} tokenized questions.")
        if answers is not None:
            if answer_ids is not None:
                raise ValueError("Pass either `answers` or `answer_ids`, not both.")
            if len(answers) != batch_size:
                raise ValueError(f"Got answers for {len(answers)} questions but the batch has {batch_size}.")
            answer_ids = tokenize_answers(tokenizer, answers)
        answer_ids = normalize_answer_ids(answer_ids, batch_size)

        # [batch, proj]
        question_projection = self.embed_questions(input_ids, attention_mask, token_type_ids)
        # Training retrieves the searcher beam for the retrieval loss; inference retrieves what it reads.
        k = min(self.searcher_beam_size if self.training or num_blocks is None else num_blocks, len(retriever))
        reader_beam_size = min(reader_beam_size, k)
        # One search gives everything read about the blocks, from one state of the corpus: their stored embeddings (the
        # retrieval score) and, for a searcher beam wider than what is read, their token ids (to find the answers in
        # it without tokenizing every pair).
        search = self._search_blocks(
            retriever, tokenizer, question_projection.detach(), k, questions, k > reader_beam_size, filter
        )
        search = drop_unfilled_blocks(search, questions)  # places no question's search filled (filters, IVF/HNSW)
        block_ids = search.block_ids
        reader_beam_size = min(reader_beam_size, block_ids.shape[1])
        if self._trains_document_embedder():
            # End-to-end: fresh embeddings for the top blocks, so the retrieval loss also trains the document
            # embedder; stored ones for the rest of the beam (memory bounded by `document_gradient_beam_size`).
            block_emb = self._training_block_embeddings(tokenizer, search, question_projection, reader_beam_size)
        else:
            # Re-score with the stored block vectors so the loss reaches the question embedder, as the legacy
            # einsum did.
            block_emb = search.block_embeddings.to(question_projection.device)
        # Retrieval logits in at least fp32, also under autocast: the softmax over the searcher beam needs their small
        # differences (bf16 keeps about 3 significant digits).
        score_dtype = torch.promote_types(question_projection.dtype, torch.float32)
        with torch.autocast(question_projection.device.type, enabled=False):
            relevance_score = torch.einsum(
                "bd,bkd->bk", question_projection.to(score_dtype), block_emb.to(score_dtype)
            )
        # Places a filtered search left empty (-1) take no share of p(z|x).
        relevance_score = relevance_score.masked_fill(block_ids.to(relevance_score.device) < 0, float("-inf"))

        reader = self.answering_modules()[1]

        def read_inputs(search):
            # Pairs for the blocks read; whether each block of the searcher beam holds an answer, from the corpus's
            # stored token ids (tokenizing thousands of pairs per question dominated a training step).
            return build_beam_reader_inputs(
                tokenizer,
                questions,
                search,
                answer_ids,
                max_length=self.config.reader_seq_len,
                reader_beam_size=reader_beam_size,
                return_offsets_mapping=getattr(tokenizer, "is_fast", False),
            ).to(reader.device)

        reader_inputs = read_inputs(search)
        order = None
        positive = self.training and getattr(self.config, "reader_beam_positive", False)
        if positive and reader_inputs.has_answers is not None:
            order = positive_block_order(reader_inputs.has_answers, reader_beam_size)
        if order is not None:
            # A block holding an answer from further down the searcher beam is read in the last place; the retrieval
            # loss is a marginal over the whole beam, so only the order changes.
            search = search.reordered(order)
            block_ids = search.block_ids
            relevance_score = relevance_score.gather(1, order.to(relevance_score.device))
            reader_inputs = read_inputs(search)
        # Answering weighs the read blocks as `config.answer_block_prior` says; training by REALM's retrieval scores.
        reader_output = reader(
            input_ids=reader_inputs.input_ids[:, :reader_beam_size],
            attention_mask=reader_inputs.attention_mask[:, :reader_beam_size],
            token_type_ids=reader_inputs.token_type_ids[:, :reader_beam_size],
            relevance_score=relevance_score if self.training else answer_block_logits(self.config, relevance_score),
            block_mask=reader_inputs.block_mask,
            has_answers=reader_inputs.has_answers,
            start_positions=reader_inputs.start_positions,
            end_positions=reader_inputs.end_positions,
            # Only attention distillation reads them (None keeps the reader's chunked, fused-attention path).
            output_attentions=True if needs_reader_attentions(self.config, reader_inputs.has_answers) else None,
            return_dict=True,
        )
        # `config.retriever_loss` other than REALM's marginal: the reader's signal replaces the retriever's loss.
        apply_retriever_loss(self.config, reader_output, relevance_score, reader_inputs)
        outputs = collect_answers(reader_output, reader_inputs, block_ids, relevance_score, search, tokenizer)
        if not return_dict:
            return reader_output, outputs.predicted_answer_ids
        return outputs

    @contextlib.contextmanager
    def evaluating(self):
        """
        Evaluation mode for the duration of a `with` block, safe with concurrent callers: the first caller in switches
        the model to `eval()`, the last one out restores the mode it found. [`~RealmForOpenQA.answer`] and the
        pipeline answer inside it; a plain `eval()` ... `train(was_training)` per call would let one thread's restore
        turn dropout (and the training-time searcher beam) on in the middle of another thread's forward.
        """
        with _MODE_LOCK:
            if getattr(self, "_evaluating_calls", 0) == 0:
                self._mode_before_evaluating = self.training
                self.eval()
            self._evaluating_calls = getattr(self, "_evaluating_calls", 0) + 1
        try:
            yield self
        finally:
            with _MODE_LOCK:
                self._evaluating_calls -= 1
                if self._evaluating_calls == 0:
                    self.train(self._mode_before_evaluating)

    @torch.inference_mode()
    def answer(
        self,
        questions: str | dict | list,
        tokenizer=None,
        batch_size: int = 16,
        max_question_length: int = 64,
        num_blocks: int | None = None,
        dtype: str | torch.dtype | None = None,
        top_k: int | None = None,
        align_to_words: bool = True,
        no_answer_threshold: float | None = None,
        filter=None,
    ):
        r"""
        Answer questions end to end, with provenance in the schema the pipeline and `realm-hf ask --json` share
        (docs/provenance.md).

        Args:
            questions (`str`, `dict` or `list`): A question, a `{"question": ...}` dict (as the pipeline takes), or a
                list of either. Every question is checked before any model work (`user_text.check_questions`): a
                non-string, an empty question, undecodable bytes, a question with no known wordpiece (only `[UNK]`)
                or one over `max_question_length` raises a `ValueError` naming its position in the list
                (`questions[i]`), and no question of the call is answered.
            tokenizer (*optional*): Question tokenizer; defaults to the retriever's.
            batch_size (`int`, *optional*, defaults to 16): Questions per forward pass.
            max_question_length (`int`, *optional*, defaults to 64): Questions longer than this many wordpieces are
                refused, and so are questions longer than the model takes (`config.max_position_embeddings` less
                `[CLS]` and `[SEP]`).
            num_blocks (`int`, *optional*, defaults to `config.reader_beam_size`): Blocks retrieved and read per
                question.
            dtype (`str` or `torch.dtype`, *optional*, defaults to fp32): Compute dtype. `"bf16"` runs the model
                under bf16 autocast where the CPU (AVX512-BF16 or AMX) or GPU (compute capability 8.0+) has native
                bf16, and in fp32 with a warning elsewhere (bf16 would be slower there); `"auto"` picks bf16 where
                it is native, silently; `"fp32"` or `None` is fp32. Retrieval scores and span logits stay fp32.
                `"int8"` (CPUs only) runs an int8 copy of the reader's encoder
                ([`~RealmForOpenQA.answering_modules`]); answers can differ from fp32's where spans nearly tie.
                Weights are never cast or changed. See [`~realm_hf.precision.resolve_autocast_dtype`].
            top_k (`int`, *optional*): The `top_k` best answers per question, as the pipeline's `top_k`: distinct
                span texts across the read blocks, best first, each at most `config.max_span_width` wordpieces (fewer
                when the blocks hold fewer). Each question then gets a list of answer dicts (a list of such lists for
                a list of questions). Without it, one answer dict per question.
            align_to_words (`bool`, *optional*, defaults to `True`): Widen each answer to whole words (a wordpiece
                span may start or end inside a word: "Ken Thom" becomes "Ken Thompson"), as the classic
                question-answering pipeline does. Needs a fast tokenizer's character offsets; with a slow tokenizer
                the wordpieces are decoded.
            no_answer_threshold (`float`, *optional*, defaults to `config.no_answer_threshold`): Answer "no answer"
                (`answer` `""`, `block` `None`, `score` the best span's probability) when the best span's
                probability is under this; with `top_k`, spans under it are dropped and a question left with none
                gets one "no answer". `None` (and a config without one): always the best span, as REALM answers; 0
                never abstains.
            filter (`dict` or `callable`, *optional*): Answer from the blocks whose metadata match only (see
                [`~RealmForOpenQA.forward`]); `retrieved` then lists only such blocks.

        Returns:
            A `dict` per question (a list of them for a list of questions) with `question`, `answer`, `score` (the
            span's probability over every span of every read block), `logit` (REALM's raw score: span logit +
            retrieval score), `start`, `end` (character offsets in `block["text"]`), `block` (the answer's block, see
            [`~realm_hf.models.provenance.block_provenance`]) and `retrieved` (every read block, best first, same dicts).
        """
        questions, single = as_question_list(questions)
        batch_size = check_positive_int(batch_size, "batch_size")
        if top_k is not None:
            top_k = check_positive_int(top_k, "top_k")
        check_max_question_length(max_question_length)
        if not isinstance(align_to_words, bool):
            raise ValueError(f"`align_to_words` must be True or False, got {align_to_words!r}.")
        no_answer_threshold = resolve_no_answer_threshold(self.config, no_answer_threshold)
        tokenizer = tokenizer if tokenizer is not None else self.require_retriever().tokenizer
        check_questions(
            questions, tokenizer, max_question_length, getattr(self.config, "max_position_embeddings", None)
        )
        precision = autocast(self.device, dtype, "answering")  # an unknown dtype fails here, before any model work
        self.warn_if_reader_untrained()
        results = []
        with self.evaluating():
            for start in range(0, len(questions), batch_size):
                chunk = questions[start : start + batch_size]
                inputs = tokenizer_call(tokenizer, chunk, padding=True, return_tensors="pt").to(self.device)
                with precision:
                    out = self(
                        input_ids=inputs["input_ids"],
                        attention_mask=inputs["attention_mask"],
                        token_type_ids=inputs.get("token_type_ids"),
                        questions=chunk,
                        num_blocks=num_blocks,
                        filter=filter,
                    )
                check_finite_reader_logits(out.reader_output.reader_logits)
                # The one answer path (`openqa_answers.best_spans`), as the pipeline and `realm-hf ask` answer.
                options = {
                    "align_to_words": align_to_words,
                    "skip_answers_in_question": self.config.skip_answers_in_question,
                    "no_answer_threshold": no_answer_threshold,
                }
                for b, result in enumerate(read_results(out, chunk)):
                    retrieved = [block_provenance(z) for z in out.retrieved_blocks[b] if z.get("block_id", 0) >= 0]
                    if top_k is None:
                        answer = best_answer(result, self.config.max_span_width, tokenizer, **options)
                        results.append({"question": chunk[b], **answer, "retrieved": retrieved})
                        continue
                    answers = best_spans(result, top_k, self.config.max_span_width, tokenizer, **options)
                    results.append([{"question": chunk[b], **answer, "retrieved": retrieved} for answer in answers])
        return results[0] if single else results
