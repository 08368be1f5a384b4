"""
Load the retriever saved with a REALM model, checked against the embedder that fills its index; check the embedding
size of a retriever attached to a model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .file_utils import consistent_read

if TYPE_CHECKING:
    from .configuration_realm import RealmConfig


def load_retriever_for_model(model, path: str, model_dir: str | None = None, verify_checksums: bool = True):
    """
    Load a saved retriever for `model`, checking it against the embedder that fills its index and, given the
    `model_dir` the weights were loaded from, that those weights are the ones saved with it.
    """
    from .retrieval.serialization import check_model_files  # local import: retrieval pulls in faiss and datasets

    # One save: the model files checked are those of the manifest the retriever is then loaded with.
    from .retrieval.sparse import attach_saved_sparse_index
    from .retrieval_realm import RealmRetriever

    with consistent_read(path):
        if model_dir is not None:
            check_model_files(path, model_dir, verify_checksums=verify_checksums)
        # The fingerprint (stale-index warning) only means something against the document embedder: the model's own
        # when it trains one. Otherwise the index came from a separate pre-trained embedder: check the dimension only.
        document_embedder = getattr(model, "document_embedder", None)
        if document_embedder is not None:
            dense = RealmRetriever.from_pretrained(path, embedder=document_embedder, verify_checksums=verify_checksums)
        else:
            dense = RealmRetriever.from_pretrained(
                path, expected_dim=model.config.retriever_proj_size, verify_checksums=verify_checksums
            )
        # A BM25 index saved beside the dense one (hybrid retrieval) comes back with it.
        return attach_saved_sparse_index(dense, path)


def check_retriever_dim(retriever, config: RealmConfig) -> None:
    """Refuse a retriever whose embeddings are not `config.retriever_proj_size`-dimensional (`None` passes)."""
    dim = getattr(retriever, "embedding_dim", None)
    if dim is None or int(dim) == int(config.retriever_proj_size):
        return
    raise ValueError(
        f"This retriever holds {int(dim)}-d embeddings, but the model's embedder projects to "
        f"{config.retriever_proj_size} dimensions (config.retriever_proj_size): its inner products would be "
        "meaningless. Use the corpus built for this model, or re-embed it with this model's embedder "
        "(`retriever.embed_corpus(model.embedder)`)."
    )
