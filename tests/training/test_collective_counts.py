"""Collectives that must not scale with the work, and decisions every rank must share
(torchrun, 2 CPU processes, gloo, FSDP2; real tiny models and videos).

- The LM head is gathered once per log-prob pass: a pass over 12 chunks of 4 tokens issues as many
  all-gathers and reduce-scatters as the same pass in one chunk, with and without gradients and
  with the exact KL to a sharded reference (`models.logprobs.head_pass`). With a head call per
  chunk (b8c4854) the 12-chunk passes made 76 / 38 / 116 all-gathers against 34 / 16 / 52.
- A weight sync in bf16 gathers bf16 tensors (each float32 master shard cast before its
  all-gather), and hands bf16 weights on (`models.lora.merged_state_items(dtype=...)`).
- Rank balance is decided on one shared list of estimates: when rank 1 cannot read a video that
  rank 0 reads, the ranks' slots still partition the batch (estimated apart, rank 0 took samples
  1, 3, 4 and rank 1 took 3, 4, 5: two trained twice, two never).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_distributed import TIMEOUT_S, synth_rows

from easyvideor1.models.tiny import build_tiny_model
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)

HERE = Path(__file__).parent


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _torchrun(*args) -> subprocess.CompletedProcess:
    return forkserver.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           *map(str, args)], capture_output=True, text=True, env=_env(), timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def counts(tmp_path_factory):
    """Each rank's record from one run of `collectives_worker.py`."""
    root = tmp_path_factory.mktemp("collectives")
    model = build_tiny_model("qwen2_5_vl", root / "model", seed=0)
    rows = [r for r in synth_rows(root, num_train=8) if r["data_type"] == "video"][:2]
    rows += [{"problem_id": f"t{i}", "problem": "Say why. " * (4 * i + 1), "answer": "a",
              "problem_type": "free-form"} for i in range(4)]
    data = root / "samples.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = _torchrun(HERE / "collectives_worker.py", model, data, root / "out")
    assert proc.returncode == 0, proc.stderr[-6000:]
    return [{**json.loads((root / "out" / f"counts-rank{r}.json").read_text()),
             "close": json.loads((root / "out" / f"close-rank{r}.json").read_text())} for r in (0, 1)]


def test_head_gathered_once_per_pass_and_sync_gathers_in_bf16(counts):
    for got in counts:
        one, many = got["counts"]["one"], got["counts"]["many"]
        for kind in ("grad", "no_grad", "grad_full_kl"):
            assert one[kind]["all_gather"] > 0  # the counter sees FSDP's collectives
            assert many[kind] == one[kind], (kind, one[kind], many[kind])
        assert one["grad"]["reduce_scatter"] > 0 and "reduce_scatter" not in one["no_grad"]
        assert got["sync_gather_dtypes"] == ["torch.bfloat16"]
        assert got["sync_item_dtypes"] == ["torch.bfloat16"]


def test_close_keeps_each_groups_last_work_to_the_end(counts):
    """`distributed.close` ends each group it leaves (the world and a waiting group here) with a
    collective whose work it holds until the process ends, so no gloo worker thread frees a tensor
    while the interpreter finalises (the SIGABRT at exit its module docstring explains; a barrier,
    whose work frees the works before it on the worker thread, brought it back)."""
    for got in counts:
        assert got["close"] == {"joined": 2, "kept": [[True, "cpu"], [True, "cpu"]]}, got["close"]


def test_ranks_share_one_balanced_assignment(counts):
    slots = [got["slots"] for got in counts]
    assert sorted(slots[0] + slots[1]) == list(range(6)), slots  # each sample exactly once
    assert len(slots[0]) == len(slots[1]) == 3
