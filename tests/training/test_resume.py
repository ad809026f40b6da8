"""Exact resume: a training run SIGKILLed after a checkpoint and resumed (`resume: auto`)
ends with the same parameters as an uninterrupted run. Real subprocesses and checkpoints."""

import json
import os
import signal
import subprocess
import sys
import time

import torch
from safetensors.torch import load_file

from easyvideor1.data.synth import write_suite
from easyvideor1.models.tiny import build_tiny_model
from test_distributed import TIMEOUT_S, write_config


def _train(cfg):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-m", "easyvideor1.cli", "train", str(cfg)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_sigkill_and_resume_equals_uninterrupted(tmp_path):
    model = build_tiny_model("qwen2_5_vl", tmp_path / "model", seed=1)
    data = write_suite(tmp_path / "synth", num_train=16, num_val=0, seed=4)["train"]
    steps = 4
    straight = write_config(tmp_path, model, data, tmp_path / "straight", steps=steps, data__shuffle=True,
                            checkpoint__every=1, checkpoint__resume="auto")
    killed = write_config(tmp_path, model, data, tmp_path / "killed", steps=steps, data__shuffle=True,
                          checkpoint__every=1, checkpoint__resume="auto")
    proc = _train(straight)
    assert proc.wait(timeout=TIMEOUT_S) == 0, proc.stdout.read()[-4000:]

    proc = _train(killed)
    ckpts = tmp_path / "killed" / "checkpoints"
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline and not (ckpts / "step-000001" / "state.pt").exists():
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = sorted(p.name for p in ckpts.iterdir() if p.name.startswith("step-") and ".tmp" not in p.name)
    assert done and done[-1] < f"step-{steps:06d}", f"the run finished before the kill ({done})"
    proc = _train(killed)
    out = proc.stdout.read()
    assert proc.wait(timeout=TIMEOUT_S) == 0, out[-4000:]
    assert "resumed from" in out

    a = load_file(str(tmp_path / "straight" / "hf_model" / "model.safetensors"))
    b = load_file(str(tmp_path / "killed" / "hf_model" / "model.safetensors"))
    assert set(a) == set(b)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    steps_logged = [json.loads(l)["step"] for l in (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()]
    assert sorted(set(steps_logged)) == list(range(1, steps + 1))
