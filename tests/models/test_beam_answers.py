"""Training's searcher beam: answers found in the corpus's stored token ids, with the losses of tokenizing every pair.

`RealmForOpenQA.forward` used to tokenize every (question, block) pair of the searcher beam to learn which blocks hold
an answer (the retriever loss). It now reads the blocks' wordpiece ids stored with the corpus and tokenizes only the
pairs the reader reads. The reference below is that former path, kept here: every pair through `build_reader_inputs`.
"""

import json
import os

import numpy as np
import pytest
import torch

from realm_hf import RealmForOpenQA, RealmTokenizer
from realm_hf.models.reader_inputs import build_reader_inputs, tokenize_answers, truncated_pair_lengths
from realm_hf.retrieval.corpus import TOKEN_IDS_COLUMN
from realm_hf.retrieval.encoding import tokenize_block_texts
from realm_hf.retrieval.refresh import embed_corpus
from realm_hf.retrieval.retriever import RealmRetriever
from realm_hf.text.answer_spans import find_answer_spans, find_answers_in_token_ids
from realm_hf.training.openqa import DataCollatorForOpenQA
from tests.support.paths import CORPUS_DIR
from tests.support.tiny_model import tiny_openqa_config

# Extra blocks: a literal [SEP] (the pair search stops there), and a block only its question's answer is in.
EXTRA_DOCUMENTS = [
    {"doc_id": "sep", "title": "Separator", "text": "Salt came first [SEP] then salt traders arrived."},
    {"doc_id": "kite", "title": "Kites", "text": "A red kite nests on PORT ESTREL cliffs."},
]
QUESTIONS = [
    # Uppercase and several answers; "salt traders" sits after the [SEP] of the extra block.
    {"question": "Who founded Port Estrel?", "answers": ["salt traders", "PORT ESTREL"]},
    # An answer in nearly every block, so the reader's loss is exercised too.
    {"question": "what is quillon?", "answers": [".", "1642"]},
    # Long enough that longest-first truncation cuts question and block.
    {
        "question": "a very long question about the mountain railway of Mount Ferrow, its steepest gradient and "
        "the minutes trains take from the valley station",
        "answers": ["Mount Ferrow", "25 percent", "minutes"],
    },
]


def tiny_tokenizer(vocab=None):
    return RealmTokenizer(vocab=vocab or os.path.join(CORPUS_DIR, "vocab.txt"))


def documents():
    with open(os.path.join(CORPUS_DIR, "documents.jsonl")) as f:
        return [json.loads(line) for line in f] + EXTRA_DOCUMENTS


def tiny_model(tokenizer, reader_seq_len=28):
    torch.manual_seed(0)
    config = tiny_openqa_config(
        len(tokenizer),
        searcher_beam_size=10_000,  # the whole corpus: every kind of block is in the beam
        reader_seq_len=reader_seq_len,  # shorter than most pairs: truncation decides what "holds an answer" means
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        initializer_range=0.2,
    )
    return RealmForOpenQA(config).train()


@pytest.fixture(scope="module")
def model():
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer)
    model.set_retriever(
        RealmRetriever.from_documents(documents(), model.embedder, tokenizer, max_block_length=24, show_progress=False)
    )
    return model


def without_token_ids(retriever, tokenizer=None):
    """The same corpus and index as a retriever saved before the corpus stored token ids."""
    return RealmRetriever(
        retriever.corpus.remove_columns([TOKEN_IDS_COLUMN]),
        retriever.export_index_state().index,
        tokenizer=tokenizer or retriever.tokenizer,
        max_block_length=retriever.max_block_length,
    )


def every_pair_forward(model, batch):
    """The former training forward: tokenize every (question, block) pair of the searcher beam, then read."""
    retriever, config = model.retriever, model.config
    tokenizer = retriever.tokenizer
    question_projection = model.embed_questions(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    k = min(config.searcher_beam_size, len(retriever))
    block_ids = retriever.search(question_projection.detach(), k).block_ids
    block_emb = retriever.store.embeddings(block_ids)
    relevance_score = torch.einsum("bd,bkd->bk", question_projection, block_emb)
    inputs = build_reader_inputs(
        tokenizer,
        batch["questions"],
        retriever.store.texts(block_ids),
        answer_ids=tokenize_answers(tokenizer, batch["answers"]),
        max_length=config.reader_seq_len,
        return_offsets_mapping=True,
    )
    read = min(config.reader_beam_size, k)
    output = model.reader(
        input_ids=inputs.input_ids[:, :read],
        attention_mask=inputs.attention_mask[:, :read],
        token_type_ids=inputs.token_type_ids[:, :read],
        relevance_score=relevance_score,
        block_mask=inputs.block_mask,
        has_answers=inputs.has_answers,
        start_positions=inputs.start_positions,
        end_positions=inputs.end_positions,
        return_dict=True,
    )
    return output, inputs, block_ids


def assert_same_training_outputs(model, batch):
    reference, inputs, block_ids = every_pair_forward(model, batch)
    out = model(**batch)
    assert torch.equal(out.retrieved_block_ids, block_ids)
    for name in ("loss", "retriever_loss", "reader_loss", "retriever_correct", "reader_correct", "reader_logits"):
        assert torch.equal(getattr(out.reader_output, name), getattr(reference, name)), name
    read = model.config.reader_beam_size
    assert torch.equal(out.reader_input_ids, inputs.input_ids[:, :read])
    out.loss.backward()  # the new path's graph is a training graph
    return reference, inputs, block_ids


@pytest.mark.parametrize("stored", ["column", "no column (old save)", "column with rows added without ids"])
def test_training_losses_identical_to_tokenizing_every_pair(model, stored):
    retriever = model.retriever
    tokenizer = retriever.tokenizer
    try:
        if stored == "no column (old save)":
            model.set_retriever(without_token_ids(retriever))
        elif stored == "column with rows added without ids":
            copy = RealmRetriever(
                retriever.corpus, retriever.export_index_state().index, tokenizer=None, max_block_length=24
            )
            extra = {"title": ["Late"], "text": ["Salt traders came late to Mount Ferrow."], "doc_id": ["late"]}
            store = copy.store.appended(extra, np.ones((1, retriever.embedding_dim), dtype=np.float32))
            copy = RealmRetriever.from_store(store, None, copy.max_block_length)
            assert copy.corpus[-1][TOKEN_IDS_COLUMN] is None  # stored without ids: tokenized when retrieved
            copy.tokenizer = tokenizer
            model.set_retriever(copy)
        batch = DataCollatorForOpenQA(tokenizer)(QUESTIONS)
        reference, inputs, block_ids = assert_same_training_outputs(model, batch)
        used = model.retriever
    finally:
        model.set_retriever(retriever)

    # The comparison covers what made "holds an answer" subtle: answers only in the part of a block that its pair
    # cuts off, an answer after a [SEP] written in the text, answers beyond the reader beam, the reader's own loss.
    ids, lengths = used.store.token_ids(block_ids, used.tokenizer)
    answers = tokenize_answers(tokenizer, batch["answers"])
    anywhere = torch.stack([find_answers_in_token_ids(ids[b], lengths[b], answers[b]) for b in range(len(answers))])
    assert (anywhere & ~inputs.has_answers).any()
    sep_block = int(model.retriever.corpus.to_pandas().query("doc_id == 'sep'").block_id.iloc[0])
    column = int((block_ids[0] == sep_block).nonzero())
    assert anywhere[0, column] and not inputs.has_answers[0, column]
    assert inputs.has_answers[:, model.config.reader_beam_size :].any()
    assert (reference.reader_loss > 0).any() and (reference.retriever_loss > 0).any()
    truncated = inputs.attention_mask.sum(-1) == model.config.reader_seq_len
    assert truncated.any() and (~truncated).any()


class PairCountingTokenizer(RealmTokenizer):
    """Counts the (question, block) pairs it encodes."""

    pairs = 0

    def __call__(self, text=None, text_pair=None, *args, **kwargs):
        if text_pair is not None:
            type(self).pairs += len(text_pair) if isinstance(text_pair, list) else 1
        return super().__call__(text, text_pair, *args, **kwargs)


def test_training_step_tokenizes_only_the_pairs_it_reads(model):
    tokenizer = PairCountingTokenizer(vocab=os.path.join(CORPUS_DIR, "vocab.txt"))
    retriever = model.retriever
    model.set_retriever(RealmRetriever(retriever.corpus, retriever.export_index_state().index, tokenizer=tokenizer))
    try:
        batch = DataCollatorForOpenQA(tokenizer)(QUESTIONS)
        PairCountingTokenizer.pairs = 0
        out = model(**batch)
    finally:
        model.set_retriever(retriever)
    assert out.retrieved_block_ids.shape == (len(QUESTIONS), len(retriever))
    assert PairCountingTokenizer.pairs == len(QUESTIONS) * model.config.reader_beam_size


def test_a_changed_tokenizer_falls_back_to_every_pair_with_a_warning(model, tmp_path):
    # The corpus's ids were made by the fixture vocabulary; this one swaps "." and "," (new ids for both).
    with open(os.path.join(CORPUS_DIR, "vocab.txt")) as f:
        vocab = f.read().split("\n")
    a, b = vocab.index("."), vocab.index(",")
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab))
    tokenizer = tiny_tokenizer(str(tmp_path / "vocab.txt"))
    retriever = model.retriever
    model.set_retriever(RealmRetriever(retriever.corpus, retriever.export_index_state().index, tokenizer=tokenizer))
    try:
        with pytest.warns(UserWarning, match="tokenizer changed"):
            assert_same_training_outputs(model, DataCollatorForOpenQA(tokenizer)(QUESTIONS))
    finally:
        model.set_retriever(retriever)


def stored_ids_match_texts(retriever):
    assert TOKEN_IDS_COLUMN in retriever.corpus.column_names
    assert None not in retriever.corpus[TOKEN_IDS_COLUMN]
    block_ids = torch.as_tensor(retriever.store.block_ids)
    ids, lengths = retriever.store.token_ids(block_ids, retriever.tokenizer)
    expected = tokenize_block_texts(retriever.tokenizer, retriever.store.texts(block_ids))
    assert [row[:n].tolist() for row, n in zip(ids, lengths)] == expected
    assert ids.shape[1] == max(len(row) for row in expected) and bool((ids[lengths == 0] == -1).all())
    # Search results and provenance carry the metadata, not the ids.
    assert TOKEN_IDS_COLUMN not in retriever.store.blocks(block_ids[:2])[0]


def test_token_ids_are_kept_through_add_remove_save_load_and_refresh(model, tmp_path):
    tokenizer = model.retriever.tokenizer
    retriever = RealmRetriever.from_documents(
        documents()[:6], model.embedder, tokenizer, max_block_length=24, show_progress=False
    )
    stored_ids_match_texts(retriever)
    assert retriever.corpus.features[TOKEN_IDS_COLUMN].feature.dtype == "uint16"  # a vocabulary under 65,536
    retriever.add_documents(documents()[6:9], model.embedder, show_progress=False)
    stored_ids_match_texts(retriever)
    retriever.remove_documents(doc_ids=[documents()[1]["doc_id"]])
    stored_ids_match_texts(retriever)
    embed_corpus(retriever, model.embedder, show_progress=False)
    stored_ids_match_texts(retriever)
    retriever.save_pretrained(tmp_path / "saved")
    loaded = RealmRetriever.from_pretrained(tmp_path / "saved")
    stored_ids_match_texts(loaded)
    assert loaded.corpus[TOKEN_IDS_COLUMN] == retriever.corpus[TOKEN_IDS_COLUMN]

    # A corpus saved without the column loads, grows and answers as before; its ids come from the tokenizer.
    old = without_token_ids(retriever)
    old.save_pretrained(tmp_path / "old")
    old = RealmRetriever.from_pretrained(tmp_path / "old")
    old.add_documents(documents()[9:10], model.embedder, show_progress=False)
    assert TOKEN_IDS_COLUMN not in old.corpus.column_names
    ids, lengths = old.store.token_ids(torch.as_tensor(old.store.block_ids), old.tokenizer)
    expected = tokenize_block_texts(tokenizer, old.store.texts(torch.as_tensor(old.store.block_ids)))
    assert [row[:n].tolist() for row, n in zip(ids, lengths)] == expected


def test_truncated_pair_lengths_match_the_tokenizer():
    tokenizer = tiny_tokenizer()
    words = documents()[0]["text"].split()
    pairs = [(" ".join(words[:q]), " ".join(words[3 : 3 + b])) for q in range(0, 22, 1) for b in range(0, 22, 1)]
    q_len = torch.tensor([len(ids) for ids in tokenizer([q for q, _ in pairs], add_special_tokens=False)["input_ids"]])
    b_len = torch.tensor([len(ids) for ids in tokenizer([b for _, b in pairs], add_special_tokens=False)["input_ids"]])
    for max_length in (8, 9, 12, 17, 32, 64):
        encoded = tokenizer(
            [q for q, _ in pairs], [b for _, b in pairs], truncation=True, max_length=max_length, verbose=False
        )
        # [CLS] question [SEP] are type 0, block [SEP] type 1.
        kept_q = torch.tensor([types.count(0) - 2 for types in encoded["token_type_ids"]])
        kept_b = torch.tensor([types.count(1) - 1 for types in encoded["token_type_ids"]])
        q_kept, b_kept = truncated_pair_lengths(q_len, b_len, max_length)
        assert torch.equal(q_kept, kept_q) and torch.equal(b_kept, kept_b), max_length
    # Every truncation case occurred: none, the longer one cut, both cut, and ties.
    assert bool((q_len + b_len + 3 > 8).any() and (q_len + b_len + 3 <= 64).any() and (q_len == b_len).any())


def test_answer_matching_equals_find_answer_spans_on_random_ids():
    rng = np.random.default_rng(0)
    cls, sep, pad = 101, 102, 0
    for _ in range(300):
        num_blocks = 6
        blocks = [rng.integers(1, 9, size=rng.integers(0, 14)).tolist() for _ in range(num_blocks)]
        for block in blocks:
            if block and rng.random() < 0.3:
                block[rng.integers(len(block))] = sep  # a [SEP] written in the text
        answers = [rng.integers(1, 9, size=rng.integers(1, 4)).tolist() for _ in range(rng.integers(1, 3))]
        question = rng.integers(1, 9, size=rng.integers(0, 6)).tolist()
        kept = [int(rng.integers(0, len(block) + 1)) for block in blocks]  # what a pair's truncation left
        expected = []
        for block, n in zip(blocks, kept):
            pair = [cls] + question + [sep] + block[:n] + [sep] + [pad] * 4
            expected.append(bool(find_answer_spans(pair, answers, sep)[0]))
        padded = torch.full((num_blocks, 14), -1)
        for i, block in enumerate(blocks):
            padded[i, : len(block)] = torch.tensor(block, dtype=torch.long)
        first_sep = [block.index(sep) if sep in block else len(block) for block in blocks]
        searchable = torch.tensor([min(n, s) for n, s in zip(kept, first_sep)])
        assert find_answers_in_token_ids(padded, searchable, answers).tolist() == expected


def test_token_ids_are_tokenized_in_bounded_chunks(monkeypatch):
    """A corpus is tokenized a chunk at a time (the whole 1M-block corpus at once took ~20 GB), with the same ids."""
    from realm_hf.retrieval import building

    tokenizer = tiny_tokenizer()
    texts = [doc["text"] for doc in documents()] * 3
    columns = {"title": [""] * len(texts), "text": texts}
    calls = []
    real = building.tokenize_block_texts

    def counting(tok, chunk):
        calls.append(len(chunk))
        return real(tok, chunk)

    monkeypatch.setattr(building, "tokenize_block_texts", counting)
    monkeypatch.setattr(building, "TOKENIZE_CHUNK_BLOCKS", 4)
    column = building.with_token_ids(columns, tokenizer)[TOKEN_IDS_COLUMN]
    assert max(calls) <= 4 and sum(calls) == len(texts)
    assert column.to_pylist() == tokenize_block_texts(tokenizer, texts)
    assert building.with_token_ids({"title": [], "text": []}, tokenizer)[TOKEN_IDS_COLUMN].to_pylist() == []
