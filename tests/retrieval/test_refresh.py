"""Refreshing the index (`realm_hf.retrieval.refresh`): `embed_corpus` over shares of the corpus, staleness by the
embedder fingerprint, and states swapped in atomically."""

import pytest
import torch

from realm_hf.retrieval.encoding import embed_blocks, fingerprint_module
from realm_hf.retrieval.refresh import embed_corpus, is_stale
from realm_hf.retrieval.retriever import RealmRetriever
from tests.support.retrieval import MAX_BLOCK_LENGTH, NEW_DOC, PROJ, TinyEmbedder


def test_embed_corpus_refreshes_embeddings_and_fingerprint(documents, embedder, tokenizer, tmp_path):
    retriever = RealmRetriever.from_documents(
        documents[:10], embedder, tokenizer, max_block_length=MAX_BLOCK_LENGTH, show_progress=False
    )
    before = retriever.store.embeddings(torch.as_tensor(retriever.store.block_ids))
    new_embedder = TinyEmbedder(len(tokenizer), seed=3)
    assert is_stale(retriever, new_embedder)
    # A share of the rows (distributed re-indexing) only computes embeddings.
    share = embed_corpus(retriever, new_embedder, start=2, end=5, show_progress=False)
    assert share.shape == (3, PROJ) and is_stale(retriever, new_embedder)
    # Built off the live retriever, swapped in atomically.
    full = embed_corpus(retriever, new_embedder, start=0, end=len(retriever), show_progress=False)
    torch.testing.assert_close(full[2:5], share)
    state = retriever.store.with_embeddings(full, embedder_fingerprint=fingerprint_module(new_embedder))
    torch.testing.assert_close(retriever.store.embeddings(torch.as_tensor(retriever.store.block_ids)), before)
    retriever.swap_index_state(state)
    assert not is_stale(retriever, new_embedder)
    expected = embed_blocks(
        new_embedder, tokenizer, retriever.corpus["title"], retriever.corpus["text"], show_progress=False
    )
    torch.testing.assert_close(retriever.store.embeddings(torch.as_tensor(retriever.store.block_ids)), expected)
    assert retriever.search(expected[:2], k=1).block_ids[:, 0].tolist() == retriever.store.block_ids[:2].tolist()
    # Whole-corpus embed_corpus refreshes in place; a stale state is refused after the corpus changed.
    embed_corpus(retriever, embedder, show_progress=False)
    torch.testing.assert_close(retriever.store.embeddings(torch.as_tensor(retriever.store.block_ids)), before)
    retriever.remove_documents(block_ids=[int(retriever.store.block_ids[0])])
    with pytest.raises(ValueError, match="corpus changed"):
        retriever.swap_index_state(state)
    # A saved (memory-mapped) retriever exports an independent copy of its index.
    retriever.save_pretrained(tmp_path)
    loaded = RealmRetriever.from_pretrained(tmp_path)
    exported = loaded.export_index_state()
    retriever.swap_index_state(exported)
    retriever.add_documents([NEW_DOC], embedder, show_progress=False)
    assert loaded.store.index.index.ntotal == len(loaded) == len(retriever) - 1
