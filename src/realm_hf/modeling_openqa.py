"""End-to-end open-domain QA: `RealmForOpenQA` (retrieve, then read), its loading and saving, and `answer()`."""

from __future__ import annotations

import contextlib
import threading

import torch

from .configuration_realm import RealmConfig
from .file_utils import consistent_read
from .logging_utils import get_logger
from .modeling_base import RealmPreTrainedModel
from .modeling_embedder import RealmEmbedder
from .modeling_outputs import RealmForOpenQAOutput
from .modeling_reader import RealmReader
from .openqa_answers import _best_spans, check_finite_reader_logits, collect_answers
from .openqa_document_embedder import RealmOpenQADocumentEmbedderMixin
from .openqa_retrieval import load_retriever_for_checkpoint
from .precision import autocast
from .provenance import answer_record, block_provenance, span_log_probs
from .reader_inputs import build_beam_reader_inputs, normalize_answer_ids, positive_block_order, tokenize_answers
from .retriever_loading import check_retriever_dim
from .retriever_losses import apply_retriever_loss, needs_reader_attentions
from .text_inputs import as_question_list, check_max_question_length, check_positive_int, check_questions
from .tokenization_realm import tokenizer_call

# What `from_pretrained` calls, looked up in this module, to find a checkpoint's corpus (its name in earlier releases).
_load_retriever_for = load_retriever_for_checkpoint

logger = get_logger(__name__)

# Guards the count of `RealmForOpenQA.evaluating` callers (one lock for all models: held for a few attribute writes).
_MODE_LOCK = threading.Lock()


class RealmForOpenQA(RealmOpenQADocumentEmbedderMixin, RealmPreTrainedModel):
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

    def __init__(self, config: RealmConfig, retriever=None):
        super().__init__(config)
        self.embedder = RealmEmbedder(config)
        self.reader = RealmReader(config)
        self.document_embedder = RealmEmbedder(config) if getattr(config, "use_document_embedder", False) else None
        self.set_retriever(retriever)
        self.post_init()

    def get_input_embeddings(self):
        """The question embedder's word embeddings (what PEFT and `resize_token_embeddings` look for)."""
        return self.embedder.get_input_embeddings()

    @property
    def query_embedder(self) -> RealmEmbedder:
        """The question embedder, `embedder` (the name its weights carry in every REALM Open-QA checkpoint)."""
        return self.embedder

    @property
    def searcher_beam_size(self) -> int:
        """Blocks retrieved per question: `searcher_beam_size` while training, `reader_beam_size` otherwise."""
        if self.training:
            return self.config.searcher_beam_size
        return self.config.reader_beam_size

    def set_retriever(self, retriever) -> None:
        """Attach (or replace) the knowledge corpus this model retrieves from; its embedding size must match."""
        check_retriever_dim(retriever, self.config)
        self.retriever = retriever

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path,
        *model_args,
        retriever=None,
        load_retriever: bool = True,
        allow_pickle=False,
        verify_checksums: bool = True,
        **kwargs,
    ):
        r"""
        Load the model and, unless `retriever` is given or `load_retriever=False`, the knowledge corpus saved with it.

        Besides the usual [`~transformers.PreTrainedModel.from_pretrained`] arguments:

        Args:
            retriever ([`RealmRetriever`], *optional*):
                Corpus to attach instead of the one found in the checkpoint.
            load_retriever (`bool`, *optional*, defaults to `True`):
                Load the saved corpus and index. `False` loads the weights alone (nothing is read, downloaded or
                unpickled for the corpus; `model.retriever` is `None` unless `retriever` is given), e.g. to re-embed
                a corpus, convert weights, or answer from given contexts only.
            allow_pickle (`bool`, *optional*, defaults to `False`):
                For legacy checkpoints only: allow unpickling their `block_records.npy` (only for files you trust).
                Prefer converting once with `realm-hf convert`.
            verify_checksums (`bool`, *optional*, defaults to `True`):
                Compare the sha256 of the corpus, index, tokenizer and weight files of a local directory with those
                recorded at save time (about 1 s per GB, see [`RealmRetriever.from_pretrained`]); `False` compares
                sizes only, for trusted local files.

        A local directory whose save was interrupted while its files were being swapped in is completed first (see
        [`~RealmForOpenQA.save_pretrained`]); weights and retriever from two different saves are refused.
        """
        # One save: no save into the directory swaps files in between the weights and the retriever being read.
        with consistent_read(pretrained_model_name_or_path, kwargs.get("subfolder")):
            loaded = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
            model = loaded[0] if isinstance(loaded, tuple) else loaded  # output_loading_info=True gives (model, info)
            if retriever is None and load_retriever:
                retriever = _load_retriever_for(
                    model,
                    pretrained_model_name_or_path,
                    allow_pickle=allow_pickle,
                    verify_checksums=verify_checksums,
                    **kwargs,
                )
        model.set_retriever(retriever)
        model.warn_if_reader_untrained()
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

    def save_pretrained(self, save_directory, *args, save_retriever: bool = True, model_card: bool = True, **kwargs):
        r"""
        Save the weights and config as usual and, when a retriever is attached, the corpus, FAISS index and
        manifest in `save_directory/retriever/`, so that one directory (or Hub repo) holds everything
        [`~RealmForOpenQA.from_pretrained`] needs to answer questions.

        The save is all-or-nothing, even if the process is killed at any moment: everything is written (and flushed
        to disk) into a temporary folder inside `save_directory` first, then swapped in under a journal, so the
        directory always loads as exactly the previous save or exactly this one (an interrupted swap is completed
        by the next load or save). Only what the save writes is replaced (weights, config, `README.md`,
        `retriever/`, and weight shards of an earlier save it supersedes): your other files in the directory, such
        as a Trainer's `checkpoint-*` folders, are kept. The retriever's manifest records the sha256 of these
        weights, so that weights and index from two different saves are refused at load.

        Args:
            save_retriever (`bool`, *optional*, defaults to `True`): Also save the attached retriever. Without it, a
                `retriever/` already in the directory is kept (and now goes with these weights).
            model_card (`bool`, *optional*, defaults to `True`): Write (or update) the README.md model card; text
                written by hand in an existing card is kept.
            tokenizer (*optional*): A tokenizer to save in the same all-or-nothing swap (the pipeline and
                `realm-hf train` pass theirs), so that a crash never leaves weights of one save beside the tokenizer of
                another.
            corpus_format (`str`, *optional*, defaults to `"arrow"`): Format of the saved corpus: `"arrow"`
                (memory-mapped on load) or `"parquet"` (shards any Parquet tool reads; what
                [`~RealmForOpenQA.push_to_hub`] uploads). See [`RealmRetriever.save_pretrained`].
        """
        if self.retriever is not None:
            # The attached corpus's size, not the config's default (REALM's 13,353,718 Wikipedia blocks).
            self.config.num_block_records = len(self.retriever)
        retriever = self.retriever if save_retriever else None
        if retriever is not None and retriever.collective:
            # One process saves a model, but every process holds a part of a sharded corpus: its save is collective.
            logger.warning(
                "The model's retriever is sharded across processes: it is not saved with the model. Save it with "
                "`model.retriever.save_pretrained(directory)` on every process (docs/sharding.md)."
            )
            retriever = None
        write_card = self._card_writer(save_directory, retriever) if model_card else None
        self._save_directory(save_directory, args, kwargs, retriever=retriever, write_extra=write_card)

    def push_to_hub(self, repo_id: str, **kwargs):
        r"""
        Push weights, config, tokenizer, corpus + FAISS index (`retriever/`) and model card to one Hub repo.
        See [`realm_hf.hub.push_to_hub`] for the arguments (e.g. `tokenizer=`, `private=`, `revision=`).
        """
        from .hub import push_to_hub

        return push_to_hub(self, repo_id, **kwargs)

    def require_retriever(self):
        """
        The attached retriever; raises a `ValueError` that says how to attach one (or, for a legacy checkpoint, how
        to convert it) when there is none.
        """
        if self.retriever is None:
            hint = ""
            if getattr(self, "legacy_block_emb", None) is not None:
                hint = (
                    " This is a legacy checkpoint: its block embeddings were found, but its block texts are in a pickled"
                    " `block_records.npy`. Convert it once with `realm-hf convert <legacy_dir> <output_dir>` (or load"
                    " with `allow_pickle=True` if you trust the file)."
                )
            raise ValueError(
                "RealmForOpenQA has no retriever: build a corpus with `RealmRetriever.from_documents(...)` and pass it"
                " with `model.set_retriever(retriever)` or `from_pretrained(..., retriever=retriever)`." + hint
            )
        return self.retriever

    def _require_retriever(self):
        # The private name earlier releases used (and other modules called); kept for their callers.
        return self.require_retriever()

    def embed_questions(self, input_ids, attention_mask=None, token_type_ids=None) -> torch.FloatTensor:
        """Question embeddings, shape `(batch_size, retriever_proj_size)`; in fp32 outside training, even under autocast."""
        # Searching many blocks separates scores finer than bf16 resolves: bf16 question vectors retrieved other blocks
        # than fp32 for most questions of bench/qa.py. One short question costs about 1% of reading its blocks.
        precision = contextlib.nullcontext() if self.training else torch.autocast(input_ids.device.type, enabled=False)
        with precision:
            return self.embedder(
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
            retriever, tokenizer, question_projection.detach(), k, questions, return_token_ids=k > reader_beam_size
        )
        block_ids = search.block_ids
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
            ).to(self.reader.device)

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
        reader_output = self.reader(
            input_ids=reader_inputs.input_ids[:, :reader_beam_size],
            attention_mask=reader_inputs.attention_mask[:, :reader_beam_size],
            token_type_ids=reader_inputs.token_type_ids[:, :reader_beam_size],
            relevance_score=relevance_score,
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
    ):
        r"""
        Answer questions end to end, with provenance in the schema the pipeline and `realm-hf ask --json` share
        (docs/provenance.md).

        Args:
            questions (`str`, `dict` or `list`): A question, a `{"question": ...}` dict (as the pipeline takes), or a
                list of either. Every question is checked before any model work (`text_inputs.check_questions`): a
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
                Weights are not cast. See [`~realm_hf.precision.resolve_autocast_dtype`].
            top_k (`int`, *optional*): The `top_k` best answers per question, as the pipeline's `top_k`: distinct
                span texts across the read blocks, best first, each at most `config.max_span_width` wordpieces (fewer
                when the blocks hold fewer). Each question then gets a list of answer dicts (a list of such lists for
                a list of questions). Without it, one answer dict per question.

        Returns:
            A `dict` per question (a list of them for a list of questions) with `question`, `answer`, `score` (the
            span's probability over every span of every read block), `logit` (REALM's raw score: span logit +
            retrieval score), `start`, `end` (character offsets in `block["text"]`), `block` (the answer's block, see
            [`~realm_hf.provenance.block_provenance`]) and `retrieved` (every read block, best first, same dicts).
        """
        questions, single = as_question_list(questions)
        batch_size = check_positive_int(batch_size, "batch_size")
        if top_k is not None:
            top_k = check_positive_int(top_k, "top_k")
        check_max_question_length(max_question_length)
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
                    )
                reader_output = out.reader_output
                check_finite_reader_logits(reader_output.reader_logits)
                for b, question in enumerate(chunk):
                    if top_k is not None:
                        results.append(self._top_answers(out, b, question, top_k, tokenizer))
                        continue
                    row, candidate = int(reader_output.block_idx[b]), int(reader_output.candidate[b])
                    log_probs = span_log_probs(reader_output.reader_logits[b])
                    span = out.answer_char_spans[b]
                    retrieved = [block_provenance(block) for block in out.retrieved_blocks[b]]
                    record = answer_record(
                        out.predicted_answers[b],
                        score=float(log_probs[row, candidate].exp()),
                        logit=float(out.answer_scores[b]),
                        start=span[0] if span else None,
                        end=span[1] if span else None,
                        block=retrieved[row],
                    )
                    results.append({"question": question, **record, "retrieved": retrieved})
        return results[0] if single else results

    def _top_answers(self, out: RealmForOpenQAOutput, b: int, question: str, top_k: int, tokenizer) -> list[dict]:
        # The pipeline's selection (`_best_spans`) over question `b`'s read blocks, in `answer()`'s schema.
        reader_output = out.reader_output
        num_read = reader_output.reader_logits.shape[1]
        retrieved = [block_provenance(block) for block in out.retrieved_blocks[b]]
        offsets = out.reader_offset_mapping
        result = {
            "logits": reader_output.reader_logits[b].detach().float().cpu(),
            "starts": reader_output.candidate_starts.cpu(),
            "ends": reader_output.candidate_ends.cpu(),
            "offsets": offsets[b, :num_read].cpu() if offsets is not None else None,
            "input_ids": out.reader_input_ids[b, :num_read].cpu(),
            "texts": [block["text"] for block in out.retrieved_blocks[b][:num_read]],
            "blocks": retrieved[:num_read],
        }
        answers = _best_spans(result, top_k, self.config.max_span_width, tokenizer)
        return [{"question": question, **answer, "retrieved": retrieved} for answer in answers]
