"""The output dataclasses of the REALM models (the legacy port's names and fields, plus batched Open-QA and pre-training outputs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers.utils import ModelOutput


@dataclass
class RealmEmbedderOutput(ModelOutput):
    """
    Outputs of [`RealmEmbedder`].

    Args:
        projected_score (`torch.FloatTensor` of shape `(batch_size, config.retriever_proj_size)`):
            The retrieval embedding: the projected, layer-normalised [CLS] pooler output.
        hidden_states (`tuple(torch.FloatTensor)`, *optional*):
            Hidden states of the encoder, when `output_hidden_states=True`.
        attentions (`tuple(torch.FloatTensor)`, *optional*):
            Attention weights, when `output_attentions=True`.
    """

    projected_score: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class RealmScorerOutput(ModelOutput):
    """
    Outputs of [`RealmScorer`].

    Args:
        relevance_score (`torch.FloatTensor` of shape `(batch_size, config.num_candidates)`):
            Relevance score of each candidate (before softmax).
        query_score (`torch.FloatTensor` of shape `(batch_size, config.retriever_proj_size)`):
            Query embeddings.
        candidate_score (`torch.FloatTensor` of shape `(batch_size, config.num_candidates, config.retriever_proj_size)`):
            Candidate embeddings.
    """

    relevance_score: torch.FloatTensor | None = None
    query_score: torch.FloatTensor | None = None
    candidate_score: torch.FloatTensor | None = None


@dataclass
class RealmReaderOutput(ModelOutput):
    """
    Outputs of [`RealmReader`]. For the legacy single-question input (2-D `input_ids`) the predictions are scalars as
    in the legacy port; for batched input (3-D `input_ids`) they have a leading `batch_size` dimension.

    Args:
        loss (`torch.FloatTensor` of shape `()`, *optional*):
            Mean over questions of retriever loss + reader loss (when gold positions are given).
        retriever_loss (`torch.FloatTensor`, *optional*):
            Marginal log-likelihood loss of the retrieval scores over the blocks that contain an answer.
        reader_loss (`torch.FloatTensor`, *optional*):
            Marginal log-likelihood loss of the span scores over the gold spans.
        retriever_correct (`torch.BoolTensor` of shape `([batch_size,] searcher_beam_size)`, *optional*):
            Whether each block contains an answer.
        reader_correct (`torch.BoolTensor` of shape `([batch_size,] reader_beam_size, num_candidates)`, *optional*):
            Whether each span candidate is a gold span.
        block_idx (`torch.LongTensor`):
            Index (among the read blocks) of the block holding the best span.
        candidate (`torch.LongTensor`):
            Index of the best span candidate.
        start_pos (`torch.LongTensor`):
            Start of the best span in the reader input.
        end_pos (`torch.LongTensor`):
            End (inclusive) of the best span in the reader input.
        reader_logits (`torch.FloatTensor` of shape `([batch_size,] reader_beam_size, num_candidates)`):
            Span scores (retrieval score of the block added), masked outside the block.
        candidate_starts, candidate_ends (`torch.LongTensor` of shape `(num_candidates,)`):
            Start and end position of each span candidate.
        hidden_states, attentions: As in [`RealmEmbedderOutput`].
    """

    loss: torch.FloatTensor | None = None
    retriever_loss: torch.FloatTensor | None = None
    reader_loss: torch.FloatTensor | None = None
    retriever_correct: torch.BoolTensor | None = None
    reader_correct: torch.BoolTensor | None = None
    block_idx: torch.LongTensor | None = None
    candidate: torch.LongTensor | None = None
    start_pos: torch.LongTensor | None = None
    end_pos: torch.LongTensor | None = None
    reader_logits: torch.FloatTensor | None = None
    candidate_starts: torch.LongTensor | None = None
    candidate_ends: torch.LongTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


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
            Score of each predicted answer (span logit + retrieval score of its block).
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


@dataclass
class RealmForPreTrainingOutput(ModelOutput):
    r"""
    Outputs of [`RealmForPreTraining`].

    Args:
        loss (`torch.FloatTensor` of shape `()`, *optional*):
            The marginal masked-LM loss: minus the mean over masked tokens of
            log sum_z p(z|x) p(y_j|z,x), over the candidates z (null document included).
        logits (`torch.FloatTensor` of shape `(batch_size, num_candidates, joint_length, vocab_size)`, *optional*):
            Masked-LM logits of each (input, candidate) pair; returned with `return_logits=True` only (large).
        relevance_score (`torch.FloatTensor` of shape `(batch_size, num_candidates)`):
            Retrieval logits (query · document, re-scored with the current document embedder); 0 for the null
            document (candidate 0), a very large negative number for padding candidates.
        retrieval_log_probs (`torch.FloatTensor` of shape `(batch_size, num_candidates)`):
            log p(z|x): `log_softmax` of `relevance_score`.
        retrieved_block_ids (`torch.LongTensor` of shape `(batch_size, num_candidates)`):
            Corpus id of each candidate: -1 for the null document, -2 for padding (corpus too small).
        candidate_mlm_log_probs (`torch.FloatTensor` of shape `(batch_size, num_candidates)`):
            Mean over the input's masked tokens of log p(y_j|z,x) for each candidate (no gradient).
        retrieval_utility (`torch.FloatTensor` of shape `(batch_size, num_candidates)`):
            The paper's retrieval utility, log p(y|z,x) - log p(y|null,x), per token (no gradient); 0 for candidate 0.
        marginal_predictions (`torch.LongTensor` of shape `(batch_size, input_length)`, *optional*):
            argmax over the vocabulary of sum_z p(z|x) p(y|z,x) at each masked position of the input (positions as in
            the given `input_ids`), -100 elsewhere. Returned in eval mode or with `return_predictions=True`.
        null_predictions (`torch.LongTensor` of shape `(batch_size, input_length)`, *optional*):
            The same with the null document alone, i.e. p(y|null,x): what the encoder predicts without retrieval.
    """

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    relevance_score: torch.FloatTensor | None = None
    retrieval_log_probs: torch.FloatTensor | None = None
    retrieved_block_ids: torch.LongTensor | None = None
    candidate_mlm_log_probs: torch.FloatTensor | None = None
    retrieval_utility: torch.FloatTensor | None = None
    marginal_predictions: torch.LongTensor | None = None
    null_predictions: torch.LongTensor | None = None
