"""Open-QA metrics: exact match and F1 with SQuAD answer normalisation, and retrieval recall@k, MRR@k and nDCG@k.

The functions here are the single source of truth; the `evaluate` metric module in `metrics/realm_qa/` calls them.
Load it offline with `evaluate.load(realm_hf.metrics.REALM_QA_METRIC_PATH)` (or [`load_realm_qa_metric`]):
`evaluate.load("squad")` needs the Hub.
"""

from __future__ import annotations

import collections
import math
import numbers
import os
import re
import string
from collections.abc import Iterable, Sequence

__all__ = [
    "REALM_QA_METRIC_PATH",
    "answer_mrr_at_k",
    "answer_ndcg_at_k",
    "answer_recall_at_k",
    "compute_qa_metrics",
    "exact_match_score",
    "f1_score",
    "has_answer",
    "load_realm_qa_metric",
    "mrr_at_k",
    "ndcg_at_k",
    "normalize_answer",
    "recall_at_k",
]

#: Directory of the local `evaluate` metric module, `realm_qa` (exact match and F1): `evaluate.load(REALM_QA_METRIC_PATH)`
#: works offline, where `evaluate.load("squad")` needs the Hub.
REALM_QA_METRIC_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "realm_qa")

_ARTICLES = re.compile(r"\b(a|an|the)\b", flags=re.UNICODE)
# str.translate: one C pass per string (a per-character generator was most of building the Wikipedia task).
_DROP_PUNCTUATION = str.maketrans("", "", string.punctuation)
DEFAULT_KS = (1, 5, 10, 20, 50, 100)


def normalize_answer(s: str) -> str:
    """
    Normalise an answer string as the official SQuAD evaluation script does: lowercase, remove punctuation, remove
    the articles "a", "an" and "the", and collapse whitespace.

    Args:
        s (`str`): The answer text.

    Returns:
        `str`: The normalised text (tokens separated by single spaces).

    Example:

    ```python
    >>> normalize_answer("The  Eiffel-Tower!")
    'eiffeltower'
    ```
    """
    s = s.lower()
    s = s.translate(_DROP_PUNCTUATION)
    # Articles are removed after punctuation, as in SQuAD, so "the-end" -> "theend" keeps its "the".
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _check_answer_text(value, what: str) -> str:
    # normalize_answer would fail on `.lower()` (AttributeError) or, for a number, never match its string form.
    if not isinstance(value, str):
        raise TypeError(
            f"{what} must be a string, got {type(value).__name__} {value!r}: convert answers to text first "
            '(e.g. `str(answer)` for numbers, `""` for no answer).'
        )
    return value


def _as_gold_list(ground_truths: str | Iterable[str]) -> list[str]:
    if isinstance(ground_truths, str):
        return [ground_truths]
    if not isinstance(ground_truths, Iterable):
        _check_answer_text(ground_truths, "A gold answer")
    golds = [_check_answer_text(g, "A gold answer") for g in ground_truths]
    # SQuAD v2 convention: no (or only empty) golds means the correct answer is the empty string.
    return golds if any(normalize_answer(g) for g in golds) else [""]


def _exact_match_single(prediction: str, ground_truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def _f1_single(prediction: str, ground_truth: str, squad_v2: bool = False) -> float:
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(ground_truth).split()
    if squad_v2 and (not pred_tokens or not gold_tokens):
        # SQuAD 2.0 (no-answer questions): F1 is 1 when both are empty, else 0.
        return float(pred_tokens == gold_tokens)
    # SQuAD v1.1's script: no common token (which includes an empty prediction or gold) scores 0.
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def exact_match_score(prediction: str, ground_truths: str | Iterable[str]) -> float:
    """
    Exact match of a prediction against one or several gold answers, after [`normalize_answer`].

    Args:
        prediction (`str`): The predicted answer.
        ground_truths (`str` or `Iterable[str]`): One gold answer or several; the best match counts. An empty list
            (or only empty golds) means the gold answer is the empty string, as in SQuAD v2.

    Returns:
        `float`: 1.0 if the normalised prediction equals any normalised gold answer, else 0.0.
    """
    _check_answer_text(prediction, "The prediction")
    return max(_exact_match_single(prediction, gt) for gt in _as_gold_list(ground_truths))


def f1_score(prediction: str, ground_truths: str | Iterable[str], squad_v2: bool = False) -> float:
    """
    Token-level F1 between a prediction and one or several gold answers (bag of normalised tokens, as in SQuAD).

    Args:
        prediction (`str`): The predicted answer.
        ground_truths (`str` or `Iterable[str]`): One gold answer or several; the maximum F1 counts.
        squad_v2 (`bool`, *optional*, defaults to `False`): How an answer that normalises to nothing scores. `False`
            is SQuAD v1.1's official script, which REALM and ORQA report: F1 is 0 whenever prediction and gold share
            no token, so also when both are empty (`f1_score("", [""]) == 0.0`; exact match still counts `""` equal
            to `""`). `True` is SQuAD 2.0's rule for no-answer questions: 1.0 if both are empty, 0.0 if only one is.

    Returns:
        `float`: F1 in [0, 1].
    """
    _check_answer_text(prediction, "The prediction")
    return max(_f1_single(prediction, gt, squad_v2) for gt in _as_gold_list(ground_truths))


def compute_qa_metrics(
    predictions: Sequence[str], references: Sequence[str | Sequence[str]], squad_v2: bool = False
) -> dict:
    """
    Corpus-level exact match and F1 on the SQuAD 0-100 scale (SQuAD v1.1's F1 unless `squad_v2`, see [`f1_score`]).

    Args:
        predictions (`Sequence[str]`): One predicted answer per question.
        references (`Sequence[str | Sequence[str]]`): The gold answers of each question (a string or a list).
        squad_v2 (`bool`, *optional*, defaults to `False`): Score empty answers by SQuAD 2.0's rule ([`f1_score`]).

    Returns:
        `dict`: `exact_match` and `f1` (means over questions, in percent), `exact_match_count` (questions answered
        exactly) and `total` (number of questions). Both means are 0.0 when there are no questions.

    Example:

    ```python
    >>> compute_qa_metrics(["Paris France", "1984"], [["Paris"], ["1985", "1984"]])
    {'exact_match': 50.0, 'f1': 83.33333333333333, 'exact_match_count': 1, 'total': 2}
    ```
    """
    _check_per_question(predictions, "predictions", "one predicted answer string per question")
    _check_per_question(references, "references", "one string or list of gold answers per question")
    if len(predictions) != len(references):
        raise ValueError(f"Got {len(predictions)} predictions for {len(references)} references.")
    total = len(predictions)
    em = [exact_match_score(p, r) for p, r in zip(predictions, references)]
    f1 = [f1_score(p, r, squad_v2) for p, r in zip(predictions, references)]
    return {
        "exact_match": 100.0 * sum(em) / total if total else 0.0,
        "f1": 100.0 * sum(f1) / total if total else 0.0,
        "exact_match_count": int(sum(em)),
        "total": total,
    }


def _check_per_question(values, name: str, expected: str) -> None:
    # A bare string has a length too: its characters would be scored as questions (a silent wrong score).
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise TypeError(f"`{name}` must be a list with {expected}, got {type(values).__name__} {values!r:.80}.")


def _check_ks(ks: Iterable[int]) -> list[int]:
    # `ks=5` (not a list) or `ks=[1.5]` (cut to 1 by int()) would fail deep in a set comprehension or score silently.
    if isinstance(ks, (str, bytes)) or not isinstance(ks, Iterable):
        raise TypeError(f"`ks` must be a list of cut-offs such as [1, 5, 10], got {ks!r}.")
    ks = list(ks)
    if not ks or any(isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1 for k in ks):
        raise ValueError(f"`ks` must be positive integers, got {ks}.")
    return sorted({int(k) for k in ks})


def _gold_id_set(gold, question: int) -> set[int]:
    """The gold block ids of one question: an id, several, or none (`None`: a miss)."""
    if gold is None:
        return set()
    if hasattr(gold, "tolist"):  # tensors and numpy values, 0-d ones included (a 0-d tensor cannot be iterated)
        gold = gold.tolist()
    # A string is one id: iterating "12" gave the ids {1, 2}, a silent wrong recall.
    if isinstance(gold, (str, bytes)) or not isinstance(gold, Iterable):
        gold = [gold]
    try:
        return {int(g) for g in gold}
    except (TypeError, ValueError):
        raise ValueError(
            f"The gold block ids of question {question} must be integers (the `block_id`s a search returns), got "
            f"{gold!r:.80}."
        ) from None


def recall_at_k(
    retrieved_block_ids: Sequence[Sequence[int]],
    gold_block_ids: Sequence[int | Iterable[int]],
    ks: Iterable[int] = DEFAULT_KS,
) -> dict[str, float]:
    """
    Retrieval recall@k by block id: the fraction of questions with at least one gold block among the top `k`
    retrieved blocks.

    Args:
        retrieved_block_ids (`Sequence[Sequence[int]]`): For each question, retrieved block ids, best first.
        gold_block_ids (`Sequence[int | Iterable[int]]`): For each question, its gold block id or ids. A question
            with no gold block counts as a miss.
        ks (`Iterable[int]`, *optional*, defaults to `(1, 5, 10, 20, 50, 100)`): Cut-offs. When fewer than `k`
            blocks were retrieved, all of them count.

    Returns:
        `dict[str, float]`: `{"recall@k": fraction in [0, 1]}` for each `k` (0.0 when there are no questions).
    """
    relevance, _ = _block_relevance(retrieved_block_ids, gold_block_ids)
    ks = _check_ks(ks)
    # Rank of the first gold block per question (None: never retrieved); one pass serves every k.
    first_hits = [next((rank for rank, hit in enumerate(row) if hit), None) for row in relevance]
    return _recall_from_first_hits(first_hits, ks)


def _block_relevance(retrieved_block_ids, gold_block_ids) -> tuple[list[list[bool]], list[int]]:
    """Per question: whether each retrieved block is a gold one, and how many gold blocks the question has."""
    if len(retrieved_block_ids) != len(gold_block_ids):
        raise ValueError(f"Got {len(retrieved_block_ids)} retrievals for {len(gold_block_ids)} gold entries.")
    relevance, totals = [], []
    for question, (retrieved, gold) in enumerate(zip(retrieved_block_ids, gold_block_ids)):
        gold_set = _gold_id_set(gold, question)
        if hasattr(retrieved, "tolist"):
            retrieved = retrieved.tolist()
        if isinstance(retrieved, (str, bytes)) or not isinstance(retrieved, Iterable):
            raise TypeError(
                f"`retrieved_block_ids` holds one list of block ids per question; question {question} has "
                f"{retrieved!r:.80}. For one question pass `[ids]`."
            )
        relevance.append([int(b) in gold_set for b in retrieved])
        totals.append(len(gold_set))
    return relevance, totals


def _answer_relevance(retrieved_texts, answers, depth: int | None) -> list[list[bool]]:
    """Per question: whether each of its first `depth` (`None`: all) retrieved blocks holds a gold answer."""
    if len(retrieved_texts) != len(answers):
        raise ValueError(f"Got {len(retrieved_texts)} retrievals for {len(answers)} answer lists.")
    relevance = []
    for question, (texts, golds) in enumerate(zip(retrieved_texts, answers)):
        if isinstance(texts, (str, bytes)) or not hasattr(texts, "__len__"):
            raise TypeError(
                f"`retrieved_texts` holds one list of block texts per question; question {question} has a "
                f"{type(texts).__name__}. For one retrieved block per question pass `[[text], ...]`."
            )
        relevance.append([has_answer(t, golds) for t in texts[:depth]])
    return relevance


def _mrr(relevance: list[list[bool]], ks: list[int]) -> dict[str, float]:
    n = len(relevance)
    first = [next((rank for rank, hit in enumerate(row) if hit), None) for row in relevance]
    return {f"mrr@{k}": (sum(1.0 / (r + 1) for r in first if r is not None and r < k) / n if n else 0.0) for k in ks}


def _ndcg(relevance: list[list[bool]], relevant_counts: list[int], ks: list[int]) -> dict[str, float]:
    n = len(relevance)
    scores = {}
    for k in ks:
        total = 0.0
        for row, count in zip(relevance, relevant_counts):
            ideal = sum(1.0 / math.log2(rank + 2) for rank in range(min(k, count)))
            if ideal:
                total += sum(1.0 / math.log2(rank + 2) for rank, hit in enumerate(row[:k]) if hit) / ideal
        scores[f"ndcg@{k}"] = total / n if n else 0.0
    return scores


def mrr_at_k(
    retrieved_block_ids: Sequence[Sequence[int]],
    gold_block_ids: Sequence[int | Iterable[int]],
    ks: Iterable[int] = DEFAULT_KS,
) -> dict[str, float]:
    """
    Mean reciprocal rank by block id: the mean over questions of 1 / (the rank of the first gold block among the top
    `k` retrieved), 0 for a question with none there.

    Args:
        retrieved_block_ids (`Sequence[Sequence[int]]`): For each question, retrieved block ids, best first.
        gold_block_ids (`Sequence[int | Iterable[int]]`): For each question, its gold block id or ids.
        ks (`Iterable[int]`, *optional*, defaults to `(1, 5, 10, 20, 50, 100)`): Cut-offs.

    Returns:
        `dict[str, float]`: `{"mrr@k": value in [0, 1]}` for each `k` (0.0 when there are no questions).
    """
    ks = _check_ks(ks)
    relevance, _ = _block_relevance(retrieved_block_ids, gold_block_ids)
    return _mrr(relevance, ks)


def ndcg_at_k(
    retrieved_block_ids: Sequence[Sequence[int]],
    gold_block_ids: Sequence[int | Iterable[int]],
    ks: Iterable[int] = DEFAULT_KS,
) -> dict[str, float]:
    """
    Normalised discounted cumulative gain by block id, with binary gains (a gold block 1, any other 0): DCG@k =
    sum over the top `k` of gain / log2(rank + 1), divided by the DCG of the ideal ranking (every gold block first).

    Args:
        retrieved_block_ids (`Sequence[Sequence[int]]`): For each question, retrieved block ids, best first.
        gold_block_ids (`Sequence[int | Iterable[int]]`): For each question, its gold block id or ids; a question
            without one scores 0.
        ks (`Iterable[int]`, *optional*, defaults to `(1, 5, 10, 20, 50, 100)`): Cut-offs.

    Returns:
        `dict[str, float]`: `{"ndcg@k": value in [0, 1]}` for each `k`.
    """
    ks = _check_ks(ks)
    relevance, totals = _block_relevance(retrieved_block_ids, gold_block_ids)
    return _ndcg(relevance, totals, ks)


def _recall_from_first_hits(first_hits: list[int | None], ks: list[int]) -> dict[str, float]:
    n = len(first_hits)
    return {f"recall@{k}": (sum(1 for r in first_hits if r is not None and r < k) / n if n else 0.0) for k in ks}


def has_answer(text: str, answers: str | Iterable[str]) -> bool:
    """
    Whether a block contains an answer: some normalised answer occurs in the normalised block text as a whole-token
    sequence (so "C" does not match inside "cat"), as in ORQA/REALM evaluation.

    Args:
        text (`str`): The block text.
        answers (`str` or `Iterable[str]`): The gold answers; answers that normalise to nothing never match.

    Returns:
        `bool`
    """
    _check_answer_text(text, "The block text")
    answers = [answers] if isinstance(answers, str) else answers
    if not isinstance(answers, Iterable):
        _check_answer_text(answers, "A gold answer")
    padded_text = f" {normalize_answer(text)} "
    for answer in answers:
        normalized = normalize_answer(_check_answer_text(answer, "A gold answer"))
        if normalized and f" {normalized} " in padded_text:
            return True
    return False


def answer_recall_at_k(
    retrieved_texts: Sequence[Sequence[str]],
    answers: Sequence[str | Sequence[str]],
    ks: Iterable[int] = DEFAULT_KS,
) -> dict[str, float]:
    """
    Answer recall@k: the fraction of questions for which at least one of the top `k` retrieved blocks contains a
    gold answer (see [`has_answer`]). This is the retrieval metric of ORQA and REALM, usable without gold block ids.

    Args:
        retrieved_texts (`Sequence[Sequence[str]]`): For each question, the texts of the retrieved blocks, best first.
        answers (`Sequence[str | Sequence[str]]`): For each question, its gold answer(s).
        ks (`Iterable[int]`, *optional*, defaults to `(1, 5, 10, 20, 50, 100)`): Cut-offs.

    Returns:
        `dict[str, float]`: `{"answer_recall@k": fraction in [0, 1]}` for each `k`.
    """
    if len(retrieved_texts) != len(answers):
        raise ValueError(f"Got {len(retrieved_texts)} retrievals for {len(answers)} answer lists.")
    ks = _check_ks(ks)
    max_k = ks[-1]
    first_hits = []
    for question, (texts, golds) in enumerate(zip(retrieved_texts, answers)):
        # A string per question would be sliced into characters, none of which holds an answer: recall 0 in silence.
        if isinstance(texts, (str, bytes)) or not hasattr(texts, "__len__"):
            raise TypeError(
                f"`retrieved_texts` holds one list of block texts per question; question {question} has a "
                f"{type(texts).__name__}. For one retrieved block per question pass `[[text], ...]`."
            )
        first_hits.append(next((rank for rank, t in enumerate(texts[:max_k]) if has_answer(t, golds)), None))
    return {f"answer_{key}": value for key, value in _recall_from_first_hits(first_hits, ks).items()}


def answer_mrr_at_k(
    retrieved_texts: Sequence[Sequence[str]],
    answers: Sequence[str | Sequence[str]],
    ks: Iterable[int] = DEFAULT_KS,
) -> dict[str, float]:
    """
    Answer MRR@k: the mean over questions of 1 / (the rank of the first retrieved block among the top `k` that holds a
    gold answer, [`has_answer`]), 0 for a question with none there. The ranking counterpart of
    [`answer_recall_at_k`], usable without gold block ids.

    Returns:
        `dict[str, float]`: `{"answer_mrr@k": value in [0, 1]}` for each `k`.
    """
    ks = _check_ks(ks)
    return {
        f"answer_{key}": value for key, value in _mrr(_answer_relevance(retrieved_texts, answers, ks[-1]), ks).items()
    }


def answer_ndcg_at_k(
    retrieved_texts: Sequence[Sequence[str]],
    answers: Sequence[str | Sequence[str]],
    ks: Iterable[int] = DEFAULT_KS,
) -> dict[str, float]:
    """
    Answer nDCG@k, with binary gains: a retrieved block that holds a gold answer ([`has_answer`]) gains 1. Open-QA
    data names no gold blocks, so the ideal ranking is that of the retrieved blocks themselves (every answer-holding
    block of the given list first): the metric measures how high retrieval ranks the answer-holding blocks it found,
    and a question whose list holds none scores 0. Pass the same depth of retrieved blocks for every model compared.

    Returns:
        `dict[str, float]`: `{"answer_ndcg@k": value in [0, 1]}` for each `k`.
    """
    ks = _check_ks(ks)
    relevance = _answer_relevance(retrieved_texts, answers, None)  # the whole list: its answer-holding blocks
    counts = [sum(row) for row in relevance]
    return {f"answer_{key}": value for key, value in _ndcg(relevance, counts, ks).items()}


def load_realm_qa_metric(**kwargs):
    """
    Load the `realm_qa` `evaluate` metric (exact match and F1) from the script shipped with realm-hf. It loads from a
    local path, so it works offline, unlike `evaluate.load("squad")`.

    Args:
        **kwargs: Passed to `evaluate.load` (e.g. `experiment_id`, `num_process`, `process_id`).

    Returns:
        `evaluate.Metric`: call `.compute(predictions=[...], references=[[...], ...])` to get the same numbers as
        [`compute_qa_metrics`].
    """
    import evaluate

    return evaluate.load(REALM_QA_METRIC_PATH, **kwargs)
