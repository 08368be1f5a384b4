"""One retriever contract and one immutable store: what the model relies on, checked without a model."""

import inspect

import numpy as np
import pytest
import torch

from realm_hf import RealmRetriever, ShardedRealmRetriever
from realm_hf.retrieval.contract import Retriever
from tests.support.paths import CORPUS_VOCAB
from tests.support.retrieval import TinyEmbedder, embed_questions, structured_vectors

DIM = 8
QUESTION_TEXTS = ["where is velmora?", "who built the steam engine?", "what do people eat on the island?"]


def contract_members() -> set[str]:
    names = {name for name in vars(Retriever) if not name.startswith("_") or name == "__len__"}
    names |= set(Retriever.__annotations__)
    return names - {"__annotations__", "__dict__", "__weakref__", "__module__", "__doc__", "__protocol_attrs__"}


@pytest.mark.parametrize("cls", [RealmRetriever, ShardedRealmRetriever])
def test_both_retrievers_have_every_member_of_the_contract(cls):
    missing = [
        name
        for name in sorted(contract_members())
        if not hasattr(cls, name) and name not in ("tokenizer", "max_block_length")
    ]
    assert not missing, f"{cls.__name__} lacks {missing}"
    search = inspect.signature(cls.search).parameters
    # Every parameter of the contract's search, `questions` (hybrid retrieval) included: the model passes them all.
    assert list(search) == list(inspect.signature(Retriever.search).parameters)


def test_a_dense_retriever_ignores_question_texts():
    retriever = small_retriever()
    query = torch.from_numpy(np.eye(2, DIM, dtype=np.float32))
    plain = retriever.search(query, 3, return_blocks=False)
    with_texts = retriever.search(query, 3, return_blocks=False, questions=["text 0", "text 1"])
    assert torch.equal(plain.block_ids, with_texts.block_ids)


def small_retriever() -> RealmRetriever:
    vectors = np.eye(6, DIM, dtype=np.float32)  # block i is the best match of its own vector
    return RealmRetriever.from_embeddings(
        vectors, [f"text {i}" for i in range(6)], metadata={"doc_id": list(range(6))}
    )


def test_a_store_is_not_changed_by_a_refresh_swapped_in_after_it():
    retriever = small_retriever()
    store = retriever.store
    retriever.swap_index_state(store.with_embeddings(np.eye(6, DIM, k=1, dtype=np.float32)))
    query = np.eye(1, DIM, k=1, dtype=np.float32)
    assert store.top_blocks(query, k=1).block_ids.tolist() == [[1]]  # the old state, as it was
    assert retriever.search(query, k=1).block_ids.tolist() == [[0]]  # the live one: the new embeddings


def test_the_search_output_carries_the_token_ids_of_its_blocks():
    from transformers import BertTokenizer

    retriever = small_retriever()
    retriever.tokenizer = BertTokenizer(vocab=CORPUS_VOCAB)
    queries = torch.from_numpy(retriever.store.corpus.embeddings(np.array([0, 3]), DIM))
    out = retriever.search(queries, k=2, return_token_ids=True)
    tokens, lengths = retriever.store.token_ids(out.block_ids, retriever.tokenizer)
    assert torch.equal(out.block_token_ids, tokens) and torch.equal(out.block_token_lengths, lengths)
    # Reordering a result reorders every field together.
    order = torch.tensor([[1, 0], [1, 0]])
    swapped = out.reordered(order)
    assert swapped.block_ids[:, 0].tolist() == out.block_ids[:, 1].tolist()
    assert torch.equal(swapped.block_token_ids[:, 0], out.block_token_ids[:, 1])
    assert swapped.blocks[0][0] == out.blocks[0][1]


@pytest.mark.parametrize("bad", [None, b"who wrote unix?"])
def test_search_names_question_embeddings_that_are_no_numbers(tiny, bad):
    # Before: None became a NaN vector, refused as "the question embedder's weights have diverged"; bytes failed
    # with numpy's "could not convert string to float" (a string is a question text, embedded: below).
    with pytest.raises(TypeError, match="`projected_score`"):
        tiny[0].retriever.search(bad, k=2)


# ---------------------------------------------------------------------------------------------------------------------
# Question texts or embeddings
# ---------------------------------------------------------------------------------------------------------------------


def test_search_takes_question_texts_embedded_as_their_embeddings(retriever, embedder, tokenizer):
    by_text = retriever.search(QUESTION_TEXTS, k=4)
    by_embedding = retriever.search(embed_questions(embedder, tokenizer, QUESTION_TEXTS), k=4)
    assert torch.equal(by_text.block_ids, by_embedding.block_ids)
    torch.testing.assert_close(by_text.scores, by_embedding.scores)
    # One string is a batch of one; the output type is the same.
    one = retriever.search(QUESTION_TEXTS[0], k=4)
    assert type(one) is type(by_text) and torch.equal(one.block_ids, by_text.block_ids[:1])
    # The embedder's mode is left as it was.
    embedder.train()
    try:
        assert torch.equal(retriever.search(QUESTION_TEXTS, k=4).block_ids, by_text.block_ids)
        assert embedder.training
    finally:
        embedder.eval()


def test_question_texts_need_an_embedder_and_are_checked(tokenizer):
    vectors = structured_vectors(20, 16)
    bare = RealmRetriever.from_embeddings(vectors, [f"text {i}" for i in range(20)], tokenizer=tokenizer)
    with pytest.raises(ValueError, match=r"no question embedder.*model.set_retriever\(retriever\)"):
        bare.search("where is velmora?", k=2)
    bare.question_embedder = TinyEmbedder(len(tokenizer))
    assert bare.search("where is velmora?", k=2).block_ids.shape == (1, 2)
    with pytest.raises(TypeError, match="not both in one list"):
        bare.search(["where is velmora?", vectors[0]], k=2)
    with pytest.raises(ValueError, match=r"questions\[1\]: Empty question"):
        bare.search(["where is velmora?", "  "], k=2)
    with pytest.raises(ValueError, match="given twice"):
        bare.search(["where is velmora?"], k=2, questions=["where is velmora?"])


def test_a_sharded_corpus_takes_question_texts_with_its_shards_embedder(retriever, embedder):
    sharded = ShardedRealmRetriever.from_retriever(retriever, num_shards=2)
    assert sharded.question_embedder is embedder and sharded.to_retriever().question_embedder is embedder
    assert torch.equal(sharded.search(QUESTION_TEXTS, k=3).block_ids, retriever.search(QUESTION_TEXTS, k=3).block_ids)
