"""Worker for tests/training/test_openqa.py: five rounds of (training step, index refresh across processes, close),
then exit.

Run under `accelerate launch --multi_gpu --num_processes 2` with ACCELERATE_USE_CPU=1. Each round's refresh creates the
callback's two gloo groups; `close()` must destroy them, so the number of process groups is back where it started
after every round. Writes the counts seen after each round to argv[1] (rank 0). The run must also exit: a run that left
the groups alive hung at exit about once in five.
"""

import json
import sys

import torch
from accelerate import Accelerator, DistributedDataParallelKwargs
from tiny_openqa import QUESTIONS, end_to_end_model
from torch.distributed import distributed_c10d
from torch.utils.data import DataLoader

from realm_hf.training.callbacks import RealmReindexCallback
from realm_hf.training.openqa import DataCollatorForOpenQA

ROUNDS = 5


def main(out_path):
    accelerator = Accelerator(cpu=True, kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
    model = end_to_end_model()
    retriever = model.retriever
    loader = DataLoader(QUESTIONS[:2], batch_size=1, collate_fn=DataCollatorForOpenQA(retriever.tokenizer))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    baseline = len(distributed_c10d._world.pg_map)
    counts = []
    for _ in range(ROUNDS):
        reindex = RealmReindexCallback(retriever, refresh_steps=1, background=True)
        batch = next(iter(loader))
        accelerator.backward(model(**batch).loss)
        optimizer.step()
        optimizer.zero_grad()
        reindex.step(1, model)  # starts a refresh: creates the gloo groups
        reindex.wait(1)
        assert reindex.refresh_count == 1
        reindex.close()
        counts.append(len(distributed_c10d._world.pg_map))
    if accelerator.is_main_process:
        with open(out_path, "w") as f:
            json.dump({"world_size": accelerator.num_processes, "baseline": baseline, "after_close": counts}, f)
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main(sys.argv[1])
