"""
The two warm-ups before Open-QA fine-tuning, each a cheap stage that trains one part of [`RealmForOpenQA`] on its
own: the retriever warm-up first, then the reader warm-up, then joint fine-tuning. Their recipes (data, arguments,
Trainer) are in `training/recipes.py`.

The retriever warm-up: REALM's retrieval loss alone, on the question embedder, against a fixed index. REALM fine-tunes
the question embedder through the marginal likelihood of the blocks of its searcher beam that hold an answer (the
document embedder and index stay fixed). In a full Open-QA step that gradient comes with a reader pass over every
question's read blocks, which is most of the step's cost. Without the reader a step embeds a batch of short questions
and scores the beam's stored vectors, so the question embedder sees many more questions in the same time.

The reader warm-up: extractive reading of (question, block) pairs whose block is known. A reader initialised from a
BERT checkpoint has a random span scorer. Open-QA fine-tuning teaches it only on the questions whose retrieved blocks
hold an answer, one retrieval per step; reading a question against a block known to answer it costs one encoder pass
and needs no search, so it trains the span scorer far more cheaply. The data are free: salient-span cloze questions
of the corpus's own blocks (REALM's masking, read against the block they come from), and any QA pairs whose gold
block is known.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import datasets
import torch
from transformers import Trainer

from ..logging_utils import get_logger
from ..metrics import has_answer, normalize_answer
from ..models.modeling_reader import marginal_log_loss
from ..models.reader_inputs import build_reader_inputs, normalize_answer_ids, tokenize_answers
from ..progress import progress_bar
from ..text.answer_spans import find_answers_in_token_ids
from ..text.salient_spans import salient_spans
from ..text.sentences import sentence_spans
from ..text.tokenizer_calls import tokenizer_call
from ..text.user_text import check_positive_int
from .openqa import BeamAnswerTally, keep_data_columns, require_data
from .saving import RealmCheckpointMixin

logger = get_logger(__name__)

__all__ = [
    "DataCollatorForReaderWarmup",
    "RealmReaderTrainer",
    "RealmRetrieverTrainer",
    "add_retrieved_negatives",
    "blank_to_question",
    "make_cloze_reading_examples",
    "make_gold_block_examples",
    "retrieval_loss",
]


# The reader warm-up.

BLANK = "___"
_YEAR = re.compile(r"^(?:1[0-9]{3}|20[0-9]{2}|[0-9]{1,4}\s*(?:BC|BCE|AD|CE))s?$")
_MONTH = re.compile(r"\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\b")
_NUMBER = re.compile(r"^[\d.,]+%?$")


def blank_to_question(cloze: str, answer: str, rng: random.Random) -> str:
    """
    Turn a cloze sentence into a question in the sentence's own word order: the blank becomes a question phrase chosen
    by the answer's kind ("what year" for a year, "when" for a date, "how many" for a number, "who"/"what"/"which"
    for a name) and the final period a question mark. "Kubrick directed the film in ___." with answer "1968" gives
    "Kubrick directed the film in what year?". A reader trained on both forms reads typed questions, not only blanks.
    """
    answer = answer.strip()
    if _YEAR.match(answer):
        phrase = rng.choice(("what year", "when"))
    elif _MONTH.search(answer):
        phrase = "when"
    elif _NUMBER.match(answer):
        phrase = rng.choice(("how many", "what number"))
    else:
        phrase = rng.choice(("who", "what", "which"))
    question = cloze.replace(BLANK, phrase, 1).strip()
    question = re.sub(r"[.;:!]+$", "", question).rstrip()
    if question and question[0].islower():
        question = question[0].upper() + question[1:]
    return question + "?"


def make_cloze_reading_examples(
    blocks: Iterable[dict],
    seed: int = 0,
    max_per_block: int | None = 2,
    question_share: float = 0.5,
    min_words: int = 6,
    max_words: int = 40,
    max_answer_words: int = 5,
    keep_sentence: bool = True,
) -> list[dict]:
    """
    Salient-span cloze questions read against their own block: for a sentence of a block with a name, date or number
    (REALM's salient spans), the question is the sentence with that span blanked (`___`), or, for `question_share` of
    them, turned into a question ([`blank_to_question`]); the context is the block and the answer the span. Cheap
    and unlimited: every block gives some.

    With `keep_sentence=True` the context is the whole block, the question's own sentence included, so the reader
    learns to align a question with the passage it was cut from. With `keep_sentence=False` that sentence is taken
    out of the context and only spans whose answer the rest of the block still holds are used: the reader must find
    the answer in other words than the question's, as for a question asked about a retrieved block (the held-out
    cloze questions of [`~realm_hf.data.make_wikipedia_qa_task`] are built the same way).

    Args:
        blocks (`Iterable[dict]`): Blocks with `text` (e.g. the rows of a retriever's corpus, or documents).
        seed (`int`, *optional*, defaults to 0): The draw for a block depends only on the seed and its text.
        max_per_block (`int`, *optional*, defaults to 2): At most this many examples per block, from different
            sentences; `None` keeps one per sentence.
        question_share (`float`, *optional*, defaults to 0.5): Share written as questions rather than blanks.
        min_words, max_words (`int`): Sentence length bounds, in words.
        max_answer_words (`int`, *optional*, defaults to 5): Longest answer, in words.
        keep_sentence (`bool`, *optional*, defaults to `True`): Whether the context keeps the question's sentence.

    Returns:
        `list[dict]`: `question`, `context` and `answers` (one) per example.
    """
    if not 0.0 <= question_share <= 1.0:
        raise ValueError(f"`question_share` must be in [0, 1], got {question_share}.")
    examples = []
    for block in blocks:
        text = block["text"]
        rng = random.Random(f"{seed}:{text[:200]}")
        per_sentence = []
        for start, end in sentence_spans(text):
            sentence = text[start:end]
            if not min_words <= len(sentence.split()) <= max_words:
                continue
            spans = [
                (s, e)
                for s, e in salient_spans(sentence)
                if len(sentence[s:e].split()) <= max_answer_words and normalize_answer(sentence[s:e])
            ]
            # The blanked answer must not stay readable elsewhere in the question.
            spans = [(s, e) for s, e in spans if not has_answer(sentence[:s] + BLANK + sentence[e:], [sentence[s:e]])]
            if keep_sentence:
                context = text
            else:
                context = " ".join(part for part in (text[:start].strip(), text[end:].strip()) if part)
                spans = [(s, e) for s, e in spans if has_answer(context, [sentence[s:e]])]
            if spans:
                per_sentence.append((sentence, context, rng.choice(spans)))
        rng.shuffle(per_sentence)
        for sentence, context, (s, e) in per_sentence[:max_per_block]:
            answer = sentence[s:e]
            cloze = sentence[:s] + BLANK + sentence[e:]
            question = blank_to_question(cloze, answer, rng) if rng.random() < question_share else cloze
            examples.append({"question": question, "context": context, "answers": [answer]})
    return examples


def make_gold_block_examples(questions: Sequence[dict], blocks_by_doc: dict[Any, list[str]]) -> list[dict]:
    """
    QA pairs read against their gold block: for each question (`question`, `answers`, `doc_id`), the first block of
    its document that holds an answer. Questions whose document holds none are skipped.

    Args:
        questions (`Sequence[dict]`): Training questions with the `doc_id` of the document that answers them.
        blocks_by_doc (`dict`): Each document's block texts, in order.

    Returns:
        `list[dict]`: `question`, `context` and `answers` per example.
    """
    examples = []
    for q in questions:
        for text in blocks_by_doc.get(q["doc_id"], ()):
            if has_answer(text, q["answers"]):
                examples.append({"question": q["question"], "context": text, "answers": list(q["answers"])})
                break
    return examples


def add_retrieved_negatives(
    model, examples: Sequence[dict], num_negatives: int = 1, batch_size: int = 64, show_progress: bool = False
) -> list[dict]:
    """
    Give each reading example `num_negatives` blocks that the model's own retriever ranks highest for its question
    but that are not its context: the blocks the reader will meet beside the right one at answer time. Read together
    ([`DataCollatorForReaderWarmup`] reads `[context] + negatives` as one reader beam), the span loss is normalised
    over the spans of all of them, as in REALM's Open-QA loss, so the reader learns which block answers, not only
    where the answer sits in a block known to hold it. A negative that holds an answer string counts as a right
    block, as in Open-QA fine-tuning.

    Args:
        model ([`RealmForOpenQA`]): Embeds the questions (`embed_questions`, no gradient) and searches its retriever.
        examples (`Sequence[dict]`): `question`, `context` and `answers` per example (e.g. [`reader_warmup_examples`]).
        num_negatives (`int`, *optional*, defaults to 1): Retrieved blocks added per example.
        batch_size (`int`, *optional*, defaults to 64): Questions embedded and searched per call.
        show_progress (`bool`, *optional*, defaults to `False`): Show a progress bar.

    Returns:
        `list[dict]`: The examples with a `negatives` list of `num_negatives` block texts each.
    """

    num_negatives = check_positive_int(num_negatives, "num_negatives")
    retriever = model.require_retriever()
    if retriever.num_blocks <= num_negatives:
        raise ValueError(
            f"The corpus has {retriever.num_blocks} blocks: too few for {num_negatives} negatives besides the context "
            "block. Use fewer negatives or a larger corpus."
        )
    tokenizer = retriever.tokenizer
    max_positions = getattr(model.config, "max_position_embeddings", None) or 66
    # One spare per negative: the context block itself, and a duplicate text, may be among the top blocks.
    k = min(retriever.num_blocks, 2 * num_negatives + 1)
    examples = [dict(example) for example in examples]
    with model.evaluating(), torch.no_grad():
        for begin in progress_bar(
            range(0, len(examples), batch_size), desc="Retrieving negatives", disable=not show_progress
        ):
            batch = examples[begin : begin + batch_size]
            questions = [e["question"] for e in batch]
            encoded = tokenizer_call(
                tokenizer,
                questions,
                padding=True,
                truncation=True,
                max_length=min(64, max_positions),
                return_tensors="pt",
            ).to(model.device)
            queries = model.embed_questions(
                encoded["input_ids"], encoded["attention_mask"], encoded.get("token_type_ids")
            )
            found = retriever.search(queries, k=k, questions=questions)
            for example, blocks in zip(batch, found.blocks):
                texts = [block["text"] for block in blocks if block["text"].strip() != example["context"].strip()]
                texts = list(dict.fromkeys(texts))[:num_negatives]
                if len(texts) < num_negatives:
                    raise ValueError(
                        f"Found only {len(texts)} distinct blocks besides the context of {example['question']!r}; "
                        f"the corpus repeats its texts. Use fewer negatives."
                    )
                example["negatives"] = texts
    return examples


@dataclass
class DataCollatorForReaderWarmup:
    """
    Batches `{"question", "context", "answers"}` examples for [`RealmReader`]: each question paired with its context
    as the reader reads a retrieved block (`[CLS] question [SEP] block [SEP]`, cut to `max_length`), and with its
    `negatives` too when the examples carry them ([`add_retrieved_negatives`]: one beam per question), with the gold
    spans marked and zero retrieval scores. An example whose answer is not in what is read (absent from its context,
    or cut off) counts for nothing in the loss: the first is logged and `num_without_answer` counts them.

    Args:
        tokenizer: The reader's BERT WordPiece tokenizer.
        max_length (`int`): Pair length (the model's `config.reader_seq_len`).
    """

    tokenizer: Any
    max_length: int
    num_without_answer: int = 0

    def __call__(self, examples: Sequence[dict]) -> dict[str, torch.Tensor]:
        questions = [e["question"] for e in examples]
        answers = [[e["answers"]] if isinstance(e["answers"], str) else list(e["answers"]) for e in examples]
        # Retrieved negatives ([`add_retrieved_negatives`]) are read beside the context as one beam.
        contexts = [[e["context"], *(e.get("negatives") or ())] for e in examples]
        if len({len(c) for c in contexts}) > 1:
            raise ValueError("Every example of a batch must carry the same number of `negatives`.")
        inputs = build_reader_inputs(
            self.tokenizer,
            questions,
            contexts,
            answer_ids=tokenize_answers(self.tokenizer, answers),
            max_length=self.max_length,
        )
        missing = [i for i, found in enumerate(inputs.has_answers.any(-1).tolist()) if not found]
        if missing:
            # Such an example trains nothing: say so once, or a file of them trains a reader at loss 0 in silence.
            if not self.num_without_answer:
                logger.warning(
                    "Reader warm-up example without its answer in the first %d wordpieces read (question %r, answers "
                    "%r): it adds nothing to the loss. Further ones are counted in the collator's "
                    "`num_without_answer`.",
                    self.max_length,
                    questions[missing[0]],
                    answers[missing[0]],
                )
            self.num_without_answer += len(missing)
        return {
            "input_ids": inputs.input_ids,
            "attention_mask": inputs.attention_mask,
            "token_type_ids": inputs.token_type_ids,
            "block_mask": inputs.block_mask,
            "start_positions": inputs.start_positions,
            "end_positions": inputs.end_positions,
            "has_answers": inputs.has_answers,
            # No retrieval prior: the reader alone must tell the right block from the negatives.
            "relevance_score": torch.zeros(len(examples), len(contexts[0]) if contexts else 1),
        }


class RealmReaderTrainer(RealmCheckpointMixin, Trainer):
    """
    [`~transformers.Trainer`] for the reader warm-up: trains a [`RealmReader`] (e.g. `open_qa_model.reader`) on
    [`DataCollatorForReaderWarmup`] batches. It keeps the `question`, `context` and `answers` columns for the collator
    (the stock Trainer would drop them as unknown to the reader's `forward`), and refuses a training set without
    them, or without a record, before the first step.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        dataset = self.train_dataset
        if isinstance(dataset, datasets.Dataset):  # streamed data meets the collator's checks as it comes
            require_data(
                dataset,
                ("question", "context", "answers"),
                "reader warm-up",
                "each example is a question, the context that answers it and its answers (`reader_warmup_examples`)",
            )

    def _set_signature_columns_if_needed(self):
        super()._set_signature_columns_if_needed()
        keep_data_columns(self, ("question", "context", "answers"))


# The retriever warm-up.


def retrieval_loss(model, input_ids, attention_mask=None, token_type_ids=None, answers=None, answer_ids=None, k=None):
    """
    REALM's retrieval loss for a batch of questions: `-log` of the retrieval probability mass, over the `k` blocks
    retrieved from the model's (fixed) index, on the blocks that hold a gold answer (wordpiece match against the
    corpus's stored token ids, as in Open-QA fine-tuning). Questions whose beam holds no answer add nothing.

    Args:
        model ([`RealmForOpenQA`]): With a retriever; its question embedder gets the gradient.
        input_ids, attention_mask, token_type_ids (`torch.Tensor`): The tokenized questions.
        answers (`list[list[str]]`, *optional*): Gold answers per question (or `answer_ids`, wordpiece ids).
        k (`int`, *optional*): Beam size; defaults to `config.searcher_beam_size`.

    Returns:
        `(loss, has_answer)`: the mean loss (a scalar tensor) and, per question, whether its beam held an answer.
    """
    retriever = model.require_retriever()
    if answers is not None:
        answer_ids = tokenize_answers(retriever.tokenizer, answers)
    answer_ids = normalize_answer_ids(answer_ids, input_ids.shape[0])
    if answer_ids is None:
        raise ValueError("The retrieval loss needs the gold `answers` (or `answer_ids`) of every question.")
    k = min(int(k or model.config.searcher_beam_size), len(retriever))
    question = model.embed_questions(input_ids, attention_mask, token_type_ids)
    # Embeddings and token ids from the search itself: one state of the corpus, nothing looked up afterwards.
    search = retriever.search(question.detach(), k, return_embeddings=True, return_token_ids=True)
    with torch.autocast(question.device.type, enabled=False):
        scores = torch.einsum(
            "bd,bkd->bk", question.float(), search.block_embeddings.to(question.device, torch.float32)
        )
    token_ids, lengths = search.block_token_ids, search.block_token_lengths
    correct = torch.stack(
        [
            find_answers_in_token_ids(token_ids[i].long(), lengths[i], golds)
            if golds
            else torch.zeros(k, dtype=torch.bool)
            for i, golds in enumerate(answer_ids)
        ]
    ).to(scores.device)
    has_answer = correct.any(-1)
    loss = (marginal_log_loss(scores, correct) * has_answer.to(scores.dtype)).mean()
    return loss, has_answer


class RealmRetrieverTrainer(RealmCheckpointMixin, Trainer):
    """
    [`~transformers.Trainer`] for the retriever warm-up of a [`RealmForOpenQA`]: each step minimises
    [`retrieval_loss`] on a batch of [`~realm_hf.training.DataCollatorForOpenQA`] questions; the reader is never run.
    Freeze what should not move (the recipe `retriever_warmup_trainer` trains the question embedder only).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.beam_answers = BeamAnswerTally()

    def _set_signature_columns_if_needed(self):
        super()._set_signature_columns_if_needed()
        keep_data_columns(self, ("question", "answers"))

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, has_answer = retrieval_loss(
            model,
            inputs["input_ids"],
            inputs.get("attention_mask"),
            inputs.get("token_type_ids"),
            answers=inputs.get("answers"),
        )
        if model.training:
            self.beam_answers.add(has_answer)
        return (loss, {"loss": loss, "has_answer": has_answer}) if return_outputs else loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        self.beam_answers.log_into(logs)
        super().log(logs, start_time)
