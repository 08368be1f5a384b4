"""
The retriever warm-up: REALM's retrieval loss alone, on the question embedder, against a fixed index.

REALM fine-tunes the question embedder through the marginal likelihood of the blocks of its searcher beam that hold
an answer (the document embedder and index stay fixed). In a full Open-QA step that gradient comes with a reader pass
over every question's read blocks, which is most of the step's cost. Without the reader a step embeds a batch of
short questions and scores the beam's stored vectors, so the question embedder sees many more questions in the same
time: a cheap first stage, followed by reading ([`~realm_hf.training.reader_warmup`]) and joint fine-tuning.
"""

from __future__ import annotations

import torch
from transformers import Trainer

from ..models.modeling_reader import _marginal_log_loss
from ..models.reader_inputs import find_answers_in_token_ids, normalize_answer_ids, tokenize_answers
from .openqa import keep_data_columns
from .saving import RealmCheckpointMixin

__all__ = ["RealmRetrieverTrainer", "retrieval_loss"]


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
    loss = (_marginal_log_loss(scores, correct) * has_answer.to(scores.dtype)).mean()
    return loss, has_answer


class RealmRetrieverTrainer(RealmCheckpointMixin, Trainer):
    """
    [`~transformers.Trainer`] for the retriever warm-up of a [`RealmForOpenQA`]: each step minimises
    [`retrieval_loss`] on a batch of [`~realm_hf.training.DataCollatorForOpenQA`] questions; the reader is never run.
    Freeze what should not move (the recipe `retriever_warmup_trainer` trains the question embedder only).
    """

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
        return (loss, {"loss": loss, "has_answer": has_answer}) if return_outputs else loss
