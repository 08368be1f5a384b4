"""
The one answer path of REALM Open-QA: the text of a span from its offsets ([`span_text`], written once), the best
distinct spans of one question across its read blocks ([`best_spans`] and [`best_answer`]: what `RealmForOpenQA.answer`,
the question-answering pipeline and `realm-hf ask` return), the per-question reader results of a forward pass
([`read_results`]), how answering weighs the blocks it reads ([`answer_block_logits`]), and the
[`RealmForOpenQAOutput`] of a forward pass ([`collect_answers`]: the reader's best span of
each question, its block, and every retrieved block with its retrieval score).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
from transformers.utils import ModelOutput

from ..metrics import normalize_answer
from .configuration_realm import check_no_answer_threshold
from .modeling_reader import RealmReaderOutput
from .provenance import answer_record, block_provenance, no_answer_record, span_log_probs
from .reader_inputs import RealmReaderInputs


@dataclass
class RealmForOpenQAOutput(ModelOutput):
    """
    Outputs of [`RealmForOpenQA`].

    Args:
        loss (`torch.FloatTensor` of shape `()`, *optional*):
            The legacy marginal loss (retriever + reader), averaged over questions, when answers are given.
        reader_output ([`RealmReaderOutput`]):
            The reader's output for the whole batch.
        predicted_answer_ids (`torch.LongTensor` or `list[torch.LongTensor]`):
            Wordpiece ids of each predicted answer. For a single question this is one tensor, as in the legacy port.
        predicted_answers (`list[str]`):
            Each predicted answer, cut from its block's original text (casing and punctuation kept).
        answer_scores (`torch.FloatTensor` of shape `(batch_size,)`):
            Score of each predicted answer: its span logit + its block's log-prior (the block's retrieval score, or
            its rank with `config.answer_block_prior="rank"`).
        answer_block_ids (`torch.LongTensor` of shape `(batch_size,)`):
            Corpus id of the block each answer was read from.
        answer_char_spans (`list[tuple[int, int]]`):
            Character offsets `(start, end)` of each answer in its block's text.
        retrieved_block_ids (`torch.LongTensor` of shape `(batch_size, k)`):
            Corpus ids of the retrieved blocks, best first.
        retrieved_scores (`torch.FloatTensor` of shape `(batch_size, k)`):
            Retrieval scores (question · block inner products) of the retrieved blocks.
        retrieved_blocks (`list[list[dict]]`):
            The retrieved blocks (`block_id`, `title`, `text`, `score` and the corpus's other columns): the answers'
            provenance.
        reader_input_ids (`torch.LongTensor` of shape `(batch_size, num_read_blocks, sequence_length)`):
            The reader's (question, block) pairs as the forward tokenized them, so that a caller can cut answers from
            other spans than the best one without tokenizing the pairs again.
        reader_offset_mapping (`torch.LongTensor` of shape `(batch_size, num_read_blocks, seq_len, 2)`, *optional*):
            Character offsets of each token of `reader_input_ids` in its segment (question or block text); `None`
            with a slow tokenizer.
    """

    loss: torch.FloatTensor | None = None
    reader_output: RealmReaderOutput | None = None
    predicted_answer_ids: Any = None
    predicted_answers: list[str] | None = None
    answer_scores: torch.FloatTensor | None = None
    answer_block_ids: torch.LongTensor | None = None
    answer_char_spans: list[tuple[int, int]] | None = None
    retrieved_block_ids: torch.LongTensor | None = None
    retrieved_scores: torch.FloatTensor | None = None
    retrieved_blocks: list[list[dict]] | None = None
    reader_input_ids: torch.LongTensor | None = None
    reader_offset_mapping: torch.LongTensor | None = None


def answer_block_logits(config, relevance_score: torch.Tensor) -> torch.Tensor:
    """
    The log p(z|x) that answering adds to the span scores of each read block (`config.answer_block_prior`): the
    retrieval scores themselves (`"retrieval"`, REALM's), or minus each block's place in the retriever's order
    (`"rank"`: 0 for the first block, -1 for the second, ...), blocks scored `-inf` kept at `-inf`.
    """
    if getattr(config, "answer_block_prior", "retrieval") != "rank":
        return relevance_score
    places = torch.arange(relevance_score.shape[-1], dtype=relevance_score.dtype, device=relevance_score.device)
    return torch.where(torch.isneginf(relevance_score), relevance_score, -places.expand_as(relevance_score))


def check_finite_reader_logits(reader_logits: torch.Tensor) -> None:
    """
    Refuse NaN span logits when answering: every span would tie at NaN, and the answer would be an empty span with
    score 0, which reads like "no answer" instead of a broken model.
    """
    if torch.isnan(reader_logits).any():
        raise ValueError(
            "The reader's span scores are NaN: its weights hold NaN (training diverged: lower the learning rate or "
            "resume from an earlier checkpoint; or the checkpoint is damaged: load it again) or its activations "
            "overflowed in fp16 (answer in fp32 or bf16). No answer can be chosen."
        )


def collect_answers(
    reader_output: RealmReaderOutput, reader_inputs: RealmReaderInputs, block_ids, relevance_score, search, tokenizer
) -> RealmForOpenQAOutput:
    """
    The [`RealmForOpenQAOutput`] of a forward pass from the reader's output over `reader_inputs`, the retrieved
    `block_ids`, their `relevance_score` and the `search` that found them. Answer texts come from [`span_text`].
    """
    batch = torch.arange(block_ids.shape[0], device=reader_output.block_idx.device)
    num_read = reader_output.reader_logits.shape[1]
    answer_scores = reader_output.reader_logits[batch, reader_output.block_idx, reader_output.candidate]
    answer_ids, answer_texts, char_spans = [], [], []
    blocks = search.blocks
    offsets = reader_inputs.offset_mapping
    for b in range(block_ids.shape[0]):
        row = int(reader_output.block_idx[b])
        start, end = int(reader_output.start_pos[b]), int(reader_output.end_pos[b])
        input_ids = reader_inputs.input_ids[b, row]
        answer_ids.append(input_ids[start : end + 1])
        text, char_start, char_end = span_text(
            blocks[b][row]["text"], None if offsets is None else offsets[b, row], input_ids, start, end, tokenizer
        )
        answer_texts.append(text)
        char_spans.append(None if char_start is None else (char_start, char_end))
    answer_block_ids = block_ids.to(batch.device)[batch, reader_output.block_idx]
    retrieved_blocks = [
        [dict(block, score=float(score)) for block, score in zip(row_blocks, row_scores)]
        for row_blocks, row_scores in zip(blocks, relevance_score.detach().cpu().tolist())
    ]
    return RealmForOpenQAOutput(
        loss=reader_output.loss,
        reader_output=reader_output,
        predicted_answer_ids=answer_ids[0] if len(answer_ids) == 1 else answer_ids,
        predicted_answers=answer_texts,
        answer_scores=answer_scores,
        answer_block_ids=answer_block_ids,
        answer_char_spans=char_spans,
        retrieved_block_ids=block_ids,
        retrieved_scores=relevance_score,
        retrieved_blocks=retrieved_blocks,
        # The read pairs, so callers (the pipeline's top-k answers) need not tokenize them a second time.
        reader_input_ids=reader_inputs.input_ids[:, :num_read],
        reader_offset_mapping=reader_inputs.offset_mapping[:, :num_read]
        if reader_inputs.offset_mapping is not None
        else None,
    )


def _normalize_text(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().casefold()


def _align_to_words(text: str, start: int, end: int) -> tuple[int, int]:
    """Widen the characters `[start, end)` of `text` to whole words (a wordpiece span may start or end in one)."""
    # Words as BERT's pre-tokenizer cuts them: runs of letters and digits; spaces and punctuation end a word.
    while start > 0 and text[start - 1].isalnum() and text[start].isalnum():
        start -= 1
    while end < len(text) and text[end].isalnum() and text[end - 1].isalnum():
        end += 1
    return start, end


def span_text(
    text: str, offsets, input_ids, start: int, end: int, tokenizer, align_to_words: bool = False
) -> tuple[str, int | None, int | None]:
    """
    The answer text of the wordpieces `start`..`end` (inclusive) of one read (question, block) pair, and its character
    span `[char_start, char_end)` in the block's `text`: cut from `text` by the pair's character `offsets` (`[seq, 2]`,
    from a fast tokenizer), widened to whole words with `align_to_words`; without offsets (a slow tokenizer), the
    wordpieces `input_ids[start:end + 1]` decoded, and no character span (`None, None`).
    """
    if offsets is None:
        return tokenizer.decode(input_ids[start : end + 1]), None, None
    char_start, char_end = int(offsets[start, 0]), int(offsets[end, 1])
    if align_to_words:
        char_start, char_end = _align_to_words(text, char_start, char_end)
    return text[char_start:char_end], char_start, char_end


def read_results(out: RealmForOpenQAOutput, questions: list[str]) -> list[dict]:
    """
    What [`best_spans`] reads for each question of a [`RealmForOpenQA`] forward pass: its span logits over the read
    blocks, the candidate spans, the read pairs' offsets and wordpieces (the forward's own encoding: each pair is
    tokenized once per call), and the read blocks' texts and provenance (CPU tensors).
    """
    reader_output = out.reader_output
    num_read = reader_output.reader_logits.shape[1]
    offsets, input_ids = out.reader_offset_mapping, out.reader_input_ids
    results = []
    for b, question in enumerate(questions):
        blocks = out.retrieved_blocks[b][:num_read]
        results.append(
            {
                "question": question,
                "logits": reader_output.reader_logits[b].detach().float().cpu(),
                "starts": reader_output.candidate_starts.cpu(),
                "ends": reader_output.candidate_ends.cpu(),
                "offsets": offsets[b, :num_read].cpu() if offsets is not None else None,
                "input_ids": input_ids[b, :num_read].cpu(),
                "texts": [block["text"] for block in blocks],
                "blocks": [block_provenance(block) for block in blocks],
            }
        )
    return results


def is_question_phrase(answer: str, question: str) -> bool:
    """
    Whether `answer` is a phrase of `question`: its SQuAD-normalised words appear in the normalised question next to
    each other and in the same order ("carolingian empire" in "which treaty split the carolingian empire in 843";
    not "Kuwait City" in "the capital and largest city of Kuwait").
    """
    return _is_run_of(normalize_answer(answer).split(), normalize_answer(question).split())


def _is_run_of(words: list[str], question_words: list[str]) -> bool:
    n = len(words)
    return n > 0 and any(question_words[i : i + n] == words for i in range(len(question_words) - n + 1))


def _best_first(scores: torch.Tensor, head: int):
    """
    Indices of `scores` from the highest: the best `head` by a partial sort, the rest (rarely needed: repeated texts,
    spans that are phrases of the question) by a full sort only if the caller reads past them.
    """
    head = min(head, scores.numel())
    yield from torch.topk(scores, head).indices.tolist()
    if head < scores.numel():
        yield from torch.argsort(scores, descending=True)[head:].tolist()


def best_spans(
    result: dict,
    top_k: int,
    max_answer_len: int,
    tokenizer,
    align_to_words: bool = True,
    skip_answers_in_question: bool = False,
    no_answer_threshold: float | None = None,
) -> list[dict]:
    """
    The `top_k` best spans across the read blocks of one question (a [`read_results`] entry, or the pipeline's
    `context` windows in the same form), with distinct texts, best first, each at most `max_answer_len` wordpieces;
    widened to whole words with `align_to_words` (where there are character offsets: a fast tokenizer; without
    them the wordpieces are decoded). Each is an [`~realm_hf.models.provenance.answer_record`]; fewer than `top_k`
    when the blocks hold fewer, none when every span is masked. With `skip_answers_in_question`
    (`config.skip_answers_in_question`), spans that are a phrase of the result's `question` ([`is_question_phrase`])
    come after every other span, in their own order. With `no_answer_threshold`, spans whose probability is under it
    are dropped, and when none is left the list holds one "no answer"
    ([`~realm_hf.models.provenance.no_answer_record`], whose `score` is the best span's probability).
    """
    answers = _ranked_spans(result, top_k, max_answer_len, tokenizer, align_to_words, skip_answers_in_question)
    if no_answer_threshold is None or not answers:
        return answers
    kept = [answer for answer in answers if answer["score"] >= no_answer_threshold]
    return kept or [no_answer_record(max(answer["score"] for answer in answers))]


def _ranked_spans(
    result: dict,
    top_k: int,
    max_answer_len: int,
    tokenizer,
    align_to_words: bool,
    skip_answers_in_question: bool,
) -> list[dict]:
    logits = result["logits"]  # [num_blocks, num_candidates]
    starts, ends = result["starts"], result["ends"]
    num_candidates = logits.shape[-1]
    flat = logits.reshape(-1)
    # Spans outside a block carry a huge negative mask; they are not answers and take no probability mass.
    log_probs = span_log_probs(flat)
    valid = log_probs > float("-inf")
    if not bool(valid.any()):
        return []
    widths = (ends - starts + 1).repeat(logits.shape[0])
    eligible = valid & (widths <= max_answer_len)
    ranking = torch.where(eligible, flat, torch.full_like(flat, float("-inf")))
    # The question's words once, not once per candidate span.
    question_words = normalize_answer(result["question"]).split() if skip_answers_in_question else None
    answers, seen, in_question = [], set(), []
    for index in _best_first(ranking, 4 * top_k + 16):
        if not bool(eligible[index]) or len(answers) >= top_k:
            break
        row, candidate = divmod(index, num_candidates)
        offsets, input_ids = result["offsets"], result["input_ids"]
        text, char_start, char_end = span_text(
            result["texts"][row],
            None if offsets is None else offsets[row],
            None if input_ids is None else input_ids[row],
            int(starts[candidate]),
            int(ends[candidate]),
            tokenizer,
            align_to_words,
        )
        key = _normalize_text(text)
        if not key or key in seen:
            continue
        seen.add(key)
        record = answer_record(
            text,
            score=float(log_probs[index].exp()),
            logit=float(flat[index]),
            start=char_start,
            end=char_end,
            block=dict(result["blocks"][row]),
        )
        if question_words is not None and _is_run_of(normalize_answer(text).split(), question_words):
            # Ranked last, not dropped: when the blocks hold nothing else, it is still the best answer there is.
            if len(in_question) < top_k:
                in_question.append(record)
            continue
        answers.append(record)
    return answers + in_question[: top_k - len(answers)]


def best_answer(
    result: dict,
    max_answer_len: int,
    tokenizer,
    align_to_words: bool = True,
    skip_answers_in_question: bool = False,
    no_answer_threshold: float | None = None,
) -> dict:
    """
    The best span of [`best_spans`], or "no answer" (`""`, no block) when no span can be one (`score` 0) or, with
    `no_answer_threshold`, when the best span's probability (its `score`) is under it.
    """
    answers = best_spans(
        result,
        1,
        max_answer_len,
        tokenizer,
        align_to_words=align_to_words,
        skip_answers_in_question=skip_answers_in_question,
        no_answer_threshold=no_answer_threshold,
    )
    return answers[0] if answers else no_answer_record(0.0)


#: The span probability under which the question-answering pipeline's `handle_impossible_answer=True` and
#: `realm-hf serve` answer "no answer" when neither the call nor `config.no_answer_threshold` names one. A starting
#: point: `bench/abstention.py` measures what a threshold costs and gains on a given model.
DEFAULT_NO_ANSWER_THRESHOLD = 0.1


def resolve_no_answer_threshold(
    config, no_answer_threshold: float | None = None, handle_impossible_answer: bool | None = None
) -> float | None:
    """
    The span probability under which a call answers "no answer", or `None` (always the best span): the call's
    `no_answer_threshold`, else with `handle_impossible_answer=True` (transformers' name) `config.no_answer_threshold`
    or [`DEFAULT_NO_ANSWER_THRESHOLD`], with `handle_impossible_answer=False` none, and when neither is given
    `config.no_answer_threshold`. Checked: a probability from 0 to 1.
    """
    if handle_impossible_answer is not None and not isinstance(handle_impossible_answer, bool):
        raise ValueError(f"`handle_impossible_answer` must be True or False, got {handle_impossible_answer!r}.")
    threshold = check_no_answer_threshold(no_answer_threshold)
    if threshold is not None:
        if handle_impossible_answer is False:
            raise ValueError(
                f"`handle_impossible_answer=False` (always answer) contradicts `no_answer_threshold={threshold}`: "
                "give one of them."
            )
        return threshold
    configured = getattr(config, "no_answer_threshold", None)
    if handle_impossible_answer is None:
        return configured
    if not handle_impossible_answer:
        return None
    return configured if configured is not None else DEFAULT_NO_ANSWER_THRESHOLD
