"""
The processes a sharded retriever spans: object collectives over a gloo group of `torch.distributed` (or one process,
with no group at all), and errors raised on every process at the same point, never on one while the others wait.
"""

from __future__ import annotations

import os
import pickle
import threading
from typing import Any

import numpy as np
import torch

# One gloo group per default process group, created the first time a sharded retriever is built or loaded (a
# collective call, like the constructor that makes it): searches then never share a group with DDP's gradients or
# with the re-index callback's worker thread, and run on CPU tensors whatever the default backend (NCCL on GPUs).
_GLOO_GROUPS: dict[int, Any] = {}
_GLOO_LOCK = threading.Lock()


class ShardedCollectiveError(ValueError):
    """A step of a collective call failed on at least one process: raised on every process, with every message."""


def distributed_world() -> tuple[int, int]:
    """`(rank, world_size)` of the default process group, `(0, 1)` when none is initialised."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def default_gloo_group():
    """A gloo group over all processes of the default group (created once, collectively), or `None` for one process."""
    _, world_size = distributed_world()
    launched = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world_size == 1 and launched > 1:
        # Launched as one of several processes, before their group exists: each process would hold every shard.
        raise RuntimeError(
            f"This process is one of {launched} (WORLD_SIZE={launched}), but torch.distributed is not initialised "
            "yet: create the `Accelerator()` (or `accelerate.PartialState()`, or call "
            "`torch.distributed.init_process_group`) before building or loading a sharded retriever, so that each "
            "process holds its share."
        )
    if world_size == 1:
        return None
    key = id(torch.distributed.group.WORLD)
    with _GLOO_LOCK:
        if key not in _GLOO_GROUPS:
            _GLOO_GROUPS[key] = torch.distributed.new_group(backend="gloo")
        return _GLOO_GROUPS[key]


class ShardGroup:
    """
    The processes of a sharded retriever and the few collectives it needs (all gather, scatter, broadcast of Python
    objects). Every method is a collective: all processes of the group call it, in the same order.

    Args:
        group (`torch.distributed.ProcessGroup`, *optional*): A group that can move CPU tensors (gloo). Defaults to a
            gloo group over every process of the default group, or to one process when `torch.distributed` is not
            initialised (every collective is then local).
    """

    def __init__(self, group=None):
        self.group = group if group is not None else default_gloo_group()
        if self.group is None:
            self.rank, self.world_size = 0, 1
        else:
            self.rank = torch.distributed.get_rank(self.group)
            self.world_size = torch.distributed.get_world_size(self.group)

    def all_gather(self, obj) -> list:
        """`obj` of every process, in rank order."""
        if self.world_size == 1:
            return [obj]
        gathered = [None] * self.world_size
        torch.distributed.all_gather_object(gathered, obj, group=self.group)
        return gathered

    def broadcast(self, obj, src: int = 0):
        """`obj` of process `src`, on every process."""
        if self.world_size == 1:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, group=self.group, group_src=src)
        return box[0]

    def exchange(self, outgoing: list) -> list:
        """
        Send `outgoing[d]` to process `d` and receive what each process sent here: `received[s]` came from process
        `s`. Each process receives only what it is sent (an all-gather would send every process everything), in two
        `all_to_all` calls (the sizes, then the pickled messages: objects between the processes of one job, never
        read from a file).
        """
        if len(outgoing) != self.world_size:
            raise ValueError(f"One message per process expected ({self.world_size}), got {len(outgoing)}.")
        if self.world_size == 1:
            return list(outgoing)
        messages = [pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) for obj in outgoing]
        send_sizes = torch.tensor([len(message) for message in messages], dtype=torch.int64)
        receive_sizes = torch.empty(self.world_size, dtype=torch.int64)
        torch.distributed.all_to_all_single(receive_sizes, send_sizes, group=self.group)
        send = torch.frombuffer(bytearray(b"".join(messages)), dtype=torch.uint8)
        receive = torch.empty(int(receive_sizes.sum()), dtype=torch.uint8)
        torch.distributed.all_to_all_single(
            receive,
            send,
            output_split_sizes=receive_sizes.tolist(),
            input_split_sizes=send_sizes.tolist(),
            group=self.group,
        )
        data = receive.numpy().tobytes()
        bounds = [0, *np.cumsum(receive_sizes.numpy()).tolist()]
        return [pickle.loads(data[bounds[s] : bounds[s + 1]]) for s in range(self.world_size)]

    def run(self, what: str, function, *args):
        """
        `function(*args)` on every process, then [`~ShardGroup.raise_if_any`]: the result where every process
        succeeded, a [`ShardedCollectiveError`] on every process otherwise (one process re-raises its own error).
        """
        try:
            result, error = function(*args), None
        except Exception as err:
            if self.world_size == 1:
                raise
            result, error = None, describe(err)
        self.raise_if_any(error, what)
        return result

    def raise_if_any(self, error: str | None, what: str) -> None:
        """
        Gather each process's error (`None` when its step succeeded) and raise [`ShardedCollectiveError`] on every
        process when any failed, naming the processes: a process that raised alone would leave the others waiting in
        the next collective.
        """
        errors = self.all_gather(error)
        failed = [(rank, message) for rank, message in enumerate(errors) if message is not None]
        if not failed:
            return
        if self.world_size == 1:
            raise ShardedCollectiveError(f"{what} failed: {failed[0][1]}")
        details = "; ".join(f"process {rank}: {message}" for rank, message in failed)
        raise ShardedCollectiveError(f"{what} failed on {len(failed)} of {self.world_size} processes. {details}")


def describe(error: BaseException) -> str:
    """An exception as the one line other processes are told."""
    return f"{type(error).__name__}: {error}"


def row_bounds(num_rows: int, num_parts: int) -> list[int]:
    """Contiguous split of `num_rows` rows into `num_parts` parts: part `i` is rows `bounds[i]:bounds[i + 1]`."""
    return [num_rows * i // num_parts for i in range(num_parts + 1)]


def gather_rows(rows: torch.Tensor, bounds: list[int], group) -> torch.Tensor:
    """
    Every process's share of a row-split matrix (process `r` holds rows `bounds[r]:bounds[r + 1]`), gathered in row
    order on every process over `group` (a gloo group of `torch.distributed`).
    """
    # all_gather needs equal shapes: pad every share to the largest, then cut each back.
    sizes = [bounds[r + 1] - bounds[r] for r in range(len(bounds) - 1)]
    padded = torch.zeros(max(sizes), rows.shape[1], dtype=torch.float32)
    padded[: rows.shape[0]] = rows.float().cpu()
    shares = [torch.empty_like(padded) for _ in sizes]
    torch.distributed.all_gather(shares, padded, group=group)
    return torch.cat([share[:size] for share, size in zip(shares, sizes)])
