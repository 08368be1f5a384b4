"""Asynchronous index refresh while the document embedder trains: [`RealmReindexCallback`]."""

from __future__ import annotations

import copy
import json
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback

from ..constants import MANIFEST_NAME, RETRIEVER_SUBFOLDER
from ..io.atomic import atomic_write
from ..logging_utils import get_logger
from ..retrieval.refresh import is_stale, refresh_index_state, saved_index_state
from ..text.tokenizer_calls import tokenizer_call

logger = get_logger(__name__)

REINDEX_STATE_NAME = "reindex_state.json"


def unwrap_realm_model(model):
    """Strip DDP / Accelerate / PEFT wrappers to reach the REALM model."""
    while True:
        if hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
            model = model.module
        elif hasattr(model, "get_base_model"):
            model = model.get_base_model()
        else:
            return model


def document_embedder_of(model) -> torch.nn.Module:
    """The embedder whose outputs fill the index: the REALM model's `index_embedder`, under any DDP / PEFT wrapper."""
    model = unwrap_realm_model(model)
    embedder = getattr(model, "index_embedder", None)
    if embedder is None:
        raise ValueError(f"{type(model).__name__} has no `index_embedder` (the embedder that fills the index).")
    return embedder


def _distributed_info() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class RealmReindexCallback(TrainerCallback):
    r"""
    Keeps the retriever's index fresh while the document embedder trains, without stopping training.

    Every `refresh_steps` optimizer steps the callback snapshots the document embedder (a copy of its weights at
    that step), re-embeds the whole corpus with the snapshot in a background worker, builds a new index of the
    same type, and swaps it in atomically at the end of the first training step after it is ready. Training keeps
    using the old index meanwhile; the delay between snapshot and swap (in steps) is logged as `staleness`. A refresh
    is checked before the swap (every embedding finite, one per block, the live index's dimension); if it fails,
    the error is logged with what to do, counted in `failed_refreshes` (logged as `reindex/failed_refreshes`), and
    training continues on the old index.

    With several processes (`accelerate launch`, DDP) each process embeds its share of the corpus; the shares are
    gathered over a separate gloo group so every process swaps in the same index at the same step. With a
    [`ShardedRealmRetriever`] each process re-embeds only the blocks it holds and swaps its own shards' new index in
    (nothing is gathered), at the same step as the other processes; with it, checkpoints save the shards from every
    process.

    Use it with [`~transformers.Trainer`] (`callbacks=[RealmReindexCallback(retriever, refresh_steps=500)]`), or in a
    plain training loop by calling `reindexer.step(global_step, model)` after each optimizer step.

    Args:
        retriever ([`RealmRetriever`]): The corpus and index the model retrieves from (the same object).
        refresh_steps (`int`, *optional*, defaults to 500): Refresh period in optimizer steps (the paper's value).
        batch_size (`int`, *optional*, defaults to 128): Blocks per embedding batch.
        device (`str` or `torch.device`, *optional*): Device for re-embedding (e.g. a spare GPU); defaults to the
            device of the embedder.
        dtype (`torch.dtype`, *optional*): Autocast dtype for re-embedding (fp16/bf16 on GPUs).
        background (`bool`, *optional*, defaults to `True`): Refresh in a worker thread while training continues.
            With `False` the refresh runs inline (training pauses), which is what one wants for tests or on a
            machine with no spare core.
        save_with_checkpoints (`bool`, *optional*, defaults to `True`): Save the current index into each Trainer
            checkpoint (`checkpoint-N/retriever/`) and restore it on resume.
        keep_last_snapshot (`bool`, *optional*, defaults to `False`): Keep the embedder copy of the last swapped
            refresh as `last_snapshot` (for inspection and tests; costs one embedder's memory).
        refresh_at_end (`bool`, *optional*, defaults to `True`): When training ends with an index older than the
            document embedder (it trained since the last snapshot), re-embed once more so the saved model and its
            index agree. Costs one refresh; nothing happens when the document embedder is frozen.
        show_progress (`bool`, *optional*, defaults to `False`): Show a progress bar while re-embedding (rank 0).
        staleness_questions (`list[str]`, *optional*): A sample of training questions. At each swap their top
            `staleness_k` blocks in the old (stale) index are compared with those in the refreshed one, and the
            fraction the stale index still finds is logged as `reindex/stale_recall@{k}` (1.0: the refresh changed
            nothing; falling values: the index drifts away from the document embedder between refreshes, refresh
            more often). Questions are embedded with the model's question embedder at the swap. Not computed for a
            [`ShardedRealmRetriever`].
        staleness_k (`int`, *optional*, defaults to 10): `k` of the staleness recall.

    Refresh metrics (`reindex/refreshes`, `reindex/staleness`, `reindex/refresh_seconds`, `reindex/index_size`) go
    into `trainer.state.log_history` at the step of each swap, and into the next logging step's metrics so that
    `report_to` integrations receive them; [`RealmOpenQATrainer`] places the callback first for that, and with a plain
    `Trainer` use `RealmReindexCallback.attach(trainer)` instead of `callbacks=[...]`.
    """

    def __init__(
        self,
        retriever,
        refresh_steps: int = 500,
        batch_size: int = 128,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        background: bool = True,
        save_with_checkpoints: bool = True,
        keep_last_snapshot: bool = False,
        refresh_at_end: bool = True,
        show_progress: bool = False,
        staleness_questions: list[str] | None = None,
        staleness_k: int = 10,
    ):
        if refresh_steps < 1:
            raise ValueError(f"refresh_steps must be >= 1, got {refresh_steps}.")
        if isinstance(staleness_k, bool) or not isinstance(staleness_k, int) or staleness_k < 1:
            raise ValueError(f"staleness_k must be a positive integer, got {staleness_k!r}.")
        if staleness_questions is not None and (
            isinstance(staleness_questions, str)
            or not all(isinstance(q, str) and q.strip() for q in staleness_questions)
        ):
            raise ValueError("staleness_questions must be a list of non-empty question strings.")
        self.staleness_questions = list(staleness_questions) if staleness_questions else None
        self.staleness_k = staleness_k
        self._model = None
        self.retriever = retriever
        self.refresh_steps = refresh_steps
        self.batch_size = batch_size
        self.device = device
        self.dtype = dtype
        self.background = background
        self.save_with_checkpoints = save_with_checkpoints
        self.keep_last_snapshot = keep_last_snapshot
        self.refresh_at_end = refresh_at_end
        self.show_progress = show_progress

        self.refresh_count = 0
        self.failed_refreshes = 0
        self.history: list[dict[str, Any]] = []
        self.last_snapshot: torch.nn.Module | None = None
        self.last_refresh_step: int | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._future: Future | None = None
        self._snapshot_step: int | None = None
        self._snapshot: torch.nn.Module | None = None
        self._started_at: float | None = None
        self._pending_logs: dict[str, float] = {}
        self._gather_group = None
        self._sync_group = None

    def attach(self, trainer) -> RealmReindexCallback:
        """
        Add this callback to `trainer` (if it is not there yet) as its first callback.

        Integrations (`report_to`) receive logs in callback order; being first lets the refresh metrics merged in
        [`~RealmReindexCallback.on_log`] reach them.
        """
        place_reindex_callbacks_first(trainer, extra=self)
        return self

    # ---------------------------------------------------------------- core (shared by Trainer and plain loops)

    def step(self, global_step: int, model) -> dict[str, float]:
        """
        Call after each optimizer step of a plain (e.g. Accelerate) training loop: swaps in a finished refresh and
        starts a new one every `refresh_steps` steps.

        Returns:
            `dict`: metrics of a refresh swapped in at this step (empty otherwise), to log as you like.
        """
        logs: dict[str, float] = {}
        if self._future is not None and self._all_ranks_done():
            logs = self._finish(global_step)
        if global_step > 0 and global_step % self.refresh_steps == 0:
            if self._future is None:
                self._start(global_step, model)
                if not self.background:
                    logs = self._finish(global_step)
            else:
                logger.warning(
                    "Index refresh from step %d is still running at step %d; skipping this refresh (consider a larger "
                    "refresh_steps or a faster indexing device).",
                    self._snapshot_step,
                    global_step,
                )
        return logs

    def wait(self, global_step: int | None = None) -> dict[str, float]:
        """Block until the running refresh (if any) finishes, and swap it in."""
        if self._future is None:
            return {}
        self._future.exception()  # waits; errors are handled in _finish
        return self._finish(global_step if global_step is not None else self._snapshot_step)

    def refresh_now(self, model, global_step: int = 0) -> dict[str, float]:
        """Re-embed the corpus with the model's current document embedder and swap the index in, synchronously."""
        if self._future is not None:
            self.wait(global_step)
        self._start(global_step, model)
        return self._finish(global_step)

    def close(self) -> None:
        """
        Stop the worker (waits for a running refresh to end, without swapping it in) and destroy the gloo groups
        the refreshes of several processes created; called on every process (`on_train_end` does). A later refresh
        creates them again.
        """
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self._future = None
        # Groups left alive were torn down with the process, while DDP freed its own: a 2-process run hung at exit
        # about once in five. What this callback created, it destroys.
        groups = [group for group in (self._gather_group, self._sync_group) if group is not None]
        self._gather_group = self._sync_group = None
        if groups and torch.distributed.is_available() and torch.distributed.is_initialized():
            for group in groups:
                torch.distributed.destroy_process_group(group)

    def _start(self, global_step: int, model) -> None:
        embedder = document_embedder_of(model)
        device = torch.device(self.device) if self.device is not None else next(embedder.parameters()).device
        # The snapshot is what makes the refresh consistent: training keeps updating `embedder` meanwhile.
        snapshot = copy.deepcopy(embedder).to(device).eval()
        snapshot.requires_grad_(False)
        self._snapshot, self._snapshot_step, self._started_at = snapshot, global_step, time.perf_counter()
        self._model = model  # embeds the staleness questions at the swap
        rank, world_size = _distributed_info()
        if world_size > 1 and self._gather_group is None:
            # Separate groups: the worker thread's collectives must never interleave with DDP's or the main
            # thread's on the default group.
            self._gather_group = torch.distributed.new_group(backend="gloo")
            self._sync_group = torch.distributed.new_group(backend="gloo")
        if self.background:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="realm-reindex")
            self._future = self._executor.submit(self._build, snapshot, rank, world_size)
        else:
            future: Future = Future()
            try:
                future.set_result(self._build(snapshot, rank, world_size))
            except Exception as error:  # reported in _finish, like a background failure
                future.set_exception(error)
            self._future = future

    def _build(self, snapshot, rank: int, world_size: int):
        """Worker: the retriever's refreshed index state (each process embeds its share: `refresh_index_state`)."""
        return refresh_index_state(
            self.retriever,
            snapshot,
            batch_size=self.batch_size,
            dtype=self.dtype,
            show_progress=self.show_progress and rank == 0,
            group=self._gather_group,
        )

    def _check_state(self, state) -> None:
        """Refuse a refreshed index that the model could not search: checked before the swap, never after."""
        for shard_state in getattr(state, "shard_states", [state]):
            dim, live_dim = shard_state.dim, self.retriever.embedding_dim
            if dim != live_dim:
                raise ValueError(
                    f"The refreshed embeddings have dimension {dim} but the live index, which the model's question "
                    f"embedder searches, has {live_dim}: the document embedder projects to another size than the "
                    "question embedder (`config.retriever_proj_size`). Give both embedders the same projection size; "
                    "to change the dimension on purpose, re-embed the corpus once with "
                    "`realm_hf.retrieval.embed_corpus(retriever, embedder)` and train with a matching question embedder."
                )

    def _all_ranks_done(self) -> bool:
        done = self._future is not None and self._future.done()
        if self._sync_group is None:
            return done
        # Every process swaps at the same step: a tiny MIN-reduce over "done" flags, only while a refresh runs.
        flag = torch.tensor([1 if done else 0], dtype=torch.int32)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN, group=self._sync_group)
        return bool(flag.item())

    def _finish(self, global_step: int | None) -> dict[str, float]:
        future, snapshot_step, snapshot = self._future, self._snapshot_step, self._snapshot
        self._future, self._snapshot = None, None
        step = global_step if global_step is not None else snapshot_step
        try:
            state = future.result()  # waits when called right after _start (refresh_now)
            self._check_state(state)
            try:
                staleness = self._stale_recall(state)
            except Exception as error:  # a metric must never cost the refresh
                logger.warning("Could not measure the index's staleness: %s: %s", type(error).__name__, error)
                staleness = {}
            self.retriever.swap_index_state(state)
        except Exception as error:  # a failed refresh must never stop training
            self.failed_refreshes += 1
            logger.error(
                "Index refresh from step %d failed (%d failed so far); training continues on the old index (last "
                "refreshed at step %s) and the next refresh is tried in %d steps. %s: %s",
                snapshot_step,
                self.failed_refreshes,
                self.last_refresh_step,
                self.refresh_steps,
                type(error).__name__,
                error,
            )
            record = {"reindex/failed": 1.0, "reindex/snapshot_step": float(snapshot_step), "step": step}
            self.history.append({**record, "error": repr(error)})
            self._pending_logs.update({"reindex/failed_refreshes": float(self.failed_refreshes)})
            return {"reindex/failed_refreshes": float(self.failed_refreshes)}
        elapsed = time.perf_counter() - self._started_at
        self.refresh_count += 1
        self.last_refresh_step = snapshot_step
        if self.keep_last_snapshot:
            self.last_snapshot = snapshot
        logs = {
            "reindex/refreshes": float(self.refresh_count),
            "reindex/staleness": float(step - snapshot_step),
            "reindex/refresh_seconds": round(elapsed, 3),
            "reindex/index_size": float(len(self.retriever)),
            **staleness,
        }
        self.history.append({**logs, "reindex/snapshot_step": float(snapshot_step), "step": step})
        logger.info("Swapped in the index embedded at step %d (at step %d, %.1fs).", snapshot_step, step, elapsed)
        self._pending_logs.update(logs)
        return logs

    def _stale_recall(self, state) -> dict[str, float]:
        """
        `{"reindex/stale_recall@k": r}`: of the refreshed index's top `k` blocks for the staleness questions, the
        fraction that the live (stale) index also returns, averaged over the questions; `{}` without questions.
        """
        if self.staleness_questions is None or self._model is None or self.retriever.collective:
            return {}

        model = unwrap_realm_model(self._model)
        embedder = getattr(model, "query_embedder", None) or model.embedder
        k = min(self.staleness_k, len(self.retriever))
        device = next(embedder.parameters()).device
        inputs = tokenizer_call(
            self.retriever.tokenizer, self.staleness_questions, padding=True, truncation=True, return_tensors="pt"
        ).to(device)
        with torch.no_grad():
            questions = embedder(**inputs, return_dict=True).projected_score.float().cpu().numpy()
        stale = self.retriever.search(questions, k, return_blocks=False).block_ids.numpy()
        # Labels of a refreshed index are the corpus's block ids, as the live index's search returns them.
        fresh = state.top_blocks(np.ascontiguousarray(questions), k, return_blocks=False).block_ids.numpy()
        found = [len(set(s[s >= 0]) & set(f[f >= 0])) / max(1, int((f >= 0).sum())) for s, f in zip(stale, fresh)]
        return {f"reindex/stale_recall@{k}": round(float(np.mean(found)), 4)}

    # ---------------------------------------------------------------- Trainer hooks

    def on_step_end(self, args, state, control, model=None, **kwargs):
        logs = self.step(state.global_step, model)
        if logs:
            # Into the Trainer's own log history, so the metrics land with the run (and in trainer_state.json).
            state.log_history.append({**logs, "step": state.global_step})
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None and self._pending_logs:
            logs.update(self._pending_logs)
            self._pending_logs = {}
        return control

    def on_save(self, args, state, control, model=None, **kwargs):
        collective = self.retriever.collective
        if not self.save_with_checkpoints or not (state.is_world_process_zero or collective):
            return control
        checkpoint = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if collective:
            # A collective save: every process writes its shards (the model's own save leaves them out).
            self.save_checkpoint(checkpoint)
            return control
        if os.path.isdir(checkpoint):
            # `RealmForOpenQA.save_pretrained` already wrote this very retriever into the checkpoint: do not write
            # the corpus and index a second time, only the refresh bookkeeping.
            saved_by_model = (
                model is not None and getattr(unwrap_realm_model(model), "retriever", None) is self.retriever
            )
            already_there = os.path.isfile(os.path.join(checkpoint, RETRIEVER_SUBFOLDER, MANIFEST_NAME))
            self.save_checkpoint(checkpoint, save_retriever=not (saved_by_model and already_there))
        return control

    def on_train_begin(self, args, state, control, **kwargs):
        if self.save_with_checkpoints and state.global_step > 0:
            checkpoint = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            if os.path.isdir(os.path.join(checkpoint, RETRIEVER_SUBFOLDER)):
                self.load_checkpoint(checkpoint)
            else:
                logger.warning(
                    "Resuming at step %d but %s holds no saved index; the index will be current only after the next "
                    "refresh.",
                    state.global_step,
                    checkpoint,
                )
        return control

    def on_train_end(self, args, state, control, model=None, **kwargs):
        # Do not leave a refresh half-done: finish it, so the saved model ends with the freshest index.
        if self._future is not None:
            logs = self.wait(state.global_step)
            if logs:
                state.log_history.append({**logs, "step": state.global_step})
        if self.refresh_at_end and model is not None:
            logs = self.refresh_if_stale(model, state.global_step)
            if logs:
                state.log_history.append({**logs, "step": state.global_step})
        self.close()
        # Nothing after training should carry refresh metrics (e.g. a later `evaluate()`'s logs).
        self._pending_logs = {}
        return control

    def refresh_if_stale(self, model, global_step: int = 0) -> dict[str, float]:
        """
        Re-embed the corpus synchronously if the model's document embedder changed since the index was built (by
        the recorded fingerprint); call at the end of a plain training loop before saving. Returns the refresh
        metrics, or `{}` when the index is already current.
        """
        if self._future is not None:
            self.wait(global_step)
        if is_stale(self.retriever, document_embedder_of(model)) is False:
            return {}
        return self.refresh_now(model, global_step)

    # ---------------------------------------------------------------- checkpoints

    def save_checkpoint(self, checkpoint_dir: str, save_retriever: bool = True) -> None:
        """Save the current index (and the refresh bookkeeping) into a checkpoint directory."""
        if save_retriever:
            self.retriever.save_pretrained(os.path.join(checkpoint_dir, RETRIEVER_SUBFOLDER))
        if not self.retriever.is_main_process:
            return
        state = {
            "refresh_count": self.refresh_count,
            "failed_refreshes": self.failed_refreshes,
            "last_refresh_step": self.last_refresh_step,
            "refresh_steps": self.refresh_steps,
        }
        with atomic_write(os.path.join(checkpoint_dir, REINDEX_STATE_NAME)) as f:
            json.dump(state, f, indent=2)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        """Restore the index saved in a checkpoint directory into the live retriever."""
        folder = os.path.join(checkpoint_dir, RETRIEVER_SUBFOLDER)
        self.retriever.swap_index_state(saved_index_state(self.retriever, folder))
        state_file = os.path.join(checkpoint_dir, REINDEX_STATE_NAME)
        if os.path.exists(state_file):
            with open(state_file) as f:
                state = json.load(f)
            self.refresh_count = state.get("refresh_count", 0)
            self.failed_refreshes = state.get("failed_refreshes", 0)
            self.last_refresh_step = state.get("last_refresh_step")
        logger.info("Restored the index from %s.", checkpoint_dir)


def place_reindex_callbacks_first(trainer, extra: RealmReindexCallback | None = None) -> None:
    """Move every [`RealmReindexCallback`] of `trainer` (and `extra`, added if missing) to the front of its callbacks."""
    callbacks = trainer.callback_handler.callbacks
    if extra is not None and not any(callback is extra for callback in callbacks):
        callbacks.append(extra)
    reindexers = [callback for callback in callbacks if isinstance(callback, RealmReindexCallback)]
    others = [callback for callback in callbacks if not isinstance(callback, RealmReindexCallback)]
    callbacks[:] = reindexers + others


__all__ = ["RealmReindexCallback", "place_reindex_callbacks_first", "document_embedder_of", "unwrap_realm_model"]
