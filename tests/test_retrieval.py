"""RealmRetriever: splitting, embedding, exact/approximate search, save/load, manifest checks, updates, legacy."""

import json
import logging
import os
import warnings

import faiss
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import BertConfig, BertModel, BertTokenizer

from realm_hf.constants import FORMAT_VERSION, INDEX_NAME, MANIFEST_NAME
from realm_hf.retrieval import faiss_ops
from realm_hf.retrieval.chunking import block_spans, split_documents
from realm_hf.retrieval.conversion import convert_legacy_checkpoint
from realm_hf.retrieval.encoding import embed_blocks, fingerprint_module
from realm_hf.retrieval.legacy import legacy_retriever_call
from realm_hf.retrieval.refresh import embed_corpus, is_stale
from realm_hf.retrieval.retriever import RealmRetriever

HERE = os.path.dirname(__file__)
CORPUS_DIR = os.path.join(HERE, "fixtures", "corpus")
LEGACY_OPENQA = os.path.join(HERE, "fixtures", "legacy", "openqa")
MAX_BLOCK_LENGTH = 48
PROJ = 16


class TinyEmbedder(nn.Module):
    """The RealmEmbedder interface: BERT [CLS] pooler output -> dense -> LayerNorm, as `projected_score`."""

    def __init__(self, vocab_size, seed=0, proj=PROJ):
        super().__init__()
        torch.manual_seed(seed)
        self.config = BertConfig(
            vocab_size=vocab_size,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=37,
            max_position_embeddings=128,
            # BERT's default 0.02 makes an untrained encoder map every text to nearly the same vector.
            initializer_range=0.3,
        )
        self.config.retriever_proj_size = proj
        self.bert = BertModel(self.config)
        self.dense = nn.Linear(32, proj)
        self.norm = nn.LayerNorm(proj)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        pooled = self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).pooler_output
        return type("Out", (), {"projected_score": self.norm(self.dense(pooled))})()


@pytest.fixture(scope="module")
def tokenizer():
    return BertTokenizer(vocab=os.path.join(CORPUS_DIR, "vocab.txt"))


@pytest.fixture(scope="module")
def documents():
    with open(os.path.join(CORPUS_DIR, "documents.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def embedder(tokenizer):
    return TinyEmbedder(len(tokenizer)).eval()


@pytest.fixture(scope="module")
def retriever(documents, embedder, tokenizer):
    return RealmRetriever.from_documents(
        documents, embedder, tokenizer, max_block_length=MAX_BLOCK_LENGTH, batch_size=8, show_progress=False
    )


def embed_questions(embedder, tokenizer, questions):
    with torch.no_grad():
        return embedder(**tokenizer(questions, padding=True, return_tensors="pt")).projected_score


def brute_force(queries, matrix, k):
    scores = queries @ matrix.T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(scores, order, axis=1)


def structured_vectors(n, dim, seed=0, clusters=40):
    """Clustered vectors (shared cluster centres, per-seed samples), LayerNorm-like normalised as REALM's are."""
    centers = np.random.default_rng(1234).normal(size=(clusters, dim)).astype(np.float32)
    rng = np.random.default_rng(seed)
    x = centers[rng.integers(0, clusters, n)] + 0.35 * rng.normal(size=(n, dim)).astype(np.float32)
    x = (x - x.mean(1, keepdims=True)) / x.std(1, keepdims=True)
    return x.astype(np.float32)


# ------------------------------------------------------------------------------------------------------------------
# Splitting and embedding
# ------------------------------------------------------------------------------------------------------------------


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


def test_empty_and_malformed_documents(embedder, tokenizer):
    with pytest.raises(ValueError, match="empty"):
        RealmRetriever.from_documents([], embedder, tokenizer, show_progress=False)
    with pytest.raises(ValueError, match="empty"):
        RealmRetriever.from_documents([{"title": "x", "text": "   "}], embedder, tokenizer, show_progress=False)
    with pytest.raises(KeyError, match="'text'"):
        RealmRetriever.from_documents([{"title": "x", "body": "y"}], embedder, tokenizer, show_progress=False)
    with pytest.raises(ValueError, match="empty"):
        RealmRetriever.from_embeddings(np.zeros((0, 4), np.float32), [])


# ------------------------------------------------------------------------------------------------------------------
# Search
# ------------------------------------------------------------------------------------------------------------------


def test_flat_search_is_exact(retriever, embedder, tokenizer):
    questions = ["when was port estrel founded?", "who designed quillon?", "what is the ferrow ibex?", "drum memory"]
    queries = embed_questions(embedder, tokenizer, questions)
    out = retriever.search(queries.requires_grad_(), k=5)
    stored = retriever.store.embeddings(torch.as_tensor(retriever.store.block_ids)).numpy()
    expected_rows, expected_scores = brute_force(queries.detach().numpy(), stored, 5)
    assert out.block_ids.dtype == torch.int64 and out.block_ids.shape == (4, 5)
    assert out.block_ids.tolist() == retriever.store.block_ids[expected_rows].tolist()  # recall 1.0, same order
    np.testing.assert_allclose(out.scores.numpy(), expected_scores, rtol=1e-5, atol=1e-5)
    assert torch.all(out.scores[:, :-1] >= out.scores[:, 1:])
    # The stored vectors are what the model re-scores with: question . block reproduces the scores.
    rescored = torch.einsum("bd,bkd->bk", queries.detach(), retriever.store.embeddings(out.block_ids))
    torch.testing.assert_close(rescored, out.scores, atol=1e-5, rtol=1e-5)
    block = out.blocks[1][0]
    assert {"block_id", "title", "text", "score", "doc_id"} <= set(block)
    assert block["block_id"] == int(out.block_ids[1, 0]) and block["score"] == pytest.approx(float(out.scores[1, 0]))
    assert retriever.store.texts(out.block_ids)[1][0] == block["text"]
    # One question, numpy input.
    single = retriever.search(queries[0].detach().numpy(), k=3)
    assert single.block_ids.tolist() == [out.block_ids[0, :3].tolist()]


def test_search_argument_errors(retriever):
    with pytest.raises(ValueError, match=f"larger than the number of blocks in the corpus \\({len(retriever)}\\)"):
        retriever.search(np.zeros((1, PROJ), np.float32), k=len(retriever) + 1)
    with pytest.raises(ValueError, match=f"embedder of projection size {PROJ}"):
        retriever.search(np.zeros((2, PROJ + 1), np.float32), k=2)
    with pytest.raises(ValueError, match="nprobe"):
        retriever.search(np.zeros((1, PROJ), np.float32), k=2, nprobe=4)
    with pytest.raises(KeyError):
        retriever.store.texts([[10**9]])
    assert retriever.num_blocks == len(retriever) == retriever.store.index.index.ntotal
    assert retriever.embedding_dim == PROJ and retriever.store.index_type == "Flat"


@pytest.mark.parametrize(
    "factory,params,floor",
    [
        ("HNSW32", {"efSearch": 64}, 0.95),
        ("IVF32,Flat", {"nprobe": 8}, 0.9),
        ("IVF32,SQ8", {"nprobe": 8}, 0.9),
        # 4-bit PQ codes are coarse: re-ranking 4k candidates by exact inner product is what makes them usable.
        ("IVF32,PQ16x4", {"nprobe": 8, "rerank_factor": 4}, 0.6),
    ],
)
def test_approximate_index_recall(factory, params, floor):
    vectors = structured_vectors(6000, PROJ, seed=1)
    queries = structured_vectors(200, PROJ, seed=2)
    texts = [f"block {i}" for i in range(len(vectors))]
    exact = RealmRetriever.from_embeddings(vectors, texts)
    approx = RealmRetriever.from_embeddings(vectors, texts, index=factory)
    truth = exact.search(queries, k=5, return_blocks=False).block_ids.numpy()
    found = approx.search(queries, k=5, return_blocks=False, **params).block_ids.numpy()
    recall = np.mean([len(set(t) & set(f)) / 5 for t, f in zip(truth, found)])
    assert recall >= floor, f"{factory} recall@5 {recall:.3f}"
    if "rerank_factor" in params:
        plain = approx.search(queries, k=5, return_blocks=False, nprobe=params["nprobe"]).block_ids.numpy()
        assert np.mean([len(set(t) & set(f)) / 5 for t, f in zip(truth, plain)]) < recall
    # Parameters apply to one call only.
    name = next(iter(params))
    default = faiss_ops.get_search_param(approx.store.index.index, name)
    assert default != params[name]
    approx.search(queries[:2], k=5, **params)
    assert faiss_ops.get_search_param(approx.store.index.index, name) == default
    # Scores are exact inner products (compressed codes are re-scored with the stored vectors).
    out = approx.search(queries[:3], k=5, **params)
    rescored = torch.einsum("bd,bkd->bk", torch.from_numpy(queries[:3]), approx.store.embeddings(out.block_ids))
    torch.testing.assert_close(out.scores, rescored, atol=1e-4, rtol=1e-5)


def test_ivf_pq_rerank_is_exact_top_k_and_reads_vectors_in_pieces(monkeypatch):
    # The 1 GB paper-scale setup (bench/search.py): IVF-PQ codes with block ids in the lists (no IDMap), candidates
    # re-scored from the corpus's memory-mapped embeddings. Probing every list and re-scoring every block is exact.
    from realm_hf.retrieval import corpus as corpus_module

    vectors = structured_vectors(3000, PROJ, seed=1)
    queries = structured_vectors(40, PROJ, seed=2)
    texts = [f"block {i}" for i in range(len(vectors))]
    approx = RealmRetriever.from_embeddings(vectors, texts, index="IVF16,PQ8", block_ids=np.arange(3000) * 2 + 5)
    # Ids in the lists: 8 bytes, not 16.
    assert type(faiss.downcast_index(approx.store.index.index)).__name__ == "IndexIVFPQ"
    assert approx.store.corpus.dataset.cache_files  # the stored vectors are a memory-mapped file, not anonymous memory
    gathered = []
    gather = corpus_module.BlockCorpus._gather

    def spy(self, column, rows):
        if column == "embeddings":
            gathered.append(len(rows))
        return gather(self, column, rows)

    monkeypatch.setattr(corpus_module.BlockCorpus, "_gather", spy)
    out = approx.search(queries, k=5, return_blocks=False, nprobe=16, rerank_factor=len(vectors))
    order, scores = brute_force(queries, vectors, 5)
    assert out.block_ids.tolist() == (order * 2 + 5).tolist()
    np.testing.assert_allclose(out.scores.numpy(), scores, rtol=1e-5, atol=1e-4)
    # 40 x 3000 candidates are read a bounded number of rows at a time (Arrow's pool keeps what one take allocated).
    assert sum(gathered) == 40 * 3000 and max(gathered) <= corpus_module.GATHER_ROWS < 40 * 3000


def test_ivf_with_too_many_lists_is_reduced(caplog):
    vectors = structured_vectors(400, PROJ)
    with caplog.at_level(logging.WARNING):
        retriever = RealmRetriever.from_embeddings(vectors, [str(i) for i in range(400)], index="IVF1024,Flat")
    assert "IVF10,Flat" in caplog.text and retriever.store.index_type == "IVF10,Flat"
    assert len(retriever.search(vectors[:2], k=3, nprobe=10).block_ids[0]) == 3


def test_gpu_request_falls_back_to_cpu(caplog):
    if faiss_ops.faiss_gpu_available():
        pytest.skip("faiss has GPU support here")
    vectors = structured_vectors(50, PROJ)
    with caplog.at_level(logging.WARNING):
        retriever = RealmRetriever.from_embeddings(vectors, [str(i) for i in range(50)], use_gpu=True)
    assert "realm-hf[gpu]" in caplog.text
    assert retriever.search(vectors[:1], k=1).block_ids.item() == 0


# ------------------------------------------------------------------------------------------------------------------
# Save / load
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("corpus_format", ["arrow", "parquet"])
def test_save_load_round_trip(retriever, embedder, tokenizer, tmp_path, corpus_format):
    retriever.save_pretrained(tmp_path, corpus_format=corpus_format, max_shard_size="4KB")
    assert sorted(os.listdir(tmp_path)) == ["corpus", INDEX_NAME, MANIFEST_NAME, "tokenizer"]
    if corpus_format == "parquet":
        shards = sorted(os.listdir(tmp_path / "corpus"))
        assert len(shards) > 1 and shards[0] == f"data-00000-of-{len(shards):05d}.parquet"
    manifest = json.loads((tmp_path / MANIFEST_NAME).read_text())
    assert manifest["embedding_dim"] == PROJ and manifest["num_blocks"] == len(retriever)
    assert manifest["index_type"] == "Flat" and manifest["metric"] == "inner_product"
    assert manifest["embedder_fingerprint"] == fingerprint_module(embedder)
    assert manifest["max_block_length"] == MAX_BLOCK_LENGTH and manifest["format_version"] == FORMAT_VERSION
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # same embedder: not stale
        loaded = RealmRetriever.from_pretrained(tmp_path, embedder=embedder)
    assert loaded.store.index.source is not None  # the index's flat codes are memory-mapped
    queries = embed_questions(embedder, tokenizer, ["lighthouse of port estrel", "garbage collector", "wool market"])
    a, b = retriever.search(queries, k=6), loaded.search(queries, k=6)
    assert torch.equal(a.block_ids, b.block_ids) and torch.equal(a.scores, b.scores)
    assert a.blocks == b.blocks
    assert torch.equal(retriever.store.embeddings(a.block_ids), loaded.store.embeddings(a.block_ids))
    assert loaded.tokenizer("Velmora")["input_ids"] == tokenizer("Velmora")["input_ids"]


def test_manifest_and_model_mismatch_errors(retriever, tokenizer, tmp_path):
    retriever.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=f"holds {PROJ}-d embeddings.*expects 32-d"):
        RealmRetriever.from_pretrained(tmp_path, expected_dim=32)
    with pytest.raises(ValueError, match="projection size"):
        RealmRetriever.from_pretrained(tmp_path, embedder=TinyEmbedder(len(tokenizer), proj=8))
    with pytest.raises(ValueError, match=f"has {len(retriever)} blocks but 7 were expected"):
        RealmRetriever.from_pretrained(tmp_path, expected_num_blocks=7)
    manifest = json.loads((tmp_path / MANIFEST_NAME).read_text())
    (tmp_path / MANIFEST_NAME).write_text(json.dumps({**manifest, "num_blocks": len(retriever) + 1}))
    with pytest.raises(ValueError, match="manifest says"):
        RealmRetriever.from_pretrained(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text(json.dumps({**manifest, "embedding_dim": 8}))
    with pytest.raises(ValueError, match="8"):
        RealmRetriever.from_pretrained(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        RealmRetriever.from_pretrained(tmp_path)
    os.remove(tmp_path / MANIFEST_NAME)
    with pytest.raises(OSError, match="no retriever_manifest.json.*from_documents"):
        RealmRetriever.from_pretrained(tmp_path)
    with pytest.raises(OSError, match="not found"):
        RealmRetriever.from_pretrained(tmp_path / "missing")


def test_stale_embedder_warns(retriever, tokenizer, tmp_path):
    retriever.save_pretrained(tmp_path)
    trained = TinyEmbedder(len(tokenizer))
    with torch.no_grad():
        trained.dense.weight.add_(0.01)
    with pytest.warns(UserWarning, match="stale"):
        RealmRetriever.from_pretrained(tmp_path, embedder=trained)
    assert is_stale(retriever, trained) and not is_stale(retriever, TinyEmbedder(len(tokenizer)))


def test_corrupt_or_foreign_index_gives_clear_error(retriever, tmp_path):
    retriever.save_pretrained(tmp_path)
    index_path = tmp_path / INDEX_NAME
    size = index_path.stat().st_size
    index_path.write_bytes(np.random.default_rng(0).bytes(size))
    with pytest.raises(ValueError, match="index.faiss is corrupt: its sha256 differs"):
        RealmRetriever.from_pretrained(tmp_path)
    # Without the checksums (trusted files), FAISS's own checks still refuse the file clearly.
    with pytest.raises(ValueError, match="not a FAISS index.*from_documents"):
        RealmRetriever.from_pretrained(tmp_path, verify_checksums=False)
    index_path.write_bytes(b"IxM2" + np.random.default_rng(0).bytes(size - 4))
    with pytest.raises(ValueError, match="could not be read as a FAISS index.*from_documents"):
        RealmRetriever.from_pretrained(tmp_path, verify_checksums=False)
    good_prefix = faiss.serialize_index(retriever.store.index.index).tobytes()[: size // 2]
    index_path.write_bytes(good_prefix)
    with pytest.raises(ValueError, match="truncated"):
        RealmRetriever.from_pretrained(tmp_path)
    # A valid FAISS file of another dimension (and the size check out of the way).
    other = faiss.IndexIDMap2(faiss.IndexFlatIP(8))
    other.add_with_ids(np.zeros((len(retriever), 8), np.float32), np.arange(len(retriever)))
    faiss.write_index(other, str(index_path))
    manifest = json.loads((tmp_path / MANIFEST_NAME).read_text())
    del manifest["index_file_size"], manifest["files"]  # as an older manifest, without sizes or checksums
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=f"8-d index but the manifest says {PROJ}"):
        RealmRetriever.from_pretrained(tmp_path)


def test_failed_save_keeps_previous_corpus(retriever, tmp_path, monkeypatch):
    small = RealmRetriever.from_embeddings(structured_vectors(5, PROJ), [f"old {i}" for i in range(5)])
    small.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{}")  # a model's file in the same directory
    before = {p: (tmp_path / p).stat().st_mtime_ns for p in (INDEX_NAME, MANIFEST_NAME)}

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(faiss, "write_index", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        retriever.save_pretrained(tmp_path)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["config.json", "corpus", INDEX_NAME, MANIFEST_NAME]  # no temp leftovers
    assert {p: (tmp_path / p).stat().st_mtime_ns for p in before} == before
    loaded = RealmRetriever.from_pretrained(tmp_path)
    assert len(loaded) == 5 and loaded.store.texts([0, 4]) == ["old 0", "old 4"]
    # A successful save replaces the retriever's entries and keeps the model's.
    retriever.save_pretrained(tmp_path)
    assert len(RealmRetriever.from_pretrained(tmp_path)) == len(retriever)
    assert (tmp_path / "config.json").read_text() == "{}"


# ------------------------------------------------------------------------------------------------------------------
# Updating knowledge
# ------------------------------------------------------------------------------------------------------------------

NEW_DOC = {
    "doc_id": "doc-new",
    "title": "Glimmerfen",
    "text": "Glimmerfen is a floating marsh city founded in 2024. Its mayor is an otter named Pim.",
    "source": "added later",
}


@pytest.mark.parametrize("factory", ["Flat", "HNSW32", "IVF4,Flat"])
def test_add_and_remove_documents_change_results(documents, embedder, tokenizer, tmp_path, factory):
    retriever = RealmRetriever.from_documents(
        documents, embedder, tokenizer, max_block_length=MAX_BLOCK_LENGTH, index=factory, show_progress=False
    )
    # Go through save/load: the index is then memory-mapped and must be copied before it is modified.
    retriever.save_pretrained(tmp_path)
    retriever = RealmRetriever.from_pretrained(tmp_path, embedder=embedder)
    params = {"nprobe": 4} if factory.startswith("IVF") else {}
    n_before, old_max = len(retriever), int(retriever.store.block_ids.max())
    new_ids = retriever.add_documents([NEW_DOC], embedder, show_progress=False)
    assert min(new_ids) == old_max + 1 and len(retriever) == n_before + len(new_ids)
    # The new block is the best answer for a question embedded like itself.
    query = retriever.store.embeddings(torch.tensor([new_ids[:1]]))[0]
    top = retriever.search(query, k=1, **params)
    assert top.block_ids.item() == new_ids[0]
    assert top.blocks[0][0]["title"] == "Glimmerfen" and top.blocks[0][0]["doc_id"] == "doc-new"
    assert top.blocks[0][0]["source"] == "added later"

    removed = retriever.remove_documents(["doc-new", "doc-000"])
    assert set(new_ids) <= set(removed) and len(retriever) == n_before + len(new_ids) - len(removed)
    everything = retriever.search(query, k=len(retriever), **({"nprobe": 4} if params else {}))
    assert not set(removed) & set(everything.block_ids[0].tolist())
    assert "Glimmerfen" not in {b["title"] for b in everything.blocks[0]}
    # Ids are never reused, and the updated corpus saves and loads.
    again = retriever.add_documents([dict(NEW_DOC, doc_id="doc-new-2")], embedder, show_progress=False)
    assert min(again) > max(new_ids)
    retriever.remove_documents(block_ids=again)
    retriever.save_pretrained(tmp_path)
    loaded = RealmRetriever.from_pretrained(tmp_path)
    assert len(loaded) == len(retriever) and loaded.store.next_block_id == retriever.store.next_block_id
    assert torch.equal(loaded.search(query, k=5, **params).block_ids, retriever.search(query, k=5, **params).block_ids)


def test_answer_changes_after_corpus_update(retriever, embedder, tokenizer):
    retriever = RealmRetriever.from_embeddings(
        retriever.store.embeddings(torch.as_tensor(retriever.store.block_ids)),
        retriever.store.texts(retriever.store.block_ids),
        tokenizer=tokenizer,
        metadata={"doc_id": retriever.corpus["doc_id"]},
        embedder_fingerprint=fingerprint_module(embedder),
    )
    retriever.max_block_length = MAX_BLOCK_LENGTH
    question = "Glimmerfen is a floating marsh city founded in 2024. Its mayor is an otter named Pim."
    query = embed_blocks(embedder, tokenizer, ["Glimmerfen"], [question], show_progress=False)
    before = retriever.search(query, k=1).blocks[0][0]["text"]
    assert "Pim" not in before
    retriever.add_documents([NEW_DOC], embedder, show_progress=False)
    assert "Pim" in retriever.search(query, k=1).blocks[0][0]["text"]
    retriever.remove_documents("doc-new")
    assert retriever.search(query, k=1).blocks[0][0]["text"] == before


def test_embed_corpus_refreshes_embeddings_and_fingerprint(documents, embedder, tokenizer, tmp_path):
    retriever = RealmRetriever.from_documents(
        documents[:10], embedder, tokenizer, max_block_length=MAX_BLOCK_LENGTH, show_progress=False
    )
    before = retriever.store.embeddings(torch.as_tensor(retriever.store.block_ids))
    new_embedder = TinyEmbedder(len(tokenizer), seed=3)
    assert is_stale(retriever, new_embedder)
    # A share of the rows (distributed re-indexing) only computes embeddings.
    share = embed_corpus(retriever, new_embedder, start=2, end=5, show_progress=False)
    assert share.shape == (3, PROJ) and is_stale(retriever, new_embedder)
    # Built off the live retriever, swapped in atomically.
    full = embed_corpus(retriever, new_embedder, start=0, end=len(retriever), show_progress=False)
    torch.testing.assert_close(full[2:5], share)
    state = retriever.store.with_embeddings(full, embedder_fingerprint=fingerprint_module(new_embedder))
    torch.testing.assert_close(retriever.store.embeddings(torch.as_tensor(retriever.store.block_ids)), before)
    retriever.swap_index_state(state)
    assert not is_stale(retriever, new_embedder)
    expected = embed_blocks(
        new_embedder, tokenizer, retriever.corpus["title"], retriever.corpus["text"], show_progress=False
    )
    torch.testing.assert_close(retriever.store.embeddings(torch.as_tensor(retriever.store.block_ids)), expected)
    assert retriever.search(expected[:2], k=1).block_ids[:, 0].tolist() == retriever.store.block_ids[:2].tolist()
    # Whole-corpus embed_corpus refreshes in place; a stale state is refused after the corpus changed.
    embed_corpus(retriever, embedder, show_progress=False)
    torch.testing.assert_close(retriever.store.embeddings(torch.as_tensor(retriever.store.block_ids)), before)
    retriever.remove_documents(block_ids=[int(retriever.store.block_ids[0])])
    with pytest.raises(ValueError, match="corpus changed"):
        retriever.swap_index_state(state)
    # A saved (memory-mapped) retriever exports an independent copy of its index.
    retriever.save_pretrained(tmp_path)
    loaded = RealmRetriever.from_pretrained(tmp_path)
    exported = loaded.export_index_state()
    retriever.swap_index_state(exported)
    retriever.add_documents([NEW_DOC], embedder, show_progress=False)
    assert loaded.store.index.index.ntotal == len(loaded) == len(retriever) - 1


# ------------------------------------------------------------------------------------------------------------------
# Legacy checkpoints
# ------------------------------------------------------------------------------------------------------------------


def make_legacy_dir(path, tokenizer, n=30, dim=PROJ, safetensors=False):
    rng = np.random.default_rng(5)
    texts = [f"Legacy block number {i}: the Torre Alba is {i} metres tall. Café ünïcode {i}." for i in range(n)]
    records = np.array([t.encode("utf-8") for t in texts], dtype=object)
    np.save(path / "block_records.npy", records, allow_pickle=True)
    block_emb = torch.from_numpy(rng.normal(size=(n, dim)).astype(np.float32))
    state = {"block_emb": block_emb, "embedder.cls.dense.weight": torch.zeros(dim, 4)}
    if safetensors:
        save_file(state, str(path / "model.safetensors"))
    else:
        torch.save(state, path / "pytorch_model.bin")
    tokenizer.save_pretrained(path)
    return texts, block_emb


@pytest.mark.parametrize("safetensors", [False, True])
def test_legacy_conversion_reproduces_brute_force(tokenizer, tmp_path, monkeypatch, safetensors):
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    texts, block_emb = make_legacy_dir(legacy, tokenizer, safetensors=safetensors)
    monkeypatch.delenv("REALM_HF_ALLOW_PICKLE", raising=False)
    with pytest.raises(ValueError, match="allow_pickle=True.*REALM_HF_ALLOW_PICKLE=1"):
        RealmRetriever.from_legacy(legacy)
    with pytest.raises(ValueError, match="allow_pickle"):
        convert_legacy_checkpoint(legacy, tmp_path / "out")
    assert not (tmp_path / "out").exists()

    out_dir = tmp_path / "out"
    converted = convert_legacy_checkpoint(legacy, out_dir, allow_pickle=True)
    assert not [f for f in os.listdir(out_dir) if f.endswith((".npy", ".pkl", ".bin"))]
    loaded = RealmRetriever.from_pretrained(out_dir)  # no pickle needed any more
    questions = torch.from_numpy(np.random.default_rng(9).normal(size=(4, PROJ)).astype(np.float32))
    for retriever in (converted, loaded):
        ids = torch.arange(len(texts)).view(1, -1)
        assert torch.equal(retriever.store.embeddings(ids)[0], block_emb)  # exact legacy vectors
        assert retriever.store.texts(ids)[0] == texts
        for q in questions:  # the legacy way: one question at a time, einsum over the full matrix + topk
            scores = torch.einsum("BD,QD->QB", block_emb, q[None])
            legacy_scores, legacy_ids = torch.topk(scores, k=5, dim=-1)
            out = retriever.search(q[None], k=5)
            assert out.block_ids.tolist() == legacy_ids.tolist()
            torch.testing.assert_close(out.scores, legacy_scores, atol=1e-5, rtol=1e-5)
    assert loaded.tokenizer is not None
    assert loaded.store.blocks([0])[0]["title"] == ""

    monkeypatch.setenv("REALM_HF_ALLOW_PICKLE", "1")
    assert len(RealmRetriever.from_legacy(legacy)) == len(texts)


def test_legacy_fixture_matches_recorded_legacy_outputs():
    if not os.path.isdir(LEGACY_OPENQA):
        pytest.skip("legacy fixtures not present")
    tensors = load_file(os.path.join(LEGACY_OPENQA, "expected_outputs.safetensors"))
    retriever = RealmRetriever.from_legacy(LEGACY_OPENQA, allow_pickle=True)
    ids = torch.arange(len(retriever)).view(1, -1)
    assert torch.equal(retriever.store.embeddings(ids)[0], tensors["block_emb"])
    for qi in range(4):
        out = retriever.search(tensors[f"q{qi}.question_projection"], k=len(tensors[f"q{qi}.retrieved_block_ids"]))
        assert out.block_ids[0].tolist() == tensors[f"q{qi}.retrieved_block_ids"].tolist()
        torch.testing.assert_close(out.scores[0], tensors[f"q{qi}.retrieved_scores"], atol=1e-5, rtol=0)


def test_legacy_call_builds_the_legacy_reader_inputs():
    if not os.path.isdir(LEGACY_OPENQA):
        pytest.skip("legacy fixtures not present")
    tensors = load_file(os.path.join(LEGACY_OPENQA, "expected_outputs.safetensors"))
    retriever = RealmRetriever.from_legacy(LEGACY_OPENQA, allow_pickle=True)
    for qi in range(4):
        p = f"q{qi}."
        answers = [[t for t in row if t >= 0] for row in tensors[p + "answer_ids"].tolist()]
        has_answers, start_pos, end_pos, inputs = legacy_retriever_call(
            retriever, tensors[p + "retrieved_block_ids"], tensors[p + "input_ids"], answers, max_length=48
        )
        assert torch.equal(inputs["input_ids"], tensors[p + "reader_input_ids"])
        assert torch.equal(inputs["token_type_ids"], tensors[p + "reader_token_type_ids"])
        assert has_answers == tensors[p + "has_answers"].tolist()
        assert (
            start_pos == tensors[p + "start_positions"].tolist() and end_pos == tensors[p + "end_positions"].tolist()
        )
    legacy_call = legacy_retriever_call(retriever, tensors["q0.retrieved_block_ids"], tensors["q0.input_ids"], None)
    assert legacy_call[:3] == (None, None, None)


def test_fingerprint_module(tokenizer):
    a, b = TinyEmbedder(len(tokenizer)), TinyEmbedder(len(tokenizer))
    assert fingerprint_module(a) == fingerprint_module(b) and len(fingerprint_module(a)) == 16
    with torch.no_grad():
        b.norm.bias[0] += 1e-3
    assert fingerprint_module(a) != fingerprint_module(b)


def test_missing_results_are_marked():
    vectors = structured_vectors(400, PROJ)
    retriever = RealmRetriever.from_embeddings(vectors, [str(i) for i in range(400)], index="IVF8,Flat")
    out = retriever.search(vectors[:3], k=len(retriever), nprobe=1)  # one list cannot hold every block
    missing = out.block_ids == -1
    assert missing.any() and not missing.all()
    assert torch.isinf(out.scores[missing]).all() and torch.isfinite(out.scores[~missing]).all()
    assert {b["text"] for row, m in zip(out.blocks, missing) for b, mm in zip(row, m) if mm} == {""}
    assert torch.count_nonzero(retriever.store.embeddings(out.block_ids)[missing]) == 0


def test_with_realm_embedder(documents, tokenizer, tmp_path):
    realm_hf = pytest.importorskip("realm_hf")
    config = realm_hf.RealmConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        retriever_proj_size=PROJ,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    embedder = realm_hf.RealmEmbedder(config).eval()
    retriever = RealmRetriever.from_documents(
        documents[:8], embedder, tokenizer, max_block_length=64, show_progress=False
    )
    retriever.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = RealmRetriever.from_pretrained(tmp_path, embedder=embedder)
    question = embedder(**tokenizer(["who founded port estrel?"], return_tensors="pt")).projected_score
    assert torch.equal(loaded.search(question, k=3).block_ids, retriever.search(question, k=3).block_ids)
    other = realm_hf.RealmEmbedder(realm_hf.RealmConfig(**{**config.to_dict(), "retriever_proj_size": 8}))
    with pytest.raises(ValueError, match="retriever_proj_size"):
        RealmRetriever.from_pretrained(tmp_path, embedder=other)


def test_hub_id_offline_gives_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError, match="could not be downloaded from the Hub.*HF_HUB_OFFLINE"):
        RealmRetriever.from_pretrained("realm-hf-tests/no-such-corpus")
