"""The REALM reader: span scoring of (question, block) pairs, its output, projection head, span helpers and losses."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers.models.bert.modeling_bert import BertModel, BertOnlyMLMHead
from transformers.utils import ModelOutput

from .configuration_realm import RealmConfig
from .modeling_base import RealmPreTrainedModel, check_input_shape, check_token_ids, encoder_output_kwargs


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


def _mask_to_score(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (1.0 - mask.type(dtype)) * torch.finfo(dtype).min


def _span_candidates(max_sequence_len: int, max_span_width: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    # Same enumeration order as the legacy reader (all width-1 spans, then width-2, ...), so candidate indices match.
    starts, ends = [], []
    for width in range(1, max_span_width + 1):
        starts.append(torch.arange(max_sequence_len - width + 1, device=device))
        ends.append(torch.arange(width - 1, max_sequence_len, device=device))
    return torch.cat(starts, 0), torch.cat(ends, 0)


def _full_candidate_index(
    starts: torch.Tensor, ends: torch.Tensor, full_len: int, max_span_width: int
) -> torch.Tensor:
    """Positions of the spans `(starts, ends)` in the candidate enumeration of a `full_len`-long sequence."""
    # The enumeration is width-major: width w holds full_len - w + 1 spans, ordered by start.
    sizes = [full_len - width + 1 for width in range(1, max_span_width)]
    offsets = torch.tensor([0] + sizes, device=starts.device).cumsum(0)
    return offsets[ends - starts] + starts


class RealmReaderProjection(nn.Module):
    """Scores every span of at most `config.max_span_width` wordpieces that lies inside the block."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.dense_intermediate = nn.Linear(config.hidden_size, config.span_hidden_size * 2)
        self.dense_output = nn.Linear(config.span_hidden_size, 1)
        self.layer_normalization = nn.LayerNorm(config.span_hidden_size, eps=config.reader_layer_norm_eps)
        self.relu = nn.ReLU()

    def forward(self, hidden_states, block_mask):
        """
        Args:
            hidden_states (`torch.FloatTensor` of shape `(num_rows, seq_len, hidden_size)`)
            block_mask (`torch.BoolTensor` of shape `(num_rows, seq_len)`)

        Returns:
            `(reader_logits, candidate_starts, candidate_ends)` of shapes `(num_rows, num_candidates)`,
            `(num_candidates,)`, `(num_candidates,)`.
        """
        max_sequence_len = block_mask.shape[-1]
        starts, ends = _span_candidates(max_sequence_len, self.config.max_span_width, block_mask.device)
        span_mask = torch.index_select(block_mask, -1, starts) * torch.index_select(block_mask, -1, ends)

        # Span scores in the weights' dtype (fp32), also under bf16/fp16 autocast: rounding the logits to bf16 (a
        # resolution of 1/16 at 10) decides between spans whose fp32 logits differ by less. The head is a few % of
        # the reader's work.
        with torch.autocast(hidden_states.device.type, enabled=False):
            hidden_states = hidden_states.to(self.layer_normalization.weight.dtype)
            start_projection, end_projection = self.dense_intermediate(hidden_states).chunk(2, dim=-1)
            candidate_hidden = torch.index_select(start_projection, 1, starts) + torch.index_select(
                end_projection, 1, ends
            )
            candidate_hidden = self.layer_normalization(self.relu(candidate_hidden))
            reader_logits = self.dense_output(candidate_hidden).squeeze(-1)
        reader_logits = reader_logits + _mask_to_score(span_mask, reader_logits.dtype)
        return reader_logits, starts, ends


def marginal_log_loss(logits: torch.Tensor, is_correct: torch.Tensor) -> torch.Tensor:
    """Negative log of the probability mass on the correct entries (last dimension)."""
    log_numerator = torch.logsumexp(logits + _mask_to_score(is_correct, logits.dtype), dim=-1)
    log_denominator = torch.logsumexp(logits, dim=-1)
    return log_denominator - log_numerator


class RealmReader(RealmPreTrainedModel):
    r"""
    The REALM reader: a BERT encoder over `[CLS] question [SEP] block [SEP]` that scores every span of at most
    `config.max_span_width` wordpieces inside the block; the block's retrieval score is added to its span scores.

    Takes either the legacy single-question layout (`input_ids` of shape `(reader_beam_size, seq_len)`,
    `relevance_score` of shape `(searcher_beam_size,)`) or a batch of questions (`input_ids` of shape
    `(batch_size, reader_beam_size, seq_len)`, `relevance_score` of shape `(batch_size, searcher_beam_size)`).
    """

    _tied_weights_keys = {"cls.predictions.decoder.bias": "cls.predictions.bias"}

    def __init__(self, config: RealmConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.realm = BertModel(config)
        # The reader never predicts tokens, but legacy reader checkpoints hold this head.
        self.cls = BertOnlyMLMHead(config)
        self.qa_outputs = RealmReaderProjection(config)
        # Rows (question, block pairs) are read in groups of similar length of at most this many tokens, each
        # padded only to its own longest row; `None` reads all rows in one padded batch.
        self.max_tokens_per_chunk: int | None = 4096
        self.post_init()

    def _read_rows(self, flat_ids, flat_mask, flat_types, flat_block_mask, encoder_kwargs):
        """
        Encode the flattened rows and score their spans. With right-padded rows of different lengths, rows are
        sorted by length and read in chunks padded to their own length: a batch of questions then costs what its
        rows need rather than `rows x longest row`, and the span tensors (rows x spans x span_hidden_size) stay
        small. Returns `(sequence_output or None, reader_logits, candidate_starts, candidate_ends)`.
        """
        num_rows, seq_len = flat_block_mask.shape
        lengths = flat_mask.sum(-1) if flat_mask is not None else None
        chunked = (
            self.max_tokens_per_chunk is not None
            and flat_ids is not None
            and lengths is not None
            and not encoder_kwargs.get("output_attentions")
            and not encoder_kwargs.get("output_hidden_states")
            and num_rows * seq_len > self.max_tokens_per_chunk
            # Right padding only: every row's mask is a prefix of ones.
            and bool((flat_mask == (torch.arange(seq_len, device=flat_mask.device) < lengths.unsqueeze(-1))).all())
        )
        if not chunked:
            outputs = self.realm(flat_ids, attention_mask=flat_mask, token_type_ids=flat_types, **encoder_kwargs)
            logits, starts, ends = self.qa_outputs(outputs.last_hidden_state, flat_block_mask)
            return outputs, logits, starts, ends

        width = self.config.max_span_width
        starts, ends = _span_candidates(seq_len, width, flat_block_mask.device)
        reader_logits = None
        order = torch.argsort(lengths, descending=True).tolist()
        lengths = lengths.tolist()
        begin = 0
        while begin < num_rows:
            # Rows are sorted longest first: the chunk's first row sets its padded length.
            chunk_len = min(seq_len, max(width, int(lengths[order[begin]])))
            size = max(1, self.max_tokens_per_chunk // chunk_len)
            rows = torch.tensor(order[begin : begin + size], device=flat_block_mask.device)
            begin += size
            outputs = self.realm(
                flat_ids[rows, :chunk_len],
                attention_mask=flat_mask[rows, :chunk_len],
                token_type_ids=flat_types[rows, :chunk_len] if flat_types is not None else None,
                **encoder_kwargs,
            )
            logits, chunk_starts, chunk_ends = self.qa_outputs(
                outputs.last_hidden_state, flat_block_mask[rows, :chunk_len]
            )
            if reader_logits is None:
                # Spans beyond a chunk's length lie in padding: masked, as the one-batch path masks them.
                reader_logits = torch.full(
                    (num_rows, starts.shape[0]),
                    torch.finfo(logits.dtype).min,
                    dtype=logits.dtype,
                    device=logits.device,
                )
            columns = _full_candidate_index(chunk_starts, chunk_ends, seq_len, width)
            reader_logits[rows.unsqueeze(-1), columns.unsqueeze(0)] = logits
        return None, reader_logits, starts, ends

    def get_input_embeddings(self):
        return self.realm.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.realm.embeddings.word_embeddings = value

    @staticmethod
    def _check_reader_shapes(
        batch_size, reader_beam_size, seq_len, attention_mask, token_type_ids, relevance_score, block_mask
    ):
        """The inputs' shapes against `input_ids`' (batched layout): a mismatch broadcast or failed deep in torch."""
        pairs = (batch_size, reader_beam_size, seq_len)
        check_input_shape("attention_mask", attention_mask, pairs, "one entry per token of `input_ids`")
        check_input_shape("token_type_ids", token_type_ids, pairs, "one entry per token of `input_ids`")
        check_input_shape(
            "relevance_score",
            relevance_score,
            (batch_size, (">=", reader_beam_size)),
            f"the retrieval scores of each question's blocks, at least the {reader_beam_size} blocks of `input_ids`",
        )
        check_input_shape(
            "block_mask",
            block_mask,
            (batch_size, (">=", reader_beam_size), seq_len),
            "one row per block of `relevance_score`, one entry per token of `input_ids`",
        )

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        relevance_score: torch.FloatTensor | None = None,
        block_mask: torch.BoolTensor | None = None,
        start_positions: torch.LongTensor | None = None,
        end_positions: torch.LongTensor | None = None,
        has_answers: torch.BoolTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> tuple | RealmReaderOutput:
        r"""
        relevance_score (`torch.FloatTensor` of shape `([batch_size,] searcher_beam_size)`):
            Retrieval logits of the blocks; the first `reader_beam_size` are the blocks in `input_ids`.
        block_mask (`torch.BoolTensor` of shape `([batch_size,] searcher_beam_size, sequence_length)`):
            True on block wordpieces (where answer spans may lie).
        start_positions, end_positions (`torch.LongTensor` of shape `([batch_size,] searcher_beam_size, num_answers)`, *optional*):
            Gold answer positions in each block, -1 for padding.
        has_answers (`torch.BoolTensor` of shape `([batch_size,] searcher_beam_size)`, *optional*):
            Whether each block contains an answer.

        Returns:
            [`RealmReaderOutput`]
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        if relevance_score is None:
            raise ValueError("You have to specify `relevance_score` to calculate logits and loss.")
        if block_mask is None:
            raise ValueError("You have to specify `block_mask` to separate question block and evidence block.")
        if input_ids is None and inputs_embeds is None:
            raise ValueError("You have to specify either `input_ids` or `inputs_embeds`.")
        check_token_ids("input_ids", input_ids, self.config)
        reference = input_ids if input_ids is not None else inputs_embeds[..., 0]
        if reference.dim() not in (2, 3):
            raise ValueError(
                f"`input_ids` has shape {tuple(reference.shape)}: the reader reads (question, block) pairs of shape "
                "(reader_beam_size, seq_len) for one question or (batch_size, reader_beam_size, seq_len)."
            )
        single = reference.dim() == 2
        if single:
            # Legacy layout: one question, its blocks along the first axis.
            input_ids, attention_mask, token_type_ids, inputs_embeds = (
                t.unsqueeze(0) if t is not None else None
                for t in (input_ids, attention_mask, token_type_ids, inputs_embeds)
            )
            relevance_score, block_mask, start_positions, end_positions, has_answers = (
                t.unsqueeze(0) if t is not None else None
                for t in (relevance_score, block_mask, start_positions, end_positions, has_answers)
            )
        batch_size, reader_beam_size, seq_len = (input_ids if input_ids is not None else inputs_embeds[..., 0]).shape
        if seq_len < self.config.max_span_width:
            raise ValueError("The input sequence length must be greater than or equal to config.max_span_width.")
        self._check_reader_shapes(
            batch_size, reader_beam_size, seq_len, attention_mask, token_type_ids, relevance_score, block_mask
        )
        searcher_beam_size = relevance_score.shape[1]
        for name, tensor in (("start_positions", start_positions), ("end_positions", end_positions)):
            check_input_shape(
                name, tensor, (batch_size, (">=", reader_beam_size), None), "gold positions in each read block"
            )
        check_input_shape(
            "has_answers", has_answers, (batch_size, searcher_beam_size), "one flag per block of `relevance_score`"
        )

        flat_ids, flat_mask, flat_types = self._flatten_inputs(input_ids, attention_mask, token_type_ids)
        flat_block_mask = block_mask[:, :reader_beam_size].reshape(-1, seq_len)
        encoder_kwargs = encoder_output_kwargs(output_attentions, output_hidden_states)
        if inputs_embeds is not None or position_ids is not None:
            if inputs_embeds is not None:
                inputs_embeds = inputs_embeds.reshape(-1, *inputs_embeds.shape[-2:])
            outputs = self.realm(
                flat_ids,
                attention_mask=flat_mask,
                token_type_ids=flat_types,
                position_ids=position_ids,
                inputs_embeds=inputs_embeds,
                **encoder_kwargs,
            )
            reader_logits, candidate_starts, candidate_ends = self.qa_outputs(
                outputs.last_hidden_state, flat_block_mask
            )
        else:
            outputs, reader_logits, candidate_starts, candidate_ends = self._read_rows(
                flat_ids, flat_mask, flat_types, flat_block_mask, encoder_kwargs
            )
        num_candidates = candidate_starts.shape[0]
        # [batch, reader_beam, num_candidates]: span score + retrieval score of its block.
        reader_logits = reader_logits.view(batch_size, reader_beam_size, num_candidates)
        # Span and retrieval logits in at least fp32, also under bf16/fp16 autocast: the marginals over spans and
        # blocks compare logits that differ by less than half precision resolves.
        logit_dtype = torch.promote_types(reader_logits.dtype, torch.float32)
        reader_logits = reader_logits.to(logit_dtype) + relevance_score[:, :reader_beam_size].unsqueeze(-1).to(
            logit_dtype
        )

        flat_best = reader_logits.reshape(batch_size, -1).argmax(-1)
        predicted_block_index = torch.div(flat_best, num_candidates, rounding_mode="floor")
        predicted_candidate = flat_best % num_candidates
        predicted_start = candidate_starts[predicted_candidate]
        predicted_end = candidate_ends[predicted_candidate]

        total_loss = retriever_loss = reader_loss = retriever_correct = reader_correct = None
        if start_positions is not None and end_positions is not None and has_answers is not None:
            # Positions beyond the input are ignored; -1 marks "no answer".
            start_positions = start_positions.clamp(-1, seq_len)
            end_positions = end_positions.clamp(-1, seq_len)
            retriever_correct = has_answers.bool()
            # [batch, reader_beam, num_answers, num_candidates]
            is_gold_start = candidate_starts.view(1, 1, 1, -1) == start_positions[:, :reader_beam_size].unsqueeze(-1)
            is_gold_end = candidate_ends.view(1, 1, 1, -1) == end_positions[:, :reader_beam_size].unsqueeze(-1)
            reader_correct = (is_gold_start & is_gold_end).any(2)

            retriever_loss = marginal_log_loss(relevance_score, retriever_correct)
            retriever_loss = retriever_loss * retriever_correct.any(-1).type(retriever_loss.dtype)
            reader_loss = marginal_log_loss(
                reader_logits.reshape(batch_size, -1), reader_correct.reshape(batch_size, -1)
            )
            reader_loss = reader_loss * reader_correct.reshape(batch_size, -1).any(-1).type(reader_loss.dtype)
            total_loss = (retriever_loss + reader_loss).mean()

        if single:
            squeeze = lambda t: t.squeeze(0) if t is not None else None  # noqa: E731
            retriever_loss, reader_loss = squeeze(retriever_loss), squeeze(reader_loss)
            retriever_correct, reader_correct = squeeze(retriever_correct), squeeze(reader_correct)
            reader_logits = squeeze(reader_logits)
            predicted_block_index, predicted_candidate = predicted_block_index[0], predicted_candidate[0]
            # The legacy reader returned 1-element start/end tensors.
            predicted_start, predicted_end = predicted_start[:1], predicted_end[:1]

        if not return_dict:
            output = (predicted_block_index, predicted_candidate, predicted_start, predicted_end)
            if total_loss is not None:
                return (total_loss, retriever_loss, reader_loss, retriever_correct, reader_correct) + output
            return output
        return RealmReaderOutput(
            loss=total_loss,
            retriever_loss=retriever_loss,
            reader_loss=reader_loss,
            retriever_correct=retriever_correct,
            reader_correct=reader_correct,
            block_idx=predicted_block_index,
            candidate=predicted_candidate,
            start_pos=predicted_start,
            end_pos=predicted_end,
            reader_logits=reader_logits,
            candidate_starts=candidate_starts,
            candidate_ends=candidate_ends,
            hidden_states=outputs.hidden_states if outputs is not None else None,
            attentions=outputs.attentions if outputs is not None else None,
        )
