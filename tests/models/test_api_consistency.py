"""One API across the REALM classes: weights without the corpus, a public `require_retriever`, `num_blocks` as a
forward argument, reader pairs in the model output (tokenized once per pipeline call), and `query_embedder` /
`document_embedder` with one meaning on every class."""

import copy
import re

import pytest
import torch

import realm_hf
from realm_hf import RealmEmbedder, RealmForOpenQA, RealmForPreTraining, RealmScorer
from realm_hf.models.modeling_ict import RealmForInverseClozeTask
from realm_hf.training.lora import lora_target_regex
from tests.support.tiny_model import QUESTIONS


def _encode(tokenizer, questions):
    return tokenizer(questions, padding=True, return_tensors="pt")


# ------------------------------------------------------------------------------------------------------------------
# Loading without the corpus
# ------------------------------------------------------------------------------------------------------------------


def test_from_pretrained_without_retriever_loads_the_weights_alone(tiny, monkeypatch):
    import realm_hf.models.retriever_owner as retriever_owner

    def no_corpus(*args, **kwargs):
        raise AssertionError("load_retriever=False must not look for a corpus")

    monkeypatch.setattr(retriever_owner, "load_checkpoint_retriever", no_corpus)
    model = RealmForOpenQA.from_pretrained(tiny[2], load_retriever=False)
    assert model.retriever is None
    expected = tiny[0].state_dict()
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0)
    # A retriever passed explicitly is still attached.
    with_corpus = RealmForOpenQA.from_pretrained(tiny[2], load_retriever=False, retriever=tiny[0].retriever)
    assert with_corpus.retriever is tiny[0].retriever


def test_pretraining_from_pretrained_without_retriever(tiny, tmp_path):
    model = tiny[0]
    pretraining = RealmForPreTraining(model.config, retriever=model.retriever)
    pretraining.save_pretrained(tmp_path / "pretraining")
    assert RealmForPreTraining.from_pretrained(tmp_path / "pretraining").retriever is not None
    assert RealmForPreTraining.from_pretrained(tmp_path / "pretraining", load_retriever=False).retriever is None


def test_require_retriever_is_public(tiny):
    model = tiny[0]
    assert model.require_retriever() is model.retriever
    assert not hasattr(model, "_require_retriever")  # the never-released private name is gone
    bare = RealmForOpenQA(model.config)
    with pytest.raises(ValueError, match="no retriever"):
        bare.require_retriever()
    pretraining = RealmForPreTraining(model.config)
    with pytest.raises(ValueError, match="no retriever"):
        pretraining.require_retriever()
    pretraining.set_retriever(model.retriever)
    assert pretraining.require_retriever() is model.retriever


# ------------------------------------------------------------------------------------------------------------------
# num_blocks per call
# ------------------------------------------------------------------------------------------------------------------


def test_forward_num_blocks_is_a_call_argument(tiny):
    model, tokenizer = tiny[0], tiny[1]
    config_before = model.config.to_dict()
    seen = []
    hook = model.reader.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(model.config.reader_beam_size), with_kwargs=True
    )
    try:
        with torch.no_grad():
            out = model(**_encode(tokenizer, QUESTIONS), questions=QUESTIONS, num_blocks=5)
            default = model(**_encode(tokenizer, QUESTIONS), questions=QUESTIONS)
    finally:
        hook.remove()
    assert seen == [3, 3]  # the config is never changed, not even during the call
    assert model.config.to_dict() == config_before
    assert out.retrieved_block_ids.shape == (3, 5) and out.reader_output.reader_logits.shape[1] == 5
    assert default.retrieved_block_ids.shape == (3, 3)
    # The top blocks are the same search, just deeper.
    assert out.retrieved_block_ids[:, :3].tolist() == default.retrieved_block_ids.tolist()
    with pytest.raises(ValueError, match="num_blocks"):
        model(**_encode(tokenizer, QUESTIONS[:1]), num_blocks=0)


def test_answer_num_blocks(tiny):
    model = tiny[0]
    assert len(model.answer(QUESTIONS[0], num_blocks=5)["retrieved"]) == 5
    assert len(model.answer(QUESTIONS[0])["retrieved"]) == model.config.reader_beam_size == 3


# ------------------------------------------------------------------------------------------------------------------
# The reader pairs travel in the output: one tokenization per pair
# ------------------------------------------------------------------------------------------------------------------


def test_output_carries_the_reader_pairs(tiny):
    model, tokenizer = tiny[0], tiny[1]
    with torch.no_grad():
        out = model(**_encode(tokenizer, QUESTIONS), questions=QUESTIONS)
    num_read = out.reader_output.reader_logits.shape[1]
    assert out.reader_input_ids.shape[:2] == (len(QUESTIONS), num_read)
    assert out.reader_offset_mapping.shape == (*out.reader_input_ids.shape, 2)
    for b in range(len(QUESTIONS)):
        row = int(out.reader_output.block_idx[b])
        start, end = int(out.reader_output.start_pos[b]), int(out.reader_output.end_pos[b])
        offsets = out.reader_offset_mapping[b, row]
        text = out.retrieved_blocks[b][row]["text"]
        assert text[int(offsets[start, 0]) : int(offsets[end, 1])] == out.predicted_answers[b]


def test_pipeline_tokenizes_each_question_block_pair_once(tiny, monkeypatch):
    model, tokenizer = tiny[0], tiny[1]
    qa = realm_hf.pipeline("question-answering", model=model)
    pairs = []
    tokenizer_class = type(tokenizer)
    original_call = tokenizer_class.__call__

    def counting_call(self, text=None, text_pair=None, *args, **kwargs):
        if text_pair is not None:
            pairs.extend(zip(text, text_pair) if isinstance(text_pair, list) else [(text, text_pair)])
        return original_call(self, text, text_pair, *args, **kwargs)

    monkeypatch.setattr(tokenizer_class, "__call__", counting_call)
    answers = qa(QUESTIONS, num_blocks=4, top_k=3, batch_size=len(QUESTIONS))
    assert len(answers) == len(QUESTIONS)
    # Every (question, block) pair read: 3 questions x 4 blocks, each tokenized exactly once.
    assert len(pairs) == len(QUESTIONS) * 4
    assert len(set(pairs)) == len(pairs)


# ------------------------------------------------------------------------------------------------------------------
# query_embedder / document_embedder
# ------------------------------------------------------------------------------------------------------------------


def _with(config, **changes):
    config = copy.deepcopy(config)
    for name, value in changes.items():
        setattr(config, name, value)
    return config


def _embed(embedder, tokenizer, texts):
    with torch.no_grad():
        return embedder(**tokenizer(texts, padding=True, return_tensors="pt")).projected_score


def test_embedder_names_mean_the_same_on_every_class(tiny):
    model, tokenizer = tiny[0], tiny[1]
    config = model.config
    # RealmForOpenQA: `embedder` is the question embedder; the index was embedded outside the model.
    assert model.query_embedder is model.embedder and model.document_embedder is None
    end_to_end = RealmForOpenQA(_with(config))  # add_document_embedder sets a config field
    document = end_to_end.add_document_embedder()
    assert end_to_end.document_embedder is document and end_to_end.query_embedder is end_to_end.embedder

    # RealmScorer: candidates through `document_embedder`, inputs through `query_embedder`.
    scorer = RealmScorer(config, query_embedder=RealmEmbedder(config)).eval()
    assert scorer.document_embedder is scorer.embedder and scorer.query_embedder is not scorer.embedder
    candidates = tokenizer.batch_encode_candidates([["unix is old", "lisp is old"]], max_length=8, return_tensors="pt")
    with torch.no_grad():
        out = scorer(
            **_encode(tokenizer, [QUESTIONS[0]]),
            candidate_input_ids=candidates["input_ids"],
            candidate_attention_mask=candidates["attention_mask"],
            candidate_token_type_ids=candidates["token_type_ids"],
        )
    torch.testing.assert_close(out.query_score, _embed(scorer.query_embedder, tokenizer, [QUESTIONS[0]]))
    with torch.no_grad():
        expected = scorer.document_embedder(
            input_ids=candidates["input_ids"][0],
            attention_mask=candidates["attention_mask"][0],
            token_type_ids=candidates["token_type_ids"][0],
        ).projected_score
    torch.testing.assert_close(out.candidate_score[0], expected)
    shared = RealmScorer(config)
    assert shared.query_embedder is shared.document_embedder is shared.embedder

    # Pre-training and ICT: `embedder` is the document embedder; the query embedder may be separate.
    for cls in (RealmForPreTraining, RealmForInverseClozeTask):
        separate = cls(_with(config, share_query_document_embedder=False))
        assert separate.document_embedder is separate.embedder
        assert isinstance(separate.query_embedder, RealmEmbedder) and separate.query_embedder is not separate.embedder
        legacy_layout = cls(_with(config, share_query_document_embedder=True))
        assert legacy_layout.query_embedder is legacy_layout.document_embedder is legacy_layout.embedder


def test_aliases_add_no_state_dict_keys(tiny):
    # The legacy checkpoint layout is unchanged: the new names are views, not new weights.
    keys = tiny[0].state_dict().keys()
    assert not any(k.startswith(("query_embedder.", "document_embedder.")) for k in keys)
    assert any(k.startswith("embedder.") for k in keys)
    scorer_keys = RealmScorer(tiny[0].config).state_dict().keys()
    assert not any(k.startswith(("query_embedder.", "document_embedder.")) for k in scorer_keys)


def test_lora_targets_follow_the_shared_names(tiny):
    config = tiny[0].config
    separate = _with(config, share_query_document_embedder=False)
    pretraining, ict = RealmForPreTraining(separate), RealmForInverseClozeTask(separate)
    end_to_end = RealmForOpenQA(_with(config))  # add_document_embedder sets a config field
    end_to_end.add_document_embedder()
    expected = {
        # (model, component) -> submodule path the weights carry
        (end_to_end, "query_embedder"): "embedder",
        (end_to_end, "document_embedder"): "document_embedder",
        (RealmScorer(config), "query_embedder"): "embedder",
        (RealmScorer(config), "document_embedder"): "embedder",
        (pretraining, "query_embedder"): "query_embedder",
        (pretraining, "document_embedder"): "embedder",
        (pretraining, "encoder"): "encoder",
        (ict, "query_embedder"): "query_embedder",
        (ict, "document_embedder"): "embedder",
    }
    for (model, component), path in expected.items():
        pattern = lora_target_regex(model, (component,))
        matched = {name.split(".realm.")[0] for name, _ in model.named_modules() if re.fullmatch(pattern, name)}
        assert matched == {path}, (type(model).__name__, component, matched)
    with pytest.raises(ValueError, match="is not set"):
        lora_target_regex(RealmForOpenQA(config), ("document_embedder",))
    with pytest.raises(ValueError, match="no component 'reader'"):
        lora_target_regex(ict, ("reader",))


# ------------------------------------------------------------------------------------------------------------------
# One answer path; one notion of the embedder that fills the index
# ------------------------------------------------------------------------------------------------------------------


def test_answer_pipeline_and_forward_cut_span_text_in_one_place(tiny, monkeypatch):
    """`answer()` and the pipeline each cut span text from offsets; now `openqa_answers.span_text` does."""
    from realm_hf.models import openqa_answers

    model, tokenizer = tiny[0], tiny[1]
    qa = realm_hf.pipeline("question-answering", model=model)
    cut = []
    original = openqa_answers.span_text

    def recording(*args, **kwargs):
        cut.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(openqa_answers, "span_text", recording)
    calls = {
        "answer()": lambda: model.answer(QUESTIONS[0]),
        "answer(top_k=2)": lambda: model.answer(QUESTIONS[0], top_k=2),
        "pipeline": lambda: qa(QUESTIONS[0]),
        "pipeline(top_k=2)": lambda: qa(QUESTIONS[0], top_k=2),
        "pipeline(context=...)": lambda: qa(QUESTIONS[0], context="Donald Knuth wrote the book."),
        "forward": lambda: model(**_encode(tokenizer, QUESTIONS[:1]), questions=QUESTIONS[:1]),
    }
    for name, call in calls.items():
        cut.clear()
        with torch.no_grad():
            call()
        assert cut, f"{name} did not cut its answer text through openqa_answers.span_text"
    # And the one path gives one answer: answer() is the pipeline's best answer, with the read blocks.
    for question in QUESTIONS:
        answer, piped = model.answer(question), qa(question)
        assert {k: answer[k] for k in piped if k != "block"} == {k: v for k, v in piped.items() if k != "block"}
        assert answer["block"] == piped["block"]
        assert model.answer(question, top_k=3) == [
            {"question": question, **a, "retrieved": answer["retrieved"]} for a in qa(question, top_k=3)
        ]


def test_index_embedder_is_the_embedder_that_fills_the_index(tiny):
    from realm_hf.training.callbacks import document_embedder_of
    from realm_hf.training.recipes import set_document_embedder_trainable

    model = RealmForOpenQA(copy.deepcopy(tiny[0].config))
    # Open-QA without a document embedder of its own: the index is re-embedded with the question embedder.
    assert model.document_embedder is None and model.index_embedder is model.query_embedder is model.embedder
    assert document_embedder_of(model) is model.index_embedder
    assert set_document_embedder_trainable(model, True) is model.document_embedder is model.index_embedder
    assert model.index_embedder is not model.query_embedder
    pretraining = RealmForPreTraining(model.config)
    assert pretraining.index_embedder is pretraining.document_embedder is pretraining.embedder
    assert document_embedder_of(pretraining) is pretraining.embedder
    ict = RealmForInverseClozeTask(model.config)
    assert ict.index_embedder is ict.embedder
