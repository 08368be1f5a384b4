import math
import os

import pytest
import torch

from realm_hf.metrics import (
    REALM_QA_METRIC_PATH,
    answer_recall_at_k,
    compute_qa_metrics,
    exact_match_score,
    f1_score,
    has_answer,
    load_realm_qa_metric,
    normalize_answer,
    recall_at_k,
)
from tests.support.paths import REPO


def test_normalize_answer():
    assert normalize_answer("The Eiffel Tower") == "eiffel tower"
    assert normalize_answer("  an  apple,  a pear!  ") == "apple pear"
    # Articles only as whole words: "theory" and "Anne" keep their letters.
    assert normalize_answer("Theory of Anne") == "theory of anne"
    # Punctuation goes before articles are removed, as in the SQuAD script.
    assert normalize_answer("U.S.A.") == "usa"
    assert normalize_answer("C++") == "c"
    assert normalize_answer("") == ""


def test_exact_match():
    assert exact_match_score("the Eiffel tower", "Eiffel Tower") == 1.0
    assert exact_match_score("Eiffel", "Eiffel Tower") == 0.0
    # Best over several golds.
    assert exact_match_score("1984", ["1985", "1984."]) == 1.0
    assert exact_match_score("1983", ["1985", "1984"]) == 0.0
    assert exact_match_score("", "") == 1.0
    # No gold answer means the empty answer is correct (SQuAD v2 convention).
    assert exact_match_score("", []) == 1.0
    assert exact_match_score("x", []) == 0.0


def test_f1():
    # "paris france" vs "paris": precision 1/2, recall 1/1 -> 2 * (1/2 * 1) / (1/2 + 1) = 2/3.
    assert f1_score("Paris France", "Paris") == pytest.approx(2 / 3)
    # Articles do not count: "a big red dog" -> [big, red, dog] vs [red, dog, barks]: 2 common,
    # precision 2/3, recall 2/3 -> F1 2/3.
    assert f1_score("a big red dog", "red dog barks") == pytest.approx(2 / 3)
    # Repeated tokens count once each: [the, the] is empty after normalisation; [dog dog dog] vs [dog]:
    # common 1, precision 1/3, recall 1 -> 0.5.
    assert f1_score("dog dog dog", "dog") == pytest.approx(0.5)
    assert f1_score("cat", "dog") == 0.0
    assert f1_score("", "dog") == 0.0
    assert f1_score("dog", "") == 0.0
    # Both normalise to nothing: 0 in SQuAD v1.1's script (no common token), 1 by SQuAD 2.0's no-answer rule.
    assert f1_score("the", "a") == 0.0
    assert f1_score("the", "a", squad_v2=True) == 1.0
    # Max over golds: 2/3 against "Paris", 1 against "Paris, France".
    assert f1_score("Paris France", ["Paris", "Paris, France"]) == 1.0


def test_compute_qa_metrics():
    predictions = ["the Eiffel tower", "Paris France", "1983", "C++"]
    references = [["Eiffel Tower"], ["Paris", "Lyon"], ["1984"], "C"]
    result = compute_qa_metrics(predictions, references)
    # EM: 1, 0, 0, 1 -> 50%. F1: 1, 2/3, 0, 1 -> 2.6667 / 4 = 66.67%.
    assert result["exact_match"] == pytest.approx(50.0)
    assert result["f1"] == pytest.approx(100 * (1 + 2 / 3 + 0 + 1) / 4)
    assert result["exact_match_count"] == 2
    assert result["total"] == 4
    assert compute_qa_metrics([], []) == {"exact_match": 0.0, "f1": 0.0, "exact_match_count": 0, "total": 0}
    with pytest.raises(ValueError):
        compute_qa_metrics(["a"], [])


def test_recall_at_k():
    retrieved = [[3, 1, 2], [5, 6, 7], [9, 8, 4]]
    gold = [1, {7, 100}, 42]
    # Ranks of the first gold: 1, 2, never -> recall@1 0/3, @2 1/3, @3 2/3, @10 2/3 (only 3 retrieved).
    assert recall_at_k(retrieved, gold, ks=(1, 2, 3, 10)) == {
        "recall@1": 0.0,
        "recall@2": pytest.approx(1 / 3),
        "recall@3": pytest.approx(2 / 3),
        "recall@10": pytest.approx(2 / 3),
    }
    assert recall_at_k([[1]], [[]], ks=(1,)) == {"recall@1": 0.0}  # no gold block: a miss
    assert recall_at_k([], [], ks=(5,)) == {"recall@5": 0.0}
    with pytest.raises(ValueError):
        recall_at_k([[1]], [1], ks=(0,))


def test_has_answer():
    assert has_answer("The language C was designed at Bell Labs.", ["C"])
    # Whole tokens only: "C" is not inside "cat", "Bell" does not match "Bellman".
    assert not has_answer("The cat sat.", ["C"])
    assert not has_answer("Bellman-Ford", "Bell")
    assert has_answer("designed by Dennis  Ritchie, in 1972", ["dennis ritchie"])
    assert not has_answer("anything", ["", "the"])  # empty answers never match


def test_answer_recall_at_k():
    retrieved_texts = [
        ["nothing here", "Dennis Ritchie designed C"],
        ["The Eiffel tower is in Paris", "x"],
        ["no", "no"],
    ]
    answers = [["Dennis Ritchie"], ["Paris"], ["Lyon"]]
    assert answer_recall_at_k(retrieved_texts, answers, ks=(1, 2)) == {
        "answer_recall@1": pytest.approx(1 / 3),
        "answer_recall@2": pytest.approx(2 / 3),
    }


def test_metric_script_has_one_import_per_line():
    # evaluate's dependency scanner reads "import a, b" as a package named "a,".
    with open(os.path.join(REALM_QA_METRIC_PATH, "realm_qa.py"), encoding="utf-8") as f:
        imports = [line for line in f if line.startswith("import ")]
    assert imports and all("," not in line for line in imports)


def test_evaluate_metric_matches_functions(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    metric = load_realm_qa_metric()
    predictions = ["the Eiffel tower", "Paris France", "1983", "", "dog dog dog"]
    references = [["Eiffel Tower"], ["Paris", "Lyon"], ["1984", "1983 AD"], ["something"], ["dog"]]
    result = metric.compute(predictions=predictions, references=references)
    expected = compute_qa_metrics(predictions, references)
    assert result == pytest.approx(expected)
    # Hand-worked: EM 1,0,0,0,0 -> 20%; F1 1, 2/3, 2/3 ("1983" vs "1983 ad"), 0, 1/2 -> 2.8333/5.
    assert result["exact_match"] == pytest.approx(20.0)
    assert result["f1"] == pytest.approx(100 * (1 + 2 / 3 + 2 / 3 + 0 + 0.5) / 5)
    # One gold string per question is accepted too.
    single = metric.compute(predictions=["the Eiffel tower"], references=["Eiffel Tower"])
    assert single["exact_match"] == 100.0


def test_mrr_and_ndcg_by_block_id():
    from realm_hf.metrics import mrr_at_k, ndcg_at_k

    retrieved = [[3, 7, 9], [1, 2, 4], [5, 6, 8]]
    gold = [7, [4, 2], None]  # rank 2; ranks 2 and 3 (two gold blocks); none
    assert mrr_at_k(retrieved, gold, ks=[1, 3]) == pytest.approx({"mrr@1": 0.0, "mrr@3": (1 / 2 + 1 / 2) / 3})
    ideal_two = 1 + 1 / math.log2(3)
    expected3 = (1 / math.log2(3) + (1 / math.log2(3) + 1 / math.log2(4)) / ideal_two + 0.0) / 3
    assert ndcg_at_k(retrieved, gold, ks=[1, 3]) == pytest.approx({"ndcg@1": 0.0, "ndcg@3": expected3})
    assert ndcg_at_k([[7, 3]], [7], ks=[2]) == {"ndcg@2": 1.0}
    with pytest.raises(ValueError, match="2 retrievals for 1 gold"):
        mrr_at_k([[1], [2]], [1])
    with pytest.raises(ValueError, match="`ks`"):
        ndcg_at_k([[1]], [1], ks=[0])


def test_answer_mrr_and_ndcg_use_answer_containment():
    from realm_hf.metrics import answer_mrr_at_k, answer_ndcg_at_k

    texts = [["Lyon is big.", "Paris is the capital.", "Paris again."], ["Nothing here.", "Nor here."]]
    answers = [["paris"], ["london"]]
    assert answer_mrr_at_k(texts, answers, ks=[1, 2]) == pytest.approx({"answer_mrr@1": 0.0, "answer_mrr@2": 0.25})
    # The ideal ranking is the retrieved list's own: its two answer-holding blocks first.
    dcg = 1 / math.log2(3) + 1 / math.log2(4)
    assert answer_ndcg_at_k(texts, answers, ks=[3])["answer_ndcg@3"] == pytest.approx(dcg / (1 + 1 / math.log2(3)) / 2)
    with pytest.raises(TypeError, match="one list of block texts per question"):
        answer_ndcg_at_k(["a string"], [["a"]], ks=[1])


def test_the_metric_loads_offline_from_its_documented_path():
    import evaluate

    from realm_hf import metrics

    # The path docs/training.md and the metrics' docstrings give: `evaluate.load("squad")` needs the Hub.
    metric = evaluate.load(metrics.REALM_QA_METRIC_PATH)
    assert metric.compute(predictions=["the Eiffel tower"], references=[["Eiffel Tower"]])["exact_match"] == 100.0
    for where in (metrics.__doc__, open(os.path.join(REPO, "docs", "training.md")).read()):
        assert "evaluate.load(realm_hf.metrics.REALM_QA_METRIC_PATH)" in where


def test_answer_recall_refuses_one_text_per_question():
    # Before: each string was sliced into characters, none holding the answer: recall 0.0 in silence.
    with pytest.raises(TypeError, match="one list of block texts per question"):
        answer_recall_at_k(["Paris is the capital of France"], [["Paris"]], ks=[1])


def test_recall_reads_gold_ids_given_as_strings_tensors_or_none():
    # Before: the gold id "12" was iterated into the ids {1, 2} (recall 0.0), and a 0-d tensor failed in torch with
    # "iteration over a 0-d tensor".
    assert recall_at_k([[12]], ["12"], ks=[1]) == {"recall@1": 1.0}
    assert recall_at_k(torch.tensor([[3, 4]]), torch.tensor([4]), ks=[1, 2]) == {"recall@1": 0.0, "recall@2": 1.0}
    assert recall_at_k([[3]], [None], ks=[1]) == {"recall@1": 0.0}
    with pytest.raises(ValueError, match="question 0.*integers"):
        recall_at_k([[3]], ["Paris"], ks=[1])


def test_recall_cut_offs_must_be_a_list_of_positive_integers():
    # Before: `ks=5` failed with "'int' object is not iterable"; `ks=[1.5]` was cut to 1 in silence.
    with pytest.raises(TypeError, match=r"list of cut-offs such as \[1, 5, 10\]"):
        recall_at_k([[3]], [3], ks=5)
    with pytest.raises(ValueError, match="positive integers"):
        recall_at_k([[3]], [3], ks=[1.5])


@pytest.mark.parametrize(
    "predictions, references, error, message",
    [
        # Before: AttributeError: 'int' object has no attribute 'lower' (numeric answers from JSON).
        ([1984], [["1984"]], TypeError, "prediction.*string.*int 1984"),
        (["1984"], [[1984]], TypeError, "gold answer.*string.*int 1984"),
        (["1984"], [None], TypeError, "gold answer.*string.*NoneType"),
        # Before: one string of length 2 scored as two predictions "a" and "b" in silence.
        ("ab", ["a", "b"], TypeError, "`predictions` must be a list"),
    ],
)
def test_qa_metrics_refuse_answers_that_are_not_text(predictions, references, error, message):
    with pytest.raises(error, match=message):
        compute_qa_metrics(predictions, references)


def test_exact_match_names_a_missing_prediction():
    with pytest.raises(TypeError, match="prediction.*string.*NoneType"):
        exact_match_score(None, ["x"])


def _squad_v11_f1(prediction, ground_truth):
    # SQuAD v1.1's official evaluate-v1.1.py `f1_score`, as published (normalisation aside), as the oracle.
    import collections

    from realm_hf.metrics import normalize_answer

    prediction_tokens = normalize_answer(prediction).split()
    ground_truth_tokens = normalize_answer(ground_truth).split()
    common = collections.Counter(prediction_tokens) & collections.Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    return (2 * precision * recall) / (precision + recall)


@pytest.mark.parametrize(
    ("prediction", "gold"),
    [("", ""), ("the", "a"), ("", "dog"), ("dog", ""), ("dog dog dog", "dog"), ("Paris France", "Paris"), ("a", "b")],
)
def test_f1_matches_squad_v11_by_default(prediction, gold):
    from realm_hf.metrics import compute_qa_metrics, f1_score

    assert f1_score(prediction, [gold]) == pytest.approx(_squad_v11_f1(prediction, gold))
    assert compute_qa_metrics([prediction], [[gold]])["f1"] == pytest.approx(100 * _squad_v11_f1(prediction, gold))


def test_empty_answers_score_by_squad_v2_only_when_asked(monkeypatch):
    from realm_hf.metrics import compute_qa_metrics, load_realm_qa_metric

    assert compute_qa_metrics([""], [[""]]) == {"exact_match": 100.0, "f1": 0.0, "exact_match_count": 1, "total": 1}
    assert compute_qa_metrics([""], [[""]], squad_v2=True)["f1"] == 100.0
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    metric = load_realm_qa_metric()
    assert metric.compute(predictions=[""], references=[[""]])["f1"] == 0.0
    assert metric.compute(predictions=[""], references=[[""]], squad_v2=True)["f1"] == 100.0
