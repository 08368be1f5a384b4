"""
What a model card says about each kind of REALM model: Open-QA, pre-training, the ICT warm start (its pipeline tag,
tags, description, details, usage and the name of its loss).
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class CardTask:
    r"""
    The task-dependent parts of a REALM model card.

    Args:
        name (`str`): `"open-qa"`, `"pretraining"` or `"ict"`; a model class names its own in `model_card_task`.
        pipeline_tag (`str`): The Hub task of the model.
        tags (`tuple[str, ...]`): Tags every card of the task has.
        eval_task (`dict`): `type` and `name` of the task in `model-index` entries.
        description (`str`): What the model is (the card's first paragraph).
        evaluation_note (`str`): What the evaluation metrics mean (after the card's results table).
        loss_name (`str`, *optional*): The name of the evaluation loss (`eval_loss`, the quality measure of a
            pre-training run) among the card's results; `None`: the loss is not a result of the task.
    """

    name: str
    pipeline_tag: str
    tags: tuple[str, ...]
    eval_task: dict
    description: str
    evaluation_note: str
    loss_name: str | None = None


OPEN_QA = CardTask(
    name="open-qa",
    pipeline_tag="question-answering",
    tags=("realm", "retrieval-augmented", "open-domain-qa", "question-answering", "faiss"),
    eval_task={"type": "question-answering", "name": "Open-domain question answering"},
    description=(
        "A [REALM](https://arxiv.org/abs/2002.08909) (Retrieval-Augmented Language Model, Guu et al. 2020) "
        "open-domain question-answering model for [realm-hf](https://pypi.org/project/realm-hf/). A question is "
        "embedded by the question embedder, the most relevant text blocks are found by maximum inner-product search in "
        "a FAISS index over the knowledge corpus, and the reader extracts the answer span from the retrieved blocks. "
        "The answer's score is the span logit plus the retrieval score of its block, and every answer comes with the "
        "block it was read from."
    ),
    evaluation_note=(
        "Exact match and F1 use the SQuAD answer normalisation; recall@k is the share of questions with a gold "
        "block (or answer) among the top k retrieved blocks."
    ),
)
PRETRAINING = CardTask(
    name="pretraining",
    pipeline_tag="fill-mask",
    tags=("realm", "retrieval-augmented", "masked-language-modeling", "pretraining", "faiss"),
    eval_task={"type": "fill-mask", "name": "Retrieval-augmented masked language modelling"},
    description=(
        "A [REALM](https://arxiv.org/abs/2002.08909) (Retrieval-Augmented Language Model, Guu et al. 2020) "
        "pre-training model for [realm-hf](https://pypi.org/project/realm-hf/): a retrieval-augmented masked language "
        "model with a learned retriever. Each masked input is embedded by the query embedder, blocks of the knowledge "
        "corpus are retrieved by maximum inner-product search in a FAISS index and re-scored by the document embedder, "
        "and the knowledge-augmented encoder predicts the masked tokens from the input joined with each block; the "
        "masked-LM loss is marginalised over the candidates by their retrieval probability, so its gradient trains "
        "both embedders. The first candidate is always the *null document* (no block, relevance 0), and the block an "
        "input was cut from, when the data names it, is never retrieved for it (no trivial retrieval). Its embedders and encoder are the "
        "starting point of REALM's open-domain QA fine-tuning."
    ),
    evaluation_note=(
        "The masked-LM loss is the evaluation loss of pre-training: the negative log-probability of the masked "
        "tokens, marginalised over the retrieved candidates (null document included)."
    ),
    loss_name="Masked-LM loss",
)
ICT = CardTask(
    name="ict",
    pipeline_tag="feature-extraction",
    tags=("realm", "retrieval", "inverse-cloze-task", "dense-retrieval"),
    eval_task={"type": "feature-extraction", "name": "Inverse Cloze Task retrieval"},
    description=(
        "The Inverse Cloze Task (ICT; Lee et al. 2019, ORQA) warm start of a [REALM](https://arxiv.org/abs/2002.08909) "
        "retriever, for [realm-hf](https://pypi.org/project/realm-hf/): a query embedder and a document embedder "
        "(BERT with a projection to the retrieval embedding) trained so that a sentence retrieves the block it was "
        "taken from against the other blocks of its batch (in-batch softmax over query-document inner products). "
        "REALM pre-training starts its embedders here, since a random retriever gets no useful gradient from the "
        "masked-LM loss."
    ),
    evaluation_note=(
        "The ICT loss is the cross-entropy of each sentence against the blocks of its batch, its own block the target."
    ),
    loss_name="ICT loss (in-batch cross-entropy)",
)
TASKS = {task.name: task for task in (OPEN_QA, PRETRAINING, ICT)}


def card_task(model=None, task: str | None = None) -> CardTask:
    """
    The card task named by `task`, else by the model's class (`model_card_task`, e.g. `"pretraining"` for
    [`RealmForPreTraining`]), else Open-QA.

    Raises:
        `ValueError`: for an unknown task name.
    """
    name = task or getattr(model, "model_card_task", None) or OPEN_QA.name
    if name not in TASKS:
        raise ValueError(f"Unknown model card task {name!r}: use one of {', '.join(sorted(TASKS))}.")
    return TASKS[name]


def detail_rows(model, task: CardTask) -> list[tuple[str, object]]:
    """The rows of the card's "Model details" table for `model` (its config's facts that matter for `task`)."""
    config = model.config
    rows = [
        ("Architecture", type(model).__name__),
        (
            "Encoder",
            f"BERT, {config.num_hidden_layers} layers, hidden size {config.hidden_size}, "
            f"{config.num_attention_heads} attention heads",
        ),
        ("Retrieval embedding size", config.retriever_proj_size),
    ]
    if task is OPEN_QA:
        rows += [
            ("Blocks read per question", config.reader_beam_size),
            ("Longest answer (wordpieces)", config.max_span_width),
            ("Reader input length", config.reader_seq_len),
        ]
    else:
        shared = getattr(config, "share_query_document_embedder", None)
        rows.append(("Query and document embedders", "shared" if shared or shared is None else "separate"))
    if task is PRETRAINING:
        rows += [
            ("Candidates per input (null document included)", getattr(model, "num_candidates", None)),
            ("Block length (wordpieces)", getattr(model, "max_block_length", None)),
            ("Input + block length (wordpieces)", getattr(model, "max_joint_length", None)),
        ]
    rows.append(("Vocabulary size", config.vocab_size))
    return [(label, value) for label, value in rows if value is not None]


def usage_text(task: CardTask, model_id: str, question: str) -> str:
    """The card's usage section: how to load and use a model of `task` saved as `model_id`."""
    quoted = json.dumps(model_id)
    if task is PRETRAINING:
        return (
            "Install with `pip install realm-hf`, then:\n\n"
            "```python\n"
            "from realm_hf import RealmForPreTraining\n\n"
            "# The weights, and the corpus and index saved with them (retriever/), from a repo id or a local copy.\n"
            f"model = RealmForPreTraining.from_pretrained({quoted})\n"
            "# Go on pre-training with realm_hf.training.recipes.pretraining_trainer, or take the embedders and the\n"
            "# encoder on to open-domain QA fine-tuning (the legacy checkpoint layout):\n"
            'model.export_components("components")\n'
            "```"
        )
    if task is ICT:
        return (
            "Install with `pip install realm-hf`, then start REALM pre-training from these embedders:\n\n"
            "```python\n"
            "from realm_hf import RealmForPreTraining\n"
            "from realm_hf.training import RealmForInverseClozeTask\n\n"
            f"ict = RealmForInverseClozeTask.from_pretrained({quoted})\n"
            "model = RealmForPreTraining(ict.config)  # or init_from_bert(RealmForPreTraining, bert_dir)\n"
            "model.load_ict_embedders(ict)\n"
            "```\n\n"
            "`ict.embedder` (the document embedder) builds the first index: "
            "`RealmRetriever.from_documents(documents, ict.embedder, tokenizer)`."
        )
    return (
        "Install with `pip install realm-hf`, then:\n\n"
        "```python\n"
        "import realm_hf\n\n"
        f'qa = realm_hf.pipeline("question-answering", model={quoted})\n'
        f"answer = qa({json.dumps(question)})\n"
        'print(answer["answer"], answer["score"], answer["block"]["title"])\n\n'
        "# Several answers, each with the block it was read from:\n"
        f"for candidate in qa({json.dumps(question)}, top_k=3):\n"
        '    print(candidate["answer"], candidate["block"]["id"])\n'
        "```\n\n"
        '`transformers.pipeline("realm-question-answering", model=...)` works too once `realm_hf` is imported; '
        "`RealmForOpenQA.from_pretrained(...)` gives the model with its corpus and index."
    )


__all__ = ["ICT", "OPEN_QA", "PRETRAINING", "TASKS", "CardTask", "card_task", "detail_rows", "usage_text"]
