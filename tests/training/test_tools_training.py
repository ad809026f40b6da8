"""`easyvideor1 train` with `rollout.tools` (a real subprocess, tiny budget) on the `flash` task
with hybrid groups: each sample's offline trajectory calls crop_video on the stated window, so it
is replayed as a multi-turn response (its tool turn computed from the clip) and trained on
beside the online responses; the tool metrics are logged."""

import json
import os
import subprocess
import sys

from easyvideor1.data.synth import write_suite
from easyvideor1.models.tiny import build_tiny_model


def test_train_with_tools_replays_the_offline_call(tmp_path):
    model = build_tiny_model("qwen2_5_vl", tmp_path / "model", seed=0)
    data = write_suite(tmp_path / "synth", num_train=2, num_val=0, seed=0, tasks=("flash",))["train"]
    out = tmp_path / "out"
    overrides = [f"model.path={model}", f"data.train_files={data}", f"logging.out_dir={out}", "model.dtype=float32",
                 "vision.fps=1", "vision.max_frames=8", "vision.video_min_pixels=3136", "vision.video_max_pixels=3136",
                 "vision.image_min_pixels=3136", "vision.image_max_pixels=12544", "rollout.n=2",
                 "rollout.max_tokens=320", "rollout.tools=[crop_video]", "rollout.tool_call_visual_tokens=64",
                 "training.steps=1", "training.rollout_batch_size=2", "training.mini_batch_size=2",
                 "training.micro_batch_size=2", "training.lr=1e-3", "hybrid.enable=true", "logging.progress=false",
                 "checkpoint.every=0", "checkpoint.export_hf=false", "algorithm.disable_kl=true"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "easyvideor1.cli", "train", *overrides], capture_output=True,
                          text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (row,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert row["hybrid/groups_replaced"] == 2 and row["update/grad_norm"] > 0
    assert {"tools/calls_per_response", "tools/errors", "tools/visual_tokens"} <= set(row)
    examples = [json.loads(line) for line in (out / "examples.jsonl").read_text().splitlines()]
    (offline,) = [e for e in examples if e["offline"]]
    # replayed: its text is the answer turn (the call became a turn of its own, answered by the clip)
    assert offline["response"].startswith("<think>") and offline["accuracy"] == 1.0
