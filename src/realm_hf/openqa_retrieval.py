"""
How [`RealmForOpenQA`] searches its corpus: one search that also returns the blocks' embeddings, and a search's
results put in a new order. (Finding the corpus of a checkpoint is `retriever_loading`'s, for every REALM model.)
"""

from __future__ import annotations

import inspect

import torch


def search_with_embeddings(retriever, question_embeddings: torch.Tensor, k: int, questions: list[str] | None = None):
    """
    `retriever.search(question_embeddings, k)` with the retrieved blocks' stored embeddings (`block_embeddings`).

    A [`RealmRetriever`] looks ids, blocks and embeddings up in one locked step, so they come from one state of
    the corpus and index even while another thread swaps the index or adds and removes documents. Other retrievers
    (anything with `search` and `get_block_embeddings`) are asked for the embeddings in a second call.
    """
    parameters = inspect.signature(retriever.search).parameters
    if questions is not None and "questions" in parameters:
        # A retriever that also searches by text (`retrieval.sparse.HybridRealmRetriever`).
        return retriever.search(question_embeddings, k, questions=questions, return_embeddings=True)
    if "return_embeddings" in parameters:
        return retriever.search(question_embeddings, k, return_embeddings=True)
    search = retriever.search(question_embeddings, k)
    search.block_embeddings = retriever.get_block_embeddings(search.block_ids)
    return search


def reorder_search(search, order: torch.LongTensor):
    """
    `search` (a [`~realm_hf.retrieval.searching.RealmSearchOutput`]) with each question's results in a new order:
    `order[b]` lists, for each new place, the old place of question `b`'s result.
    """
    gather = lambda t: None if t is None else t.gather(1, order.to(t.device))  # noqa: E731
    embeddings = search.block_embeddings
    if embeddings is not None:
        embeddings = embeddings.gather(1, order.to(embeddings.device).unsqueeze(-1).expand_as(embeddings))
    return type(search)(
        block_ids=gather(search.block_ids),
        scores=gather(search.scores),
        blocks=[[row[i] for i in row_order] for row, row_order in zip(search.blocks, order.tolist())],
        block_embeddings=embeddings,
    )
