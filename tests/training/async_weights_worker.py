"""Two weight syncs of separate placement under torchrun with 3 CPU processes (gloo): ranks 0-1
are trainer ranks (`RankRollouts`, the real trainer side) holding FSDP2 shards of float32
parameters; rank 2 is a rollout rank that answers as `rollout_side.serve_rank` does and receives
with the real `WeightReceiver`, in bfloat16. Records what crosses: on the trainer ranks the dtype
of every all-gather of the syncs; on the rollout rank each broadcast it posts and each message it
takes from trainer rank 0, in order, whether trainer rank 0 said it sends before the rollout rank
said it was ready (`WeightReceiver.arrived`), and whether the weights arrived bit for bit. Writes
`<out>/weights-rank<r>.json`. A test helper, run as a script:

    async_weights_worker.py OUT_DIR
"""

import json
import pickle
import secrets
import sys
import time
from multiprocessing.connection import Listener
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from easyvideor1 import distributed
from easyvideor1.config import load_config
from easyvideor1.training.asynchronous.placement import ADDRESS_KEY, PAIR_PREFIX, reachable_host
from easyvideor1.training.asynchronous.trainer_side import RankRollouts
from easyvideor1.training.asynchronous.weights import WeightReceiver, weight_group
from easyvideor1.training.fsdp import init_distributed
from collectives_worker import Collectives

# MiB in bfloat16: 1, 2 KiB, 1 | 6 (over a bucket: alone) | 0.25, 2 -> 3 buckets of 4 MiB at most
SHAPES = {"a": (512, 1024), "b": (1024,), "c": (512, 1024), "big": (2048, 1536), "d": (256, 512), "e": (1024, 1024)}
CFG = load_config(None, ["rollout.placement=separate", "model.dtype=bfloat16", "training.steps=2",
                         "training.max_staleness=0", "checkpoint.every=0"])


def weights() -> torch.nn.Module:
    """The same float32 values on every rank."""
    torch.manual_seed(0)
    module = torch.nn.Module()
    for name, shape in SHAPES.items():
        module.register_parameter(name, torch.nn.Parameter(torch.randn(shape)))
    return module


def step(module: torch.nn.Module) -> None:
    """What an update does between the syncs (elementwise: the same bits sharded or whole)."""
    with torch.no_grad():
        for p in module.parameters():
            p.mul_(2).add_(1)


class Recorded:
    """A connection or a process group that notes what passes through it in `events`."""

    def __init__(self, inner, events: list):
        self.inner, self.events = inner, events

    def fileno(self):
        return self.inner.fileno()

    def recv_bytes(self):
        data = self.inner.recv_bytes()
        self.events.append(["message", pickle.loads(data)])
        return data

    def send_bytes(self, data):
        self.inner.send_bytes(data)

    def broadcast(self, tensors, options):
        self.events.append(["broadcast", tensors[0].numel(), str(tensors[0].dtype)])
        return self.inner.broadcast(tensors, options)


def trainer(rank: int, out: Path) -> None:
    init_distributed(rollout_ranks=1)
    module = weights()
    fully_shard(module)
    remote = RankRollouts(CFG, torch.device("cpu"), rank)
    with Collectives() as seen:
        remote.start(module, 0, {})
        step(module)
        remote.publish(1)
    distributed.launch_store().wait(["received"])  # a trainer that hangs up mid-receive ends the rollout side
    remote.close()
    (out / f"weights-rank{rank}.json").write_text(json.dumps({"gather_dtypes": sorted(seen.gather_dtypes),
                                                              "gathers": seen.counts["all_gather"]}))
    distributed.close()


def rollout(rank: int, out: Path) -> None:
    store, key = distributed.launch_store(), secrets.token_bytes(32)
    with Listener((reachable_host(), 0), authkey=key) as listener:
        store.set(f"{ADDRESS_KEY}/0", pickle.dumps((*listener.address, key)))
        conns = [listener.accept() for _ in range(2)]
    jobs = [pickle.loads(conn.recv_bytes()) for conn in conns]
    trainers = [conns[i] for i in sorted(range(2), key=lambda i: jobs[i]["rank"])]
    model = weights()
    names = [name for name, _ in model.named_parameters()]
    for conn in trainers:
        conn.send_bytes(pickle.dumps({"kind": "hello", "names": names}))
    events: list = []
    group = weight_group(dist.PrefixStore(PAIR_PREFIX, store), 1, 2, torch.device("cpu"), 5.0)
    received = torch.nn.Module()
    for name, shape in SHAPES.items():
        received.register_parameter(name, torch.nn.Parameter(torch.zeros(shape, dtype=torch.bfloat16),
                                                             requires_grad=False))
    receiver = WeightReceiver(Recorded(group, events), [p for p in received.parameters()], torch.bfloat16,
                              [Recorded(trainers[0], events), trainers[1]])
    equal, deadline = [], time.monotonic() + 120
    while not receiver.arrived(0) and time.monotonic() < deadline:  # said before this side's "ready"
        time.sleep(0.01)
    arrived = receiver.arrived(0)
    for version in (0, 1):
        receiver.receive(version)
        equal.append(all(torch.equal(received.get_parameter(n), model.get_parameter(n).to(torch.bfloat16))
                         for n in names))
        step(model)
    store.set("received", "1")
    for conn in trainers:
        conn.close()
    (out / f"weights-rank{rank}.json").write_text(json.dumps({"events": events, "equal": equal, "arrived": arrived,
                                                              "layout": receiver.layout}))


if __name__ == "__main__":
    rank = distributed.launched()[0]
    (trainer if rank < 2 else rollout)(rank, Path(sys.argv[1]))
