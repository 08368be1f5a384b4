"""
Bad input to the public Python API, refused with a message that says what to do (reliability, round 4): metrics given
one string or a number where they take lists of strings, a single document dict read as columns, a model passed
where an embedder goes, model inputs whose shapes broadcast in silence, a part loaded from a whole model's directory,
a non-Open-QA model given to the pipeline, and question embeddings or texts of the wrong kind.
"""

import pytest
import torch
import transformers
from test_pipeline import build_tiny_model

import realm_hf
from realm_hf import RealmConfig, RealmEmbedder, RealmKnowledgeAugEncoder, RealmReader, RealmScorer
from realm_hf.metrics import answer_recall_at_k, compute_qa_metrics, exact_match_score, recall_at_k
from realm_hf.retrieval.retriever import RealmRetriever


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tiny")
    model, tokenizer = build_tiny_model(str(tmp))
    path = tmp / "model"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model, tokenizer, str(path)


def tiny_config():
    return RealmConfig(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        retriever_proj_size=16,
        span_hidden_size=16,
        max_span_width=4,
        reader_beam_size=3,
        searcher_beam_size=4,
        max_position_embeddings=64,
    )


# ---------------------------------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------------------------------


def test_answer_recall_refuses_one_text_per_question():
    # Before: each string was sliced into characters, none holding the answer: recall 0.0 in silence.
    with pytest.raises(TypeError, match="one list of block texts per question"):
        answer_recall_at_k(["Paris is the capital of France"], [["Paris"]], ks=[1])


def test_recall_reads_gold_ids_given_as_strings_tensors_or_none():
    # Before: the gold id "12" was iterated into the ids {1, 2} (recall 0.0), and a 0-d tensor failed in torch with
    # "iteration over a 0-d tensor".
    assert recall_at_k([[12]], ["12"], ks=[1]) == {"recall@1": 1.0}
    assert recall_at_k(torch.tensor([[3, 4]]), torch.tensor([4]), ks=[1, 2]) == {"recall@1": 0.0, "recall@2": 1.0}
    assert recall_at_k([[3]], [None], ks=[1]) == {"recall@1": 0.0}
    with pytest.raises(ValueError, match="gold block ids of question 0 must be integers"):
        recall_at_k([[3]], ["Paris"], ks=[1])


def test_recall_cut_offs_must_be_a_list_of_positive_integers():
    # Before: `ks=5` failed with "'int' object is not iterable"; `ks=[1.5]` was cut to 1 in silence.
    with pytest.raises(TypeError, match=r"list of cut-offs such as \[1, 5, 10\]"):
        recall_at_k([[3]], [3], ks=5)
    with pytest.raises(ValueError, match="positive integers"):
        recall_at_k([[3]], [3], ks=[1.5])


@pytest.mark.parametrize(
    "predictions, references, error, message",
    [
        # Before: AttributeError: 'int' object has no attribute 'lower' (numeric answers from JSON).
        ([1984], [["1984"]], TypeError, "The prediction must be a string, got int 1984"),
        (["1984"], [[1984]], TypeError, "A gold answer must be a string, got int 1984"),
        (["1984"], [None], TypeError, "A gold answer must be a string, got NoneType"),
        # Before: one string of length 2 scored as two predictions "a" and "b" in silence.
        ("ab", ["a", "b"], TypeError, "`predictions` must be a list"),
    ],
)
def test_qa_metrics_refuse_answers_that_are_not_text(predictions, references, error, message):
    with pytest.raises(error, match=message):
        compute_qa_metrics(predictions, references)


def test_exact_match_names_a_missing_prediction():
    with pytest.raises(TypeError, match="The prediction must be a string, got NoneType"):
        exact_match_score(None, ["x"])


# ---------------------------------------------------------------------------------------------------------------------
# Building and changing a corpus
# ---------------------------------------------------------------------------------------------------------------------


def test_one_document_dict_is_not_read_as_columns(tiny):
    model, tokenizer, _ = tiny
    retriever = RealmRetriever.from_embeddings(
        torch.randn(2, 16), ["unix is a system", "lisp is a language"], tokenizer=tokenizer
    )
    # Before: {"text": "hello there"} was a dict of columns: one document per character, 10 blocks added.
    with pytest.raises(TypeError, match=r"For one document pass a list of dicts"):
        retriever.add_documents({"text": "unix was written"}, model.embedder, show_progress=False)
    # Before: columns of different lengths were cut to the shortest by zip: one of two documents indexed.
    with pytest.raises(ValueError, match="different lengths"):
        retriever.add_documents({"text": ["unix", "lisp"], "title": ["Unix"]}, model.embedder, show_progress=False)
    with pytest.raises(TypeError, match="`documents` must be a list of dicts"):
        retriever.add_documents(None, model.embedder, show_progress=False)
    assert len(retriever) == 2


def test_a_model_given_as_the_embedder_is_named(tiny):
    model, tokenizer, _ = tiny
    documents = [{"title": "Unix", "text": "Unix was written by Ken Thompson."}]
    # Before: "'RealmReaderOutput' object has no attribute 'float'" from inside the embedding loop.
    with pytest.raises(TypeError, match=r"pass `model.index_embedder`"):
        RealmRetriever.from_documents(documents, model, tokenizer, show_progress=False)
    # Before: the reader's own "You have to specify `relevance_score`".
    with pytest.raises(TypeError, match="A RealmReader does not embed blocks"):
        RealmRetriever.from_documents(documents, model.reader, tokenizer, show_progress=False)
    # Before: FAISS's "too many values to unpack (expected 2)" on BERT's per-token output.
    bert = transformers.BertModel(
        transformers.BertConfig(
            vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37
        )
    )
    with pytest.raises(TypeError, match=r"BertModel does not embed blocks.*realm_hf.init_from_bert"):
        RealmRetriever.from_documents(documents, bert, tokenizer, show_progress=False)
    # Before: AttributeError: 'NoneType' object has no attribute 'state_dict'.
    with pytest.raises(TypeError, match="The embedder must be a `RealmEmbedder`"):
        model.retriever.add_documents(documents, None, show_progress=False)


# ---------------------------------------------------------------------------------------------------------------------
# Searching
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [None, b"who wrote unix?"])
def test_search_names_question_embeddings_that_are_no_numbers(tiny, bad):
    # Before: None became a NaN vector, refused as "the question embedder's weights have diverged"; bytes failed
    # with numpy's "could not convert string to float" (a string is a question text, embedded: tests/test_search_api.py).
    with pytest.raises(TypeError, match="the query embedder's `projected_score`"):
        tiny[0].retriever.search(bad, k=2)


def test_hybrid_search_refuses_question_texts_of_the_wrong_kind(tiny):
    hybrid = tiny[0].retriever.use_bm25()
    queries = torch.randn(2, 16)
    # Before: "ab" was two questions, "a" and "b", searched in silence.
    with pytest.raises(TypeError, match="not one string"):
        hybrid.search(queries, k=2, questions="ab")
    # Before: AttributeError: 'NoneType' object has no attribute 'lower', inside bm25s.
    with pytest.raises(TypeError, match="Question text 0 is a NoneType"):
        hybrid.search(queries, k=2, questions=[None, "lisp"])


# ---------------------------------------------------------------------------------------------------------------------
# Model inputs
# ---------------------------------------------------------------------------------------------------------------------


def reader_inputs():
    torch.manual_seed(0)
    return torch.randint(5, 50, (2, 3, 12)), torch.ones(2, 4, 12, dtype=torch.bool), torch.randn(2, 4)


def test_reader_refuses_inputs_that_broadcast_in_silence():
    reader = RealmReader(tiny_config()).eval()
    ids, block_mask, scores = reader_inputs()
    # Before: one score per question was added to all three of its blocks; a batch of one to both questions.
    with pytest.raises(ValueError, match=r"`relevance_score` has shape \(2, 1\), expected \(2, >= 3\)"):
        reader(input_ids=ids, relevance_score=scores[:, :1], block_mask=block_mask)
    with pytest.raises(ValueError, match=r"`relevance_score` has shape \(1, 4\)"):
        reader(input_ids=ids, relevance_score=scores[:1], block_mask=block_mask)
    # Before: an attention mask shorter than the inputs was read as it was.
    with pytest.raises(ValueError, match=r"`attention_mask` has shape \(2, 3, 10\), expected \(2, 3, 12\)"):
        reader(input_ids=ids, attention_mask=torch.ones(2, 3, 10), relevance_score=scores, block_mask=block_mask)
    # Before: torch's "The size of tensor a (6) must match the size of tensor b (5)".
    with pytest.raises(ValueError, match=r"`block_mask` has shape \(2, 4, 10\)"):
        reader(input_ids=ids, relevance_score=scores, block_mask=block_mask[..., :10])
    # Before: "not enough values to unpack (expected 3, got 1)".
    with pytest.raises(ValueError, match=r"`input_ids` has shape \(12,\)"):
        reader(input_ids=ids[0, 0], relevance_score=scores[0], block_mask=block_mask[0])
    assert reader(input_ids=ids, relevance_score=scores, block_mask=block_mask).block_idx.shape == (2,)


def test_embedder_and_scorer_name_wrong_token_inputs():
    config = tiny_config()
    embedder, scorer = RealmEmbedder(config).eval(), RealmScorer(config).eval()
    ids = torch.randint(5, 50, (2, 3, 12))
    # Before: BERT's "not enough values to unpack", torch's "Expected tensor for argument #1 'indices'", and "The
    # expanded size of the tensor (100) must match the existing size (64)".
    with pytest.raises(ValueError, match=r"`input_ids` has shape \(12,\).*input_ids\[None\]"):
        embedder(input_ids=ids[0, 0])
    with pytest.raises(TypeError, match="must hold integer wordpiece ids"):
        embedder(input_ids=ids[0].float())
    with pytest.raises(ValueError, match="more than the model's max_position_embeddings=64"):
        embedder(input_ids=torch.randint(5, 50, (1, 100)))
    # Before: one query's candidates scored against every query of the batch in silence.
    with pytest.raises(ValueError, match=r"`candidate_input_ids` has shape \(1, 3, 12\), expected \(2, any, any\)"):
        scorer(input_ids=ids[:, 0], candidate_input_ids=ids[:1])


def test_knowledge_augmented_encoder_checks_its_loss_inputs():
    encoder = RealmKnowledgeAugEncoder(tiny_config()).eval()
    ids = torch.randint(5, 50, (2, 3, 12))
    labels = torch.randint(5, 50, (2, 12))
    # Before: a 1-D relevance score broadcast over the batch in silence.
    with pytest.raises(ValueError, match=r"`relevance_score` has shape \(3,\), expected \(2, 3\)"):
        encoder(input_ids=ids, relevance_score=torch.randn(3), labels=labels)
    # Before: torch's "Expected input batch_size (72) to match target batch_size (78)".
    with pytest.raises(ValueError, match=r"`labels` has shape \(2, 13\), expected \(2, 12\)"):
        encoder(input_ids=ids, relevance_score=torch.randn(2, 3), labels=torch.randint(5, 50, (2, 13)))
    assert encoder(input_ids=ids, relevance_score=torch.randn(2, 3), labels=labels).loss.isfinite()


# ---------------------------------------------------------------------------------------------------------------------
# Loading and the pipeline
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("part, attribute", [(RealmReader, "reader"), (RealmEmbedder, "embedder")])
def test_a_part_of_an_openqa_directory_is_not_loaded_random(tiny, part, attribute):
    # Before: every weight MISSING, a randomly initialised part returned with only a load report.
    with pytest.raises(ValueError, match=rf"RealmForOpenQA.from_pretrained\(path\)\.{attribute}`"):
        part.from_pretrained(tiny[2])


def test_pipeline_names_a_realm_model_that_cannot_answer(tiny):
    model, tokenizer, _ = tiny
    # Before: transformers' "The task question-answering has been removed from transformers".
    with pytest.raises(ValueError, match="got a RealmReader"):
        realm_hf.pipeline("question-answering", model=model.reader, tokenizer=tokenizer)


@pytest.mark.parametrize(
    "options, message",
    [
        # Before: numpy's "negative dimensions are not allowed" after the corpus was embedded.
        ({"train_size": -1}, "`train_size` must be a positive integer"),
        # Before: "'<' not supported between instances of 'str' and 'int'" inside the block splitter.
        ({"max_block_length": "64"}, "`max_block_length` must be an integer of at least 8"),
        ({"batch_size": 0}, "`batch_size` must be a positive integer"),
        ({"index": ""}, "`index` must be a FAISS factory string"),
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
    with pytest.raises(IndexFactoryError, match="Invalid FAISS index factory string 'Nonsense'"):
        RealmRetriever.from_documents(
            [{"text": "Unix was written at Bell Labs."}], model.embedder, tokenizer, index="Nonsense"
        )
