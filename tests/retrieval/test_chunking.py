"""Splitting documents into blocks (`realm_hf.retrieval.chunking`): blocks that fit and start on words, the
documents that cannot be split (no text, wrong shapes), and one `doc_id` type per corpus."""

import numpy as np
import pytest
import torch

from realm_hf.retrieval.chunking import block_spans, split_documents
from realm_hf.retrieval.retriever import RealmRetriever
from tests.support.retrieval import MAX_BLOCK_LENGTH

BUILD = dict(max_block_length=32, show_progress=False)


def test_one_doc_id_type_per_corpus(tiny):
    from realm_hf.retrieval.retriever import RealmRetriever

    model, tokenizer, _ = tiny
    with pytest.raises(ValueError, match="Documents 0 and 1.*different types.*str '3'"):
        RealmRetriever.from_documents(
            [{"doc_id": 3, "text": "one"}, {"doc_id": "3", "text": "two"}], model.embedder, tokenizer, **BUILD
        )
    with pytest.raises(ValueError, match=r"Document 0's doc_id.*\[1\] \(list\).*integer or a str"):
        RealmRetriever.from_documents([{"doc_id": [1], "text": "one"}], model.embedder, tokenizer, **BUILD)
    retriever = RealmRetriever.from_documents(
        [{"doc_id": np.int64(3), "text": "three"}, {"doc_id": 4, "text": "four"}], model.embedder, tokenizer, **BUILD
    )
    with pytest.raises(ValueError, match=r"doc_id '3'.*str.*integers.*int\('3'\)"):
        retriever.add_documents([{"doc_id": "3", "text": "another three"}], model.embedder)
    with pytest.raises(ValueError, match="doc_id '3'.*str.*integers"):
        retriever.remove_documents("3")
    with pytest.raises(ValueError, match=r"doc_ids\[0\] is \[3\] \(list\)"):
        retriever.remove_documents([[3]])
    assert len(retriever) == 2
    retriever.remove_documents(np.int64(3))
    assert retriever.store.texts(retriever.store.block_ids.tolist()) == ["four"]

    named = RealmRetriever.from_documents([{"doc_id": "a", "text": "one"}], model.embedder, tokenizer, **BUILD)
    with pytest.raises(ValueError, match=r"doc_id 7.*int.*strings.*str\(7\)"):
        named.add_documents([{"doc_id": 7, "text": "seven"}], model.embedder)
    assert len(named) == 1


def test_documents_without_text_are_named_in_a_warning(tiny, caplog):
    from realm_hf.retrieval.retriever import RealmRetriever

    model, tokenizer, _ = tiny
    documents = [{"doc_id": 1, "text": ""}, {"doc_id": 2, "text": "two"}, {"doc_id": 3, "text": " \x00 "}]
    with caplog.at_level("WARNING", logger="realm_hf"):
        retriever = RealmRetriever.from_documents(documents, model.embedder, tokenizer, **BUILD)
    assert "2 document(s) have no text and are left out of the corpus" in caplog.text
    assert "doc_id [1, 3]" in caplog.text
    assert len(retriever) == 1


def test_one_document_dict_is_not_read_as_columns(tiny):
    model, tokenizer, _ = tiny
    retriever = RealmRetriever.from_embeddings(
        torch.randn(2, 16), ["unix is a system", "lisp is a language"], tokenizer=tokenizer
    )
    # Before: {"text": "hello there"} was a dict of columns: one document per character, 10 blocks added.
    with pytest.raises(TypeError, match="one document.*list of dicts"):
        retriever.add_documents({"text": "unix was written"}, model.embedder, show_progress=False)
    # Before: columns of different lengths were cut to the shortest by zip: one of two documents indexed.
    with pytest.raises(ValueError, match="different lengths"):
        retriever.add_documents({"text": ["unix", "lisp"], "title": ["Unix"]}, model.embedder, show_progress=False)
    with pytest.raises(TypeError, match="`documents`.*list of dicts"):
        retriever.add_documents(None, model.embedder, show_progress=False)
    assert len(retriever) == 2


def test_blocks_fit_start_on_words_and_cover_documents(documents, tokenizer):
    columns = split_documents(documents, tokenizer, MAX_BLOCK_LENGTH)
    by_doc = {d["doc_id"]: d for d in documents}
    blocks_per_doc = {}
    for doc_id, title, text, start, end in zip(
        columns["doc_id"], columns["title"], columns["text"], columns["char_start"], columns["char_end"]
    ):
        doc = by_doc[doc_id]
        assert title == doc["title"]
        assert doc["text"][start:end] == text  # a slice of the original: casing and punctuation kept
        assert len(tokenizer(title, text)["input_ids"]) <= MAX_BLOCK_LENGTH
        doc_enc = tokenizer(doc["text"], add_special_tokens=False, return_offsets_mapping=True)
        first = [i for i, (s, _) in enumerate(doc_enc["offset_mapping"]) if s == start]
        assert first, "block does not start on a token"
        assert not doc_enc.tokens()[first[0]].startswith("##")
        blocks_per_doc.setdefault(doc_id, []).append((start, end))
    assert set(blocks_per_doc) == set(by_doc)
    for doc_id, spans in blocks_per_doc.items():
        text = by_doc[doc_id]["text"]
        # Together the blocks cover the document; only whitespace falls between them.
        assert spans[0][0] == len(text) - len(text.lstrip()) and spans[-1][1] == len(text.rstrip())
        for (_, prev_end), (next_start, _) in zip(spans, spans[1:]):
            assert prev_end <= next_start and text[prev_end:next_start].strip() == ""
    multi = [spans for spans in blocks_per_doc.values() if len(spans) >= 3]
    assert len(multi) >= 4
    # Cuts prefer sentence ends.
    inner_ends = [
        columns["text"][i][-1]
        for i in range(len(columns["text"]) - 1)
        if columns["doc_id"][i] == columns["doc_id"][i + 1]
    ]
    assert sum(c in ".!?" for c in inner_ends) >= 0.6 * len(inner_ends)
    assert columns["source"][0] == documents[0]["source"]
    assert any(c.isupper() for c in columns["text"][0])


def test_long_title_and_single_long_word(tokenizer):
    title = " ".join(["velmora island"] * 30)
    spans, used_title = block_spans(tokenizer, "A short text.", title, max_block_length=32)
    assert len(tokenizer(used_title, add_special_tokens=False)["input_ids"]) <= 16
    assert spans == [(0, len("A short text."))]
    assert block_spans(tokenizer, "", "T", 32)[0] == []


def test_empty_and_malformed_documents(embedder, tokenizer):
    with pytest.raises(ValueError, match="empty"):
        RealmRetriever.from_documents([], embedder, tokenizer, show_progress=False)
    with pytest.raises(ValueError, match="empty"):
        RealmRetriever.from_documents([{"title": "x", "text": "   "}], embedder, tokenizer, show_progress=False)
    with pytest.raises(KeyError, match="'text'"):
        RealmRetriever.from_documents([{"title": "x", "body": "y"}], embedder, tokenizer, show_progress=False)
    with pytest.raises(ValueError, match="empty"):
        RealmRetriever.from_embeddings(np.zeros((0, 4), np.float32), [])
