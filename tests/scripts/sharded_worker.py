"""Worker for tests/retrieval/test_sharding.py: a ShardedRealmRetriever on 2 processes (gloo, CPU).

Run under `accelerate launch --multi_gpu --num_processes 2` with ACCELERATE_USE_CPU=1.
Usage: `sharded_worker.py OUT_DIR THREE_SHARD_SAVE`. Each process writes OUT_DIR/rank{R}.json with what its sharded
searches returned (the test compares them with a single-process RealmRetriever it builds itself), and saves a sharded
corpus into OUT_DIR/saved-{flat,ivf}; after a few training steps with refreshes, process 0 saves the document
embedder's weights (OUT_DIR/document_embedder.safetensors) so the test can re-embed a single retriever with them.
"""

import json
import os
import sys

import numpy as np
import torch
from accelerate import Accelerator, DistributedDataParallelKwargs
from safetensors.torch import save_file
from torch.utils.data import DataLoader

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures")
LEGACY_OPENQA = os.path.join(FIXTURES, "legacy", "openqa")
NUM_BLOCKS, DIM, K = 300, 16, 7
# Per-process batch sizes of each search: different on the two processes, none on one, and one batch large enough
# (41 questions in all) for FAISS's BLAS path.
BATCHES = [(3, 5), (0, 4), (1, 1), (24, 17)]
# Exhaustive IVF: every inverted list probed, in the single index and in each shard's (nlist <= 4 everywhere).
SEARCH_PARAMS = {"Flat": {}, "IVF4,Flat": {"nprobe": 4}}


def search_corpus(index: str):
    """The single-process retriever the sharded ones are compared with (the same in every process and in the test)."""
    from transformers import BertTokenizer

    from realm_hf.retrieval.retriever import RealmRetriever

    rng = np.random.default_rng(0)
    embeddings = rng.standard_normal((NUM_BLOCKS, DIM)).astype(np.float32)
    words = ["island", "plateau", "observatory", "language", "volcanic", "harbour"]
    texts = [f"{words[i % 6]} block {i} of the {words[(i * 7) % 6]}" for i in range(NUM_BLOCKS)]
    tokenizer = BertTokenizer(vocab=os.path.join(FIXTURES, "corpus", "vocab.txt"))
    titles = [f"t{i}" for i in range(NUM_BLOCKS)]
    return RealmRetriever.from_embeddings(embeddings, texts, titles=titles, tokenizer=tokenizer, index=index)


def questions(case: int) -> list[np.ndarray]:
    """The questions of each process for search `case`."""
    rng = np.random.default_rng(100 + case)
    sizes = BATCHES[case]
    allq = rng.standard_normal((sum(sizes), DIM)).astype(np.float32)
    return [allq[: sizes[0]], allq[sizes[0] :]]


def dump(search) -> dict:
    tokens, lengths = search["token_ids"]
    return {
        "ids": search["out"].block_ids.tolist(),
        "scores": search["out"].scores.tolist(),
        "texts": [[block["text"] for block in row] for row in search["out"].blocks],
        "embeddings": search["out"].block_embeddings.tolist(),
        "tokens": tokens.tolist(),
        "lengths": lengths.tolist(),
    }


def sharded_searches(sharded, rank: int, params: dict) -> list[dict]:
    results = []
    for case in range(len(BATCHES)):
        mine = torch.from_numpy(questions(case)[rank])
        out = sharded.search(mine, K, return_embeddings=True, return_token_ids=True, **params)
        results.append(dump({"out": out, "token_ids": (out.block_token_ids, out.block_token_lengths)}))
    return results


def documents() -> list[dict]:
    """The tiny corpus's documents without their doc ids (so positional doc ids are exercised too)."""
    with open(os.path.join(FIXTURES, "corpus", "documents.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [{"title": row["title"], "text": row["text"]} for row in rows]


def build_from_documents(record: dict) -> None:
    """Each process splits and embeds half of the documents."""
    from realm_hf import RealmForOpenQA, ShardedRealmRetriever

    model = RealmForOpenQA.from_pretrained(LEGACY_OPENQA, allow_pickle=True)
    sharded = ShardedRealmRetriever.from_documents(
        documents(), model.embedder, model.retriever.tokenizer, max_block_length=48, show_progress=False
    )
    shard = sharded.shards[0]
    record["documents"] = {
        "num_blocks": len(sharded),
        "block_ids": shard.store.block_ids.tolist(),
        "doc_ids": list(shard.corpus["doc_id"]),
        "texts": list(shard.corpus["text"]),
        "embeddings": shard.store.embeddings(torch.as_tensor(shard.store.block_ids)).tolist(),
    }


def train_with_refreshes(accelerator, record: dict, out_dir: str) -> None:
    """A few Open-QA training steps retrieving through shards, the document embedder refreshing each shard locally."""
    from tiny_openqa import QUESTIONS, end_to_end_model  # this script's folder: run as a script only

    import realm_hf.retrieval.refresh as refresh_module
    from realm_hf import ShardedRealmRetriever
    from realm_hf.retrieval.refresh import is_stale
    from realm_hf.training.callbacks import RealmReindexCallback
    from realm_hf.training.openqa import DataCollatorForOpenQA

    model = end_to_end_model()
    sharded = ShardedRealmRetriever.from_retriever(model.retriever)
    model.set_retriever(sharded)
    record["refresh_local_blocks"] = sharded.local_block_ids.tolist()

    def no_gathering(*args, **kwargs):
        raise AssertionError("a sharded refresh must not gather embeddings")

    refresh_module.gather_rows = no_gathering
    collator = DataCollatorForOpenQA(sharded.tokenizer)
    loader = DataLoader(QUESTIONS, batch_size=len(QUESTIONS) // accelerator.num_processes, collate_fn=collator)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    reindex = RealmReindexCallback(sharded, refresh_steps=2, background=False, refresh_at_end=False)
    model.train()
    step, losses = 0, []
    for _ in range(4):
        for batch in loader:
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            losses.append(loss.item())
            reindex.step(step, model)
    document_embedder = accelerator.unwrap_model(model).document_embedder
    record["refreshes"] = reindex.refresh_count
    record["failed_refreshes"] = reindex.failed_refreshes
    record["losses"] = losses
    record["stale_after"] = is_stale(sharded, document_embedder)
    record["refresh_local_embeddings"] = [
        shard.store.embeddings(torch.as_tensor(shard.store.block_ids)).tolist() for shard in sharded.shards
    ]
    queries = torch.from_numpy(np.random.default_rng(7 + accelerator.process_index).standard_normal((3, 16)))
    out = sharded.search(queries.float(), 12)
    record["refresh_queries"] = queries.float().tolist()
    record["refresh_ids"], record["refresh_scores"] = out.block_ids.tolist(), out.scores.tolist()
    if accelerator.is_main_process:
        state = {name: tensor.detach().clone() for name, tensor in document_embedder.state_dict().items()}
        save_file(state, os.path.join(out_dir, "document_embedder.safetensors"))


def train_with_trainer(record: dict, out_dir: str) -> None:
    """RealmOpenQATrainer with checkpoints: every process saves its shard into checkpoint-2/retriever/, and resuming
    from it restores the shards."""
    import datasets
    from tiny_openqa import QUESTIONS, end_to_end_model  # this script's folder: run as a script only
    from transformers import TrainingArguments

    from realm_hf import ShardedRealmRetriever
    from realm_hf.retrieval.refresh import refresh_index_state
    from realm_hf.training.callbacks import RealmReindexCallback
    from realm_hf.training.openqa import RealmOpenQATrainer

    model = end_to_end_model(dropout=True)
    sharded = ShardedRealmRetriever.from_retriever(model.retriever)
    model.set_retriever(sharded)

    def run(max_steps: int, resume: bool):
        args = TrainingArguments(
            output_dir=os.path.join(out_dir, "trainer"),
            per_device_train_batch_size=2,
            max_steps=max_steps,
            learning_rate=0.02,
            optim="sgd",
            logging_steps=1,
            report_to=[],
            use_cpu=True,
            save_strategy="steps",
            save_steps=2,
            disable_tqdm=True,
            ddp_find_unused_parameters=True,
            seed=0,
            data_seed=0,
        )
        reindex = RealmReindexCallback(sharded, refresh_steps=2, background=False, refresh_at_end=False)
        trainer = RealmOpenQATrainer(
            model=model, args=args, train_dataset=datasets.Dataset.from_list(QUESTIONS), callbacks=[reindex]
        )
        trainer.train(resume_from_checkpoint=resume or None)
        return reindex

    record["trainer_refreshes"] = run(2, False).refresh_count
    # Scramble the live shard, then resume: the checkpoint's shard is swapped back in.
    ids = torch.as_tensor(sharded.shards[0].store.block_ids)
    saved = sharded.shards[0].store.embeddings(ids)
    sharded.swap_index_state(refresh_index_state(sharded, model.embedder))
    record["scrambled"] = not torch.equal(sharded.shards[0].store.embeddings(ids), saved)
    resumed = run(2, True)
    record["restored"] = torch.equal(sharded.shards[0].store.embeddings(ids), saved)
    record["resumed_refresh_count"] = resumed.refresh_count


def main(out_dir: str, three_shard_save: str) -> None:
    from realm_hf import ShardedRealmRetriever

    accelerator = Accelerator(cpu=True, kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
    rank = accelerator.process_index
    record = {"world_size": accelerator.num_processes, "rank": rank}
    for index, params in SEARCH_PARAMS.items():
        full = search_corpus(index)
        sharded = ShardedRealmRetriever.from_retriever(full)
        record[f"{index}/local_blocks"] = sharded.local_block_ids.tolist()
        record[f"{index}/num_blocks"] = len(sharded)
        record[index] = sharded_searches(sharded, rank, params)
        # Saved as 2 shards, loaded back on 2 processes.
        folder = os.path.join(out_dir, "saved-" + index.split(",")[0].lower())
        sharded.save_pretrained(folder)
        loaded = ShardedRealmRetriever.from_pretrained(folder)
        record[f"{index}/reloaded"] = sharded_searches(loaded, rank, params)
        if index != "Flat":
            # One probe per shard: not exhaustive, but a sharded save loads back into the same shards.
            out = loaded.search(torch.from_numpy(questions(0)[rank]), K, nprobe=1)
            record["ivf_nprobe1"] = {"ids": out.block_ids.tolist(), "scores": out.scores.tolist()}
    try:
        ShardedRealmRetriever.from_pretrained(three_shard_save)
        record["three_shards_error"] = None
    except ValueError as err:
        record["three_shards_error"] = str(err)
    try:
        sharded.texts(torch.tensor([0 if rank else NUM_BLOCKS - 1]))  # a block of the other process
        record["remote_lookup_error"] = None
    except ValueError as err:
        record["remote_lookup_error"] = str(err)
    try:
        sharded.search(torch.zeros(2, DIM), K + rank)  # the processes disagree on k
        record["k_mismatch_error"] = None
    except ValueError as err:
        record["k_mismatch_error"] = str(err)
    build_from_documents(record)
    train_with_refreshes(accelerator, record, out_dir)
    train_with_trainer(record, out_dir)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
