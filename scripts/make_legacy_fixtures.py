"""Write the legacy REALM reference fixtures under ``tests/fixtures/legacy/``.

This script runs with the *legacy* transformers (4.57.6, the last release that still ships
``transformers.models.deprecated.realm``), never with realm-hf's own environment. It builds tiny random
models of the five legacy REALM classes, saves them the way the google/realm-* checkpoints are stored
(``pytorch_model.bin`` + ``config.json`` + slow ``RealmTokenizer`` files; the open-QA model also gets its
retriever's pickled ``block_records.npy``), runs each on fixed inputs and records inputs and outputs in
``expected_outputs.safetensors`` (tensors) and ``expected_outputs.json`` (texts, decoded answers,
state-dict keys). At the end it reloads every directory with the legacy ``from_pretrained`` and asserts
that the outputs reproduce (max abs diff < 1e-6), so the fixtures are self-consistent.

Create the legacy venv (once; torch first, the local CPU wheel):

    python3 -m venv /work/legacy-venv
    /work/legacy-venv/bin/pip install torch==2.13.0
    /work/legacy-venv/bin/pip install transformers==4.57.6 huggingface-hub==0.36.2 numpy

Run it from anywhere (it writes next to itself, in ``<repo>/tests/fixtures/legacy/``):

    /work/legacy-venv/bin/python scripts/make_legacy_fixtures.py

The output directory is built in a temporary sibling directory and swapped in at the end, so an
interrupted run leaves the previous fixtures in place. See ``tests/fixtures/legacy/README.md``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers.models.deprecated.realm import (  # noqa: E402
    RealmConfig,
    RealmEmbedder,
    RealmForOpenQA,
    RealmKnowledgeAugEncoder,
    RealmReader,
    RealmRetriever,
    RealmScorer,
    RealmTokenizer,
    RealmTokenizerFast,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = REPO_ROOT / "tests" / "fixtures" / "legacy"
TOL = 1e-6

# --------------------------------------------------------------------------------------------------
# Fixed texts and the tiny WordPiece vocabulary
# --------------------------------------------------------------------------------------------------

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PUNCTUATION = [".", ",", "?", "!", "'", "-", "(", ")", ":", ";", '"', "/"]
WORDS = """
a an and are as at be big black by cafes capital cat city code come country did do does england europe
for france from germany has in into is it kernel language linux london machine many mat museums
netherlands of on operating paris program python red river rossum sat seine sit system the
through to translate van was what where which who berlin guido flows compiler model answer question
block index search text data computer software memory file network user time first new old small large
fast slow good open source free world history science word words read write run runs
car house tree dog bird sun moon day night year man woman child school book paper music song game team
""".split()
# '##' continuation pieces; "ross"+"##um", "program"+"##s"/"##ming", "compiler"+"##s", "create"+"##d" ...
WORD_PIECES = ["ross", "create", "##um", "##s", "##d", "##ed", "##ing", "##ming", "##er", "##ly", "##es",
               "##al", "##ion", "##a", "##e", "##i", "##o", "##n", "##t", "##r"]  # fmt: skip


def build_vocab() -> list[str]:
    vocab = list(SPECIAL_TOKENS) + list(PUNCTUATION)
    for token in sorted(set(WORDS)) + WORD_PIECES:
        if token not in vocab:
            vocab.append(token)
    for i in range(10):  # single digits only: "1991" is a word WordPiece cannot cover -> [UNK]
        vocab.append(str(i))
    return vocab


EMBEDDER_TEXTS = [
    "Paris is the capital of France.",
    "The cat sat on the mat.",
    "Guido van Rossum created the Python programming language in 1991!",
]

SCORER_QUERIES = ["What is the capital of France?", "Who created Python?"]
SCORER_CANDIDATES = [
    ["Paris is the capital of France.", "The cat sat on the mat.", "London is a big city."],
    [
        "Guido van Rossum created Python.",
        "Compilers translate programs into machine code for the computer and the user.",  # truncated at 16
        "The river flows through Paris.",
    ],
]
SCORER_MAX_LENGTH = 16

ENCODER_QUERIES = ["paris is the capital of france.", "guido van rossum created python."]
ENCODER_BLOCKS = [
    ["France is a country in Europe.", "The cat sat on the mat.", "Paris has many museums and cafes."],
    ["Python is a programming language.", "Linux is an operating system kernel.", "Berlin is big."],
]
ENCODER_MAX_LENGTH = 24

BLOCK_RECORDS = [
    "paris is the capital of france.",
    "the river seine flows through paris and france.",
    "london is the capital of england.",
    "guido van rossum created python in the netherlands.",
    "python is a programming language.",
    "the cat sat on the mat in paris.",
    "compilers translate programs into machine code.",
    "paris has many museums and cafes in france, and paris is big.",
    "linux is an operating system kernel.",
    "france is a country in europe; guido van rossum lived in the netherlands.",
    "the mat was red and the cat was black.",
    "berlin is the capital of germany.",
]

READER_QUESTION = "What is the capital of France?"
READER_ANSWERS = ["paris", "france"]
# searcher_beam_size rows; the reader reads input_ids of the first reader_beam_size rows only
READER_BLOCK_IDS = [0, 2, 7, 1, 5, 11]

OPENQA_QUESTIONS = [
    ("What is the capital of France?", ["paris"]),
    ("Who created the Python language in 1991?", ["guido van rossum", "guido"]),
    ("Where is the capital of England?", ["london"]),
    ("Which country is Paris in?", ["france", "europe"]),
]


def tiny_config(vocab_size: int) -> RealmConfig:
    return RealmConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        retriever_proj_size=16,
        num_candidates=3,
        span_hidden_size=16,
        max_span_width=4,
        reader_beam_size=3,
        reader_seq_len=48,
        num_block_records=len(BLOCK_RECORDS),
        searcher_beam_size=6,
        max_position_embeddings=64,
        pad_token_id=0,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
    )


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------


def perturb_(model: torch.nn.Module, seed: int) -> None:
    """Move every parameter away from its structured init, so a dropped or mis-mapped key shows up."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied parameters are visited once
            if "LayerNorm" in name or "layer_normalization" in name:
                if name.endswith("weight"):
                    p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
                else:
                    p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))


def save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    save_file({k: v.detach().cpu().clone().contiguous() for k, v in tensors.items()}, str(path))


def write_json(obj, path: Path) -> None:
    path.write_text(json.dumps(obj, indent=1, sort_keys=False) + "\n")


def saved_keys(model_dir: Path) -> list[str]:
    return sorted(torch.load(model_dir / "pytorch_model.bin", map_location="cpu", weights_only=True).keys())


def compare(expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor], what: str) -> float:
    assert sorted(expected) == sorted(actual), (what, sorted(set(expected) ^ set(actual)))
    worst = 0.0
    for k in sorted(expected):
        e, a = expected[k], actual[k].detach().cpu()
        assert e.shape == a.shape and e.dtype == a.dtype, (what, k, e.shape, a.shape, e.dtype, a.dtype)
        if e.dtype.is_floating_point:
            same_inf = torch.equal(torch.isinf(e), torch.isinf(a))
            finite = torch.isfinite(e)
            diff = (e[finite] - a[finite]).abs().max().item() if finite.any() else 0.0
            assert same_inf, (what, k, "inf pattern differs")
        else:
            diff = 0.0 if torch.equal(e, a) else float("inf")
        worst = max(worst, diff)
        assert diff < TOL, (what, k, diff)
    return worst


def json_close(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return abs(a - b) < TOL
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(json_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(json_close(x, y) for x, y in zip(a, b))
    return a == b


def answer_ids_of(tokenizer, answers: list[str]) -> list[list[int]]:
    # exactly as the legacy RealmForOpenQA docstring builds answer_ids
    return tokenizer(
        answers, add_special_tokens=False, return_token_type_ids=False, return_attention_mask=False
    ).input_ids


def pad_ragged(rows: list[list[int]], value: int = -1) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=torch.long)


# --------------------------------------------------------------------------------------------------
# Per-class runs: each returns (tensors, json_info); called on the fresh model and on the reloaded one
# --------------------------------------------------------------------------------------------------


@torch.no_grad()
def run_embedder(model: RealmEmbedder, tok) -> tuple[dict, dict]:
    enc = tok(EMBEDDER_TEXTS, padding=True, return_tensors="pt")
    out = model(**enc, output_hidden_states=True, return_dict=True)
    tensors = {
        "input_ids": enc.input_ids,
        "attention_mask": enc.attention_mask,
        "token_type_ids": enc.token_type_ids,
        "projected_score": out.projected_score,
    }
    for i, h in enumerate(out.hidden_states):
        tensors[f"hidden_states.{i}"] = h
    info = {"texts": EMBEDDER_TEXTS, "tokens": [tok.convert_ids_to_tokens(r) for r in enc.input_ids.tolist()]}
    return tensors, info


@torch.no_grad()
def run_scorer(model: RealmScorer, tok) -> tuple[dict, dict]:
    q = tok(SCORER_QUERIES, padding=True, return_tensors="pt")
    c = tok.batch_encode_candidates(
        SCORER_CANDIDATES, max_length=SCORER_MAX_LENGTH, truncation=True, return_tensors="pt"
    )
    out = model(
        **q,
        candidate_input_ids=c.input_ids,
        candidate_attention_mask=c.attention_mask,
        candidate_token_type_ids=c.token_type_ids,
        return_dict=True,
    )
    tensors = {
        "input_ids": q.input_ids,
        "attention_mask": q.attention_mask,
        "token_type_ids": q.token_type_ids,
        "candidate_input_ids": c.input_ids,
        "candidate_attention_mask": c.attention_mask,
        "candidate_token_type_ids": c.token_type_ids,
        "relevance_score": out.relevance_score,
        "query_score": out.query_score,
        "candidate_score": out.candidate_score,
    }
    info = {
        "queries": SCORER_QUERIES,
        "candidates": SCORER_CANDIDATES,
        "batch_encode_candidates_kwargs": {"max_length": SCORER_MAX_LENGTH, "truncation": True},
    }
    return tensors, info


def encoder_inputs(tok) -> tuple[dict, torch.Tensor, torch.Tensor, torch.Tensor, list]:
    c = tok.batch_encode_candidates(
        [[q] * 3 for q in ENCODER_QUERIES],
        text_pair=ENCODER_BLOCKS,
        max_length=ENCODER_MAX_LENGTH,
        truncation=True,
        return_tensors="pt",
    )
    input_ids = c.input_ids.clone()  # [2, 3, 24]
    batch, _, seq = input_ids.shape
    labels = torch.full((batch, seq), -100, dtype=torch.long)
    # mask query tokens (text A: identical in all candidates of a row) at fixed positions
    masked_positions = [[2, 4, 6], [1, 3]]
    for b, positions in enumerate(masked_positions):
        for pos in positions:
            labels[b, pos] = input_ids[b, 0, pos]
            input_ids[b, :, pos] = tok.mask_token_id
    # mlm_mask: the query span ([CLS] + text A), minus one labelled position in row 1
    mlm_mask = ((c.token_type_ids[:, 0] == 0) & (c.attention_mask[:, 0] == 1)).long()
    mlm_mask[1, 3] = 0
    gen = torch.Generator().manual_seed(1234)
    relevance_score = torch.randn((batch, 3), generator=gen)
    inputs = {"input_ids": input_ids, "attention_mask": c.attention_mask, "token_type_ids": c.token_type_ids}
    return inputs, labels, mlm_mask, relevance_score, masked_positions


@torch.no_grad()
def run_encoder(model: RealmKnowledgeAugEncoder, tok) -> tuple[dict, dict]:
    inputs, labels, mlm_mask, relevance_score, masked_positions = encoder_inputs(tok)
    out = model(**inputs, relevance_score=relevance_score, labels=labels, mlm_mask=mlm_mask, return_dict=True)
    out_nomask = model(**inputs, relevance_score=relevance_score, labels=labels, return_dict=True)
    out_nolabels = model(**inputs, return_dict=True)
    assert out_nolabels.loss is None
    assert torch.equal(out_nolabels.logits, out.logits)
    tensors = dict(inputs)
    tensors.update(
        {
            "relevance_score": relevance_score,
            "labels": labels,
            "mlm_mask": mlm_mask,
            "logits": out.logits,
            "loss": out.loss,
            "loss_without_mlm_mask": out_nomask.loss,
        }
    )
    info = {
        "queries": ENCODER_QUERIES,
        "blocks": ENCODER_BLOCKS,
        "batch_encode_candidates_kwargs": {"max_length": ENCODER_MAX_LENGTH, "truncation": True},
        "masked_positions": masked_positions,
    }
    return tensors, info


class ReaderProbe:
    """Forward hooks that capture the reader's inputs and its raw per-span logits (not returned by legacy)."""

    def __init__(self, reader: RealmReader):
        self.inputs = None
        self.span_logits = None
        self.starts = None
        self.ends = None
        self._handles = [
            reader.register_forward_pre_hook(self._pre, with_kwargs=True),
            reader.qa_outputs.register_forward_hook(self._post),
        ]

    def _pre(self, module, args, kwargs):
        self.inputs = {k: v.detach().clone() for k, v in kwargs.items() if isinstance(v, torch.Tensor)}

    def _post(self, module, args, output):
        # the reader adds the retriever logits to this tensor *in place* afterwards: clone now
        logits, starts, ends = output
        self.span_logits = logits.detach().clone()
        self.starts, self.ends = starts.detach().clone(), ends.detach().clone()

    def remove(self):
        for h in self._handles:
            h.remove()


def reader_output_tensors(out, prefix: str = "") -> dict:
    t = {
        f"{prefix}block_idx": out.block_idx,
        f"{prefix}candidate": out.candidate,
        f"{prefix}start_pos": out.start_pos,
        f"{prefix}end_pos": out.end_pos,
    }
    if out.loss is not None:
        t.update(
            {
                f"{prefix}loss": out.loss,
                f"{prefix}retriever_loss": out.retriever_loss,
                f"{prefix}reader_loss": out.reader_loss,
                f"{prefix}retriever_correct": out.retriever_correct,
                f"{prefix}reader_correct": out.reader_correct,
            }
        )
    return t


@torch.no_grad()
def run_reader(model: RealmReader, tok) -> tuple[dict, dict]:
    cfg = model.config
    retriever = RealmRetriever(np.array([s.encode() for s in BLOCK_RECORDS], dtype=object), tok)
    question_ids = tok([READER_QUESTION], return_tensors="pt").input_ids
    answer_ids = answer_ids_of(tok, READER_ANSWERS)
    has_answers, start_pos, end_pos, concat = retriever(
        np.array(READER_BLOCK_IDS), question_ids, answer_ids, max_length=cfg.reader_seq_len
    )
    block_mask = concat.special_tokens_mask.bool().logical_not() & concat.token_type_ids.bool()
    has_answers = torch.tensor(has_answers, dtype=torch.bool)
    start_positions = torch.tensor(start_pos, dtype=torch.long)
    end_positions = torch.tensor(end_pos, dtype=torch.long)
    gen = torch.Generator().manual_seed(4321)
    relevance_score = torch.randn(len(READER_BLOCK_IDS), generator=gen)
    n = cfg.reader_beam_size
    inputs = {
        "input_ids": concat.input_ids[:n],
        "attention_mask": concat.attention_mask[:n],
        "token_type_ids": concat.token_type_ids[:n],
    }
    probe = ReaderProbe(model)
    try:
        out = model(
            **inputs,
            relevance_score=relevance_score,
            block_mask=block_mask,
            start_positions=start_positions,
            end_positions=end_positions,
            has_answers=has_answers,
            return_dict=True,
        )
        span_logits, starts, ends = probe.span_logits, probe.starts, probe.ends
        out_nolabels = model(**inputs, relevance_score=relevance_score, block_mask=block_mask, return_dict=True)
        assert torch.equal(probe.span_logits, span_logits)
    finally:
        probe.remove()
    tensors = dict(inputs)
    tensors.update(
        {
            "all_input_ids": concat.input_ids,
            "all_token_type_ids": concat.token_type_ids,
            "all_attention_mask": concat.attention_mask,
            "special_tokens_mask": concat.special_tokens_mask,
            "block_mask": block_mask,
            "relevance_score": relevance_score,
            "has_answers": has_answers,
            "start_positions": start_positions,
            "end_positions": end_positions,
            "span_logits": span_logits,
            "candidate_starts": starts,
            "candidate_ends": ends,
        }
    )
    tensors.update(reader_output_tensors(out))
    tensors.update(reader_output_tensors(out_nolabels, prefix="nolabels."))
    predicted = concat.input_ids[out.block_idx][out.start_pos : out.end_pos + 1]
    info = {
        "question": READER_QUESTION,
        "answers": READER_ANSWERS,
        "answer_ids": answer_ids,
        "block_ids": READER_BLOCK_IDS,
        "blocks": [BLOCK_RECORDS[i] for i in READER_BLOCK_IDS],
        "predicted_answer_ids": predicted.tolist(),
        "predicted_answer": tok.decode(predicted),
    }
    return tensors, info


@torch.no_grad()
def run_openqa(model: RealmForOpenQA, tok) -> tuple[dict, dict]:
    cfg = model.config
    assert not model.training and model.searcher_beam_size == cfg.reader_beam_size
    tensors = {"block_emb": model.block_emb}
    questions = []
    for qi, (question, answers) in enumerate(OPENQA_QUESTIONS):
        p = f"q{qi}."
        enc = tok([question], return_tensors="pt")
        answer_ids = answer_ids_of(tok, answers)
        # retrieval, recomputed exactly as the legacy forward does it (eval mode: k = reader_beam_size)
        question_projection = model.embedder(**enc, return_dict=True).projected_score
        block_scores = torch.einsum("BD,QD->QB", model.block_emb, question_projection)
        top_scores, top_ids = torch.topk(block_scores, k=model.searcher_beam_size, dim=-1)
        entry = {"question": question, "answers": answers, "answer_ids": answer_ids}
        tensors.update(
            {
                p + "input_ids": enc.input_ids,
                p + "attention_mask": enc.attention_mask,
                p + "token_type_ids": enc.token_type_ids,
                p + "answer_ids": pad_ragged(answer_ids),
                p + "question_projection": question_projection,
                p + "block_scores": block_scores,
                p + "retrieved_block_ids": top_ids.squeeze(0),
                p + "retrieved_scores": top_scores.squeeze(0),
            }
        )
        for mode, ans in (("", answer_ids), ("noanswer.", None)):
            probe = ReaderProbe(model.reader)
            try:
                out = model(**enc, answer_ids=ans, return_dict=True)
            finally:
                probe.remove()
            ro = out.reader_output
            assert probe.inputs is not None and probe.span_logits is not None
            tensors.update(reader_output_tensors(ro, prefix=p + mode))
            tensors[p + mode + "predicted_answer_ids"] = out.predicted_answer_ids
            tensors[p + mode + "span_logits"] = probe.span_logits
            ri = probe.inputs
            tensors[p + mode + "reader_relevance_score"] = ri["relevance_score"]
            if mode == "":
                # reader inputs built by the retriever from the retrieved blocks (same with/without answers)
                for k in ("input_ids", "attention_mask", "token_type_ids", "block_mask"):
                    tensors[p + "reader_" + k] = ri[k]
                for k in ("has_answers", "start_positions", "end_positions"):
                    tensors[p + k] = ri[k]
                entry["has_answers"] = ri["has_answers"].tolist()
                entry["retrieved_block_ids"] = top_ids.squeeze(0).tolist()
                entry["retrieved_blocks"] = [BLOCK_RECORDS[i] for i in entry["retrieved_block_ids"]]
                entry["reader_question_text"] = tok.decode(enc.input_ids[0], skip_special_tokens=True)
                entry["loss"] = ro.loss.item()
            entry[mode + "predicted_answer_ids"] = out.predicted_answer_ids.tolist()
            entry[mode + "predicted_answer"] = tok.decode(out.predicted_answer_ids)
        questions.append(entry)
    info = {"block_records": BLOCK_RECORDS, "questions": questions}
    return tensors, info


# --------------------------------------------------------------------------------------------------
# Build, save, verify
# --------------------------------------------------------------------------------------------------

SEEDS = {"embedder": 11, "scorer": 12, "encoder": 13, "reader": 14, "openqa": 15}
RUNNERS = {
    "embedder": (RealmEmbedder, run_embedder),
    "scorer": (RealmScorer, run_scorer),
    "encoder": (RealmKnowledgeAugEncoder, run_encoder),
    "reader": (RealmReader, run_reader),
    "openqa": (RealmForOpenQA, run_openqa),
}


def build_model(name: str, config: RealmConfig, tok):
    cls = RUNNERS[name][0]
    torch.manual_seed(SEEDS[name])
    if name == "openqa":
        retriever = RealmRetriever(np.array([s.encode() for s in BLOCK_RECORDS], dtype=object), tok)
        model = cls(config, retriever=retriever)
        gen = torch.Generator().manual_seed(SEEDS[name] + 1000)
        model.block_emb.copy_(torch.randn(model.block_emb.shape, generator=gen, dtype=torch.float32))
    else:
        model = cls(config)
    perturb_(model, SEEDS[name])
    return model.eval()


def generate(out: Path) -> dict:
    vocab = build_vocab()
    (out / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = RealmTokenizer(str(out / "vocab.txt"))
    config = tiny_config(len(vocab))
    summary = {}
    for name, (_, runner) in RUNNERS.items():
        d = out / name
        d.mkdir()
        model = build_model(name, config, tok)
        model.save_pretrained(d, safe_serialization=False)
        tok.save_pretrained(d)
        if name == "openqa":
            model.retriever.save_pretrained(d)  # block_records.npy (pickled object array) + tokenizer again
        tensors, info = runner(model, tok)
        state_keys = sorted(model.state_dict().keys())
        info = {
            "model_class": type(model).__name__,
            "produced_by": "scripts/make_legacy_fixtures.py",
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__,
            **info,
            "state_dict_keys": state_keys,
            "saved_keys": saved_keys(d),
        }
        save_tensors(tensors, d / "expected_outputs.safetensors")
        write_json(info, d / "expected_outputs.json")
        summary[name] = info
    return summary


def verify(out: Path) -> None:
    os.environ["TRUST_REMOTE_CODE"] = "True"  # our own block_records.npy, written a moment ago
    for name, (cls, runner) in RUNNERS.items():
        d = out / name
        tok = RealmTokenizer.from_pretrained(d)
        assert type(tok) is RealmTokenizer
        if name == "openqa":
            retriever = RealmRetriever.from_pretrained(d)  # AutoTokenizer inside: the fast tokenizer
            assert isinstance(retriever.tokenizer, (RealmTokenizer, RealmTokenizerFast)), type(retriever.tokenizer)
            print(f"verify openqa: RealmRetriever.from_pretrained tokenizer is {type(retriever.tokenizer).__name__}")
            assert list(retriever.block_records) == [s.encode() for s in BLOCK_RECORDS]
            model = cls.from_pretrained(d, retriever=retriever)
        else:
            model = cls.from_pretrained(d)
        assert not model.training
        tensors, info = runner(model, tok)
        expected = load_file(str(d / "expected_outputs.safetensors"))
        diff = compare(expected, tensors, name)
        stored = json.loads((d / "expected_outputs.json").read_text())
        for k, v in info.items():
            assert json_close(stored[k], v), (name, k, stored[k], v)
        assert stored["state_dict_keys"] == sorted(model.state_dict().keys()), name
        # the fast tokenizer (what AutoTokenizer gives) must agree with the slow one on these inputs
        fast = RealmTokenizerFast.from_pretrained(d)
        if name == "openqa":
            fast_tensors, _ = runner(
                RealmForOpenQA.from_pretrained(d, retriever=RealmRetriever(retriever.block_records, fast)), fast
            )
        else:
            fast_tensors, _ = runner(model, fast)
        fast_diff = compare(expected, fast_tensors, name + " (fast tokenizer)")
        print(f"verify {name:9s} reload max abs diff {diff:.3g}  fast-tokenizer max abs diff {fast_diff:.3g}")


def check_informative(summary: dict, out: Path) -> None:
    qs = summary["openqa"]["questions"]
    with_answer = [q["question"] for q in qs if any(q["has_answers"])]
    assert len(with_answer) >= 2, with_answer
    assert all(q["loss"] > 0 for q in qs if any(q["has_answers"])), [q["loss"] for q in qs]
    reader = load_file(str(out / "reader" / "expected_outputs.safetensors"))
    assert reader["has_answers"].any() and not reader["has_answers"].all()
    assert reader["reader_correct"].any() and reader["loss"] > 0


def main() -> int:
    torch.manual_seed(0)
    np.random.seed(0)
    OUT_DIR.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".legacy-tmp-", dir=OUT_DIR.parent))
    try:
        readme = OUT_DIR / "README.md"
        if readme.exists():
            shutil.copy2(readme, tmp / "README.md")
        summary = generate(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; safetensors writes 0600 files
        for f in tmp.rglob("*"):
            os.chmod(f, 0o755 if f.is_dir() else 0o644)
        verify(tmp)
        check_informative(summary, tmp)
        old = OUT_DIR.with_name(OUT_DIR.name + ".old")
        if OUT_DIR.exists():
            os.replace(OUT_DIR, old)
        os.replace(tmp, OUT_DIR)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    total = sum(f.stat().st_size for f in OUT_DIR.rglob("*") if f.is_file())
    print(f"wrote {OUT_DIR.relative_to(REPO_ROOT)}: {total / 1e6:.2f} MB")
    for q in summary["openqa"]["questions"]:
        print(
            f"  {q['question']!r}: retrieved {q['retrieved_block_ids']} has_answers {q['has_answers']} "
            f"loss {q['loss']:.4f} predicted {q['predicted_answer']!r}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
