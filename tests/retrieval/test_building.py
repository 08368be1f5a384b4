"""Building a retriever from documents (`realm_hf.retrieval.building`): options checked before any document is read,
the FAISS factory string tried before anything is embedded, documents given in the wrong shape."""

import pytest

from realm_hf.retrieval.retriever import RealmRetriever


@pytest.mark.parametrize(
    "options, message",
    [
        # Before: numpy's "negative dimensions are not allowed" after the corpus was embedded.
        ({"train_size": -1}, "`train_size`.*positive integer"),
        # Before: "'<' not supported between instances of 'str' and 'int'" inside the block splitter.
        ({"max_block_length": "64"}, "`max_block_length`.*at least 8"),
        ({"batch_size": 0}, "`batch_size`.*positive integer"),
        ({"index": ""}, "`index`.*FAISS factory string"),
    ],
)
def test_build_options_are_checked_before_any_document_is_read(options, message):
    from realm_hf.retrieval.building import BuildOptions

    with pytest.raises(ValueError, match=message):
        BuildOptions(**options)
    assert BuildOptions(train_size=None, max_block_length=8).max_block_length == 8


def test_from_documents_tries_the_index_factory_before_embedding(tiny, monkeypatch):
    from realm_hf.retrieval import building
    from realm_hf.retrieval.faiss_build import IndexFactoryError

    def embed(*args, **kwargs):
        raise AssertionError("the corpus was embedded before the factory string was checked")

    model, tokenizer, _ = tiny
    monkeypatch.setattr(building, "split_and_embed", embed)
    # Before: FAISS refused the string only when the index was built, after every block was embedded.
    with pytest.raises(IndexFactoryError, match="factory string 'Nonsense'"):
        RealmRetriever.from_documents(
            [{"text": "Unix was written at Bell Labs."}], model.embedder, tokenizer, index="Nonsense"
        )
