"""Building FAISS indexes (`realm_hf.retrieval.faiss_build`): IVF lists cut to the corpus size, with one warning, and
the CPU index when faiss has no GPU."""

import logging

import pytest

from realm_hf.retrieval import faiss_ops
from realm_hf.retrieval.retriever import RealmRetriever
from tests.support.retrieval import PROJ, structured_vectors


def test_ivf_fallback_warns_once_and_consistently(caplog):
    import numpy as np

    from realm_hf.retrieval.faiss_build import build_index_from_matrix

    embeddings = np.random.default_rng(0).standard_normal((12, 8)).astype("float32")
    with caplog.at_level(logging.WARNING):
        _, factory = build_index_from_matrix("IVF64,Flat", embeddings, np.arange(12, dtype="int64"), None)
    messages = [r.getMessage() for r in caplog.records if "inverted lists" in r.getMessage()]
    assert factory == "IVF1,Flat"
    assert len(messages) == 1, messages
    assert "'IVF64,Flat' has 64 inverted lists" in messages[0] and "using 'IVF1,Flat' instead" in messages[0]


def test_ivf_with_too_many_lists_is_reduced(caplog):
    vectors = structured_vectors(400, PROJ)
    with caplog.at_level(logging.WARNING):
        retriever = RealmRetriever.from_embeddings(vectors, [str(i) for i in range(400)], index="IVF1024,Flat")
    assert "IVF10,Flat" in caplog.text and retriever.store.index_type == "IVF10,Flat"
    assert len(retriever.search(vectors[:2], k=3, nprobe=10).block_ids[0]) == 3


def test_gpu_request_falls_back_to_cpu(caplog):
    if faiss_ops.faiss_gpu_available():
        pytest.skip("faiss has GPU support here")
    vectors = structured_vectors(50, PROJ)
    with caplog.at_level(logging.WARNING):
        retriever = RealmRetriever.from_embeddings(vectors, [str(i) for i in range(50)], use_gpu=True)
    assert "realm-hf[gpu]" in caplog.text
    assert retriever.search(vectors[:1], k=1).block_ids.item() == 0
