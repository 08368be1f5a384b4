"""The tiny open-QA model most tests answer with: a RealmForOpenQA (hidden 32, 2 layers) over six short documents,
indexed by its own embedder, and the comparisons of its answers."""

import os

import pytest
import torch

from realm_hf import RealmConfig, RealmForOpenQA, RealmTokenizer
from tests.support.pretraining import TINY_ENCODER

DOCS = [
    ("Compiler", "A compiler is a program that translates source code into machine code for a computer."),
    ("Unix", "Unix is an operating system written by Ken Thompson and Dennis Ritchie at Bell Labs."),
    ("Lisp", "Lisp is a family of programming languages invented by John McCarthy in 1958."),
    ("Python", "Python is a programming language created by Guido van Rossum and released in 1991."),
    ("Emacs", "Emacs is a text editor extended in Lisp and started by Richard Stallman."),
    ("Algol", "Algol is an early programming language that influenced Pascal and the C language."),
]
QUESTIONS = ["who wrote unix?", "what is a compiler?", "when was python created?"]

# The open-QA shape most model tests share: the pre-training tests' tiny encoder, a reader of 3 blocks of 48 wordpieces.
TINY_OPENQA = dict(
    TINY_ENCODER,
    span_hidden_size=16,
    max_span_width=4,
    reader_beam_size=3,
    searcher_beam_size=4,
    reader_seq_len=48,
    max_position_embeddings=64,
)


def tiny_openqa_config(vocab_size, **overrides):
    """A `RealmConfig` of the [`TINY_OPENQA`] shape over `vocab_size` wordpieces, with `overrides` on top."""
    return RealmConfig(**{**TINY_OPENQA, "vocab_size": vocab_size, **overrides})


def build_tiny_model(tmp_dir, reader_beam_size=3, seed=0):
    """A tiny RealmForOpenQA (hidden 32, 2 layers) with a 6-block corpus indexed by its own embedder."""
    from realm_hf.retrieval.retriever import RealmRetriever

    words = set()
    for title, text in DOCS:
        words.update((title + " " + text).lower().replace(".", " . ").replace("?", " ? ").split())
    words.update(["what", "who", "when", "wrote", "created", "is", "a", "?", "which"])
    vocab_file = os.path.join(tmp_dir, "vocab.txt")
    with open(vocab_file, "w") as f:
        f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(words)) + "\n")
    tokenizer = RealmTokenizer(vocab=vocab_file)
    torch.manual_seed(seed)
    config = tiny_openqa_config(
        len(tokenizer),
        reader_beam_size=reader_beam_size,
        num_block_records=len(DOCS),
        # At the default 0.02 a random tiny embedder maps every text to nearly the same unit vector: retrieval
        # scores then tie to 1e-6 and their order flips with the CPU's matmul kernels. 0.5 separates them.
        initializer_range=0.5,
    )
    model = RealmForOpenQA(config).eval()
    texts = [text for _, text in DOCS]
    with torch.no_grad():
        encoded = tokenizer(texts, padding=True, return_tensors="pt")
        embeddings = model.embedder(**encoded).projected_score
    retriever = RealmRetriever.from_embeddings(
        embeddings, texts, titles=[title for title, _ in DOCS], tokenizer=tokenizer, index="Flat"
    )
    model.set_retriever(retriever)
    return model, tokenizer


def save_tiny_model(model, tokenizer, path):
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def assert_same_answers(got, expected, abs=1e-5):
    """Same answers, offsets and blocks; scores equal up to float noise."""
    got, expected = (got if isinstance(got, list) else [got]), (expected if isinstance(expected, list) else [expected])
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert (a["answer"], a["start"], a["end"]) == (b["answer"], b["start"], b["end"])
        assert a["score"] == pytest.approx(b["score"], abs=abs) and a["logit"] == pytest.approx(b["logit"], abs=abs)
        if b.get("block") is not None:
            assert a["block"]["block_id"] == b["block"]["block_id"] and a["block"]["text"] == b["block"]["text"]
            assert a["block"]["retrieval_score"] == pytest.approx(b["block"]["retrieval_score"], abs=abs)


def answers_of(model):
    return [model.answer(q) for q in QUESTIONS]


def assert_same_model_answers(got, expected):
    for a, b in zip(got, expected):
        assert a["answer"] == b["answer"]
        assert (a["start"], a["end"]) == (b["start"], b["end"])
        assert a["block"]["block_id"] == b["block"]["block_id"]
        assert a["score"] == pytest.approx(b["score"], abs=1e-5)
        assert [r["block_id"] for r in a["retrieved"]] == [r["block_id"] for r in b["retrieved"]]
        assert [r["retrieval_score"] for r in a["retrieved"]] == pytest.approx(
            [r["retrieval_score"] for r in b["retrieved"]], abs=1e-5
        )
