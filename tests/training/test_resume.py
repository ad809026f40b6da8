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
from easyvideor1.training.metrics import read_metrics
from test_distributed import TIMEOUT_S, write_config
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)


def _train(cfg):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return forkserver.Popen([sys.executable, "-m", "easyvideor1.cli", "train", str(cfg)], env=env,
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
    while time.monotonic() < deadline and not (ckpts / "step-000001" / "state.json").exists():
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


def test_resume_keeps_the_adaptive_kl_coefficient(tmp_path):
    """A run stopped after its step-2 checkpoint and resumed continues with the adaptive KL
    coefficient it had reached (not `kl_coef` again): step 3's coefficient and the final
    parameters equal those of an uninterrupted 3-step run. The two halves are fresh interpreters
    with string-hash secrets of their own (PYTHONHASHSEED 2 and 3; tests/forkserver.py's
    `hash_seed`), as a user's restarted run has: a forked child keeps its server's."""
    model = build_tiny_model("qwen2_5_vl", tmp_path / "model", seed=1)
    data = write_suite(tmp_path / "synth", num_train=8, num_val=0, seed=4)["train"]
    algo = {"adv_estimator": "grpo", "policy_loss": "ppo_clip", "loss_agg_mode": "token_mean", "use_kl_loss": True,
            "kl_estimator": "low_var_kl", "kl_controller": "adaptive", "kl_coef": 0.5, "kl_target": 0.1,
            "kl_horizon": 10.0}
    cfgs = {k: write_config(tmp_path, model, data, tmp_path / k, steps=3, algorithm=algo, checkpoint__every=1,
                            checkpoint__resume="auto") for k in ("straight", "resumed")}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    for cfg, extra, seed in ((cfgs["straight"], [], None), (cfgs["resumed"], ["training.steps=2"], 2),
                             (cfgs["resumed"], [], 3)):
        proc = forkserver.run([sys.executable, "-m", "easyvideor1.cli", "train", str(cfg), *extra], env=env,
                              capture_output=True, text=True, timeout=600, hash_seed=seed)
        assert proc.returncode == 0, proc.stderr[-4000:]
    assert "resumed from" in proc.stderr and "step-000002" in proc.stderr

    coef = {k: {r["step"]: r["actor/kl_coef"] for r in read_metrics(tmp_path / k / "metrics.jsonl")} for k in cfgs}
    assert sorted(coef["resumed"]) == [1, 2, 3]
    assert coef["straight"][3] != 0.5  # the controller moved it (the check has teeth)
    assert coef["resumed"][3] == coef["straight"][3]
    a = load_file(str(tmp_path / "straight" / "hf_model" / "model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "hf_model" / "model.safetensors"))
    assert set(a) == set(b)
    for name in a:
        assert torch.equal(a[name], b[name]), name
