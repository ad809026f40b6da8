"""`easyvideor1 train` as a user runs it (a real subprocess, tiny budget): overrides alone on top
of the defaults, no checkpoints with `checkpoint.every=0` (the HF export still written), a
timestamp and the wall time in every metrics row, and the preset-override warning."""

import json
import os
import re
import subprocess
import sys
import time

from safetensors.torch import load_file

from easyvideor1.cli import main
from easyvideor1.data.synth import write_suite
from easyvideor1.models.tiny import build_tiny_model
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)


def test_train_from_overrides_alone(tmp_path):
    model = build_tiny_model("qwen2_5_vl", tmp_path / "model", seed=0)
    data = write_suite(tmp_path / "synth", num_train=4, num_val=0, seed=0)["train"]
    out = tmp_path / "out"
    overrides = [f"model.path={model}", f"data.train_files={data}", f"logging.out_dir={out}", "model.dtype=float32",
                 "vision.max_frames=8", "vision.video_min_pixels=3136", "vision.video_max_pixels=12544",
                 "vision.image_min_pixels=3136", "vision.image_max_pixels=12544", "rollout.n=2",
                 "rollout.max_tokens=8", "training.steps=2", "training.rollout_batch_size=2",
                 "training.mini_batch_size=2", "training.micro_batch_size=2", "hybrid.enable=true",
                 "logging.progress=false", "checkpoint.every=0",
                 "algorithm.preset=gspo", "algorithm.policy_loss=ppo_clip"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    began = time.time()
    proc = forkserver.run([sys.executable, "-m", "easyvideor1.cli", "train", *overrides], capture_output=True,
                          text=True, env=env, timeout=600)
    ended = time.time()
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert ("algorithm.preset=gspo: policy_loss=ppo_clip (from the command line) overrides the preset's gspo"
            in proc.stderr)

    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert began <= rows[0]["timestamp"] <= rows[1]["timestamp"] <= ended
    for r in rows:  # the wall interval holds the stage timers and what they leave out
        assert r["time/wall"] >= r["time/step"] > 0
    assert sum(r["time/wall"] for r in rows) <= ended - began

    assert not (out / "checkpoints").exists()
    exported = load_file(str(out / "hf_model" / "model.safetensors"))
    initial = load_file(str(model / "model.safetensors"))
    assert any(not (exported[k] == v).all() for k, v in initial.items() if k in exported)  # the trained weights


def test_train_names_what_the_defaults_lack(tmp_path, capsys):
    for argv, expected in ((["training.steps=3"], r"set model\.path=DIR .* and data\.train_files="),
                           ([str(tmp_path / "missing.yaml")], r"config .*missing\.yaml: no such file"),
                           (["training.stepz=3"], "did you mean 'steps'")):
        assert main(["train", *argv]) == 2
        assert re.match(r"easyvideor1 train: .*" + expected, capsys.readouterr().err)


def test_settings_error_is_one_message_without_traceback(tmp_path):
    """A setting that cannot work (the model is Qwen2.5-VL, the frames are sized for Qwen3-VL) is
    found at start-up and reported as one message naming the field and the fix: exit 2."""
    model = build_tiny_model("qwen2_5_vl", tmp_path / "model", seed=0)
    data = write_suite(tmp_path / "synth", num_train=2, num_val=0, seed=0)["train"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = forkserver.run([sys.executable, "-m", "easyvideor1.cli", "train", f"model.path={model}",
                           f"data.train_files={data}", f"logging.out_dir={tmp_path / 'out'}", "model.dtype=float32",
                           "vision.family=qwen3_vl"], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 2, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr
    assert "easyvideor1 train: model.path" in proc.stderr and "set vision.family=qwen2_5_vl" in proc.stderr
