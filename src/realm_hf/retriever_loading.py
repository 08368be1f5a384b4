"""Load the retriever saved with a REALM model, checked against the embedder that fills its index."""

from __future__ import annotations


def load_retriever_for_model(model, path: str, model_dir: str | None = None, verify_checksums: bool = True):
    """
    Load a saved retriever for `model`, checking it against the embedder that fills its index and, given the
    `model_dir` the weights were loaded from, that those weights are the ones saved with it.
    """
    from .retrieval.serialization import check_model_files  # local import: retrieval pulls in faiss and datasets
    from .retrieval_realm import RealmRetriever

    if model_dir is not None:
        check_model_files(path, model_dir, verify_checksums=verify_checksums)
    # The fingerprint (stale-index warning) only means something against the document embedder: the model's own
    # when it trains one. Otherwise the index came from a separate pre-trained embedder: check the dimension only.
    document_embedder = getattr(model, "document_embedder", None)
    if document_embedder is not None:
        return RealmRetriever.from_pretrained(path, embedder=document_embedder, verify_checksums=verify_checksums)
    return RealmRetriever.from_pretrained(
        path, expected_dim=model.config.retriever_proj_size, verify_checksums=verify_checksums
    )
