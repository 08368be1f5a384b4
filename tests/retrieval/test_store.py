"""Answering from several threads while the index is swapped and documents are added and removed.

Every answer must come from one state of the corpus and index: its retrieved block ids, texts and retrieval scores
must be exactly the top blocks of one known state. The states are distinguishable by construction: the corpus is
embedded by one of two embedders (A, or B: A with noise added to its weights, a "perturbed" refresh) and holds the
six base documents with or without one extra document, so four states, each with its own ranking and scores.
"""

import copy
import functools
import sys
import threading
import time

import pytest
import torch

import realm_hf
from realm_hf.retrieval.encoding import embed_blocks
from realm_hf.retrieval.refresh import embed_corpus
from tests.support.tiny_model import DOCS, QUESTIONS, build_tiny_model

EXTRA = {"title": "Fortran", "text": "Fortran is a programming language created by John Backus at IBM."}
READS_PER_THREAD = 12


def _perturbed(embedder, scale=0.5, seed=1):
    other = copy.deepcopy(embedder)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale)
    return other


def _expected_rankings(model, retriever, embedders, k):
    """For each question, each embedder and each block set: the top-k (text, score) list a consistent search gives."""
    titles = [title for title, _ in DOCS] + [EXTRA["title"]]
    texts = [text for _, text in DOCS] + [EXTRA["text"]]
    tokenizer = retriever.tokenizer
    with torch.no_grad():
        encoded = tokenizer(QUESTIONS, padding=True, return_tensors="pt")
        questions = model.embed_questions(**encoded)
    expected = {}
    for embedder in embedders.values():
        blocks = embed_blocks(
            embedder, tokenizer, titles, texts, show_progress=False, max_length=retriever.max_block_length
        )
        scores = questions @ blocks.T  # [question, block]
        for with_extra in (False, True):
            n = len(texts) if with_extra else len(DOCS)
            for q, question in enumerate(QUESTIONS):
                top = torch.topk(scores[q, :n], k)
                expected.setdefault(question, []).append(
                    [(texts[i], float(s)) for i, s in zip(top.indices.tolist(), top.values.tolist())]
                )
    return expected


def _matches(retrieved, candidates):
    """Whether `retrieved` ((text, score) pairs, best first) is exactly one candidate state's top blocks."""
    for candidate in candidates:
        if [text for text, _ in retrieved] == [text for text, _ in candidate] and all(
            abs(score - expected) < 1e-3 for (_, score), (_, expected) in zip(retrieved, candidate)
        ):
            return True
    return False


def _block_is_real(block, extra_ids):
    """The block's id, title and text belong together (a base block, or the extra document under its current id)."""
    if block["block_id"] < len(DOCS):
        return (block["title"], block["text"]) == DOCS[block["block_id"]]
    return block["block_id"] in extra_ids and (block["title"], block["text"]) == (EXTRA["title"], EXTRA["text"])


def test_answers_come_from_one_index_state_while_the_index_changes(tmp_path):
    model, _ = build_tiny_model(str(tmp_path), reader_beam_size=3)
    retriever = model.retriever
    embedders = {"A": model.embedder, "B": _perturbed(model.embedder)}
    embed_corpus(retriever, embedders["A"], show_progress=False)  # stored vectors = embedder A over (title, text)
    expected = _expected_rankings(model, retriever, embedders, k=3)
    qa = realm_hf.pipeline("question-answering", model=model)
    extra_ids, errors, answers, swaps, stop = set(), [], [], [], threading.Event()

    titles = [title for title, _ in DOCS] + [EXTRA["title"]]
    texts = [text for _, text in DOCS] + [EXTRA["text"]]
    vectors = {
        name: embed_blocks(embedder, retriever.tokenizer, titles, texts, show_progress=False)
        for name, embedder in embedders.items()
    }

    def swap(name):
        # A refresh as the re-index callback installs it: a new index built beside the live one, swapped in.
        rows = [min(int(block_id), len(DOCS)) for block_id in retriever.store.block_ids]  # the extra document is row 6
        retriever.swap_index_state(retriever.store.with_embeddings(vectors[name][rows]))

    def write():
        # Swap between the two embedders' indexes many times, with the extra document added and removed in between.
        current = "A"
        try:
            while not stop.is_set():
                for _ in range(4):
                    current = "B" if current == "A" else "A"
                    swap(current)
                    swaps.append(current)
                added = retriever.add_documents([EXTRA], embedders[current], show_progress=False)
                extra_ids.update(added)
                for _ in range(4):
                    current = "B" if current == "A" else "A"
                    swap(current)
                retriever.remove_documents(block_ids=added)
        except Exception as error:  # noqa: BLE001 - reported by the test
            errors.append(("writer", repr(error)))

    def read_model():
        try:
            for i in range(READS_PER_THREAD):
                questions = QUESTIONS if i % 2 else QUESTIONS[i % len(QUESTIONS)]
                result = model.answer(questions)
                answers.extend(("answer", r) for r in (result if isinstance(result, list) else [result]))
        except Exception as error:  # noqa: BLE001
            errors.append(("answer", repr(error)))

    def read_pipeline():
        try:
            for i in range(READS_PER_THREAD):
                result = qa(QUESTIONS, top_k=2, batch_size=2 if i % 2 else 3)
                answers.extend(("pipeline", {"question": q, "answers": a}) for q, a in zip(QUESTIONS, result))
        except Exception as error:  # noqa: BLE001
            errors.append(("pipeline", repr(error)))

    # Widen the race window a search leaves open (a few ms after it returns, before the caller uses its result),
    # so that a caller that looks anything up in a second step sees the writer's changes in a few seconds of
    # running, not once in hours; `wraps` keeps the signature the model inspects.
    search = retriever.search

    @functools.wraps(search)
    def slow_search(*args, **kwargs):
        result = search(*args, **kwargs)
        time.sleep(0.003)
        return result

    retriever.search = slow_search
    writer = threading.Thread(target=write)
    readers = [threading.Thread(target=read_model) for _ in range(2)] + [threading.Thread(target=read_pipeline)]
    # Switch threads every 20 µs instead of every 5 ms: many more interleavings in a few seconds.
    previous = sys.getswitchinterval()
    sys.setswitchinterval(2e-5)
    try:
        writer.start()
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(timeout=60)
    finally:
        stop.set()
        writer.join(timeout=60)
        sys.setswitchinterval(previous)

    assert not errors, errors
    assert len(swaps) >= 8  # the index really changed while the readers ran
    assert len(answers) == 2 * (READS_PER_THREAD // 2) * (1 + len(QUESTIONS)) + READS_PER_THREAD * len(QUESTIONS)
    mixed = []
    for source, record in answers:
        candidates = expected[record["question"]]
        if source == "answer":
            retrieved = [(block["text"], block["retrieval_score"]) for block in record["retrieved"]]
            blocks = record["retrieved"]
            consistent = _matches(retrieved, candidates)
        else:
            # The pipeline returns the answers' blocks: each must be one of the top blocks of one state, with
            # that state's score, the same state for every answer of the question.
            blocks = [answer["block"] for answer in record["answers"]]
            consistent = any(
                all(
                    any(
                        block["text"] == text and abs(block["retrieval_score"] - score) < 1e-3
                        for text, score in candidate
                    )
                    for block in blocks
                )
                for candidate in candidates
            )
        consistent = consistent and all(_block_is_real(block, extra_ids) for block in blocks)
        if not consistent:
            mixed.append((source, record["question"], [(b["block_id"], b["retrieval_score"]) for b in blocks]))
    assert not mixed, f"{len(mixed)} of {len(answers)} answers mix index states: {mixed[:3]}"


@pytest.mark.parametrize("entry", ["answer", "pipeline"])
def test_concurrent_answers_of_a_model_left_in_training_mode_stay_in_eval_mode(tmp_path, entry):
    model, _ = build_tiny_model(str(tmp_path), reader_beam_size=3)
    reference = model.answer(QUESTIONS)
    model.train()  # e.g. right after trainer.train(); dropout on (p=0.1) would change every logit
    qa = realm_hf.pipeline("question-answering", model=model)
    errors, results = [], []

    def read():
        try:
            for _ in range(6):
                if entry == "answer":
                    results.append(model.answer(QUESTIONS))
                else:
                    results.append([{"answer": a["answer"], "logit": a["logit"]} for a in qa(QUESTIONS)])
        except Exception as error:  # noqa: BLE001
            errors.append(repr(error))

    threads = [threading.Thread(target=read) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert model.training  # the mode it was left in comes back when the last call ends
    for result in results:
        for got, want in zip(result, reference):
            assert got["answer"] == want["answer"] and got["logit"] == pytest.approx(want["logit"], abs=1e-3)
