"""GPU paths: faiss-gpu search and fp16/bf16 embedding on CUDA. Marked `gpu` (deselected by default).

Run on a machine with a CUDA GPU (and `pip install -e ".[gpu]"` for the faiss-gpu tests) with `pytest -m gpu`.
"""

import os

import pytest
import torch

from realm_hf import RealmConfig, RealmEmbedder, RealmForOpenQA, RealmTokenizer
from realm_hf.retrieval import faiss_ops
from realm_hf.retrieval.encoding import embed_blocks
from realm_hf.retrieval.retriever import RealmRetriever
from tests.support.paths import LEGACY

pytestmark = pytest.mark.gpu

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_faiss_gpu = pytest.mark.skipif(
    not faiss_ops.faiss_gpu_available(), reason="needs faiss with GPU support (pip install realm-hf[gpu])"
)


def on_gpu(index) -> bool:
    return type(index).__name__.startswith("Gpu")


def clustered(n, dim, seed=0):
    generator = torch.Generator().manual_seed(seed)
    centers = torch.randn(32, dim, generator=generator)
    x = centers[torch.randint(0, 32, (n,), generator=generator)] + 0.3 * torch.randn(n, dim, generator=generator)
    return torch.nn.functional.layer_norm(x, (dim,))


@needs_faiss_gpu
@pytest.mark.parametrize("index", ["Flat", "IVF64,Flat"])
def test_gpu_index_searches_like_the_cpu_index(index):
    vectors, queries = clustered(5000, 128), clustered(200, 128, seed=1)
    texts = [f"block {i}" for i in range(len(vectors))]
    cpu = RealmRetriever.from_embeddings(vectors, texts, index=index)
    gpu = RealmRetriever.from_embeddings(vectors, texts, index=index).to_gpu()
    assert on_gpu(gpu.store.index.index)
    params = {"nprobe": 16} if index.startswith("IVF") else {}
    expected, got = cpu.search(queries, k=5, **params), gpu.search(queries, k=5, **params)
    same = (expected.block_ids == got.block_ids).float().mean().item()
    assert same > 0.99  # GPU kernels may order exact ties differently
    torch.testing.assert_close(got.scores, expected.scores, atol=1e-3, rtol=1e-3)
    gpu.to_cpu()
    assert not on_gpu(gpu.store.index.index)


@needs_cuda
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_half_precision_embedding_on_cuda_is_close_to_fp32(dtype):
    tokenizer = RealmTokenizer.from_pretrained(os.path.join(LEGACY, "embedder"))
    torch.manual_seed(0)
    config = RealmConfig(
        vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128
    )
    embedder = RealmEmbedder(config).cuda().eval()
    titles = [f"title {i}" for i in range(40)]
    texts = [("word " * (5 + 7 * i)).strip() for i in range(40)]
    fp32 = embed_blocks(embedder, tokenizer, titles, texts, batch_size=8, show_progress=False)
    half = embed_blocks(embedder, tokenizer, titles, texts, batch_size=8, dtype=dtype, show_progress=False)
    assert half.dtype == torch.float32 and half.shape == fp32.shape
    cosine = torch.nn.functional.cosine_similarity(half.float(), fp32.float(), dim=-1)
    assert cosine.min() > 0.99


@needs_cuda
def test_openqa_on_cuda_answers_like_on_cpu():
    cpu = RealmForOpenQA.from_pretrained(os.path.join(LEGACY, "openqa"), allow_pickle=True).eval()
    questions = ["What is the capital of France?", "Who created the Python language?"]
    expected = cpu.answer(questions)
    gpu = RealmForOpenQA.from_pretrained(os.path.join(LEGACY, "openqa"), allow_pickle=True).eval().cuda()
    got = gpu.answer(questions)
    assert [r["answer"] for r in got] == [r["answer"] for r in expected]
    for a, b in zip(got, expected):
        assert abs(a["score"] - b["score"]) < 1e-3
