"""Open-QA fine-tuning of [`RealmForOpenQA`]: data collator, Trainer subclass and evaluation (EM, F1, recall@k)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import datasets
import torch
from transformers import Trainer, TrainerCallback

from ..logging_utils import get_logger
from ..metrics import answer_mrr_at_k, answer_ndcg_at_k, answer_recall_at_k, compute_qa_metrics
from ..progress import progress_bar
from ..text.tokenizer_calls import tokenizer_call
from ..text.user_text import (
    more_problems,
    question_content_problems,
    question_problems,
    question_text_problems,
    truncate_questions,
)
from .callbacks import RealmReindexCallback, place_reindex_callbacks_first, unwrap_realm_model
from .saving import RealmModelCardMixin

logger = get_logger(__name__)


@dataclass
class DataCollatorForOpenQA:
    """
    Batches `{"question": str, "answers": list[str]}` examples for [`RealmForOpenQA`].

    Returns the tokenized questions (`input_ids`, `attention_mask`, `token_type_ids`) plus the raw `questions` and
    `answers`, which the model uses to build reader inputs for the retrieved blocks and to find gold spans in them.
    Retrieval happens inside the model's forward pass, against the live index.

    Args:
        tokenizer: The question tokenizer (the retriever's tokenizer).
        max_question_length (`int`, *optional*, defaults to 64): Longer questions are cut to this many wordpieces
            (as transformers' collators truncate), the text too, so the reader sees what the embedder saw; the first
            cut is logged and `num_truncated` counts them. Empty, non-string or undecodable questions, and those
            without a content wordpiece (only emoji, punctuation, special tokens), are refused.
        question_column (`str`, *optional*, defaults to `"question"`)
        answers_column (`str`, *optional*, defaults to `"answers"`): A list of answer strings (or one string).
    """

    tokenizer: Any
    max_question_length: int = 64
    question_column: str = "question"
    answers_column: str = "answers"
    num_truncated: int = 0

    def __call__(self, examples: Sequence[dict]) -> dict[str, Any]:
        missing = next((example for example in examples if self.question_column not in example), None)
        if missing is not None:
            raise ValueError(
                f"A training example has no {self.question_column!r} field (fields: {', '.join(sorted(missing))}). "
                "transformers.Trainer drops the dataset columns the model's forward does not name before they reach "
                "the collator: pass `remove_unused_columns=False` in its TrainingArguments, or train with "
                "RealmOpenQATrainer, which keeps them (docs/training.md)."
            )
        questions = [example[self.question_column] for example in examples]
        problems = question_content_problems(questions, self.tokenizer)
        if problems:
            raise ValueError("; ".join(f"Training question {questions[i]!r}: {reason}" for i, reason in problems))
        questions, truncated = truncate_questions(questions, self.tokenizer, self.max_question_length)
        if truncated:
            if not self.num_truncated:
                logger.warning(
                    "Training question cut to its first %d wordpieces (max_question_length): %r. Further cuts are "
                    "counted in the collator's `num_truncated`.",
                    self.max_question_length,
                    questions[truncated[0]],
                )
            self.num_truncated += len(truncated)
        batch = dict(tokenizer_call(self.tokenizer, questions, padding=True, return_tensors="pt"))
        batch["questions"] = questions
        if all(self.answers_column in example for example in examples):
            answers = []
            for example in examples:
                golds = example[self.answers_column]
                golds = [golds] if isinstance(golds, str) else list(golds)
                if not any(g.strip() for g in golds):
                    raise ValueError(f"Question {example[self.question_column]!r} has no non-empty answer.")
                answers.append(golds)
            batch["answers"] = answers
        return batch


def require_data(dataset, columns, what: str, advice: str, allow_empty: bool = False) -> None:
    """
    Raise a `ValueError` when `dataset` lacks one of `columns` (`None` entries are skipped), naming the missing ones,
    the columns it has and `advice`, or (unless `allow_empty`) when it has no record. `what` names the data
    ("training", "evaluation", "reader warm-up").
    """
    missing = [column for column in columns if column is not None and column not in dataset.column_names]
    if missing:
        raise ValueError(
            f"The {what} data has no {', '.join(map(repr, missing))} column (columns: "
            f"{', '.join(dataset.column_names)}); {advice}."
        )
    if not allow_empty and len(dataset) == 0:
        raise ValueError(f"The {what} data is empty: give at least one example.")


def check_training_questions(
    dataset,
    tokenizer,
    max_question_length: int = 64,
    question_column: str = "question",
    what: str = "training",
    answers_column: str | None = None,
) -> int:
    """
    Check a QA dataset's questions before training starts (so a bad record stops the run before the first step, not
    at it): a missing column (`question_column`, and `answers_column` when given), no record at all, a question that
    is not a non-empty, decodable string, or one without a content wordpiece (only emoji, punctuation, special
    tokens: `realm_hf.text.user_text`) raises a `ValueError` naming its record; questions longer than
    `max_question_length` wordpieces are counted and logged (the collator cuts them).

    Returns:
        `int`: how many questions will be cut.
    """
    require_data(dataset, (question_column, answers_column), what, "rename yours with `dataset.rename_column(...)`")
    questions = list(dataset[question_column])
    # Records are numbered from 1, as the CLI's file readers number them.
    problems = [(i + 1, reason) for i, reason in question_content_problems(questions, tokenizer)]
    if problems:
        listed = "; ".join(f"record {i}: {reason}" for i, reason in problems[:5])
        raise ValueError(f"{len(problems)} bad {what} question(s): {listed}{more_problems(problems, 'record {}')}.")
    _, truncated = truncate_questions(questions, tokenizer, max_question_length)
    if truncated:
        logger.warning(
            "%d of %d %s questions are longer than %d wordpieces (max_question_length) and will be cut to that "
            "length, e.g. record %d.",
            len(truncated),
            len(questions),
            what,
            max_question_length,
            truncated[0] + 1,
        )
    return len(truncated)


def evaluate_openqa(
    model,
    dataset,
    tokenizer=None,
    batch_size: int = 16,
    recall_ks: Sequence[int] = (1, 5),
    question_column: str = "question",
    answers_column: str = "answers",
    show_progress: bool = True,
    return_predictions: bool = False,
    max_question_length: int = 64,
    dtype=None,
    return_retrieved: bool = False,
) -> dict[str, float]:
    """
    Evaluate a [`RealmForOpenQA`] on a QA dataset: exact match and F1 of the predicted answers (SQuAD normalisation),
    and answer recall@k of retrieval (a question counts as hit at k if one of its top-k blocks contains a gold answer,
    as in ORQA/REALM) with the ranking metrics MRR@k and nDCG@k on the same relevance
    ([`~realm_hf.metrics.answer_mrr_at_k`], [`~realm_hf.metrics.answer_ndcg_at_k`]: the retrieved blocks down to the
    deepest `k`).

    Every question is scored: one longer than `max_question_length` wordpieces is cut to that length (as in
    training), and one that cannot be answered at all (empty, undecodable, no known wordpiece) counts as a wrong
    answer with nothing retrieved; both are logged.

    `dtype` is the compute dtype of answering (`"fp32"` by default, `"bf16"`, `"int8"`, ...: see
    `RealmForOpenQA.answer`); recall@k deeper than the blocks read is measured with fp32 question vectors.

    Returns:
        `dict` with `exact_match`, `f1` (0-100), and `recall@k`, `mrr@k`, `ndcg@k` (0-1) for each k; with
        `return_predictions`, `predictions` (the answer of each question); with `return_retrieved`, `retrieved` (for
        each question, `(block_id, retrieval_score)` of its blocks, best first, down to the deepest `k`; empty for a
        question that could not be answered), from which `realm-hf evaluate --run-file` writes a TREC run.
    """

    retriever = model.require_retriever()
    tokenizer = tokenizer if tokenizer is not None else retriever.tokenizer
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"`batch_size` must be a positive integer, got {batch_size!r}.")
    # datasets' own words ("Column 'answers' doesn't exist.") do not say which data or what to do.
    option = "question_column" if question_column not in dataset.column_names else "answers_column"
    require_data(
        dataset,
        (question_column, answers_column),
        "evaluation",
        f"rename yours with `dataset.rename_column(...)` or pass `{option}`",
        allow_empty=True,  # said below, as before
    )
    questions = list(dataset[question_column])
    references = [[a] if isinstance(a, str) else list(a) for a in dataset[answers_column]]
    if not questions:
        raise ValueError("The evaluation set is empty.")
    max_positions = getattr(model.config, "max_position_embeddings", None)
    if max_positions is not None:
        max_question_length = min(max_question_length, max_positions - 2)  # [CLS] question [SEP] must fit
    # Every question is scored: over-long ones are cut as in training; one that cannot be answered at all (empty, no
    # known wordpiece, ...) counts as a wrong answer with nothing retrieved, rather than stopping the evaluation.
    not_text = {i for i, _ in question_text_problems(questions)}
    text_ok = [i for i in range(len(questions)) if i not in not_text]
    cut, truncated = truncate_questions([questions[i] for i in text_ok], tokenizer, max_question_length)
    for i, text in zip(text_ok, cut):
        questions[i] = text
    if truncated:
        logger.warning(
            "%d evaluation question(s) longer than %d wordpieces were cut to that length (max_question_length).",
            len(truncated),
            max_question_length,
        )
    unanswerable = dict(question_problems(questions, tokenizer, max_question_length))
    if unanswerable:
        first = min(unanswerable)
        logger.warning(
            "%d evaluation question(s) cannot be answered and count as wrong, e.g. question %d: %s.",
            len(unanswerable),
            first,
            unanswerable[first],
        )
    answerable = [i for i in range(len(questions)) if i not in unanswerable]
    max_k = min(max(recall_ks), len(retriever))
    predictions, retrieved_texts = [""] * len(questions), [[] for _ in questions]
    retrieved_ids = [[] for _ in questions]
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for start in progress_bar(
                range(0, len(answerable), batch_size), desc="Evaluating", disable=not show_progress, leave=False
            ):
                rows = answerable[start : start + batch_size]
                chunk = [questions[i] for i in rows]
                results = model.answer(
                    chunk,
                    tokenizer=tokenizer,
                    batch_size=batch_size,
                    max_question_length=max_question_length,
                    dtype=dtype,
                )
                for i, result in zip(rows, results):
                    predictions[i] = result["answer"]
                if max_k <= min(len(result["retrieved"]) for result in results):
                    # The reader's own retrieval already covers the deepest cut-off.
                    for i, result in zip(rows, results):
                        retrieved_texts[i] = [b["text"] for b in result["retrieved"]][:max_k]
                        retrieved_ids[i] = [(b["block_id"], b["retrieval_score"]) for b in result["retrieved"]][:max_k]
                    continue
                inputs = tokenizer_call(tokenizer, chunk, padding=True, return_tensors="pt").to(model.device)
                embeddings = model.embed_questions(
                    inputs["input_ids"], inputs["attention_mask"], inputs.get("token_type_ids")
                )
                # With the question texts, as `answer()` searches: a hybrid retriever adds its BM25 candidates.
                search = retriever.search(embeddings, max_k, questions=chunk)
                for i, blocks, scores in zip(rows, search.blocks, search.scores.tolist()):
                    retrieved_texts[i] = [block["text"] for block in blocks]
                    retrieved_ids[i] = [(int(block["block_id"]), float(s)) for block, s in zip(blocks, scores)]
    finally:
        model.train(was_training)
    metrics = compute_qa_metrics(predictions, references)
    metrics = {key: float(value) for key, value in metrics.items() if key in ("exact_match", "f1")}
    ks = [k for k in recall_ks if k <= max_k]
    for retrieval_metric in (answer_recall_at_k, answer_mrr_at_k, answer_ndcg_at_k):
        # `answer_recall@k` -> `recall@k`: in Open-QA evaluation relevance is answer-based (the ORQA/REALM convention).
        values = retrieval_metric(retrieved_texts, references, ks=ks)
        metrics.update({key.removeprefix("answer_"): float(value) for key, value in values.items()})
    if return_predictions:
        metrics["predictions"] = predictions
    if return_retrieved:
        metrics["retrieved"] = retrieved_ids
    return metrics


def keep_data_columns(trainer, columns) -> None:
    """
    Keep `columns` (and the length column of `train_sampling_strategy="group_by_length"`) among the dataset columns
    a [`~transformers.Trainer`] passes on: realm-hf's collators read raw columns (questions, answers, contexts) that
    the stock Trainer would drop as unknown to the model's `forward`. Call it from `_set_signature_columns_if_needed`.
    """
    for column in (*columns, trainer.args.length_column_name):
        if column not in trainer._signature_columns:
            trainer._signature_columns.append(column)


def mark_reader_trained(model) -> bool:
    """
    Record in the config of `model` (a [`RealmForOpenQA`], possibly inside DDP / Accelerate / PEFT wrappers) that its
    reader has been trained, when its span head (`reader.qa_outputs`, which `init_from_bert` leaves random) has a
    trainable parameter (`requires_grad`; under peft, through `modules_to_save`); returns whether it did. LoRA
    adapters on the reader's attention alone do not count: they cannot make a random span head answer. Call it after
    an optimizer step of a training loop of your own; [`RealmOpenQATrainer`] calls it for you.
    """

    model = unwrap_realm_model(model)
    head = getattr(getattr(model, "reader", None), "qa_outputs", None)
    if head is None or not any(parameter.requires_grad for parameter in head.parameters()):
        return False
    model.config.reader_trained = True
    return True


class MarkReaderTrainedCallback(TrainerCallback):
    """
    Sets `config.reader_trained` at the first optimizer step, so that every checkpoint saved after it says so.

    Args:
        owner (*optional*): The [`RealmForOpenQA`] to mark, when the Trainer trains only a part of it (the reader
            warm-up trains `model.reader`); by default the Trainer's own model.
    """

    def __init__(self, owner=None):
        self.owner = owner

    def on_step_end(self, args, state, control, model=None, **kwargs):
        model = self.owner if self.owner is not None else model
        if model is not None and not getattr(getattr(model, "config", None), "reader_trained", False):
            mark_reader_trained(model)


class BeamAnswerTally:
    """
    Counts, between two training logs, the questions whose searcher beam held a gold answer, and adds their share to
    the log as `answer_in_beam`. REALM's losses are marginals over the blocks holding an answer, so a question
    without one adds nothing: a run where no beam holds an answer trains at loss 0, which the first log that finds
    it says (once). Counting stays on the device between logs (no sync per step).
    """

    def __init__(self):
        self._hits = None
        self._questions = 0
        self._warned = False

    def add(self, has_answer: torch.Tensor | None) -> None:
        """Count a batch: `has_answer` says, per question, whether its beam held a gold answer (`(batch_size,)`)."""
        if has_answer is None:
            return
        hits = has_answer.detach().sum()
        self._hits = hits if self._hits is None else self._hits + hits
        self._questions += has_answer.numel()

    def log_into(self, logs: dict) -> None:
        """Add `answer_in_beam` to a training log (one with a `loss`) and start counting anew."""
        if not self._questions or "loss" not in logs:
            return
        share = float(self._hits) / self._questions
        logs["answer_in_beam"] = round(share, 4)
        if share == 0.0 and not self._warned:
            self._warned = True
            logger.warning(
                "None of the last %d training questions had a gold answer in its retrieved blocks, so the loss is 0 "
                "and nothing trains. Check that the answers appear in the corpus text as written, or retrieve more "
                "blocks (`config.searcher_beam_size`); warm up the reader on known blocks first "
                "(`reader_warmup_trainer`) and set `config.reader_beam_positive = True` to read a block that holds one.",
                self._questions,
            )
        self._hits, self._questions = None, 0


def warn_if_index_goes_stale(trainer: Trainer) -> bool:
    """
    Warn when `trainer` would train the model's document embedder with no [`RealmReindexCallback`] among its
    callbacks: the index keeps the embeddings of the old weights while the scores of the re-embedded top blocks move
    away from them. `from_pretrained` leaves every weight trainable, so a saved model's document embedder trains
    unless frozen again. Returns whether it warned.
    """
    model = unwrap_realm_model(trainer.model)
    embedder = getattr(model, "document_embedder", None)
    if embedder is None or not any(p.requires_grad for p in embedder.parameters()):
        return False
    if any(isinstance(callback, RealmReindexCallback) for callback in trainer.callback_handler.callbacks):
        return False
    logger.warning(
        "The model's document embedder will train, but no RealmReindexCallback refreshes the index: it would go "
        "stale. Freeze it for REALM's Open-QA fine-tuning (`model.freeze_document_embedder()`; `from_pretrained` "
        "leaves every weight trainable), or refresh the index while it trains "
        "(`callbacks=[RealmReindexCallback(model.retriever, refresh_steps=...)]`)."
    )
    return True


class RealmOpenQATrainer(RealmModelCardMixin, Trainer):
    """
    [`~transformers.Trainer`] for Open-QA fine-tuning of [`RealmForOpenQA`].

    Differences from the stock Trainer: the `question`/`answers` columns are kept for the collator (retrieval runs
    inside the forward pass on raw questions), and `evaluate()` answers the evaluation questions end to end and logs
    `eval_exact_match`, `eval_f1` and `eval_recall@k`; its first optimizer step sets `config.reader_trained` (when
    the reader trains, see [`mark_reader_trained`]); `create_model_card()` (hence `push_to_hub()`) writes
    realm-hf's Open-QA card with them ([`RealmModelCardMixin`]).

    Args:
        recall_ks (`Sequence[int]`, *optional*, defaults to `(1, 5)`): Cut-offs for retrieval recall.
        All other arguments are those of [`~transformers.Trainer`]; `data_collator` defaults to
        [`DataCollatorForOpenQA`] with the retriever's tokenizer.
    """

    def __init__(self, *args, recall_ks: Sequence[int] = (1, 5), **kwargs):
        model = kwargs.get("model", args[0] if args else None)
        if kwargs.get("data_collator") is None and model is not None and getattr(model, "retriever", None) is not None:
            # Questions are cut to what the question embedder's positions take, [CLS] and [SEP] included.
            max_positions = getattr(getattr(model, "config", None), "max_position_embeddings", None) or 66
            kwargs["data_collator"] = DataCollatorForOpenQA(
                model.retriever.tokenizer, max_question_length=min(64, max_positions - 2)
            )
        super().__init__(*args, **kwargs)
        collator = self.data_collator
        if isinstance(collator, DataCollatorForOpenQA):
            # A bad record or a missing column fails here, not at the first step (where the stock Trainer says
            # only that the model returned no loss, or the collator a bare KeyError).
            for dataset, what in ((self.train_dataset, "training"), (self.eval_dataset, "evaluation")):
                if isinstance(dataset, datasets.Dataset):  # streamed data is checked by the collator as it comes
                    check_training_questions(
                        dataset,
                        collator.tokenizer,
                        collator.max_question_length,
                        collator.question_column,
                        what,
                        answers_column=collator.answers_column,
                    )
        self.recall_ks = tuple(recall_ks)
        self.beam_answers = BeamAnswerTally()
        # An optimizer step updates the reader: `config.reader_trained` (False after `init_from_bert`) becomes True.
        self.add_callback(MarkReaderTrainedCallback())
        # Re-index metrics are merged into logs by the callback's on_log; it must run before report_to integrations.
        place_reindex_callbacks_first(self)

    def train(self, *args, **kwargs):
        warn_if_index_goes_stale(self)
        return super().train(*args, **kwargs)

    def _set_signature_columns_if_needed(self):
        super()._set_signature_columns_if_needed()
        collator = self.data_collator
        keep_data_columns(
            self, (getattr(collator, "question_column", "question"), getattr(collator, "answers_column", "answers"))
        )

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        if model.training:
            reader_output = outputs.get("reader_output") if isinstance(outputs, dict) else None
            correct = getattr(reader_output, "retriever_correct", None)  # per question and beam block
            if correct is not None:
                # One question's beam is `(k,)` in the legacy layout (batch size 1 without a batch dimension).
                self.beam_answers.add(correct.any(-1) if correct.dim() > 1 else correct.any().reshape(1))
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        self.beam_answers.log_into(logs)
        super().log(logs, start_time)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        eval_dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if eval_dataset is None:
            raise ValueError("RealmOpenQATrainer.evaluate needs an eval_dataset with question/answers columns.")
        collator = self.data_collator
        metrics = evaluate_openqa(
            self.model,
            eval_dataset,
            batch_size=self.args.per_device_eval_batch_size,
            recall_ks=self.recall_ks,
            question_column=getattr(collator, "question_column", "question"),
            answers_column=getattr(collator, "answers_column", "answers"),
            show_progress=not self.args.disable_tqdm,
            max_question_length=getattr(collator, "max_question_length", 64),
        )
        metrics = {f"{metric_key_prefix}_{key}": value for key, value in metrics.items()}
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics


__all__ = [
    "BeamAnswerTally",
    "DataCollatorForOpenQA",
    "RealmOpenQATrainer",
    "check_training_questions",
    "evaluate_openqa",
    "mark_reader_trained",
    "require_data",
]
