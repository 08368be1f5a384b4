"""Worker for tests/training/test_openqa.py: a short DDP training run, then an index refresh split across processes.

Run directly (one process) or under `accelerate launch --multi_gpu --num_processes 2` with ACCELERATE_USE_CPU=1.
Writes the refreshed index's embeddings (from rank 0) and whether all ranks hold the same index to argv[1].
"""

import json
import sys

import torch
from accelerate import Accelerator, DistributedDataParallelKwargs
from tiny_openqa import QUESTIONS, end_to_end_model
from torch.utils.data import DataLoader

from realm_hf.training.callbacks import RealmReindexCallback
from realm_hf.training.openqa import DataCollatorForOpenQA


def main(out_path):
    # The legacy checkpoints' unused MLM heads get no gradient.
    accelerator = Accelerator(cpu=True, kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
    model = end_to_end_model()
    retriever = model.retriever
    collator = DataCollatorForOpenQA(retriever.tokenizer)
    # The global batch is 4 in both runs: 1 process x 4 questions, or 2 processes x 2.
    per_process = len(QUESTIONS) // accelerator.num_processes
    loader = DataLoader(QUESTIONS, batch_size=per_process, shuffle=False, collate_fn=collator)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    reindex = RealmReindexCallback(retriever, refresh_steps=2, background=True)
    model.train()
    step = 0
    for _ in range(2):
        for batch in loader:
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            reindex.step(step, model)
    reindex.wait(step)
    assert reindex.refresh_count >= 1, "no refresh happened"
    ids = torch.as_tensor(retriever.store.block_ids).view(1, -1)
    embeddings = retriever.store.embeddings(ids)[0]
    gathered = accelerator.gather(embeddings.unsqueeze(0).contiguous())
    agree = bool(all(torch.equal(gathered[0], g) for g in gathered))
    if accelerator.is_main_process:
        with open(out_path, "w") as f:
            json.dump(
                {"world_size": accelerator.num_processes, "ranks_agree": agree, "embeddings": embeddings.tolist()}, f
            )
    accelerator.wait_for_everyone()
    reindex.close()


if __name__ == "__main__":
    main(sys.argv[1])
