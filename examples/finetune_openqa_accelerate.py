"""Open-QA fine-tuning of `RealmForOpenQA` in a plain training loop with 🤗 Accelerate (one or several processes).

The same recipe as `examples/finetune_openqa.py` (same arguments, corpus, questions and model), written as an
explicit loop: `accelerator.prepare`, forward/backward/step, and, when the document embedder trains end to end,
`reindexer.step(global_step, model)` after each optimizer step, which swaps in a finished index refresh and starts a
new one every `--refresh-steps` steps while training goes on.

With several processes (DDP) each process trains on its share of every batch, evaluates its share of the questions,
and embeds its share of the corpus at each refresh; the shares are gathered so all processes swap in the same index at
the same step. The corpus is embedded once, by the main process, before training.

    python examples/finetune_openqa_accelerate.py --train-document-embedder --max-steps 20
    # two CPU processes with gloo:
    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 --main_process_port 29519 \\
        examples/finetune_openqa_accelerate.py --train-document-embedder --max-steps 4
    # checkpoint every 10 steps, then resume:
    python examples/finetune_openqa_accelerate.py --train-document-embedder --save-steps 10
    python examples/finetune_openqa_accelerate.py --train-document-embedder \\
        --resume-from-checkpoint openqa_output/checkpoints/checkpoint-10

Outputs as in the Trainer example: `OUTPUT_DIR/model` (weights, tokenizer, corpus, index) and `results.json`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import finetune_openqa as recipe  # noqa: E402  (arguments, corpus, questions, model and saving)

TRAINING_STATE_NAME = "training_state.json"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    recipe.add_common_args(parser)
    parser.add_argument("--logging-steps", type=int, default=5)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    return parser.parse_args(argv)


def build_on_every_process(args, accelerator):
    """
    Build model, corpus and questions on each process, embedding the corpus only once: the main process builds and
    saves the retriever and the questions, the others load them (so every process holds the same index).
    """
    if accelerator.num_processes == 1 or (args.corpus is not None and os.path.isdir(args.corpus)):
        return recipe.build_model_and_data(args)
    shared_dir = os.path.join(args.output_dir, "initial_corpus")
    with accelerator.main_process_first():
        if accelerator.is_main_process:
            built = recipe.build_model_and_data(args)
            model, tokenizer, retriever, train_questions, eval_questions = built
            retriever.save_pretrained(shared_dir)
            for name, rows in (("train.jsonl", train_questions), ("eval.jsonl", eval_questions)):
                tmp = os.path.join(shared_dir, f".{name}.tmp")
                with open(tmp, "w", encoding="utf-8") as f:
                    f.writelines(json.dumps(row) + "\n" for row in rows)
                os.replace(tmp, os.path.join(shared_dir, name))
        else:
            local = argparse.Namespace(**vars(args))
            local.corpus = shared_dir
            if args.train_file is None:
                local.train_file = os.path.join(shared_dir, "train.jsonl")
                local.eval_file = os.path.join(shared_dir, "eval.jsonl")
            built = recipe.build_model_and_data(local)
    return built


def evaluate(accelerator, model, eval_questions: list[dict]) -> dict[str, float]:
    """EM / F1 / recall@k over all evaluation questions, each process answering its share."""
    import datasets

    from realm_hf.training.openqa import evaluate_openqa

    with accelerator.split_between_processes(eval_questions) as shard:
        if shard:
            metrics = evaluate_openqa(
                accelerator.unwrap_model(model),
                datasets.Dataset.from_list(shard),
                recall_ks=(1, 5),
                batch_size=16,
                show_progress=False,
            )
        else:
            metrics = {}
        count = len(shard)
    keys = ["exact_match", "f1", "recall@1", "recall@5"]
    # Every metric is a mean over questions: gather count-weighted sums, divide by the total count.
    local = torch.tensor([count] + [metrics.get(k, 0.0) * count for k in keys], dtype=torch.float64)
    total = accelerator.reduce(local.to(accelerator.device), reduction="sum").cpu()
    return {key: float(total[i + 1] / total[0]) for i, key in enumerate(keys)}


def save_checkpoint(accelerator, reindexer, checkpoint_dir: str, training_state: dict) -> None:
    """Model, optimizer, scheduler, RNG and sampler state (Accelerate), the current index and the loop position."""
    accelerator.save_state(checkpoint_dir)  # every process takes part; the main process writes
    if accelerator.is_main_process:
        if reindexer is not None:
            reindexer.save_checkpoint(checkpoint_dir)
        tmp = os.path.join(checkpoint_dir, f".{TRAINING_STATE_NAME}.tmp")
        with open(tmp, "w") as f:
            json.dump(training_state, f, indent=2)
        os.replace(tmp, os.path.join(checkpoint_dir, TRAINING_STATE_NAME))
    accelerator.wait_for_everyone()


def fewer_processes_than_asked(num_processes: int, environ=os.environ) -> str | None:
    """
    A warning when `accelerate launch` was asked for several processes but this is the only one: its simple launcher
    (`--cpu --num_processes 2`, or `--num_processes 2` without `--multi_gpu` on CPU) sets `MASTER_PORT` for them and
    then starts one process, which `torch.distributed` never names (no `WORLD_SIZE`). `None` when all is as asked.
    """
    if num_processes > 1 or "MASTER_PORT" not in environ or "WORLD_SIZE" in environ:
        return None
    return (
        "accelerate launch was asked for several processes, but only this one started (it trains alone, on every "
        "batch). `accelerate launch --cpu --num_processes N` runs a single process; for N CPU processes run "
        "`ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes N ...` (or `torchrun --nproc_per_node N`)."
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    from accelerate import Accelerator, DistributedDataParallelKwargs
    from accelerate.utils import DataLoaderConfiguration
    from torch.utils.data import DataLoader
    from transformers import get_linear_schedule_with_warmup

    from realm_hf.training.openqa import DataCollatorForOpenQA, mark_reader_trained
    from realm_hf.training.recipes import seed_everything

    accelerator = Accelerator(
        # Heads REALM's Open-QA loss never reaches (e.g. the masked-LM heads kept from BERT) get no gradient.
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)],
        # A seeded sampler makes each epoch's order reproducible, so a resumed run sees the same batches.
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )
    warning = fewer_processes_than_asked(accelerator.num_processes)
    if warning:
        logging.getLogger(__name__).warning(warning)
    if accelerator.is_main_process:
        logging.getLogger("realm_hf").setLevel(logging.INFO)
        os.makedirs(args.output_dir, exist_ok=True)
    accelerator.wait_for_everyone()
    seed_everything(args.seed)  # before the model (its fresh heads) is built
    started = time.perf_counter()

    model, tokenizer, retriever, train_questions, eval_questions = build_on_every_process(args, accelerator)
    reindexer = recipe.make_reindex_callback(args, retriever)
    mode = "end to end" if args.train_document_embedder else "document embedder frozen"

    accelerator.print(f"[finetune] Evaluating before fine-tuning ({accelerator.num_processes} processes) ...")
    before = evaluate(accelerator, model, eval_questions)
    accelerator.print(f"[finetune] before: {json.dumps(before)}")

    loader = DataLoader(
        train_questions, batch_size=args.batch_size, shuffle=True, collate_fn=DataCollatorForOpenQA(tokenizer)
    )
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=args.learning_rate, weight_decay=0.01
    )
    warmup = args.warmup_steps if args.warmup_steps is not None else max(1, args.max_steps // 10)
    # A prepared scheduler steps once per process at each optimizer step, hence the factor.
    scheduler = get_linear_schedule_with_warmup(
        optimizer, warmup * accelerator.num_processes, args.max_steps * accelerator.num_processes
    )
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    global_step, epoch, batches_done = 0, 0, 0
    if args.resume_from_checkpoint:
        accelerator.load_state(args.resume_from_checkpoint)
        with open(os.path.join(args.resume_from_checkpoint, TRAINING_STATE_NAME)) as f:
            position = json.load(f)
        global_step, epoch, batches_done = position["global_step"], position["epoch"], position["batches_done"]
        if reindexer is not None:
            reindexer.load_checkpoint(args.resume_from_checkpoint)  # every process restores the saved index
        accelerator.print(f"[finetune] Resumed from {args.resume_from_checkpoint} at step {global_step}.")

    accelerator.print(
        f"[finetune] Fine-tuning ({mode}) for {args.max_steps} steps of {args.batch_size} questions per process ..."
    )
    model.train()
    train_started = time.perf_counter()
    running_loss, running_count = 0.0, 0
    reader_marked = False
    while global_step < args.max_steps:
        loader.set_epoch(epoch)
        epoch_loader = accelerator.skip_first_batches(loader, batches_done) if batches_done else loader
        for batch in epoch_loader:
            loss = model(**batch).loss
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            if not reader_marked:
                # The reader has been updated: saves now say so (`init_from_bert` left `reader_trained` False).
                mark_reader_trained(model)
                reader_marked = True
            global_step += 1
            batches_done += 1
            running_loss += accelerator.reduce(loss.detach(), reduction="mean").item()
            running_count += 1
            if reindexer is not None:
                # Every process calls it at every step: the swap happens at the same step everywhere.
                refresh_logs = reindexer.step(global_step, model)
                if refresh_logs:
                    accelerator.print(f"[finetune] step {global_step}: {json.dumps(refresh_logs)}")
            if global_step % args.logging_steps == 0:
                lr = scheduler.get_last_lr()[0]
                accelerator.print(
                    f"[finetune] step {global_step}: loss {running_loss / running_count:.4f}, lr {lr:.2e}"
                )
                running_loss, running_count = 0.0, 0
            if args.save_steps > 0 and global_step % args.save_steps == 0:
                checkpoint = os.path.join(args.output_dir, "checkpoints", f"checkpoint-{global_step}")
                save_checkpoint(
                    accelerator,
                    reindexer,
                    checkpoint,
                    {"global_step": global_step, "epoch": epoch, "batches_done": batches_done},
                )
                accelerator.print(f"[finetune] Saved {checkpoint}")
            if global_step >= args.max_steps:
                break
        else:
            epoch, batches_done = epoch + 1, 0
    train_seconds = time.perf_counter() - train_started
    if reindexer is not None:
        # Finish a refresh still running and re-embed once more if the document embedder trained since its
        # snapshot, so the model is evaluated and saved with an index that matches its weights.
        final_logs = reindexer.refresh_if_stale(model, global_step)
        if final_logs:
            accelerator.print(f"[finetune] step {global_step}: {json.dumps(final_logs)}")
        reindexer.close()
        accelerator.print(
            f"[finetune] Index refreshes: {reindexer.refresh_count} ({reindexer.failed_refreshes} failed)"
        )

    accelerator.print("[finetune] Evaluating after fine-tuning ...")
    after = evaluate(accelerator, model, eval_questions)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        results = {
            "mode": mode,
            "processes": accelerator.num_processes,
            "before": before,
            "after": after,
            "train_seconds": round(train_seconds, 1),
            "steps": global_step,
            "refreshes": reindexer.history if reindexer is not None else [],
            "num_blocks": len(retriever),
        }
        model_dir = recipe.save_model(accelerator.unwrap_model(model), tokenizer, args.output_dir, results)
        recipe.print_metrics(before, after)
        print(f"[finetune] Done in {time.perf_counter() - started:.0f}s; model, corpus and index saved in {model_dir}")
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
