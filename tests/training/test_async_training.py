"""Separate rollout placement (`training.async_rollout`): real rollout processes, real weight
broadcasts over gloo, real kills."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from easyvideor1.data.synth import write_suite
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.training.async_rollout import broadcast_versions, weight_version
from easyvideor1.training.metrics import read_metrics
from test_distributed import write_config

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _train(cfg, *extra, **kw):
    return subprocess.Popen([sys.executable, "-m", "easyvideor1.cli", "train", str(cfg), *extra], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def _finish(proc, timeout=600):
    out = proc.communicate(timeout=timeout)[0]
    assert proc.returncode == 0, out[-4000:]
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("async")
    model = build_tiny_model("qwen2_5_vl", root / "model", seed=1)
    data = write_suite(root / "synth", num_train=12, num_val=0, seed=4)["train"]
    return root, model, data


def test_the_schedule_is_fixed_by_steps_not_timing():
    assert [weight_version(s, 1, 0) for s in range(1, 6)] == [0, 0, 1, 2, 3]
    assert [weight_version(s, 0, 0) for s in range(1, 4)] == [0, 1, 2]
    # a checkpoint every 2 steps: the batch after it is generated with the checkpoint's weights
    assert [weight_version(s, 1, 2) for s in range(1, 7)] == [0, 0, 2, 2, 4, 4]
    assert [weight_version(s, 2, 0, start=3) for s in range(4, 7)] == [3, 3, 3]
    assert broadcast_versions(0, 5, 1, 0) == [1, 2, 3]
    assert broadcast_versions(2, 6, 1, 2) == [4]


def test_separate_on_policy_equals_colocated(setup):
    """k = 0 with a rollout process gives the parameters of the one-process run (3 steps)."""
    root, model, data = setup
    runs = {}
    for name, placement in (("colocated", "colocated"), ("separate", "separate")):
        cfg = write_config(root, model, data, root / name, steps=3,
                           rollout={"engine": "hf", "n": 2, "max_tokens": 12, "temperature": 1.0,
                                    "placement": placement})
        runs[name] = _train(cfg)
    outs = {k: _finish(p) for k, p in runs.items()}
    assert "rollout process" in outs["separate"]
    a = load_file(str(root / "colocated" / "hf_model" / "model.safetensors"))
    b = load_file(str(root / "separate" / "hf_model" / "model.safetensors"))
    base = load_file(str(model / "model.safetensors"))
    assert any(not torch.equal(a[n], base[n]) for n in a)  # it trained
    for n in a:
        torch.testing.assert_close(b[n], a[n], rtol=1e-5, atol=1e-6, msg=n)
    rows = read_metrics(root / "separate" / "metrics.jsonl")
    assert [r["async/staleness_max"] for r in rows] == [0.0, 0.0, 0.0]
    assert all("time/rollout_wait" in r and "time/weight_sync" in r for r in rows[:-1])
