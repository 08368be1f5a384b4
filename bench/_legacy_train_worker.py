"""Legacy half of `bench/train_step.py`: times a training step of transformers 4.57.6's `RealmForOpenQA`.

Runs inside the *legacy* venv (transformers 4.57.6, the last release with `transformers.models.deprecated.realm`);
`bench/train_step.py` starts it as a subprocess on a checkpoint directory it wrote in the legacy layout (config.json,
pytorch_model.bin with the `block_emb` buffer, tokenizer files, pickled block_records.npy). A step is one
forward/backward call per question of the batch (the legacy model refuses batches larger than 1; its retriever
tokenizes every question/block pair of the searcher beam to find the answers), the losses averaged, then an AdamW
step. The first batch is an untimed warm-up; the median of the others is written to a JSON file.

    /path/to/legacy-venv/bin/python bench/_legacy_train_worker.py --model-dir DIR --examples e.json --out t.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

# The bench wrote block_records.npy itself a moment ago; the legacy loader unpickles it only with this set.
os.environ["TRUST_REMOTE_CODE"] = "True"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--examples", required=True, help="JSON: batches of {question, answers}")
    parser.add_argument("--out", required=True)
    parser.add_argument("--beam", type=int, required=True, help="searcher_beam_size")
    parser.add_argument("--learning-rate", type=float, default=1e-5)
    parser.add_argument("--threads", type=int)
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
    with open(args.examples) as f:
        batches = json.load(f)
    retriever = RealmRetriever.from_pretrained(args.model_dir)
    tokenizer = retriever.tokenizer
    model, info = RealmForOpenQA.from_pretrained(args.model_dir, retriever=retriever, output_loading_info=True)
    model.config.searcher_beam_size = args.beam
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.learning_rate)

    seconds, with_answer = [], []
    for step, batch in enumerate(batches):
        start = time.perf_counter()
        for example in batch:
            question_ids = tokenizer([example["question"]], return_tensors="pt")
            answer_ids = [ids for ids in tokenizer(example["answers"], add_special_tokens=False).input_ids if ids]
            out = model(**question_ids, answer_ids=answer_ids, return_dict=True)
            (out.reader_output.loss / len(batch)).backward()
            with_answer.append(int(out.reader_output.retriever_correct.sum()))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step:
            seconds.append(time.perf_counter() - start)

    payload = {
        "step_s": statistics.median(seconds),
        "steps": seconds,
        "blocks_with_answer": statistics.mean(with_answer),
        "loading_info": {k: sorted(map(str, v)) for k, v in info.items()},
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f)
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
