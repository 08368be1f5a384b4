"""Embedding blocks (`realm_hf.retrieval.encoding`): batching, the block tokenizer, the embedder fingerprint, and
what is refused as an embedder."""

import pytest
import torch
import transformers
from transformers import BertTokenizerFast

from realm_hf.models.pretraining_inputs import encode_blocks
from realm_hf.retrieval.encoding import embed_blocks, fingerprint_module, tokenize_blocks
from realm_hf.retrieval.retriever import RealmRetriever
from tests.support.paths import CORPUS_VOCAB
from tests.support.retrieval import PROJ, TinyEmbedder


def test_a_model_given_as_the_embedder_is_named(tiny):
    model, tokenizer, _ = tiny
    documents = [{"title": "Unix", "text": "Unix was written by Ken Thompson."}]
    # Before: "'RealmReaderOutput' object has no attribute 'float'" from inside the embedding loop.
    with pytest.raises(TypeError, match=r"pass `model.index_embedder`"):
        RealmRetriever.from_documents(documents, model, tokenizer, show_progress=False)
    # Before: the reader's own "You have to specify `relevance_score`".
    with pytest.raises(TypeError, match="RealmReader.*embed"):
        RealmRetriever.from_documents(documents, model.reader, tokenizer, show_progress=False)
    # Before: FAISS's "too many values to unpack (expected 2)" on BERT's per-token output.
    bert = transformers.BertModel(
        transformers.BertConfig(
            vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37
        )
    )
    with pytest.raises(TypeError, match="BertModel.*realm_hf.init_from_bert"):
        RealmRetriever.from_documents(documents, bert, tokenizer, show_progress=False)
    # Before: AttributeError: 'NoneType' object has no attribute 'state_dict'.
    with pytest.raises(TypeError, match="embedder.*`RealmEmbedder`"):
        model.retriever.add_documents(documents, None, show_progress=False)


def test_block_tokenizer_matches_pretraining_encoding():
    tokenizer = BertTokenizerFast(vocab_file=CORPUS_VOCAB)
    titles, texts = ["paris", None], ["paris is the capital of france.", "the cat sat on the mat."]
    ours = tokenize_blocks(tokenizer, titles, texts, max_length=12, padding=True, return_tensors="pt")
    theirs = encode_blocks(tokenizer, titles, texts, 12)
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        assert ours[key].tolist() == theirs[key].tolist()


def test_embed_blocks_batched_equals_one_by_one(embedder, tokenizer, documents):
    titles = [d["title"] for d in documents[:7]]
    texts = [d["text"][: 80 + 20 * i] for i, d in enumerate(documents[:7])]
    batched = embed_blocks(embedder, tokenizer, titles, texts, batch_size=3, show_progress=False)
    single = torch.cat(
        [embed_blocks(embedder, tokenizer, [t], [x], batch_size=1, show_progress=False) for t, x in zip(titles, texts)]
    )
    assert batched.shape == (7, PROJ) and batched.dtype == torch.float32
    torch.testing.assert_close(batched, single, atol=1e-5, rtol=1e-5)
    # Legacy document embedding: tokenizer(titles, texts, padding=True) -> projected_score.
    with torch.no_grad():
        legacy = embedder(**tokenizer(titles, texts, padding=True, return_tensors="pt")).projected_score
    torch.testing.assert_close(batched, legacy, atol=1e-5, rtol=1e-5)
    bf16 = embed_blocks(embedder, tokenizer, titles, texts, dtype="bf16", show_progress=False)
    torch.testing.assert_close(bf16, batched, atol=0.1, rtol=0.1)
    assert embedder.training is False


def test_fingerprint_module(tokenizer):
    a, b = TinyEmbedder(len(tokenizer)), TinyEmbedder(len(tokenizer))
    assert fingerprint_module(a) == fingerprint_module(b) and len(fingerprint_module(a)) == 16
    with torch.no_grad():
        b.norm.bias[0] += 1e-3
    assert fingerprint_module(a) != fingerprint_module(b)
