"""Ranks stay in step when their data differ (torchrun, 2 CPU processes, gloo, FSDP2).

Rank 0's share of the first batch is a corrupt video and a prompt over `max_prompt_tokens`;
rank 1's loads. With dynamic sampling, rank 1 is full after one round and rank 0 is not: both
must run a second round (a per-rank decision would hang FSDP's next collective). Without
filtering, rank 0 trains two fully masked groups in their place. Either run finishes, reports
the two failures, and ends with the parameters of a 1-process run over the same data (which
fails the same samples). Every collective is recorded: the package's own all go through
`easyvideor1/distributed.py`, on the process group's device.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from test_distributed import TIMEOUT_S, write_config

from easyvideor1.data.synth import write_suite
from easyvideor1.models.tiny import build_tiny_model
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)

HERE = Path(__file__).parent
PACKAGE = Path(__file__).resolve().parents[2] / "easyvideor1"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("agree")
    model = build_tiny_model("qwen2_5_vl", root / "model", seed=0)
    paths = write_suite(root / "synth", num_train=16, num_val=0, seed=0,
                        tasks=("colour", "count", "image_colour", "image_count"))
    rows = [json.loads(line) for line in paths["train"].read_text().splitlines()]
    for r in rows:
        for key in ("videos", "images"):
            if key in r:
                r[key] = [str(root / "synth" / p) for p in r[key]]
    corrupt = root / "corrupt.mp4"
    corrupt.write_bytes(b"\x00\x00\x00\x18ftypmp42" + os.urandom(2048))  # an mp4 header, then noise
    video = next(r for r in rows if r.get("videos"))
    bad_video = {**video, "problem_id": "corrupt-video", "videos": [str(corrupt)]}
    too_long = {**rows[0], "problem_id": "too-long", "data_type": "text", "problem": "why " * 3000}
    too_long.pop("videos", None)
    too_long.pop("images", None)
    ordered = [bad_video, too_long] + rows[:10]  # global batch of 4: rank 0 gets the two bad ones
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ordered))
    return root, model, data


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _config(root, model, data, name, filtering):
    out = root / name
    shutil.rmtree(out, ignore_errors=True)
    # 4-token log-prob chunks: the ranks need different numbers of head calls (rank 0 none at all when
    # it holds only padding groups), which must still be the same collectives on every rank
    # contiguous rank slices (balance_ranks off): rank 0's share is the two bad samples, as designed
    return out, write_config(root, model, data, out, steps=2, data__max_prompt_tokens=1000,
                             training__logprob_chunk_size=4, training__balance_ranks=False,
                             algorithm__online_filtering=filtering, algorithm__max_filter_tries=4,
                             data__on_error="skip", data__max_skip_fraction=1.0)  # 2 of 4 skipped: counted, go on


@pytest.mark.parametrize("filtering", [True, False], ids=["dynamic-sampling", "padding"])
def test_failed_samples_on_one_rank_keep_ranks_in_step(setup, filtering):
    root, model, data = setup
    one, cfg1 = _config(root, model, data, f"one-{filtering}", filtering)
    two, cfg2 = _config(root, model, data, f"two-{filtering}", filtering)
    p1 = forkserver.run([sys.executable, "-m", "easyvideor1.cli", "train", str(cfg1)], capture_output=True,
                        text=True, env=_env(), timeout=TIMEOUT_S)
    assert p1.returncode == 0, p1.stderr[-4000:]
    p2 = forkserver.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                         str(HERE / "record_collectives.py"), str(cfg2)],
                        capture_output=True, text=True, env=_env(), timeout=TIMEOUT_S)  # a hang ends here
    assert p2.returncode == 0, p2.stderr[-6000:]
    assert "corrupt-video" in p2.stderr and "too-long" in p2.stderr  # named in the warnings

    m1 = [json.loads(line) for line in (one / "metrics.jsonl").read_text().splitlines()]
    m2 = [json.loads(line) for line in (two / "metrics.jsonl").read_text().splitlines()]
    assert [r["data/prompt_failures"] for r in m2] == [r["data/prompt_failures"] for r in m1] == [2.0, 0.0]
    assert [r["data/skipped_total"] for r in m2] == [r["data/skipped_total"] for r in m1] == [2.0, 2.0]
    if filtering:
        assert m2[0]["filter/filter_tries"] == 2.0  # rank 1 was full after one round, and still ran the second
    for a, b in zip(m1, m2):
        assert a["reward/all"] == pytest.approx(b["reward/all"], abs=1e-6)
        # loss terms of the same tokens, summed over differently split micro-batches and ranks
        assert a["actor/pg_loss"] == pytest.approx(b["actor/pg_loss"], rel=1e-4, abs=1e-6)
    w0 = load_file(str(model / "model.safetensors"))
    w1 = load_file(str(one / "hf_model" / "model.safetensors"))
    w2 = load_file(str(two / "hf_model" / "model.safetensors"))
    assert set(w1) == set(w2)
    for name in w1:  # same gradients up to float summation order
        assert torch.allclose(w1[name], w2[name], rtol=1e-4, atol=1e-5), name
    assert sum(not torch.equal(w0[n], w1[n]) for n in w1 if n in w0) > len(w1) // 2

    for rank in (0, 1):
        probe = json.loads((two / f"collectives-rank{rank}.json").read_text())
        records = probe["records"]
        assert {d for r in records for d in r["devices"]} <= {probe["group_device"]}
        ours = [r for r in records if r["caller"].startswith(str(PACKAGE))]
        assert ours, "the package issued no collective of its own"
        assert {Path(r["caller"]).name for r in ours} == {"distributed.py"}, ours
