"""
REALM pre-training (Guu et al., 2020): retrieval-augmented masked language modelling with a learned retriever,
`RealmForPreTraining`, with its output and its ICT warm start. Its inputs ((masked input, candidate block) pairs joined
at the wordpiece-id level) are `models/pretraining_inputs.py`'s, its legacy component checkpoints (embedder, scorer,
encoder) `models/component_checkpoints.py`'s.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Self

import torch
from transformers.utils import ModelOutput

from ..logging_utils import get_logger
from .component_checkpoints import load_embedder, write_components
from .configuration_realm import RealmConfig
from .modeling_base import RealmPreTrainedModel
from .modeling_embedder import RealmEmbedder, RealmQueryEmbedderMixin
from .modeling_ict import RealmForInverseClozeTask
from .modeling_knowledge_aug import RealmKnowledgeAugEncoder, realm_marginal_mlm_loss
from .pretraining_inputs import (
    NULL_BLOCK_ID,
    PADDING_BLOCK_ID,
    encode_blocks,
    join_inputs_and_blocks,
    source_block_sets,
)
from .retriever_owner import RetrieverOwnerMixin

logger = get_logger(__name__)


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


def _config_value(config, name, default):
    value = getattr(config, name, None)
    return default if value is None else value


class RealmForPreTraining(RetrieverOwnerMixin, RealmQueryEmbedderMixin, RealmPreTrainedModel):
    r"""
    REALM pre-training (Guu et al., 2020): a masked language model that retrieves from a knowledge corpus and learns
    the retriever through the masked-LM loss.

    For each masked input `x` the model

    1. embeds `x` with the query embedder;
    2. retrieves the top `num_candidates - 1` blocks from `retriever`'s index, excluding the block(s) `x` was cut
       from (`source_block_ids`): otherwise the encoder would just copy the masked span back (trivial retrieval);
    3. puts the *null document* first: `x` with an empty block, relevance score 0 (a zero embedding), so the model
       can always fall back on not retrieving;
    4. re-scores the retrieved blocks with the *current* document embedder (the index holds stale embeddings), so
       that the gradient reaches both embedders: relevance = query · document;
    5. runs [`RealmKnowledgeAugEncoder`] on each `[CLS] x [SEP] z [SEP]` pair and returns the marginal masked-LM
       loss over the candidates, weighted by p(z|x) = softmax(relevance).

    Submodules: `embedder` (document embedder, the one whose outputs fill the index; also exposed as
    `document_embedder`), `query_embedder` (a separate [`RealmEmbedder`] when
    `config.share_query_document_embedder=False`, else the same module as `embedder`, as in the legacy
    `realm-cc-news-pretrained-scorer` checkpoint) and `encoder`. The retriever is attached, not a module.

    Configuration fields read (besides the encoder shape): `num_candidates` (k, null document included, default 8),
    `share_query_document_embedder` (default `True`), `max_block_length` (wordpieces per block for the document
    embedder, default 288) and `max_joint_length` (longest input + block pair, default 512 or
    `max_position_embeddings`).

    Args:
        config ([`RealmConfig`]): Model configuration.
        retriever ([`RealmRetriever`], *optional*):
            The knowledge corpus: anything that satisfies the [`Retriever`] contract.
        tokenizer (*optional*): Tokenizer for the blocks; defaults to `retriever.tokenizer`.

    Example:

    ```python
    >>> from realm_hf.models.initialization import init_from_bert
    >>> from realm_hf.models.modeling_pretraining import RealmForPreTraining
    >>> from realm_hf.retrieval.retriever import RealmRetriever

    >>> model = init_from_bert(RealmForPreTraining, "path/to/bert", num_candidates=8)
    >>> retriever = RealmRetriever.from_documents(documents, model.index_embedder, tokenizer)
    >>> model.set_retriever(retriever)
    >>> batch = collator(examples)  # DataCollatorForSalientSpanMasking: input_ids, labels, mlm_mask, block_id
    >>> outputs = model(**batch)
    >>> outputs.loss.backward()
    ```"""

    main_input_name = "input_ids"
    # What its model card describes (realm_hf/hub/card_content.py).
    model_card_task = "pretraining"

    def __init__(self, config: RealmConfig, retriever=None, tokenizer=None):
        super().__init__(config)
        self.embedder = RealmEmbedder(config)
        if not _config_value(config, "share_query_document_embedder", True):
            # Straight into _modules: the `query_embedder` property makes add_module think the name is taken.
            self._modules["query_embedder"] = RealmEmbedder(config)
        self.encoder = RealmKnowledgeAugEncoder(config)
        self.set_retriever(retriever)
        self.tokenizer = tokenizer
        self.post_init()
        self._freeze_unused_parameters()

    # ------------------------------------------------------------------------------------------------ structure

    @property
    def shares_query_document_embedder(self) -> bool:
        return self._modules.get("query_embedder") is None

    @property
    def num_candidates(self) -> int:
        return int(_config_value(self.config, "num_candidates", 8))

    @property
    def max_block_length(self) -> int:
        """Block truncation length for re-scoring when the retriever does not say what it indexed with."""
        return int(_config_value(self.config, "max_block_length", 288))

    @property
    def max_joint_length(self) -> int:
        return int(_config_value(self.config, "max_joint_length", min(512, self.config.max_position_embeddings)))

    def _freeze_unused_parameters(self):
        # Never in the forward pass: the embedders' legacy MLM heads and the encoder's pooler. Without gradients they
        # would make DDP (accelerate launch) wait for gradients that never come.
        for embedder in {id(m): m for m in (self.embedder, self.query_embedder)}.values():
            embedder.cls.predictions.requires_grad_(False)
        if self.encoder.realm.pooler is not None:
            self.encoder.realm.pooler.requires_grad_(False)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, tokenizer=None, **kwargs):
        r"""
        Load the model and the corpus saved with it, from a local directory or a Hub repo id (see
        [`RetrieverOwnerMixin.from_pretrained`] for the `retriever`, `load_retriever` and `verify_checksums`
        arguments).

        Args:
            tokenizer (*optional*): Block tokenizer to attach (defaults to the retriever's).
        """
        loaded = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        (loaded[0] if isinstance(loaded, tuple) else loaded).tokenizer = tokenizer
        return loaded

    def _tokenizer(self):
        tokenizer = self.tokenizer if self.tokenizer is not None else getattr(self.retriever, "tokenizer", None)
        if tokenizer is None:
            raise ValueError("RealmForPreTraining needs a tokenizer for the blocks: pass `tokenizer=` or attach one.")
        return tokenizer

    # ------------------------------------------------------------------------------------------------ ICT warm start

    def load_ict_embedders(self, ict_model_or_path) -> Self:
        r"""
        Initialise both embedders from an Inverse Cloze Task warm start ([`RealmForInverseClozeTask`], a directory it
        was saved to, or a directory written by its `export_embedders`), as REALM does before pre-training.

        With a shared embedder here and separate ICT embedders, the ICT *document* embedder is used (it is the one
        that builds the index), with a warning. The embedders' `retriever_pooling` becomes the ICT model's, since
        the weights were trained with it.
        """

        if isinstance(ict_model_or_path, (str, os.PathLike)):
            path = str(ict_model_or_path)
            if os.path.isdir(os.path.join(path, "embedder")):
                document = RealmEmbedder.from_pretrained(os.path.join(path, "embedder"))
                query_dir = os.path.join(path, "query_embedder")
                query = RealmEmbedder.from_pretrained(query_dir) if os.path.isdir(query_dir) else document
            else:
                ict = RealmForInverseClozeTask.from_pretrained(path)
                document, query = ict.embedder, ict.query_embedder
        else:
            document, query = ict_model_or_path.embedder, ict_model_or_path.query_embedder
        pooling = document.config.retriever_pooling
        if pooling != self.config.retriever_pooling:
            # The weights only mean what ICT taught them under the pooling it trained them with.
            logger.info("Taking the ICT embedders' retriever_pooling=%r with their weights.", pooling)
            for config in {id(m.config): m.config for m in self.modules() if hasattr(m, "config")}.values():
                config.retriever_pooling = pooling
        self.embedder.load_state_dict(document.state_dict())
        if not self.shares_query_document_embedder:
            self.query_embedder.load_state_dict(query.state_dict())
        elif query is not document:
            logger.warning(
                "The ICT model has separate query and document embedders but this model shares one: using the ICT "
                "document embedder for both."
            )
        return self

    # ------------------------------------------------------------------------------------- component checkpoints

    @classmethod
    def from_legacy_checkpoints(
        cls,
        embedder_or_scorer_dir: str | os.PathLike,
        encoder_dir: str | os.PathLike,
        query_embedder_dir: str | os.PathLike | None = None,
        retriever=None,
        tokenizer=None,
        **config_overrides,
    ) -> Self:
        r"""
        Build a pre-training model from the legacy component checkpoints, e.g.
        `google/realm-cc-news-pretrained-embedder` (or `-scorer`) and `google/realm-cc-news-pretrained-encoder`.

        Args:
            embedder_or_scorer_dir (`str` or `os.PathLike`):
                A [`RealmEmbedder`] directory (keys `realm.*`, `cls.*`) or a [`RealmScorer`] directory (keys
                `embedder.*`, the query and document embedders being one module): the document embedder, also used
                as the query embedder unless `query_embedder_dir` is given.
            encoder_dir (`str` or `os.PathLike`): A [`RealmKnowledgeAugEncoder`] directory.
            query_embedder_dir (`str` or `os.PathLike`, *optional*):
                A separate query [`RealmEmbedder`]; sets `share_query_document_embedder=False`.
            retriever, tokenizer (*optional*): Attached to the model.
            **config_overrides: Set on the config (e.g. `num_candidates=8`, `max_joint_length=...`).
        """
        embedder = load_embedder(embedder_or_scorer_dir)
        encoder = RealmKnowledgeAugEncoder.from_pretrained(encoder_dir)
        config = RealmConfig.from_dict(encoder.config.to_dict())
        config.architectures = [cls.__name__]
        config.share_query_document_embedder = query_embedder_dir is None
        for key, value in config_overrides.items():
            setattr(config, key, value)
        model = cls(config, retriever=retriever, tokenizer=tokenizer)
        model.embedder.load_state_dict(embedder.state_dict())
        model.encoder.load_state_dict(encoder.state_dict())
        if query_embedder_dir is not None:
            model.query_embedder.load_state_dict(load_embedder(query_embedder_dir).state_dict())
        return model

    def export_components(self, save_directory: str | os.PathLike, safe_serialization: bool = True) -> dict[str, str]:
        r"""
        Write the parts as standalone checkpoints with the legacy layouts and keys, loadable on their own:

        - `embedder/`: the document embedder, a [`RealmEmbedder`] (keys `realm.*`, `cls.*`): what builds the index,
          and what [`RealmForOpenQA`] / ORQA fine-tuning starts from;
        - `query_embedder/`: the query [`RealmEmbedder`] (only when separate);
        - `scorer/`: a [`RealmScorer`] (keys `embedder.*`, like `realm-cc-news-pretrained-scorer`); with separate
          embedders it holds the document embedder, and `RealmScorer.from_pretrained(path,
          query_embedder=RealmEmbedder.from_pretrained(query_embedder/))` restores the pair;
        - `encoder/`: the [`RealmKnowledgeAugEncoder`] (keys `realm.*`, `cls.predictions.*`).

        Returns:
            `dict` mapping each component name to its directory.
        """
        query_embedder = None if self.shares_query_document_embedder else self.query_embedder
        return write_components(
            save_directory, self.config, self.embedder, self.encoder, query_embedder, safe_serialization
        )

    # ------------------------------------------------------------------------------------------------ retrieval

    @torch.no_grad()
    def retrieve(self, query_embeddings: torch.Tensor, num_blocks: int, source_block_ids=None):
        r"""
        Search the index for the top `num_blocks` blocks of each query, skipping each query's source blocks.

        Args:
            query_embeddings (`torch.FloatTensor` of shape `(batch_size, retriever_proj_size)`): Query embeddings.
            num_blocks (`int`): Blocks to return per query (the null document is not one of them).
            source_block_ids (`torch.LongTensor` of shape `(batch_size,)` or `(batch_size, num_sources)`, *optional*):
                Corpus ids never to return for each query; negative ids are ignored.

        Returns:
            `(block_ids, blocks)`: a `torch.LongTensor` of shape `(batch_size, num_blocks)` (-2 where the corpus ran
            out of blocks) and, per query, a list of `num_blocks` block dicts (`title`, `text`; empty for padding).
        """
        retriever = self.require_retriever()
        batch_size = query_embeddings.shape[0]
        sources = source_block_sets(source_block_ids, batch_size)
        if num_blocks <= 0:
            return torch.empty((batch_size, 0), dtype=torch.long), [[] for _ in range(batch_size)]
        # Extra hits so that dropping the source blocks still leaves `num_blocks`.
        k = min(num_blocks + max((len(s) for s in sources), default=0), len(retriever))
        search = retriever.search(query_embeddings.detach().to("cpu", torch.float32), k)
        found_ids = search.block_ids.tolist()
        found_blocks = search.blocks
        block_ids, blocks = [], []
        for b in range(batch_size):
            row_ids, row_blocks = [], []
            for block_id, block in zip(found_ids[b], found_blocks[b]):
                if block_id < 0 or block_id in sources[b]:
                    continue
                row_ids.append(block_id)
                row_blocks.append(block)
                if len(row_ids) == num_blocks:
                    break
            while len(row_ids) < num_blocks:
                row_ids.append(PADDING_BLOCK_ID)
                row_blocks.append({"title": "", "text": ""})
            block_ids.append(row_ids)
            blocks.append(row_blocks)
        return torch.tensor(block_ids, dtype=torch.long), blocks

    def score_blocks(self, query_embeddings: torch.Tensor, blocks: list[list[dict]], block_ids: torch.LongTensor):
        r"""
        Relevance of retrieved blocks under the *current* document embedder (differentiable in both embedders).

        Returns:
            `(relevance_score, block_token_ids)`: `torch.FloatTensor` of shape `(batch_size, num_blocks)` (a very large
            negative number for padding) and, per query and block, the block's wordpieces for the joint input
            (`title [SEP] text`, without `[CLS]` and the final `[SEP]`).
        """
        batch_size, num_blocks = block_ids.shape
        # Scores in at least fp32: under bf16/fp16 autocast the embeddings are half precision, and the retrieval
        # softmax over them (and the index_put below) needs one dtype that keeps their differences.
        dtype = torch.promote_types(query_embeddings.dtype, torch.float32)
        relevance = torch.full(
            (batch_size, num_blocks), torch.finfo(dtype).min, dtype=dtype, device=query_embeddings.device
        )
        token_ids = [[[] for _ in range(num_blocks)] for _ in range(batch_size)]
        valid = (block_ids >= 0).nonzero().tolist()
        if not valid:
            return relevance, token_ids
        tokenizer = self._tokenizer()
        titles = [blocks[b][j].get("title") for b, j in valid]
        texts = [blocks[b][j].get("text") or "" for b, j in valid]
        max_length = getattr(self.retriever, "max_block_length", None) or self.max_block_length
        encoded = encode_blocks(tokenizer, titles, texts, max_length)
        lengths = encoded["attention_mask"].sum(-1).tolist()
        for (b, j), ids, n, title in zip(valid, encoded["input_ids"].tolist(), lengths, titles):
            # Joint input: `title [SEP] text`, or just `text` when there is no title.
            token_ids[b][j] = ids[1 : n - 1] if title else ids[2 : n - 1]
        device = self.embedder.device
        document_embeddings = self.embedder(
            input_ids=encoded["input_ids"].to(device),
            attention_mask=encoded["attention_mask"].to(device),
            token_type_ids=encoded["token_type_ids"].to(device),
            return_dict=True,
        ).projected_score
        rows = torch.tensor([b for b, _ in valid], device=query_embeddings.device)
        cols = torch.tensor([j for _, j in valid], device=query_embeddings.device)
        scores = (query_embeddings[rows].to(dtype) * document_embeddings.to(query_embeddings.device, dtype)).sum(-1)
        relevance = relevance.index_put((rows, cols), scores)
        return relevance, token_ids

    # ------------------------------------------------------------------------------------------------ forward

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        labels: torch.LongTensor | None = None,
        mlm_mask: torch.Tensor | None = None,
        source_block_ids: torch.LongTensor | None = None,
        block_id: torch.LongTensor | None = None,
        return_loss: bool = True,
        return_logits: bool = False,
        return_predictions: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> tuple | RealmForPreTrainingOutput:
        r"""
        input_ids (`torch.LongTensor` of shape `(batch_size, input_length)`):
            Masked inputs `[CLS] x [SEP]` (e.g. from `DataCollatorForSalientSpanMasking`).
        labels (`torch.LongTensor` of shape `(batch_size, input_length)`, *optional*):
            Original ids at the masked positions, -100 elsewhere.
        mlm_mask (`torch.Tensor` of shape `(batch_size, input_length)`, *optional*):
            Positions that count in the loss (combined with `labels != -100`).
        source_block_ids (`torch.LongTensor` of shape `(batch_size,)` or `(batch_size, num_sources)`, *optional*):
            Corpus id(s) of the block each input was cut from, never retrieved for it; -1 for none.
        block_id (`torch.LongTensor` of shape `(batch_size,)`, *optional*):
            Alias of `source_block_ids`: the name the collators pass the example's block id through under.
        return_logits (`bool`, *optional*, defaults to `False`):
            Return the encoder logits of every candidate (large: batch x candidates x length x vocabulary).
        return_predictions (`bool`, *optional*):
            Return `marginal_predictions` and `null_predictions`; defaults to `not self.training`.

        Returns:
            [`RealmForPreTrainingOutput`]
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        if input_ids is None:
            raise ValueError("`input_ids` (the masked inputs) are required.")
        if source_block_ids is None:
            source_block_ids = block_id if block_id is not None else kwargs.get("source_block_id")
        if return_predictions is None:
            return_predictions = not self.training
        batch_size = input_ids.shape[0]
        tokenizer = self._tokenizer()

        # (a) query embeddings (gradient to the query embedder through the relevance scores)
        query_embeddings = self.query_embedder(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, return_dict=True
        ).projected_score
        # (b) retrieval without the source block, (d) re-scoring with the current document embedder
        num_retrieved = self.num_candidates - 1
        block_ids, blocks = self.retrieve(query_embeddings, num_retrieved, source_block_ids)
        block_ids = block_ids.to(input_ids.device)
        retrieved_scores, block_token_ids = self.score_blocks(query_embeddings, blocks, block_ids)
        # (c) the null document: candidate 0, zero embedding, so relevance 0
        null_score = torch.zeros((batch_size, 1), dtype=retrieved_scores.dtype, device=retrieved_scores.device)
        relevance_score = torch.cat([null_score, retrieved_scores], dim=1)
        candidate_ids = torch.cat(
            [torch.full((batch_size, 1), NULL_BLOCK_ID, dtype=torch.long, device=block_ids.device), block_ids], dim=1
        )
        # (e) joint (input, block) wordpieces
        joint = join_inputs_and_blocks(
            input_ids,
            [[[]] + rows for rows in block_token_ids],
            sep_token_id=tokenizer.sep_token_id,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
            max_length=self.max_joint_length,
            attention_mask=attention_mask,
            labels=labels,
            mlm_mask=mlm_mask,
        )
        # (f) knowledge-augmented encoder and marginal loss
        num_candidates, length = joint["input_ids"].shape[1:]
        hidden = self.encoder.realm(
            input_ids=joint["input_ids"].view(-1, length),
            attention_mask=joint["attention_mask"].view(-1, length),
            token_type_ids=joint["token_type_ids"].view(-1, length),
            return_dict=True,
        ).last_hidden_state
        retrieval_log_probs = relevance_score.log_softmax(-1)

        logits = None
        if return_logits:
            logits = self.encoder.cls(hidden).view(batch_size, num_candidates, length, -1)
        loss = candidate_log_probs = utility = marginal_predictions = null_predictions = None
        if labels is not None:
            # The vocabulary projection only where there is something to predict: over all positions it costs as
            # much as the encoder itself (30k x hidden per token) and holds a (B, k, L, V) tensor for nothing.
            positions, masked_labels, masked = self._masked_positions(joint["labels"], joint["mlm_mask"])
            hidden_size = hidden.shape[-1]
            index = positions[:, None, :, None].expand(-1, num_candidates, -1, hidden_size)
            masked_hidden = hidden.view(batch_size, num_candidates, length, hidden_size).gather(2, index)
            prediction_scores = self.encoder.cls(masked_hidden)  # (B, k, M, V)
            if return_loss:
                if masked.sum() == 0:
                    # No masked token in the batch: a zero that still belongs to the graph.
                    loss = prediction_scores.sum() * 0.0 + relevance_score.sum() * 0.0
                else:
                    loss = realm_marginal_mlm_loss(
                        prediction_scores.flatten(0, 1), masked_labels, relevance_score, masked
                    )
            candidate_log_probs, utility, marginal_predictions, null_predictions = self._diagnostics(
                prediction_scores,
                retrieval_log_probs,
                masked_labels,
                masked,
                positions,
                joint["input_positions"],
                input_ids.shape,
                return_predictions,
            )

        output = RealmForPreTrainingOutput(
            loss=loss,
            logits=logits,
            relevance_score=relevance_score,
            retrieval_log_probs=retrieval_log_probs,
            retrieved_block_ids=candidate_ids,
            candidate_mlm_log_probs=candidate_log_probs,
            retrieval_utility=utility,
            marginal_predictions=marginal_predictions,
            null_predictions=null_predictions,
        )
        return output if return_dict else output.to_tuple()

    @staticmethod
    def _masked_positions(labels: torch.Tensor, mlm_mask: torch.Tensor):
        """Per example, the positions that count: `(positions, labels, mask)` of shape `(batch, max_masked)`."""
        counted = mlm_mask.bool() & (labels != -100)
        width = max(int(counted.sum(-1).max()), 1)
        batch_size = labels.shape[0]
        positions = torch.zeros((batch_size, width), dtype=torch.long, device=labels.device)
        masked_labels = torch.full((batch_size, width), -100, dtype=torch.long, device=labels.device)
        masked = torch.zeros((batch_size, width), dtype=torch.long, device=labels.device)
        for b in range(batch_size):
            where = counted[b].nonzero().squeeze(-1)
            positions[b, : len(where)] = where
            masked_labels[b, : len(where)] = labels[b, where]
            masked[b, : len(where)] = 1
        return positions, masked_labels, masked

    @torch.no_grad()
    def _diagnostics(
        self, scores, retrieval_log_probs, labels, mask, positions, input_positions, input_shape, return_predictions
    ):
        batch_size, input_length = input_shape
        num_candidates = retrieval_log_probs.shape[1]
        mask = mask.bool()
        # Only the masked positions: [num_masked, candidates, vocab].
        rows, cols = mask.nonzero(as_tuple=True)
        token_log_probs = scores[rows, :, cols].float().log_softmax(-1)
        gold = token_log_probs.gather(-1, labels[rows, cols].view(-1, 1, 1).expand(-1, num_candidates, 1)).squeeze(-1)
        per_example = torch.zeros((batch_size, num_candidates), device=gold.device)
        per_example.index_add_(0, rows, gold)
        counts = mask.sum(-1, keepdim=True).clamp(min=1).to(per_example.dtype)
        candidate_log_probs = per_example / counts
        utility = candidate_log_probs - candidate_log_probs[:, :1]
        marginal_predictions = null_predictions = None
        if return_predictions:
            marginal = (token_log_probs + retrieval_log_probs[rows].float().unsqueeze(-1)).logsumexp(1)
            marginal_predictions = torch.full((batch_size, input_length), -100, dtype=torch.long, device=gold.device)
            null_predictions = marginal_predictions.clone()
            # Back to the positions of the caller's `input_ids` (the joint input drops padding).
            original = torch.tensor(
                [input_positions[r][p] for r, p in zip(rows.tolist(), positions[rows, cols].tolist())],
                dtype=torch.long,
                device=gold.device,
            )
            marginal_predictions[rows, original] = marginal.argmax(-1)
            null_predictions[rows, original] = token_log_probs[:, 0].argmax(-1)
        return candidate_log_probs, utility, marginal_predictions, null_predictions


__all__ = ["RealmForPreTraining", "RealmForPreTrainingOutput"]
