"""The weights' trip from trainer rank 0 to the rollout processes: a process group of their own
(not the trainers' world), broadcasts in the rollout dtype, every wait polling the peer."""

from __future__ import annotations

import datetime
import time
from typing import Any

import torch
import torch.distributed as dist

from easyvideor1.distributed import serial_gloo_group

POLL_S = 0.05  # how often a wait looks at the other process
SEND_WINDOW_BYTES = 512 * 2**20  # weight broadcasts in flight at once (the sender's extra memory)


def weight_group(store: dist.Store, rank: int, size: int, device: torch.device, timeout_minutes: float) -> Any:
    """Trainer rank 0 (rank 0) and the `size` - 1 rollout processes (rank 1 + i): a process group
    of their own, for the weight broadcasts. A broadcast may wait `timeout_minutes`
    (`training.collective_timeout_minutes`; NCCL's default of 10 min would abort a long step)."""
    timeout = datetime.timedelta(minutes=timeout_minutes)
    if device.type == "cuda":
        return dist.ProcessGroupNCCL(store, rank, size, timeout)
    return serial_gloo_group(store, rank, size, timeout)  # one worker thread: distributed.py says why

def wait_work(work: Any, alive, what: str) -> None:
    """Wait for an async collective, checking `alive()` (raises with the peer's fate) meanwhile."""
    while not work.is_completed():
        alive(what)
        time.sleep(POLL_S)
    try:
        work.wait()
    except RuntimeError:
        alive(what)  # the peer died: its exit code says more than gloo's socket error
        raise

class WeightSender:
    """Broadcasts from rank 0 of the pair, tensor by tensor as they are handed over, with at most
    `SEND_WINDOW_BYTES` in flight: the sender never holds the whole model in the rollout dtype
    (under FSDP2 each whole parameter is gathered just before it is sent)."""

    def __init__(self, group: Any, alive):
        self.group, self.alive = group, alive
        self.works: list[tuple[Any, int]] = []  # (work, bytes) in flight, oldest first
        self.in_flight = 0

    def send(self, tensor: torch.Tensor) -> None:
        self.works.append((self.group.broadcast([tensor], dist.BroadcastOptions()), tensor.nbytes))
        self.in_flight += tensor.nbytes
        while self.in_flight > SEND_WINDOW_BYTES and len(self.works) > 1:
            self._wait_oldest()

    def finish(self) -> None:
        while self.works:
            self._wait_oldest()

    def _wait_oldest(self) -> None:
        work, nbytes = self.works.pop(0)
        wait_work(work, self.alive, "the weight broadcast")
        self.in_flight -= nbytes
