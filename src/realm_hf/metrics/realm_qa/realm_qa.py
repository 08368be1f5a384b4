# Copyright realm-hf contributors. Licensed under the Apache License, Version 2.0.
"""
`evaluate` metric module for open-domain QA: exact match and F1 with SQuAD answer normalisation.

Load it from its local path (works offline, unlike `evaluate.load("squad")`):

    import evaluate
    from realm_hf.metrics import REALM_QA_METRIC_PATH
    metric = evaluate.load(REALM_QA_METRIC_PATH)

or with `realm_hf.metrics.load_realm_qa_metric()`. evaluate copies this script into its module cache, so it cannot
use relative imports; it imports the installed `realm_hf.metrics`, where the scoring code lives. evaluate's
dependency scanner reads `import a, b` as one package named "a,": keep one import per line.
"""

import datasets
import evaluate

from realm_hf.metrics import compute_qa_metrics

_CITATION = """\
@inproceedings{guu2020realm,
  title={Retrieval Augmented Language Model Pre-Training},
  author={Guu, Kelvin and Lee, Kenton and Tung, Zora and Pasupat, Panupong and Chang, Ming-Wei},
  booktitle={International Conference on Machine Learning},
  year={2020}
}
@inproceedings{rajpurkar2016squad,
  title={SQuAD: 100,000+ Questions for Machine Comprehension of Text},
  author={Rajpurkar, Pranav and Zhang, Jian and Lopyrev, Konstantin and Liang, Percy},
  booktitle={EMNLP},
  year={2016}
}
"""

_DESCRIPTION = """\
Open-domain question answering metrics as reported by REALM and ORQA: exact match (EM) and token-level F1 of a
predicted answer string against one or several gold answers, after SQuAD normalisation (lowercase, no punctuation,
no articles, collapsed whitespace). Each question scores its best match over its gold answers. F1 follows SQuAD
v1.1's official script, which REALM reported: an empty prediction or gold answer shares no token and scores 0 (also
when both are empty); `squad_v2=True` scores them by SQuAD 2.0's no-answer rule instead (1 when both are empty).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list[str]`): one predicted answer per question.
    references (`list[list[str]]` or `list[str]`): the gold answers of each question.
    squad_v2 (`bool`, *optional*, defaults to `False`): SQuAD 2.0's F1 for empty answers (1 when both are empty).
Returns:
    exact_match (`float`): percentage of questions answered exactly (0-100).
    f1 (`float`): mean token-level F1 (0-100).
    exact_match_count (`int`): number of questions answered exactly.
    total (`int`): number of questions.
Examples:
    >>> metric = evaluate.load(REALM_QA_METRIC_PATH)
    >>> metric.compute(predictions=["the Eiffel tower"], references=[["Eiffel Tower"]])
    {'exact_match': 100.0, 'f1': 100.0, 'exact_match_count': 1, 'total': 1}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class RealmQa(evaluate.Metric):
    """Exact match and F1 for open-domain QA (see `realm_hf.metrics.compute_qa_metrics`)."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            # Several gold answers per question is the usual Open-QA case; a single string is accepted too.
            features=[
                datasets.Features(
                    {
                        "predictions": datasets.Value("string"),
                        "references": datasets.Sequence(datasets.Value("string")),
                    }
                ),
                datasets.Features(
                    {
                        "predictions": datasets.Value("string"),
                        "references": datasets.Value("string"),
                    }
                ),
            ],
            reference_urls=["https://arxiv.org/abs/2002.08909", "https://rajpurkar.github.io/SQuAD-explorer/"],
        )

    def _compute(self, predictions, references, squad_v2=False):
        return compute_qa_metrics(predictions, references, squad_v2=squad_v2)
