"""The weight sync of separate placement (`training.asynchronous.weights`), on a real torchrun of 3
CPU processes over gloo (`async_weights_worker.py`): 2 trainer ranks with FSDP2 shards of float32
parameters (the real `RankRollouts`) send two syncs to a rollout rank receiving in bfloat16 (the
real `WeightReceiver`), which records every broadcast it posts and every message it takes.

- Flat buckets: one broadcast per bucket of `bucket_layout` (3 for 6 parameters, a 6 MiB one
  alone), in bfloat16, and the weights arrive bit for bit (before: one broadcast per parameter).
- The gather moves rollout-dtype bytes: each trainer rank's all-gathers of a sync receive
  bfloat16 (each float32 shard cast before `full_tensor`; before: float32, cast after).
- Handshake (review gpu-scale-review-2, N2): the rollout side posts no receive before trainer
  rank 0's "weights" message for that version (before: all receives posted at once, the wait in
  NCCL counting the trainer's whole step against its timeout).
"""

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from easyvideor1.training.asynchronous.weights import BUCKET_BYTES, bucket_layout
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)

HERE = Path(__file__).parent
MIB = 2**20


def test_bucket_layout_packs_consecutive_parameters_and_sends_a_big_one_alone():
    assert BUCKET_BYTES == 4 * MIB
    sizes = lambda *mib: [torch.Size([int(m * MIB) // 2]) for m in mib]  # noqa: E731 - bfloat16 elements
    assert bucket_layout(sizes(1, 1, 1, 1), torch.bfloat16) == [[0, 1, 2, 3]]
    assert bucket_layout(sizes(1, 1, 1, 1, 0.5), torch.bfloat16) == [[0, 1, 2, 3], [4]]
    assert bucket_layout(sizes(3, 2, 5, 1), torch.bfloat16) == [[0], [1], [2], [3]]
    assert bucket_layout(sizes(0.5, 6, 0.5, 0.5), torch.bfloat16) == [[0], [1], [2, 3]]
    assert bucket_layout(sizes(1, 1, 1, 1), torch.float32) == [[0, 1], [2, 3]]  # the dtype that travels
    assert bucket_layout([], torch.bfloat16) == []


@pytest.fixture(scope="module")
def synced(tmp_path_factory):
    """Each rank's record from one torchrun of `async_weights_worker.py`."""
    out = tmp_path_factory.mktemp("weights")
    p = forkserver.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
                        str(HERE / "async_weights_worker.py"), str(out)], capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    return [json.loads((out / f"weights-rank{r}.json").read_text()) for r in range(3)]


def _syncs(events):
    """The rollout rank's events, one list per sync, each opened by the message it took."""
    syncs = []
    for event in events:
        if event[0] == "message":
            syncs.append([])
        assert syncs, f"a broadcast posted before any message from trainer rank 0: {events}"
        syncs[-1].append(event)
    return syncs


def test_one_broadcast_per_bucket_in_the_rollout_dtype_bit_for_bit(synced):
    rollout = synced[2]
    assert rollout["layout"] == [[0, 1, 2], [3], [4, 5]]  # 1 MiB, 2 KiB, 1 MiB | 6 MiB | 0.25 MiB, 2 MiB
    bucket_elements = [512 * 1024 * 2 + 1024, 2048 * 1536, 256 * 512 + 1024 * 1024]
    for sync in _syncs(rollout["events"]):
        assert [e[1:] for e in sync[1:]] == [[n, "torch.bfloat16"] for n in bucket_elements]
    assert rollout["equal"] == [True, True]  # both syncs, the second after an update


def test_trainer_ranks_gather_in_the_rollout_dtype(synced):
    for trainer in synced[:2]:
        assert trainer["gather_dtypes"] == ["torch.bfloat16"]
        assert trainer["gathers"] == 2 * 6  # each parameter once per sync, every trainer rank alike


def test_receives_are_posted_only_after_the_trainer_says_it_sends(synced):
    """... which it says first, so a partial rollout can switch as the weights arrive without waiting."""
    assert synced[2]["arrived"]
    syncs = _syncs(synced[2]["events"])
    assert [s[0] for s in syncs] == [["message", {"kind": "weights", "version": v}] for v in (0, 1)]
    assert all(e[0] == "broadcast" for s in syncs for e in s[1:])
