"""Worker for tests/models/test_modeling_pretraining.py: REALM pre-training with `Trainer` + `RealmReindexCallback`
under DDP.

Run directly (one process) or under `accelerate launch --multi_gpu --num_processes 2` with ACCELERATE_USE_CPU=1.
Usage: `pretrain_ddp_worker.py OUT.json OUTPUT_DIR {inline,background}`. Writes to OUT.json (from rank 0): the world
size, the losses, the refresh records, the final index embeddings, and whether every rank ended with the same weights
and the same index. Inline refreshes swap at fixed steps, so runs on 1 and 2 processes can be compared number for
number; background ones swap when ready, which depends on timing.
"""

import json
import os
import sys

import torch
from transformers import Trainer, TrainingArguments

from realm_hf import RealmTokenizer
from realm_hf.models.modeling_pretraining import RealmForPreTraining
from realm_hf.models.pretraining_inputs import encode_blocks
from realm_hf.retrieval.refresh import is_stale
from realm_hf.retrieval.retriever import RealmRetriever
from realm_hf.training.callbacks import RealmReindexCallback, document_embedder_of
from realm_hf.training.pretraining import DataCollatorForSalientSpanMasking

# Run as a script (by `accelerate launch`): the repository root is not on the path.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from tests.support.pretraining import TEXTS, TITLES, tiny_config  # noqa: E402

LEGACY = os.path.join(os.path.dirname(__file__), "..", "fixtures", "legacy")
# Salient spans as character offsets; block_id is the source block, never retrieved for its own sentence.
EXAMPLES = [
    {"text": "paris is the capital of france .", "salient_spans": [[24, 30]], "block_id": 0},
    {"text": "guido van rossum created python .", "salient_spans": [[25, 31]], "block_id": 3},
    {"text": "berlin is the capital of germany .", "salient_spans": [[25, 32]], "block_id": 6},
    {"text": "linux is an open source operating system kernel .", "salient_spans": [[0, 5]], "block_id": 5},
]


def main(out_path, output_dir, mode):
    tokenizer = RealmTokenizer.from_pretrained(os.path.join(LEGACY, "embedder"))
    torch.manual_seed(0)
    config = tiny_config(tokenizer, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = RealmForPreTraining(config, tokenizer=tokenizer)
    with torch.no_grad():
        blocks = encode_blocks(tokenizer, TITLES, TEXTS, model.max_block_length)
        embeddings = model.embedder.eval()(**blocks).projected_score
    retriever = RealmRetriever.from_embeddings(embeddings, TEXTS, titles=TITLES, tokenizer=tokenizer)
    model.set_retriever(retriever)
    reindex = RealmReindexCallback(
        retriever, refresh_steps=2, background=mode == "background", save_with_checkpoints=False
    )
    # The global batch is 4 in both runs: 1 process x 4 examples, or 2 processes x 2.
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    args = TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=4 // world_size,
        max_steps=4,
        learning_rate=0.5,
        optim="sgd",  # Adam's first steps are sign-like: tiny reduction-order differences would flip updates
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        remove_unused_columns=False,
        disable_tqdm=True,
        ddp_find_unused_parameters=True,
        seed=0,
        data_seed=0,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=EXAMPLES * 4,
        data_collator=DataCollatorForSalientSpanMasking(tokenizer, seed=0, detect_dates_and_numbers=False),
    )
    reindex.attach(trainer)
    trainer.train()

    state = trainer.accelerator
    final_index = retriever.store.embeddings(torch.as_tensor(retriever.store.block_ids).view(1, -1))[0]
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered_index = state.gather(final_index.unsqueeze(0).contiguous())
    gathered_weights = state.gather(weights.unsqueeze(0).contiguous())
    agree = bool(all(torch.equal(gathered_index[0], g) for g in gathered_index))
    agree &= bool(all(torch.equal(gathered_weights[0], g) for g in gathered_weights))
    if state.is_main_process:
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        with open(out_path, "w") as f:
            json.dump(
                {
                    "world_size": state.num_processes,
                    "ranks_agree": agree,
                    "losses": losses,
                    "refreshes": reindex.refresh_count,
                    "history": reindex.history,
                    "stale_after_training": is_stale(retriever, document_embedder_of(model)),
                    "index": final_index.tolist(),
                },
                f,
            )
    state.wait_for_everyone()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
