"""The block table (`realm_hf.retrieval.corpus`): what a doc_id may be."""

import pytest
from test_pipeline import DOCS, build_tiny_model

from realm_hf.retrieval.retriever import RealmRetriever


@pytest.mark.parametrize("empty", ["", "   ", "\t"])
def test_an_empty_doc_id_is_refused(tmp_path, empty):
    """An empty doc_id was accepted, and named a document nothing could remove."""
    model, tokenizer = build_tiny_model(str(tmp_path))
    documents = [{"title": t, "text": x, "doc_id": t.lower()} for t, x in DOCS]
    documents[2]["doc_id"] = empty
    with pytest.raises(ValueError, match=r"Document 2's doc_id is .*empty string"):
        RealmRetriever.from_documents(documents, model.embedder, tokenizer, max_block_length=48, show_progress=False)
    retriever = RealmRetriever.from_documents(
        documents[:2], model.embedder, tokenizer, max_block_length=48, show_progress=False
    )
    with pytest.raises(ValueError, match="empty string"):
        retriever.add_documents([{"text": "Fortran is a language.", "doc_id": empty}], model.embedder)
    with pytest.raises(ValueError, match="empty string"):
        retriever.remove_documents([empty])
    assert len(retriever) == 2
