"""
[`RealmQuestionAnsweringPipeline`]: open-domain questions answered by retrieval from the model's corpus and the reader,
or, when a `context` is given, by the reader on that context alone (as the classic extractive QA pipeline does).

With what it takes: a question string or dict, its context, a streamed dataset; and the options of transformers'
classic question-answering pipeline, mapped to REALM's own parameters where they mean something for REALM, refused with
a `ValueError` saying why where not.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterator, Mapping

import torch
from transformers import Pipeline

from ..logging_utils import get_logger
from ..models.configuration_realm import check_no_answer_threshold
from ..models.modeling_base import RealmPreTrainedModel
from ..models.modeling_openqa import RealmForOpenQA
from ..models.openqa_answers import (
    best_answer,
    best_spans,
    check_finite_reader_logits,
    read_results,
    resolve_no_answer_threshold,
)
from ..models.provenance import block_provenance
from ..precision import autocast, parse_dtype
from ..text.tokenizer_calls import tokenizer_call
from ..text.user_text import check_context as _check_context
from ..text.user_text import check_positive_int, check_questions
from ..text.user_text import question_example as _to_example

__all__ = ["RealmQuestionAnsweringPipeline", "CLASSIC_ALIASES", "CLASSIC_REFUSED", "map_classic_options"]


logger = get_logger(__name__)

_DEFAULT_BATCH_SIZE = 8
_DEFAULT_MAX_QUESTION_LENGTH = 64
_DEFAULT_DOC_STRIDE = 128


class RealmQuestionAnsweringPipeline(Pipeline):
    r"""
    Open-domain question answering with REALM: each question is embedded, the `num_blocks` most relevant blocks are
    retrieved from the model's corpus (its [`RealmRetriever`]), and the reader scores every answer span of at most
    `max_answer_len` wordpieces in each block. A question that comes with a `context` is answered from that context by
    the reader alone (no retrieval; the context gets relevance score 0 and is split into overlapping windows when it
    is longer than `config.reader_seq_len`).

    Inputs: a question (`str`), a dict `{"question": ..., "context": ...}` (`context` optional), a list of either, or
    the keyword arguments `question=` / `context=` (each a string or a list). Lists are batched through the model:
    one forward pass per `batch_size` questions.

    Each answer is a dict in the schema `RealmForOpenQA.answer()` and `realm-hf ask --json` share
    (docs/provenance.md):

    - `answer` (`str`): the span, cut from the original block (or context) text;
    - `score` (`float`): the span's probability under the reader, i.e. the softmax of REALM's span logits over every
      span of every read block (for REALM this is p(span, block | question) restricted to the retrieved blocks);
    - `logit` (`float`): REALM's raw score of the span, span logit + retrieval score of its block (the quantity the
      model maximises; with a context the retrieval score is 0);
    - `start`, `end` (`int`): character offsets of the answer in `block["text"]`;
    - `block` (`dict`): provenance from [`~realm_hf.models.provenance.block_provenance`]: `block_id`, `doc_id`, `title`,
      `text`, `retrieval_score` and the corpus's other columns. For a `context` answer the block is the context:
      `block_id`, `doc_id` and `title` are `None`, `retrieval_score` is 0.

    With `top_k=1` each question gets one dict, otherwise a list of up to `top_k` dicts with distinct answer texts
    (compared case- and whitespace-insensitively), best first.

    Example:

    ```python
    >>> import realm_hf

    >>> qa = realm_hf.pipeline("question-answering", model="path/to/realm-model")
    >>> qa("what is a compiler?")
    {'answer': ..., 'score': ..., 'logit': ..., 'start': ..., 'end': ..., 'block': {'block_id': ..., 'title': ..., ...}}
    >>> qa(["what is a compiler?", "who wrote unix?"], top_k=3)  # one forward pass, three answers each
    >>> qa(question="who wrote unix?", context="Unix was written by Ken Thompson and Dennis Ritchie.")
    ```

    Args:
        model ([`RealmForOpenQA`]): The model, with its retriever attached (not needed for `context=` inputs).
        tokenizer (*optional*): Question tokenizer; defaults to the retriever's tokenizer.
        top_k (`int`, *optional*, defaults to 1): Answers per question.
        max_answer_len (`int`, *optional*, defaults to `config.max_span_width`): Longest answer, in wordpieces; at
            most `config.max_span_width` (the reader scores no longer span).
        num_blocks (`int`, *optional*, defaults to `config.reader_beam_size`): Blocks retrieved and read per question.
        filter (`dict` or `callable`, *optional*): Retrieve only blocks whose metadata match (`{"topic": "science"}`,
            `{"year": [1999, 2000]}`, a callable over a block), as `RealmRetriever.search` takes it; a question for
            which no block matches raises a `ValueError`. Questions with a `context` ignore it.
        max_question_length (`int`, *optional*, defaults to 64): Longer questions (in wordpieces) are refused, not
            truncated. The classic name `max_question_len` is accepted too; `max_seq_len`, `padding` and `topk`
            raise a `ValueError` saying why.
        handle_impossible_answer (`bool`, *optional*): As in the classic pipeline, allow "no answer": `answer` `""`,
            `block` `None` and `score` the best span's probability, when the best span's probability is under
            `no_answer_threshold` (defaults to `config.no_answer_threshold`, else 0.1). `False`: always the best
            span (REALM's answer). Not given: `config.no_answer_threshold` decides (none: always the best span).
        no_answer_threshold (`float`, *optional*): The span probability under which the answer is "no answer"
            (implies `handle_impossible_answer=True`); with `top_k`, spans under it are dropped.
        doc_stride (`int`, *optional*, defaults to 128): Overlap, in wordpieces, of the windows a long context is
            split into.
        align_to_words (`bool`, *optional*, defaults to `True`): Widen each answer to whole words (a wordpiece span
            may start or end inside a word), as the classic pipeline and `RealmForOpenQA.answer()` do. Needs a fast
            tokenizer's character offsets (`True` asked explicitly of a slow tokenizer is an error; by default a slow
            tokenizer's answers are its decoded wordpieces).
        batch_size (`int`, *optional*, defaults to 8): Questions per forward pass.
        dtype (`str` or `torch.dtype`, *optional*, defaults to fp32): Compute dtype of each call (`qa(q, dtype="bf16")`,
            or `realm_hf.pipeline(..., dtype="bf16")` for every call): bf16 autocast where the device has native bf16,
            `"auto"` for bf16 only there, `"int8"` for int8 encoders on a CPU; see `RealmForOpenQA.answer`. (`dtype=` of this class's constructor keeps
            transformers' meaning, the dtype the weights are loaded in.)
    """

    _load_tokenizer = None  # optional: the retriever carries one
    _load_processor = False
    _load_image_processor = False
    _load_video_processor = False
    _load_feature_extractor = False

    def __init__(self, model, tokenizer=None, **kwargs):
        if not isinstance(model, RealmForOpenQA):
            raise TypeError(
                f"RealmQuestionAnsweringPipeline needs a RealmForOpenQA model, got {type(model).__name__}. Load one with "
                "`RealmForOpenQA.from_pretrained(path)`."
            )
        if tokenizer is None and getattr(model, "retriever", None) is not None:
            tokenizer = getattr(model.retriever, "tokenizer", None)
        super().__init__(model=model, tokenizer=tokenizer, **kwargs)
        if self.tokenizer is None:
            raise ValueError(
                "The model has no retriever (no corpus and index attached, e.g. loaded with `load_retriever=False` or "
                "saved without one), so the pipeline has no tokenizer to take from it and could not answer open "
                "questions. Attach a corpus first: `model.set_retriever(RealmRetriever.from_documents(documents, "
                "model.index_embedder, tokenizer))`, or load a directory saved with its `retriever/`. To answer from given "
                "contexts only (`qa(question=..., context=...)`), pass `tokenizer=RealmTokenizer.from_pretrained(path)`."
            )
        model.warn_if_reader_untrained()
        # Batch by default: REALM's cost is per forward (retrieval + k reader passes), so batching pays off.
        if self._batch_size is None:
            self._batch_size = _DEFAULT_BATCH_SIZE

    # ----------------------------------------------------------------------------------------------------------------
    # Parameters and inputs
    # ----------------------------------------------------------------------------------------------------------------

    def _sanitize_parameters(
        self,
        top_k=None,
        max_answer_len=None,
        num_blocks=None,
        max_question_length=None,
        doc_stride=None,
        align_to_words=None,
        dtype=None,
        handle_impossible_answer=None,
        no_answer_threshold=None,
        filter=None,
        **kwargs,
    ):
        # The classic question-answering options: mapped to REALM's own, or refused with the reason (`map_classic_options`).
        if "max_question_len" in kwargs and max_question_length is not None:
            raise ValueError("Give either `max_question_len` or `max_question_length` (the same option), not both.")
        kwargs = map_classic_options(kwargs)
        max_question_length = kwargs.pop("max_question_length", max_question_length)
        if kwargs:
            raise TypeError(
                f"Unknown arguments for the REALM question-answering pipeline: {sorted(kwargs)}. It takes `top_k`, "
                "`num_blocks`, `filter`, `max_answer_len`, `max_question_length` (or `max_question_len`), `doc_stride`, "
                "`align_to_words`, `handle_impossible_answer`, `no_answer_threshold`, `dtype` and `batch_size`."
            )
        preprocess_params, forward_params, postprocess_params = {}, {}, {}
        if top_k is not None:
            postprocess_params["top_k"] = check_positive_int(top_k, "top_k")
        if max_answer_len is not None:
            max_width = self.model.config.max_span_width
            if not isinstance(max_answer_len, int) or not 1 <= max_answer_len <= max_width:
                raise ValueError(
                    f"`max_answer_len` must be an integer between 1 and config.max_span_width={max_width} (the reader "
                    f"scores no longer span), got {max_answer_len!r}."
                )
            postprocess_params["max_answer_len"] = max_answer_len
        if num_blocks is not None:
            forward_params["num_blocks"] = check_positive_int(num_blocks, "num_blocks")
        if filter is not None:
            if not (isinstance(filter, Mapping) or callable(filter)):
                from ..retrieval.filters import FILTER_FORMS  # deferred: `import realm_hf` keeps off datasets

                raise TypeError(f"{FILTER_FORMS}; got {type(filter).__name__}.")
            forward_params["filter"] = filter
        if doc_stride is not None:
            if not isinstance(doc_stride, int) or doc_stride < 0:
                raise ValueError(f"`doc_stride` must be a non-negative integer, got {doc_stride!r}.")
            forward_params["doc_stride"] = doc_stride
        if dtype is not None:
            forward_params["dtype"] = parse_dtype(dtype)  # an unknown dtype fails at the call, before any model work
        if max_question_length is not None:
            preprocess_params["max_question_length"] = max_question_length
        if align_to_words is not None:
            if not isinstance(align_to_words, bool):
                raise ValueError(f"`align_to_words` must be True or False, got {align_to_words!r}.")
            if align_to_words and not getattr(self.tokenizer, "is_fast", False):
                raise ValueError(
                    "`align_to_words=True` needs the character offsets of a fast tokenizer; load the pipeline with a "
                    "fast one (e.g. `RealmTokenizerFast.from_pretrained(path)`)."
                )
            postprocess_params["align_to_words"] = align_to_words
        if handle_impossible_answer is not None or no_answer_threshold is not None:
            # Checked now (before any model work), resolved per call in `postprocess` against the model's config.
            resolve_no_answer_threshold(self.model.config, no_answer_threshold, handle_impossible_answer)
            if handle_impossible_answer is not None:
                postprocess_params["handle_impossible_answer"] = handle_impossible_answer
            if no_answer_threshold is not None:
                postprocess_params["no_answer_threshold"] = check_no_answer_threshold(no_answer_threshold)
        return preprocess_params, forward_params, postprocess_params

    def __call__(self, inputs=None, *args, question=None, context=None, **kwargs):
        r"""
        Answer one or several questions.

        Args:
            inputs (`str`, `dict` or a list of them): Questions, or dicts with `question` and optional `context`.
            question (`str` or `list[str]`, *optional*): Alternative to `inputs`.
            context (`str` or `list[str]`, *optional*): Passages to answer from instead of retrieving; one for all
                questions or one per question.
            kwargs: `top_k`, `max_answer_len`, `num_blocks`, `filter`, `max_question_length`, `doc_stride`, `align_to_words`,
                `batch_size`, `dtype`, and the classic question-answering options that mean something for REALM (see
                [`~realm_hf.pipelines.question_answering.map_classic_options`]).

        Returns:
            One answer (a `dict`, or a list of `top_k` dicts) per question; a list of those for a list of questions;
            an iterator of those, consumed lazily, for a `datasets.Dataset` (its `question` column, and its `context`
            column if it has one), a torch `Dataset` or a generator.
        """
        if inputs is None and question is None:
            raise ValueError("Give a question: `qa('...')`, `qa(['...', ...])` or `qa(question='...')`.")
        if inputs is not None and question is not None:
            raise ValueError("Pass the questions either as `inputs` or as `question=`, not both.")
        if inputs is None:
            inputs = question
        if is_hf_dataset(inputs):
            inputs = dataset_questions(inputs)
        if isinstance(inputs, (types.GeneratorType,)) or _is_dataset(inputs):
            if context is not None:
                raise ValueError("With a dataset or generator, give each item its own `context`.")
            # Streamed inputs are validated item by item in `preprocess`.
            return super().__call__(inputs, *args, **kwargs)

        single = not isinstance(inputs, (list, tuple))
        examples = self._normalize_inputs([inputs] if single else list(inputs), context)
        call_params = {k: v for k, v in kwargs.items() if k not in ("batch_size", "num_workers")}
        preprocess_params = self._sanitize_parameters(**call_params)[0]
        max_question_length = {**self._preprocess_params, **preprocess_params}.get(
            "max_question_length", _DEFAULT_MAX_QUESTION_LENGTH
        )
        # Validate the whole list before any model work, so one bad question fails fast with a clear message.
        check_questions(
            [ex["question"] for ex in examples], self.tokenizer, max_question_length, _max_positions(self.model)
        )
        outputs = super().__call__(examples, *args, **kwargs)
        return outputs[0] if single else outputs

    @staticmethod
    def _normalize_inputs(items: list, context) -> list[dict]:
        if not items:
            raise ValueError("No questions given.")
        if context is not None and not isinstance(context, str):
            if not isinstance(context, (list, tuple)):
                _check_context(context)  # bytes, a number, ...: refused naming its type
            context = list(context)
            if len(context) != len(items):
                raise ValueError(f"Got {len(context)} contexts for {len(items)} questions.")
        examples = []
        for i, item in enumerate(items):
            example = _to_example(item)
            if context is not None:
                if example["context"] is not None:
                    raise ValueError("A question carries its own `context` and `context=` was given too.")
                example["context"] = context if isinstance(context, str) else context[i]
            _check_context(example["context"])
            examples.append(example)
        return examples

    def preprocess(self, inputs, max_question_length: int = _DEFAULT_MAX_QUESTION_LENGTH):
        example = _to_example(inputs)
        _check_context(example["context"])
        check_questions([example["question"]], self.tokenizer, max_question_length, _max_positions(self.model))
        # Tokenization happens per batch in `_forward`: the reader pairs each question with blocks that are only known
        # after retrieval, and a long context yields a variable number of windows, which the default collator cannot
        # pad. Strings are collated into lists.
        return {"question": example["question"], "context": example["context"]}

    # ----------------------------------------------------------------------------------------------------------------
    # Model
    # ----------------------------------------------------------------------------------------------------------------

    def _forward(
        self,
        model_inputs,
        num_blocks: int | None = None,
        doc_stride: int = _DEFAULT_DOC_STRIDE,
        dtype=None,
        filter=None,
    ):
        questions, contexts = model_inputs["question"], model_inputs["context"]
        if isinstance(questions, str):  # batch_size=1: items are not collated
            questions, contexts = [questions], [contexts]
        results: list[dict | None] = [None] * len(questions)
        open_rows = [i for i, c in enumerate(contexts) if c is None]
        context_rows = [i for i, c in enumerate(contexts) if c is not None]
        # A model fresh from training would retrieve `searcher_beam_size` blocks and keep dropout on; `evaluating`
        # switches to eval mode in a way that concurrent calls cannot undo for each other.
        with self.model.evaluating(), autocast(self.model.device, dtype, "answering"):
            if open_rows:
                read = self._retrieve_and_read([questions[i] for i in open_rows], num_blocks, filter)
                for row, result in zip(open_rows, read):
                    results[row] = result
            if context_rows:
                read = self._read_contexts(
                    [questions[i] for i in context_rows], [contexts[i] for i in context_rows], doc_stride
                )
                for row, result in zip(context_rows, read):
                    results[row] = result
        for result in results:
            check_finite_reader_logits(result["logits"])
        # One dict per question inside a list: the pipeline's un-batching hands each question its own dict.
        return {"results": results}

    def _retrieve_and_read(self, questions: list[str], num_blocks: int | None, filter=None) -> list[dict]:
        self.model.require_retriever()
        encoded = tokenizer_call(self.tokenizer, questions, padding=True, return_tensors="pt").to(self.device)
        # `num_blocks` is a forward argument: the shared config is never changed, so concurrent calls are safe.
        out = self.model(
            input_ids=encoded["input_ids"],
            attention_mask=encoded["attention_mask"],
            token_type_ids=encoded.get("token_type_ids"),
            questions=questions,
            num_blocks=num_blocks,
            filter=filter,
            return_dict=True,
        )
        # The forward's own encoded pairs: each (question, block) pair is tokenized once per call.
        return read_results(out, questions)

    def _read_contexts(self, questions: list[str], contexts: list[str], doc_stride: int) -> list[dict]:
        config = self.model.config
        max_length = config.reader_seq_len
        lengths = [
            len(ids) for ids in tokenizer_call(self.tokenizer, questions, add_special_tokens=False)["input_ids"]
        ]
        longest_question = max(lengths)
        if longest_question + 4 > max_length:
            # [CLS] question [SEP] context [SEP] must leave room for at least one context wordpiece per window.
            question = questions[lengths.index(longest_question)]
            raise ValueError(
                f"The question {question[:60]!r} has {longest_question} wordpieces: with a context, the reader reads "
                f"[CLS] question [SEP] context [SEP] in windows of config.reader_seq_len={max_length} wordpieces, so a "
                f"question may have at most {max_length - 4}. Shorten the question, or ask without a context."
            )
        # The overlap must leave room for new context tokens in every window ([CLS] q [SEP] ... [SEP]).
        stride = max(0, min(doc_stride, (max_length - longest_question - 3) // 2))
        encoded = tokenizer_call(
            self.tokenizer,
            questions,
            contexts,
            truncation="only_second",
            max_length=max_length,
            stride=stride,
            return_overflowing_tokens=True,
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
            return_token_type_ids=True,
            padding="longest",
            return_tensors="pt",
        )
        window_owner = encoded["overflow_to_sample_mapping"].tolist()
        input_ids = encoded["input_ids"]
        num_windows, seq_len = input_ids.shape
        attention_mask, token_type_ids = encoded["attention_mask"], encoded["token_type_ids"]
        block_mask = token_type_ids.bool() & ~encoded["special_tokens_mask"].bool() & attention_mask.bool()
        if seq_len < config.max_span_width:
            # The reader enumerates spans up to max_span_width wide, so its input must be at least that long.
            pad = config.max_span_width - seq_len
            input_ids = torch.nn.functional.pad(input_ids, (0, pad), value=self.tokenizer.pad_token_id or 0)
            attention_mask, token_type_ids, block_mask = (
                torch.nn.functional.pad(t, (0, pad)) for t in (attention_mask, token_type_ids, block_mask)
            )
        reader = self.model.answering_modules()[1]  # int8 copies under dtype="int8"
        device = reader.device
        # Each window is read as a question with one block of relevance 0: no retrieval score enters the logits.
        reader_output = reader(
            input_ids=input_ids.unsqueeze(1).to(device),
            attention_mask=attention_mask.unsqueeze(1).to(device),
            token_type_ids=token_type_ids.unsqueeze(1).to(device),
            relevance_score=torch.zeros(num_windows, 1, device=device),
            block_mask=block_mask.unsqueeze(1).to(device),
            return_dict=True,
        )
        logits = reader_output.reader_logits[:, 0].detach().float().cpu()
        offsets = encoded["offset_mapping"]
        results = []
        for i, (question, context) in enumerate(zip(questions, contexts)):
            windows = [w for w, owner in enumerate(window_owner) if owner == i]
            # Offsets of every window are in the whole context: one block dict for all of them.
            block = block_provenance({"text": context}, retrieval_score=0.0)
            results.append(
                {
                    "question": question,
                    "logits": logits[windows],
                    "starts": reader_output.candidate_starts.cpu(),
                    "ends": reader_output.candidate_ends.cpu(),
                    "offsets": offsets[windows],
                    "input_ids": None,
                    "texts": [context] * len(windows),
                    "blocks": [block] * len(windows),
                }
            )
        return results

    # ----------------------------------------------------------------------------------------------------------------
    # Answers
    # ----------------------------------------------------------------------------------------------------------------

    def postprocess(
        self,
        model_outputs,
        top_k: int = 1,
        max_answer_len: int | None = None,
        align_to_words: bool = True,
        handle_impossible_answer: bool | None = None,
        no_answer_threshold: float | None = None,
    ):
        result = model_outputs["results"]
        if isinstance(result, list):  # batch_size=1: the batch of one was not un-batched
            result = result[0]
        max_answer_len = max_answer_len or self.model.config.max_span_width
        # The one answer path (`openqa_answers`), shared with `RealmForOpenQA.answer`.
        options = {
            "align_to_words": align_to_words,
            "skip_answers_in_question": getattr(self.model.config, "skip_answers_in_question", False),
            "no_answer_threshold": resolve_no_answer_threshold(
                self.model.config, no_answer_threshold, handle_impossible_answer
            ),
        }
        if top_k == 1:
            return best_answer(result, max_answer_len, self.tokenizer, **options)
        return best_spans(result, top_k, max_answer_len, self.tokenizer, **options)

    def save_pretrained(self, save_directory: str | os.PathLike, **kwargs):
        """
        Save the model (with its retriever) and the tokenizer, so that `realm_hf.pipeline("question-answering",
        model=save_directory)` rebuilds this pipeline. Unlike the base class, no pipeline code is copied into the
        directory: the pipeline comes from the installed `realm_hf`, never from remote code.
        """
        if os.path.isfile(save_directory):
            raise ValueError(f"Provided path ({save_directory}) should be a directory, not a file.")
        os.makedirs(save_directory, exist_ok=True)

        if isinstance(self.model, RealmPreTrainedModel) and self.tokenizer is not None:
            # One all-or-nothing save for weights, corpus, index and tokenizer (see RealmForOpenQA.save_pretrained).
            self.model.save_pretrained(save_directory, tokenizer=self.tokenizer, **kwargs)
            return
        self.model.save_pretrained(save_directory, **kwargs)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(save_directory)


def _max_positions(model) -> int | None:
    return getattr(model.config, "max_position_embeddings", None)


def _is_dataset(inputs) -> bool:
    return isinstance(inputs, torch.utils.data.Dataset)


def is_hf_dataset(inputs) -> bool:
    """Whether `inputs` is a `datasets` dataset (or dataset dict), which the pipeline reads by its columns."""
    # A `datasets` object exists only once `datasets` is imported: until then, nothing is one (and `import realm_hf`
    # need not import it, a second of start-up).
    datasets = sys.modules.get("datasets")
    return datasets is not None and isinstance(
        inputs, (datasets.Dataset, datasets.IterableDataset, datasets.DatasetDict, datasets.IterableDatasetDict)
    )


class _QuestionRows(torch.utils.data.Dataset):
    """The `question` (and `context`) columns of a `datasets.Dataset`, row by row, as the pipeline streams them."""

    def __init__(self, dataset):
        self.has_context = "context" in dataset.column_names
        # Only the columns read: the others (answers, ids, ...) are never decoded.
        self.rows = dataset.select_columns(["question", "context"] if self.has_context else ["question"])

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        row = self.rows[index]
        return {"question": row["question"], "context": row["context"] if self.has_context else None}


def _iterable_questions(dataset) -> Iterator[dict]:
    for row in dataset:
        if "question" not in row:
            raise ValueError(_missing_question_column(sorted(row)))
        yield {"question": row["question"], "context": row.get("context")}


def _missing_question_column(columns) -> str:
    return (
        f"The dataset has no `question` column (columns: {list(columns)}). Rename the column that holds the questions "
        "with `dataset.rename_column(name, 'question')`, or pass `transformers.pipelines.pt_utils.KeyDataset(dataset, "
        "name)`."
    )


def dataset_questions(dataset):
    """
    A `datasets.Dataset` (or `IterableDataset`) as the pipeline streams it: its `question` column and, when it has
    one, its `context` column; the other columns are ignored. A `DatasetDict` is refused: pick a split.
    """
    import datasets  # a dataset was given, so datasets is imported already

    if isinstance(dataset, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        raise ValueError(
            f"Got a dataset dict with splits {list(dataset)}; pass one split, e.g. `qa(dataset['test'])`."
        )
    columns = dataset.column_names
    if columns is not None and "question" not in columns:
        raise ValueError(_missing_question_column(columns))
    if isinstance(dataset, datasets.Dataset):
        return _QuestionRows(dataset)
    return _iterable_questions(dataset)  # a generator: the pipeline streams it


#: Classic option -> the REALM pipeline's parameter of the same meaning.
CLASSIC_ALIASES = {
    # Longer questions are refused rather than truncated: a truncated question is a different question.
    "max_question_len": "max_question_length",
}

#: Classic options that mean nothing for REALM -> why, and what to do instead.
CLASSIC_REFUSED = {
    "max_seq_len": (
        "REALM reads (question, block) pairs of `config.reader_seq_len` wordpieces, the length its reader was trained "
        "on; a long `context` is read in windows of that length (`doc_stride` sets their overlap)"
    ),
    "padding": "the pipeline pads each batch itself",
    "topk": "use `top_k`",
}


def map_classic_options(kwargs: dict) -> dict:
    """
    `kwargs` with the classic options replaced by the REALM pipeline's own: `max_question_len` becomes
    `max_question_length`, and the options in `CLASSIC_REFUSED` raise a `ValueError` naming the option and why.
    (`handle_impossible_answer` is the pipeline's own option.) Unknown options are left for the caller to refuse.
    """
    kwargs = dict(kwargs)
    for name, reason in CLASSIC_REFUSED.items():
        if name in kwargs:
            raise ValueError(f"The REALM question-answering pipeline has no `{name}` option: {reason}.")
    for classic, own in CLASSIC_ALIASES.items():
        if classic in kwargs:
            if own in kwargs:
                raise ValueError(f"Give either `{classic}` or `{own}` (the same option), not both.")
            kwargs[own] = kwargs.pop(classic)
    return kwargs
