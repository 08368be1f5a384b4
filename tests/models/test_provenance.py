"""One provenance schema (docs/provenance.md) from every entry point: `model.answer()`, the pipeline with and without
`context`, and `realm-hf ask --json`, on a tiny saved model whose corpus has `doc_id` and a metadata column."""

import json

import pytest

import realm_hf
from realm_hf import RealmForOpenQA
from realm_hf.cli import main
from realm_hf.models.provenance import PROVENANCE_KEYS, block_provenance
from tests.support.tiny_model import DOCS, QUESTIONS, build_tiny_model, save_tiny_model

ANSWER_KEYS = {"answer", "score", "logit", "start", "end", "block"}
# Columns of this corpus beyond the schema's own: the block's span in its document and a document field.
CORPUS_COLUMNS = {"char_start", "char_end", "source"}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from realm_hf.retrieval.retriever import RealmRetriever

    tmp = tmp_path_factory.mktemp("provenance")
    model, tokenizer = build_tiny_model(str(tmp))
    documents = [
        {"title": title, "text": text, "doc_id": f"doc-{i}", "source": "fixture"}
        for i, (title, text) in enumerate(DOCS)
    ]
    model.set_retriever(
        RealmRetriever.from_documents(documents, model.embedder, tokenizer, max_block_length=48, show_progress=False)
    )
    path = save_tiny_model(model, tokenizer, tmp / "model")
    return RealmForOpenQA.from_pretrained(path).eval(), path


def ask_json(capsys, *argv):
    assert main(["-q", "ask", *map(str, argv), "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def check_block(block, answer):
    assert list(block)[: len(PROVENANCE_KEYS)] == list(PROVENANCE_KEYS)  # the schema's keys first, in order
    assert block["text"][answer["start"] : answer["end"]] == answer["answer"]
    # One name, one meaning: `score` is the answer's probability, the block's retrieval score is `retrieval_score`,
    # and its id `block_id` (no `id` / `score` aliases beside them).
    assert "score" not in block and "id" not in block


def check_corpus_block(block, answer):
    check_block(block, answer)
    assert set(block) == {*PROVENANCE_KEYS, *CORPUS_COLUMNS}
    title, text = DOCS[block["block_id"]]
    assert (block["title"], block["text"], block["doc_id"]) == (title, text, f"doc-{block['block_id']}")
    assert block["source"] == "fixture"


def assert_same(got, expected):
    assert (got["answer"], got["start"], got["end"]) == (expected["answer"], expected["start"], expected["end"])
    assert got["score"] == pytest.approx(expected["score"], abs=1e-5)
    assert got["logit"] == pytest.approx(expected["logit"], abs=1e-4)
    assert set(got["block"]) == set(expected["block"])
    for key, value in expected["block"].items():
        if isinstance(value, float):
            assert got["block"][key] == pytest.approx(value, abs=1e-4), key
        else:
            assert got["block"][key] == value, key


def test_same_schema_from_model_pipeline_and_cli(saved, capsys):
    model, path = saved
    reference = model.answer(QUESTIONS)
    piped = realm_hf.pipeline("question-answering", model=model)(QUESTIONS)
    records = ask_json(capsys, *QUESTIONS, "--model", path)
    assert len(reference) == len(piped) == len(records) == len(QUESTIONS)
    for question, from_model, from_pipeline, record in zip(QUESTIONS, reference, piped, records):
        assert set(from_model) == {"question", *ANSWER_KEYS, "retrieved"} and from_model["question"] == question
        assert set(from_pipeline) == ANSWER_KEYS
        assert set(record) == {"question", "rank", *ANSWER_KEYS} and record["question"] == question
        for answer in (from_model, from_pipeline, record):
            check_corpus_block(answer["block"], answer)
            # `score` is the span's probability, `logit` REALM's raw score, in every entry point.
            assert 0.0 < answer["score"] <= 1.0
            assert answer["logit"] > answer["block"]["retrieval_score"] - 1e3
        assert_same(from_pipeline, from_model)
        assert_same(record, from_model)
        # `retrieved` holds the read blocks in the same dicts, best first.
        retrieved = from_model["retrieved"]
        assert len(retrieved) == model.config.reader_beam_size
        assert from_model["block"] in retrieved
        scores = [block["retrieval_score"] for block in retrieved]
        assert scores == sorted(scores, reverse=True)
        assert all(set(block) == set(from_model["block"]) for block in retrieved)


def test_top_k_answers_share_the_schema(saved, capsys):
    model, path = saved
    piped = realm_hf.pipeline("question-answering", model=model)(QUESTIONS[0], top_k=3)
    records = ask_json(capsys, QUESTIONS[0], "--model", path, "--top-k", 3)
    assert [r["rank"] for r in records] == [1, 2, 3]
    for from_pipeline, record in zip(piped, records):
        check_corpus_block(from_pipeline["block"], from_pipeline)
        assert_same({k: record[k] for k in ANSWER_KEYS}, from_pipeline)
    assert sum(answer["score"] for answer in piped) <= 1.0 + 1e-6


def test_context_answers_share_the_schema(saved, capsys):
    model, path = saved
    context = "Unix was written by Ken Thompson at Bell Labs."
    piped = realm_hf.pipeline("question-answering", model=model)(question=QUESTIONS[0], context=context)
    (record,) = ask_json(capsys, QUESTIONS[0], "--context", context, "--model", path)
    for answer in (piped, record):
        assert ANSWER_KEYS <= set(answer)
        block = answer["block"]
        check_block(block, answer)
        assert set(block) == set(PROVENANCE_KEYS)  # no corpus, so no corpus columns
        assert {key: block[key] for key in PROVENANCE_KEYS} == {
            "block_id": None,
            "doc_id": None,
            "title": None,
            "text": context,
            "retrieval_score": 0.0,
        }
        assert 0.0 < answer["score"] <= 1.0
    assert_same({k: record[k] for k in ANSWER_KEYS}, piped)


def test_block_provenance():
    block = {"block_id": 7, "title": "T", "text": "x", "score": 1.5, "doc_id": "d", "lang": "en", "embeddings": [0.1]}
    record = block_provenance(block)
    assert record == {
        "block_id": 7,
        "doc_id": "d",
        "title": "T",
        "text": "x",
        "retrieval_score": 1.5,
        "lang": "en",
    }
    assert block_provenance(block, retrieval_score=2.0)["retrieval_score"] == 2.0
    # A corpus column named `id` is the corpus's own, kept as it is (no alias of block_id overwrites or adds it).
    assert block_provenance({**block, "id": "wiki-42"})["id"] == "wiki-42"
    assert block_provenance({"text": "a context"})["block_id"] is None
