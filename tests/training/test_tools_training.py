"""Training with `rollout.tools` on the `flash` task with hybrid groups: each sample's offline
trajectory calls crop_video on the stated window, so it is replayed as a multi-turn response
(its tool turn computed from the clip) and trained on beside the online responses. `easyvideor1
train` in a real subprocess logs the tool metrics; in-process runs with dynamic sampling fill
their batches with such groups (responses of 1 and 2 turns in one micro-batch, padding-free
rows), resume from a checkpoint exactly and, with a rollout process generating (separate
placement), equal the colocated run."""

import json
import logging
import os
import subprocess
import sys

import pytest
import torch

from easyvideor1.config import load_config
from easyvideor1.data.synth import write_suite
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.training.setup import build_run
from easyvideor1.training.trainer import train
from test_distributed import UPDATE_KEYS, same_steps
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)


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
    proc = forkserver.run([sys.executable, "-m", "easyvideor1.cli", "train", *overrides], capture_output=True,
                          text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (row,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert row["hybrid/groups_replaced"] == 2 and row["update/grad_norm"] > 0
    assert {"tools/calls_per_response", "tools/errors", "tools/visual_tokens"} <= set(row)
    examples = [json.loads(line) for line in (out / "examples.jsonl").read_text().splitlines()]
    (offline,) = [e for e in examples if e["offline"]]
    # replayed: its text is the answer turn (the call became a turn of its own, answered by the clip)
    assert offline["response"].startswith("<think>") and offline["accuracy"] == 1.0


def _flash_with_gaps(root):
    """6 flash samples in file order W N W N N W: W has its offline trajectory (a crop_video call,
    then the answer), N none. With 2 prompts per round, every round holds one group of each kind."""
    path = write_suite(root / "synth", num_train=6, num_val=0, seed=0, tasks=("flash",))["train"]
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for i in (1, 3, 4):
        del rows[i]["offline_output"]
    mixed = path.with_name("gaps.jsonl")
    mixed.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return mixed


@pytest.fixture(scope="module")
def flash(tmp_path_factory):
    """A tiny model and the flash samples of `_flash_with_gaps`."""
    root = tmp_path_factory.mktemp("flash")
    return root, build_tiny_model("qwen2_5_vl", root / "model", seed=0), _flash_with_gaps(root)


def _run_of(flash, name, *extra):
    """Dynamic sampling on the format reward over `flash`'s samples, 2 prompts a step, with tools."""
    root, model, data = flash
    return build_run(load_config(None, [
        f"model.path={model}", f"data.train_files={data}", f"logging.out_dir={root / name}", "model.dtype=float32",
        "data.shuffle=false", "vision.fps=1", "vision.max_frames=8", "vision.video_min_pixels=3136",
        "vision.video_max_pixels=3136", "rollout.n=2", "rollout.max_tokens=224", "rollout.tools=[crop_video]",
        "rollout.tool_call_visual_tokens=64", "training.rollout_batch_size=2", "training.mini_batch_size=2",
        "training.micro_batch_size=4", "training.lr=1e-3", "hybrid.enable=true", "logging.progress=false",
        "algorithm.disable_kl=true", "algorithm.online_filtering=true", "algorithm.filter_key=format",
        "checkpoint.export_hf=false", *extra]))


@pytest.fixture(scope="module")
def straight(flash):
    """The colocated 2-step run, and the filled batch of each step as the stage returned it."""
    run = _run_of(flash, "straight", "training.steps=2")
    kept = []
    fill = run.rollouts.filtered_groups
    run.rollouts.filtered_groups = lambda *args: kept.append(fill(*args)) or kept[-1]
    train(run)
    return run, kept


def test_dynamic_sampling_and_resume_with_tools(flash, straight, caplog):
    """Dynamic sampling on the format reward: a group of a sample without an offline trajectory
    (random responses, format 0) is dropped, one with it (the replayed multi-turn response has
    format 1) kept, so every step takes 2 rounds to fill its 2 groups, each an online one-turn
    response beside a 2-turn response with a clip mid-sequence, in one micro-batch of packed rows.
    A run stopped after its step-1 checkpoint and resumed (`checkpoint.resume: auto`, loader
    position mid-epoch after the extra rounds) ends step 2 with the same metrics and parameters
    as the uninterrupted run."""
    straight, kept = straight
    assert len(kept) == 2
    for scored in kept:  # padding groups would stand in for what the rounds did not fill
        assert [p.padding for p in scored.prompts] == [False, False], "the batch was not filled"
        for online, offline in scored.groups:
            assert len(online.turn_texts) == 1 and online.media is None and not online.offline
            assert offline.offline and len(offline.turn_texts) == 2 and offline.finish_reason == "offline"
            (call,) = offline.tool_calls
            assert call.name == "crop_video" and call.error is None and call.visual_tokens > 0
            assert offline.media.video_grid_thw is not None and not offline.truncated
    for row in straight.history:
        assert row["filter/filter_tries"] == 2 and row["filter/filter_dropped_all_wrong"] == 2
        assert row["filter/filter_groups_kept"] == 2 and row["hybrid/groups_replaced"] == 2
        assert row["perf/micro_batches"] == 1 and row["update/grad_norm"] > 0
    assert straight.ctx.padding_free

    resumed = _run_of(flash, "resumed", "training.steps=1", "checkpoint.every=1")
    train(resumed)
    with caplog.at_level(logging.INFO, logger="easyvideor1.training.trainer"):
        resumed = _run_of(flash, "resumed", "training.steps=2", "checkpoint.every=1")
        train(resumed)
    assert "resumed from" in caplog.text and "step-000001" in caplog.text
    (after,) = resumed.history  # only step 2 ran in this process
    keys = [k for k in straight.history[1] if not k.startswith(("time/", "perf/tokens_per_s", "timestamp"))]
    assert {k: after[k] for k in keys} == {k: straight.history[1][k] for k in keys}
    a, b = dict(straight.model.named_parameters()), dict(resumed.model.named_parameters())
    assert set(a) == set(b)
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_separate_placement_equals_colocated_with_tools(flash, straight):
    """k = 0 with a rollout process, which runs the tool loop and the replays (built as colocated,
    `setup.make_rollouts`) and fills the batches by dynamic sampling: the trainer takes the
    multi-turn responses with their tool turns masked and ends at the colocated run's parameters,
    with each step's policy loss and gradient norm and the same filter, hybrid, reward and tool
    metrics. (The trainer and the rollout process take one thread each, colocated two: sums in
    another order, hence rtol 1e-4, atol 1e-5, as `test_distributed`.)"""
    run = _run_of(flash, "separate", "training.steps=2", "rollout.placement=separate")
    train(run)
    separate = dict(run.model.named_parameters())
    for name, p in straight[0].model.named_parameters():
        torch.testing.assert_close(separate[name], p, rtol=1e-4, atol=1e-5, msg=name)
    root = flash[0]
    colocated, rows = same_steps(root / "straight", root / "separate", UPDATE_KEYS, 2)
    for a, b in zip(colocated, rows):
        keys = [k for k in a if k.startswith(("filter/", "hybrid/", "reward/", "tools/"))]
        assert "tools/calls_per_response" in keys and b["hybrid/groups_replaced"] == 2
        assert {k: b[k] for k in keys} == {k: a[k] for k in keys}
        assert b["async/staleness_max"] == 0.0
