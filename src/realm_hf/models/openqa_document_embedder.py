"""
End-to-end retriever training in [`RealmForOpenQA`]: the model's own document embedder, and the block embeddings of
the retrieval loss (the top blocks re-embedded with gradient, in bounded chunks; the index's stored vectors for the
rest of the searcher beam).
"""

from __future__ import annotations

import copy

import torch

from ..retrieval.encoding import tokenize_blocks
from .modeling_embedder import RealmEmbedder


class RealmOpenQADocumentEmbedderMixin:
    """
    The document-embedder side of [`RealmForOpenQA`], mixed into it: uses the model's `query_embedder`,
    `document_embedder`, `retriever`, `config` and `training`.
    """

    # Blocks per document-embedder call when retrieved blocks are re-embedded with gradient (end-to-end training):
    # caps the size of one call's activations; an attribute, not a config field, as results change only by rounding.
    document_embedding_chunk_size = 64

    def add_document_embedder(self, embedder: RealmEmbedder | None = None, trainable: bool = True) -> RealmEmbedder:
        r"""
        Give the model its own document embedder, for end-to-end retriever training.

        By default REALM fine-tuning keeps the document embedder frozen: the index holds precomputed block
        embeddings and only the question embedder and reader train. With a document embedder, the top
        `config.document_gradient_beam_size` retrieved blocks of each question (default: the reader beam) are
        re-embedded in the forward pass while training, so the retrieval loss reaches the document side too; the
        rest of the searcher beam is scored with the index's stored embeddings. [`RealmReindexCallback`] refreshes
        the index with its weights.

        Args:
            embedder ([`RealmEmbedder`], *optional*):
                Initial weights, e.g. the pre-trained document embedder that built the index. Defaults to a copy of
                the question embedder (they start equal in REALM's fine-tuning from pre-training).
            trainable (`bool`, *optional*, defaults to `True`): Leave its parameters trainable.
        """
        embedder = copy.deepcopy(self.query_embedder) if embedder is None else embedder
        embedder.requires_grad_(trainable)
        self.document_embedder = embedder
        self.config.use_document_embedder = True
        return embedder

    def freeze_document_embedder(self) -> None:
        """Stop training the document embedder (the paper's fine-tuning setting); the index then stays fresh."""
        if self.document_embedder is not None:
            self.document_embedder.requires_grad_(False)

    def _trains_document_embedder(self) -> bool:
        return (
            self.document_embedder is not None
            and self.training
            and torch.is_grad_enabled()
            and any(p.requires_grad for p in self.document_embedder.parameters())
        )

    def _embed_blocks(self, tokenizer, blocks: list[list[dict]]) -> torch.Tensor:
        """
        Embed retrieved blocks with the live document embedder (with gradient): `[batch, n, proj]` for `n` blocks
        per question. One tokenization for all of them (as the index was embedded), then the embedder runs over
        `document_embedding_chunk_size` blocks at a time: that caps the transient memory of one call (attention
        scores, feed-forward activations); what backward keeps still grows with the number of blocks, which
        `config.document_gradient_beam_size` bounds.
        """
        flat = [block for row in blocks for block in row]
        # The same tokenization and truncation as the index was embedded with.
        encoded = tokenize_blocks(
            tokenizer,
            [block.get("title") for block in flat],
            [block["text"] for block in flat],
            max_length=getattr(self.retriever, "max_block_length", None),
            padding=True,
            return_tensors="pt",
        ).to(self.document_embedder.device)
        chunk = max(1, int(self.document_embedding_chunk_size))
        embeddings = torch.cat(
            [
                self.document_embedder(
                    **{key: value[start : start + chunk] for key, value in encoded.items()}, return_dict=True
                ).projected_score
                for start in range(0, len(flat), chunk)
            ]
        )
        return embeddings.view(len(blocks), len(blocks[0]), -1)

    def _document_gradient_beam_size(self, k: int, reader_beam_size: int | None = None) -> int:
        """
        Blocks per question re-embedded with gradient while the document embedder trains:
        `config.document_gradient_beam_size` (default: the blocks read, `config.reader_beam_size` unless the call
        says otherwise), at most `k` (the searcher beam).
        """
        m = getattr(self.config, "document_gradient_beam_size", None)
        if m is None:
            m = self.config.reader_beam_size if reader_beam_size is None else reader_beam_size
        return max(0, min(int(m), k))

    def _training_block_embeddings(
        self, tokenizer, search, question_projection, reader_beam_size: int | None = None
    ) -> torch.Tensor:
        """
        Block embeddings `[batch, k, proj]` for the relevance scores while the document embedder trains: fresh ones
        (with gradient) for the first `document_gradient_beam_size` blocks of each question's beam, the index's
        stored ones (no gradient) for the rest.
        """
        k = search.block_ids.shape[1]
        m = self._document_gradient_beam_size(k, reader_beam_size)
        device = question_projection.device
        fresh = self._embed_blocks(tokenizer, [row[:m] for row in search.blocks]).to(device) if m else None
        if fresh is not None and m == k:
            return fresh
        # The top blocks carry the gradient into the document side (REALM's pre-training back-propagates through 8
        # candidates); the stored vectors still give the rest of the beam its place in the retrieval marginal,
        # without activations kept for backward.
        stored = search.block_embeddings[:, m:].to(
            device, fresh.dtype if fresh is not None else question_projection.dtype
        )
        return stored if fresh is None else torch.cat([fresh, stored], dim=1)

    def _search_blocks(
        self,
        retriever,
        tokenizer,
        question_embeddings: torch.Tensor,
        k: int,
        questions=None,
        return_token_ids: bool = False,
    ):
        """
        The top `k` blocks of each question with their embeddings (and, on request, token ids; with the question texts,
        a hybrid retriever adds its BM25 candidates): the index's own top `k`, or, with
        `config.rerank_beam_size = L`, the best `k` of the index's top `L` re-scored with the current document
        embedder (Atlas's re-ranking: a stale index over-retrieves, the live embedder orders). The re-scored blocks
        carry their fresh embeddings (no gradient) and scores; evaluation and training alike.
        """
        beam = getattr(self.config, "rerank_beam_size", None)
        search_options = {"return_embeddings": True, "return_token_ids": return_token_ids, "questions": questions}
        if beam is None:
            return retriever.search(question_embeddings, k, **search_options)
        if self.document_embedder is None:
            raise ValueError(
                f"`config.rerank_beam_size={beam}` re-scores retrieved blocks with the model's document embedder, "
                "but the model has none: add one with `model.add_document_embedder()` (end-to-end training), or set "
                "`rerank_beam_size` to None (a frozen index needs no re-ranking)."
            )
        search = retriever.search(question_embeddings, min(max(beam, k), len(retriever)), **search_options)
        with torch.no_grad():
            fresh = self._embed_blocks(tokenizer, search.blocks).to(question_embeddings.device)
            scores = torch.einsum("bd,bkd->bk", question_embeddings.float(), fresh.float())
        # Blocks the index could not fill (-1) stay last.
        scores = scores.masked_fill(search.block_ids.to(scores.device) < 0, float("-inf"))
        order = scores.topk(min(k, scores.shape[1]), dim=1).indices
        reranked = search.reordered(order)  # ids, blocks and token ids in the new order
        reranked.scores = scores.gather(1, order)
        reranked.block_embeddings = fresh.gather(1, order.unsqueeze(-1).expand(-1, -1, fresh.shape[-1]))
        return reranked
