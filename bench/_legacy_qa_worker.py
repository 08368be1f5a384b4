"""Legacy half of `bench/qa.py`: times transformers 4.57.6's `RealmForOpenQA`, one question per call.

Runs inside the *legacy* venv (transformers 4.57.6, the last release with `transformers.models.deprecated.realm`),
never in realm-hf's own environment; `bench/qa.py` starts it as a subprocess. It loads the checkpoint directory that
`bench/qa.py` wrote in the legacy layout (config.json, pytorch_model.bin with the `block_emb` buffer, tokenizer files,
pickled block_records.npy), answers each question the way the legacy model card shows (`tokenizer([question])`, then
`model(**question_ids, return_dict=True)`: brute-force inner products against every row of `block_emb`, top-k, reader),
and writes the decoded answers and the elapsed time to a JSON file. The first `--warmup` questions are answered once
before the clock starts and then again inside the timed loop, so every question is timed; with `--repeats` the fastest pass counts.

    /path/to/legacy-venv/bin/python bench/_legacy_qa_worker.py --model-dir DIR --questions q.json --out a.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# The bench wrote block_records.npy itself a moment ago; the legacy loader unpickles it only with this set.
os.environ["TRUST_REMOTE_CODE"] = "True"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--questions", required=True, help="JSON list of question strings")
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--warmup", type=int, default=2, help="questions answered once, untimed, before timing")
    parser.add_argument("--repeats", type=int, default=1, help="timed passes; the fastest counts")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads")
    args = parser.parse_args()

    import torch
    import transformers

    try:
        from transformers.models.deprecated.realm import RealmForOpenQA, RealmRetriever
    except ImportError as err:
        print(
            f"error: transformers {transformers.__version__} in {sys.executable} has no legacy REALM "
            f"(transformers.models.deprecated.realm): {err}. Install transformers==4.57.6 in this venv.",
            file=sys.stderr,
        )
        return 3
    if args.threads:
        torch.set_num_threads(args.threads)

    with open(args.questions) as f:
        questions = json.load(f)
    retriever = RealmRetriever.from_pretrained(args.model_dir)
    tokenizer = retriever.tokenizer
    model, info = RealmForOpenQA.from_pretrained(args.model_dir, retriever=retriever, output_loading_info=True)
    model.eval()

    def answer(question: str) -> dict:
        question_ids = tokenizer([question], return_tensors="pt")
        out = model(**question_ids, return_dict=True)
        ids = out.predicted_answer_ids
        return {
            "answer": tokenizer.decode(ids),
            "ids": ids.tolist(),
            "block_idx": int(out.reader_output.block_idx),
            "start": int(out.reader_output.start_pos.reshape(-1)[0]),
        }

    with torch.inference_mode():
        for question in questions[: args.warmup]:
            answer(question)
        elapsed, results = float("inf"), None
        for _ in range(max(1, args.repeats)):
            start = time.perf_counter()
            answers = [answer(question) for question in questions]
            elapsed = min(elapsed, time.perf_counter() - start)
            results = results if results is not None else answers

    payload = {
        "answers": [r["answer"] for r in results],
        "answer_ids": [r["ids"] for r in results],
        "block_idx": [r["block_idx"] for r in results],
        "elapsed_s": elapsed,
        "num_questions": len(questions),
        "loading_info": {k: sorted(map(str, v)) for k, v in info.items()},
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "num_blocks": int(model.block_emb.shape[0]),
    }
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f)
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
