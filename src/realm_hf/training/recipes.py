"""
The training recipes that `realm-hf train` and `examples/` share: seeding, arguments, collators, optimizers (for
REALM's parts that start from different places and so want different learning rates), trainers.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import datasets
import torch
from torch import nn
from transformers import TrainingArguments, enable_full_determinism, set_seed

from ..precision import has_native_bf16
from ..text.user_text import check_positive_int
from .callbacks import RealmReindexCallback, place_reindex_callbacks_first
from .ict import DataCollatorForInverseClozeTask, RealmICTTrainer
from .openqa import DataCollatorForOpenQA, MarkReaderTrainedCallback, RealmOpenQATrainer, check_training_questions
from .pretraining import DataCollatorForSalientSpanMasking, RealmPreTrainingTrainer
from .warmups import (
    DataCollatorForReaderWarmup,
    RealmReaderTrainer,
    RealmRetrieverTrainer,
    add_retrieved_negatives,
    make_cloze_reading_examples,
    make_gold_block_examples,
)

__all__ = [
    "evaluation_history",
    "freeze_lower_layers",
    "ict_trainer",
    "openqa_trainer",
    "pretraining_optimizer",
    "pretraining_trainer",
    "reader_warmup_examples",
    "reader_warmup_trainer",
    "reindex_callback",
    "retriever_warmup_trainer",
    "salient_span_collator",
    "seed_everything",
    "set_document_embedder_trainable",
    "training_arguments",
    "two_rate_adamw",
    "with_length_column",
]


def seed_everything(seed: int, full_determinism: bool = False) -> int:
    """
    Seed python, numpy and torch. Call it before the model is built.

    The Trainer seeds only once created, after `init_from_bert` drew the fresh heads and LoRA its adapters: without
    this, two runs of one config start from different weights and their metrics diverge.

    Args:
        seed (`int`): The seed, also to be given to the Trainer (`TrainingArguments.seed`) and the collators.
        full_determinism (`bool`, *optional*, defaults to `False`): Also make torch's kernels deterministic
            ([`~transformers.enable_full_determinism`]); slower.

    Returns:
        `int`: `seed`.
    """
    if full_determinism:
        enable_full_determinism(seed)
    else:
        set_seed(seed)
    return seed


def training_arguments(output_dir: str, seed: int, **values) -> TrainingArguments:
    """
    [`~transformers.TrainingArguments`] with `report_to="none"` unless given (trackers would reach the network).

    Raises:
        `ValueError`: naming the bad field, for an argument `TrainingArguments` does not take.
    """
    values.setdefault("report_to", "none")
    try:
        args = TrainingArguments(output_dir=output_dir, seed=seed, **values)
    except TypeError as err:
        raise ValueError(f"Invalid training_args: {err}") from err
    on_cpu = args.use_cpu or not torch.cuda.is_available()
    if args.bf16 and on_cpu and not has_native_bf16("cpu"):
        # transformers accepts it and trains under emulated bf16: a MiniLM step measured 24x slower than fp32 on an
        # AVX2 CPU (bench/README). Warned, not refused: the numbers are right, only slow.
        warnings.warn(
            "training_args.bf16 is set, but this CPU has neither AVX512-BF16 nor AMX: bf16 autocast is emulated "
            "there and training runs many times slower than in fp32. Set bf16 to false on this machine.",
            UserWarning,
            stacklevel=2,
        )
    return args


def reindex_callback(
    retriever, refresh_steps: int | None, batch_size: int = 128, background: bool = True, **kwargs
) -> RealmReindexCallback | None:
    """
    The index refresher for a trained document embedder, or `None` without `refresh_steps`.

    Args:
        retriever ([`RealmRetriever`]): The model's retriever, refreshed in place.
        refresh_steps (`int`, *optional*): Refresh period in optimizer steps; `None` or 0: no refresher.
        batch_size (`int`, *optional*, defaults to 128): Blocks per embedding batch.
        background (`bool`, *optional*, defaults to `True`): Refresh in a worker thread while training goes on.
        kwargs: Other [`RealmReindexCallback`] arguments (`device`, `save_with_checkpoints`, `refresh_at_end`, ...).
    """
    if not refresh_steps:
        return None
    return RealmReindexCallback(
        retriever, refresh_steps=int(refresh_steps), batch_size=batch_size, background=background, **kwargs
    )


def set_document_embedder_trainable(model, trainable: bool):
    """
    End-to-end retriever training (`trainable`: a document embedder is added if missing, and trains) or the paper's
    fine-tuning (the document embedder, if any, is frozen so the index never goes stale). Returns the embedder whose
    outputs fill the index (`model.index_embedder`).
    """
    if trainable:
        if model.document_embedder is None:
            # REALM's fine-tuning starts both embedders from the same pre-trained weights.
            model.add_document_embedder()
        model.document_embedder.requires_grad_(True)
    else:
        model.freeze_document_embedder()
    return model.index_embedder


def openqa_trainer(
    model,
    args: TrainingArguments,
    train_dataset,
    eval_dataset=None,
    recall_ks: Sequence[int] = (1, 5),
    reindex: RealmReindexCallback | None = None,
    callbacks: Sequence = (),
    **kwargs,
) -> RealmOpenQATrainer:
    """
    The Open-QA fine-tuning Trainer: [`RealmOpenQATrainer`] (its collator is [`DataCollatorForOpenQA`] with the
    retriever's tokenizer) with `reindex`, if given, first among the callbacks so `report_to` integrations receive the
    refresh metrics. `model` may be a PEFT wrapper. The questions of both datasets are checked first (by the Trainer,
    [`check_training_questions`]): a bad record fails here, not at a training step.
    """
    trainer = RealmOpenQATrainer(
        model=model,
        args=args,
        train_dataset=with_length_column(train_dataset, args, ("question",)),
        eval_dataset=eval_dataset,
        recall_ks=tuple(recall_ks),
        callbacks=list(callbacks) or None,
        **kwargs,
    )
    if reindex is not None:
        reindex.attach(trainer)
    return trainer


def salient_span_collator(tokenizer, seed: int, max_length: int, **options) -> DataCollatorForSalientSpanMasking:
    """
    The pre-training collator, seeded: without a seed its generator draws one from the OS, and every run masks other
    spans. `options` are the other [`DataCollatorForSalientSpanMasking`] arguments.
    """
    return DataCollatorForSalientSpanMasking(tokenizer, max_length=max_length, seed=seed, **options)


# Optimizers for REALM's parts that start from different places and so want different learning rates.


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


def pretraining_optimizer(model, learning_rate: float, embedder_lr_ratio: float = 1.0):
    """
    AdamW with the embedders at `embedder_lr_ratio` times the knowledge-augmented encoder's learning rate, or `None`
    (the Trainer's own optimizer) when the ratio is 1.

    A checkpoint without a masked-LM head (all-MiniLM-L6-v2) starts the encoder's head from scratch, which needs a
    high rate; the embedders start from the ICT warm start, whose retrieval a high rate on a noisy early gradient
    scrambles.
    """
    if float(embedder_lr_ratio) == 1.0:
        return None
    return two_rate_adamw(model, model.encoder, learning_rate, float(embedder_lr_ratio))


def pretraining_trainer(
    model,
    args: TrainingArguments,
    train_dataset,
    collator,
    eval_dataset=None,
    reindex: RealmReindexCallback | None = None,
    callbacks: Sequence = (),
    optimizer=None,
) -> RealmPreTrainingTrainer:
    """
    The REALM pre-training Trainer: [`RealmPreTrainingTrainer`] (whose `create_model_card`/`push_to_hub` write
    realm-hf's pre-training card) for [`RealmForPreTraining`] with a masking collator, `optimizer` (or the Trainer's
    own when `None`, see [`pretraining_optimizer`]) and `reindex`, if given, first among the callbacks.
    `args.remove_unused_columns` must be `False`: the collator reads the raw text, spans and block ids.
    """
    trainer = RealmPreTrainingTrainer(
        model=model,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=collator,
        callbacks=list(callbacks) or None,
        optimizers=(optimizer, None),
    )
    if reindex is not None:
        reindex.attach(trainer)
    else:
        place_reindex_callbacks_first(trainer)
    return trainer


def ict_trainer(
    model, args: TrainingArguments, train_dataset, tokenizer, max_query_length: int, max_block_length: int, seed: int
) -> RealmICTTrainer:
    """
    The Inverse Cloze Task warm-start Trainer for [`RealmForInverseClozeTask`], with its seeded collator: a
    [`RealmICTTrainer`], whose `create_model_card`/`push_to_hub` write realm-hf's ICT card.
    """
    collator = DataCollatorForInverseClozeTask(
        tokenizer, max_query_length=max_query_length, max_block_length=max_block_length, seed=seed
    )
    return RealmICTTrainer(model=model, args=args, train_dataset=train_dataset, data_collator=collator)


def reader_warmup_examples(
    retriever,
    questions: Sequence[dict] = (),
    exclude_doc_ids: Sequence = (),
    cloze_per_block: int | None = 1,
    question_share: float = 0.5,
    seed: int = 0,
    keep_sentence: bool = True,
    negatives: int = 0,
    model=None,
    max_examples: int | None = None,
) -> datasets.Dataset:
    """
    The reader warm-up's data from a retriever's own corpus: salient-span cloze questions of its blocks, each read
    against the block it comes from ([`make_cloze_reading_examples`]), plus `questions` that carry the `doc_id` of
    the document answering them, each read against the first block of that document holding an answer
    ([`make_gold_block_examples`]). Shuffled with `seed`.

    Args:
        retriever ([`RealmRetriever`]): Its corpus gives the blocks (`text`, `doc_id`).
        questions (`Sequence[dict]`, *optional*): Training questions with `question`, `answers` and `doc_id`.
        exclude_doc_ids (`Sequence`, *optional*): Documents whose blocks give no cloze question (held-out ones:
            the warm-up must not read the answers of evaluation questions).
        cloze_per_block (`int`, *optional*, defaults to 1): Cloze questions per block; 0 for none, `None` for one per
            sentence with a salient span.
        question_share (`float`, *optional*, defaults to 0.5): Share of them written as questions, not blanks.
        seed (`int`, *optional*, defaults to 0)
        keep_sentence (`bool`, *optional*, defaults to `True`): Whether a cloze question's context keeps the sentence
            it was cut from (`False`: the rest of the block, which must still hold the answer).
        negatives (`int`, *optional*, defaults to 0): Blocks the model's retriever ranks highest for each question
            besides its context, read with it as one beam ([`add_retrieved_negatives`]); needs `model`. On the
            Wikipedia demo, at the same number of (question, block) pairs read, one or two negatives scored lower
            than none (fewer questions seen), so the default is none.
        model ([`RealmForOpenQA`], *optional*): Ranks the negatives (its question embedder and `retriever`).
        max_examples (`int`, *optional*): Keep this many examples after the shuffle (e.g. `max_steps` x batch size,
            what one pass reads), so that negatives are searched only for those.

    Returns:
        `datasets.Dataset` with `question`, `context` and `answers`.

    Raises:
        `ValueError`: when no example could be made.
    """
    import random

    exclude = set(exclude_doc_ids)
    columns = [c for c in ("doc_id", "text") if c in retriever.corpus.column_names]
    blocks = [row for row in retriever.corpus.select_columns(columns) if row.get("doc_id") not in exclude]
    examples = []
    if cloze_per_block is None or cloze_per_block > 0:
        examples += make_cloze_reading_examples(
            blocks,
            seed=seed,
            max_per_block=cloze_per_block,
            question_share=question_share,
            keep_sentence=keep_sentence,
        )
    if questions:
        by_doc: dict = {}
        for row in blocks:
            by_doc.setdefault(row.get("doc_id"), []).append(row["text"])
        examples += make_gold_block_examples(questions, by_doc)
    if not examples:
        raise ValueError(
            "The reader warm-up found no example: no block sentence has a name, date or number to blank, and no "
            "question's document holds its answer. Give questions with a `doc_id`, or a corpus of prose."
        )
    random.Random(seed).shuffle(examples)
    if max_examples is not None:
        examples = examples[: check_positive_int(max_examples, "max_examples")]
    if negatives is not None and negatives != 0:
        # Checked here, under this function's own name for it (the CLI's `reader_warmup.negatives`).
        negatives = check_positive_int(negatives, "negatives")
        if model is None:
            raise ValueError(
                "`negatives` are ranked by a model's question embedder: pass `model` (the RealmForOpenQA whose "
                "reader warms up)."
            )
        examples = add_retrieved_negatives(model, examples, num_negatives=negatives)
    return datasets.Dataset.from_list(examples)


def reader_warmup_trainer(model, args: TrainingArguments, train_dataset, tokenizer=None) -> RealmReaderTrainer:
    """
    The reader warm-up Trainer: [`RealmReaderTrainer`] over `model.reader` (a [`RealmForOpenQA`]'s, trained in
    place) with [`DataCollatorForReaderWarmup`] at the model's `reader_seq_len`. `train_dataset` has `question`,
    `context` and `answers` (e.g. [`reader_warmup_examples`]). Run it before Open-QA fine-tuning: the span scorer of
    a model built with `init_from_bert` starts random, and reading known blocks trains it at a fraction of the cost
    of a retrieval step.
    """
    tokenizer = tokenizer if tokenizer is not None else model.require_retriever().tokenizer
    collator = DataCollatorForReaderWarmup(tokenizer, max_length=int(model.config.reader_seq_len))
    train_dataset = with_length_column(train_dataset, args, ("question", "context"))
    trainer = RealmReaderTrainer(model=model.reader, args=args, train_dataset=train_dataset, data_collator=collator)
    # The Trainer holds only the reader: its first optimizer step must still mark the Open-QA model's config.
    trainer.add_callback(MarkReaderTrainedCallback(model))
    return trainer


def retriever_warmup_trainer(model, args: TrainingArguments, train_dataset) -> RealmRetrieverTrainer:
    """
    The retriever warm-up Trainer: [`RealmRetrieverTrainer`] minimising REALM's retrieval loss alone over the
    searcher beam (no reader pass), which trains the question embedder of a [`RealmForOpenQA`] against its fixed
    index. `train_dataset` has `question` and `answers`; questions are checked first, as for Open-QA fine-tuning.
    """
    max_positions = getattr(model.config, "max_position_embeddings", None) or 66
    collator = DataCollatorForOpenQA(
        model.require_retriever().tokenizer, max_question_length=min(64, max_positions - 2)
    )
    if isinstance(train_dataset, datasets.Dataset):
        check_training_questions(
            train_dataset, collator.tokenizer, collator.max_question_length, answers_column="answers"
        )
    train_dataset = with_length_column(train_dataset, args, ("question",))
    return RealmRetrieverTrainer(model=model, args=args, train_dataset=train_dataset, data_collator=collator)


def with_length_column(train_dataset, args: TrainingArguments, text_columns: Sequence[str]):
    """
    `train_dataset` with the length column that `train_sampling_strategy="group_by_length"` batches by (words of
    `text_columns`), added when that strategy is on and the column is missing; otherwise `train_dataset` unchanged.
    Batches of similar lengths pad less: the warm-ups' questions run from a few words (short descriptions) to whole
    sentences (cloze questions), and padding every batch to its longest question wastes most of a step.
    """
    column = args.length_column_name
    if (
        getattr(args, "train_sampling_strategy", None) != "group_by_length"
        or not isinstance(train_dataset, datasets.Dataset)
        or column in train_dataset.column_names
    ):
        return train_dataset
    missing = [c for c in text_columns if c not in train_dataset.column_names]
    if missing:
        raise ValueError(
            f"group_by_length needs the {missing} column(s) of the training data, or a {column!r} column."
        )
    lengths = [
        sum(len(str(value).split()) for value in values)
        for values in zip(*(train_dataset[c] for c in text_columns), strict=True)
    ]
    return train_dataset.add_column(column, lengths)


def evaluation_history(trainer) -> list[dict]:
    """
    Every evaluation the Trainer logged (`eval_on_start`, `eval_strategy`, the final one) in step order, as
    `{"step": ..., "eval_...": ...}`: the metrics before the first step are otherwise only printed.
    """
    return [
        {"step": entry.get("step"), **{k: v for k, v in entry.items() if k.startswith("eval_")}}
        for entry in trainer.state.log_history
        if any(k.startswith("eval_") for k in entry)
    ]
