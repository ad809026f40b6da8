"""The weights' trip from trainer rank 0 to the rollout processes: a process group of their own
(not the trainers' world), one broadcast per flat bucket of consecutive parameters in the rollout
dtype (`bucket_layout`: both sides compute it from the names' shapes, nothing else travels), every
wait polling the peer."""

from __future__ import annotations

import datetime
import pickle
import time
from functools import partial
from multiprocessing.connection import wait
from typing import Any

import torch
import torch.distributed as dist

from easyvideor1.distributed import serial_gloo_group

POLL_S = 0.05  # how often a wait looks at the other process (at most: a short wait looks sooner)
SEND_WINDOW_BYTES = 512 * 2**20  # weight broadcasts in flight at once (either side's extra memory)
BUCKET_BYTES = 4 * 2**20  # one broadcast: consecutive parameters up to this size, a bigger one alone


def weight_group(store: dist.Store, rank: int, size: int, device: torch.device, timeout_minutes: float) -> Any:
    """Trainer rank 0 (rank 0) and the `size` - 1 rollout processes (rank 1 + i): a process group
    of their own, for the weight broadcasts. A broadcast may wait `timeout_minutes`
    (`training.collective_timeout_minutes`; NCCL's default of 10 min would abort a long step)."""
    timeout = datetime.timedelta(minutes=timeout_minutes)
    if device.type == "cuda":
        return dist.ProcessGroupNCCL(store, rank, size, timeout)
    return serial_gloo_group(store, rank, size, timeout)  # one worker thread: distributed.py says why


def wait_work(work: Any, alive, what: str) -> None:
    """Wait for an async collective, checking `alive()` (raises with the peer's fate) meanwhile;
    the pause between looks doubles from 1 ms to `POLL_S`, so a short wait ends soon after the work."""
    pause = 0.001
    while not work.is_completed():
        alive(what)
        time.sleep(pause)
        pause = min(2 * pause, POLL_S)
    try:
        work.wait()
    except RuntimeError:
        alive(what)  # the peer died: its exit code says more than gloo's socket error
        raise


def bucket_layout(shapes: list[torch.Size], dtype: torch.dtype) -> list[list[int]]:
    """Which parameters (indices into `shapes`, in order) each weight broadcast carries: consecutive
    ones up to `BUCKET_BYTES` in `dtype`, one bigger than that alone. E.g. 3 MiB, 2 MiB, 5 MiB, 1 MiB
    -> [[0], [1], [2], [3]]; 1, 1, 1 MiB -> [[0, 1, 2]]."""
    buckets: list[list[int]] = []
    size, element = 0, torch.empty(0, dtype=dtype).element_size()
    for i, shape in enumerate(shapes):
        nbytes = shape.numel() * element
        if not buckets or size + nbytes > BUCKET_BYTES:
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += nbytes
    return buckets


def pack_bucket(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One bucket's parameters as the one flat tensor that travels (a lone one: a flat view of it)."""
    if len(tensors) == 1:
        return tensors[0].contiguous().view(-1)
    return torch.cat([t.reshape(-1) for t in tensors])


class Window:
    """Weight broadcasts over the pair group, in flight oldest first, with at most
    `SEND_WINDOW_BYTES` of them at once (either side's extra memory: the sender's gathered buckets,
    the receiver's landing buffers); each wait polls the peer (`alive(what)`), and a finished
    receive runs its `then` (unpacking the bucket)."""

    def __init__(self, group: Any, alive, what: str):
        self.group, self.alive, self.what = group, alive, what
        self.works: list[tuple[Any, int, Any]] = []  # (work, bytes, then) in flight, oldest first
        self.in_flight = 0

    def add(self, tensor: torch.Tensor, then=None) -> None:
        """Broadcast `tensor` (from rank 0 of the group: sent, or received into it)."""
        self.works.append((self.group.broadcast([tensor], dist.BroadcastOptions()), tensor.nbytes, then))
        self.in_flight += tensor.nbytes
        while self.in_flight > SEND_WINDOW_BYTES and len(self.works) > 1:
            self._wait_oldest()

    def finish(self) -> None:
        while self.works:
            self._wait_oldest()

    def _wait_oldest(self) -> None:
        work, nbytes, then = self.works.pop(0)
        wait_work(work, self.alive, self.what)
        self.in_flight -= nbytes
        if then is not None:
            then()


class TrainersGone(Exception):
    """A trainer rank hung up (a run stopped early, or a trainer that failed): nothing left to serve."""


class WeightReceiver:
    """The rollout side of each weight sync, over `trainers` (a connection per trainer rank, rank
    order): say "ready" to trainer rank 0, wait (polling, `hung_up`) for its "weights" (sent when
    its weights are ready, perhaps before: `arrived`), and only then post the receives (`trainer_side.RemoteRollouts._send` is the other half: neither side
    waits in a broadcast while the other is still in its step). The broadcasts land in `params`
    (the parameters of the sender's name list, in its order, shapes and `dtype`): a bucket of
    `bucket_layout` in a flat buffer copied out, a lone parameter in place; at most
    `SEND_WINDOW_BYTES` of buffers in flight."""

    def __init__(self, group: Any, params: list[torch.Tensor], dtype: torch.dtype, trainers: list[Any]):
        self.group, self.params, self.dtype, self.trainers = group, params, dtype, trainers
        self.layout = bucket_layout([p.shape for p in params], dtype)
        self.announced: list[int] = []  # versions trainer rank 0 said it sends, not yet received

    def hung_up(self, what: str, within: float = 0.0) -> None:
        """Raise `TrainersGone` when a trainer's connection has ended (waiting up to `within` s for
        news); trainer rank 0's "weights" messages, the only ones a trainer sends after its job,
        are taken on the way."""
        for conn in wait(self.trainers, timeout=within):
            try:
                message = pickle.loads(conn.recv_bytes())  # our own trainer, an authenticated connection
            except (EOFError, OSError):
                raise TrainersGone(what) from None
            self.announced.append(message["version"])

    def arrived(self, version: int) -> bool:
        """Trainer rank 0 has said it sends `version` (looked up without waiting)."""
        self.hung_up("the weights")
        return version in self.announced

    def announcement(self, version: int) -> None:
        """Wait (polling `hung_up`) until trainer rank 0 has said it sends `version`."""
        while version not in self.announced:
            self.hung_up("the weights", within=POLL_S)

    def receive(self, version: int) -> None:
        """The weights after step `version`, into `params`."""
        self.trainers[0].send_bytes(pickle.dumps({"kind": "ready", "version": version}))
        self.announcement(version)
        self.announced.remove(version)
        window = Window(self.group, self.hung_up, "the weights")
        for bucket in self.layout:
            targets = [self.params[i] for i in bucket]
            lone = targets[0]
            if len(targets) == 1 and lone.is_contiguous() and lone.dtype == self.dtype:
                window.add(lone.view(-1))
                continue
            flat = torch.empty(sum(t.numel() for t in targets), dtype=self.dtype, device=lone.device)
            window.add(flat, then=partial(unpack_bucket, flat, targets))
        window.finish()


def unpack_bucket(flat: torch.Tensor, targets: list[torch.Tensor]) -> None:
    """Copy a received bucket into its parameters (the layout `pack_bucket` packed)."""
    offset = 0
    for t in targets:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
