"""Nothing is dropped silently (issue 45).

At load: every shipped config's largest prompt (`vision.budget`) fits its `data.max_prompt_tokens`,
and a planted config whose frames exceed the prompt is refused in one line naming the largest
admissible settings (each of which then loads, and one step past it does not).
At run time: samples whose video file is missing are skipped and counted (`data/prompt_failures`,
`data/prompts`, the run's `data/skipped_total` and `data/skipped_fraction`, resumed with the
checkpoint); past `data.max_skip_fraction` the run stops naming them, in one process and, the
same step on every rank, in two (torchrun).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import yaml

import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)
from easyvideor1.config import load_config, prompt_budget_problem
from easyvideor1.config_tree import ConfigError
from easyvideor1.data.synth import write_suite
from easyvideor1.errors import UserError
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.training.setup import build_run
from easyvideor1.training.skips import TooManySkipped
from easyvideor1.training.trainer import train
from easyvideor1.vision.budget import prompt_vision_tokens

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "configs").glob("*.yaml")) + sorted((REPO / "easyvideor1" / "configs").glob("*.yaml"))
HERE = Path(__file__).parent
TIMEOUT_S = 900  # ends a hang


@pytest.mark.parametrize("path", SHIPPED, ids=[str(p.relative_to(REPO)) for p in SHIPPED])
def test_every_shipped_config_passes_the_budget_check(path):
    cfg = load_config(str(path))  # the check runs at load
    assert prompt_budget_problem(cfg) is None
    largest = prompt_vision_tokens(cfg.vision, cfg.rollout.limit_videos, cfg.rollout.limit_images)
    assert largest + cfg.data.prompt_text_tokens <= cfg.data.max_prompt_tokens


def test_the_defaults_pass_and_the_shipped_7b_config_holds_a_full_video():
    load_config(None, [])
    cfg = load_config(str(REPO / "configs" / "qwen2_5_vl_7b_8gpu.yaml"))
    # 12,802 video + 2 x 1,339 image + 512 text = 15,992 <= 16,384 (tests/vision/test_budget.py)
    assert prompt_vision_tokens(cfg.vision, 1, 2) + 512 == 15992 <= cfg.data.max_prompt_tokens == 16384


def _planted(tmp_path, **vision):
    path = tmp_path / "planted.yaml"
    path.write_text(yaml.safe_dump({"data": {"max_prompt_tokens": 16384},
                                    "vision": {"family": "qwen2_5_vl", "max_frames": 128, "video_max_pixels": 262144,
                                               "image_max_pixels": 1048576, **vision}}))
    return str(path)


def test_a_planted_config_whose_frames_exceed_the_prompt_names_the_fixing_values(tmp_path):
    path = _planted(tmp_path)  # the 7B config before the fix: 21,378-token videos in 16,384-token prompts
    with pytest.raises(ConfigError) as e:
        load_config(path)
    message = str(e.value)
    assert "\n" not in message and isinstance(e.value, UserError)
    assert "24,568 tokens" in message and "128 frames" in message, message
    fixes = dict(re.findall(r"(\S+) [<>]= (\d+)", message.split("; set ")[1]))
    assert fixes == {"data.max_prompt_tokens": "24568", "vision.max_frames": "79",
                     "vision.video_total_pixels": "10346447"}, message
    # each value is the largest (smallest for the prompt) admissible one: it loads, one step past it does not
    for key, value in fixes.items():
        step = 1 if key == "data.max_prompt_tokens" else -1
        load_config(path, [f"{key}={value}"])
        with pytest.raises(ConfigError):
            load_config(path, [f"{key}={int(value) - step}"])
    # media per prompt are counted as the rollout limits say: a video-only run has the room
    load_config(path, ["rollout.limit_images=0", "vision.video_total_pixels=12000000"])
    # images alone too large: the image setting is named
    with pytest.raises(ConfigError, match=r"data\.max_prompt_tokens >= 2\d{4}, or vision\.image_max_pixels <= \d+$"):
        load_config(_planted(tmp_path, max_frames=8), ["rollout.limit_images=20"])


# A tiny run: 6 samples that load and 2 whose video file is missing; 4 a step in file order.
OVERRIDES = ["model.dtype=float32", "vision.family=qwen2_5_vl", "vision.max_frames=8", "vision.video_min_pixels=3136",
             "vision.video_max_pixels=12544", "vision.image_min_pixels=3136", "vision.image_max_pixels=12544",
             "data.max_prompt_tokens=2048", "data.shuffle=false", "rollout.engine=hf", "rollout.n=2",
             "rollout.max_tokens=8", "algorithm.disable_kl=true", "training.rollout_batch_size=4",
             "training.mini_batch_size=4", "training.micro_batch_size=4", "training.lr=1e-3",
             "training.balance_ranks=false", "logging.progress=false", "checkpoint.export_hf=false",
             "checkpoint.resume=auto"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("skips")
    model = build_tiny_model("qwen2_5_vl", root / "model", seed=0)
    paths = write_suite(root / "synth", num_train=6, num_val=0, seed=0, tasks=("colour", "count"))
    rows = [json.loads(line) for line in paths["train"].read_text().splitlines()]
    for r in rows:
        for key in ("videos", "images"):
            if key in r:
                r[key] = [str(root / "synth" / p) for p in r[key]]
    video = next(r for r in rows if r.get("videos"))
    gone = [{**video, "problem_id": f"gone-{i}", "videos": [str(root / f"gone-{i}.mp4")]} for i in range(2)]
    late = root / "late.jsonl"  # step 1 loads; step 2 holds both missing videos: 2 of the 8 tried
    late.write_text("".join(json.dumps(r) + "\n" for r in rows[:4] + [rows[4], gone[0], rows[5], gone[1]]))
    early = root / "early.jsonl"  # rank 0's half of step 1 (balance_ranks off) holds one: 1 of 4
    early.write_text("".join(json.dumps(r) + "\n" for r in [gone[0]] + rows[:5]))
    return root, model, late, early


def _overrides(model, data, out, *extra):
    return [f"model.path={model}", f"data.train_files=[{data}]", f"logging.out_dir={out}", *OVERRIDES, *extra]


def test_skipped_samples_are_counted_and_resumed(setup):
    root, model, late, _ = setup
    out = root / "counted"
    # step 1 with a checkpoint, then a resumed run for step 2: the count goes on from the checkpoint,
    # so 2 of 8 (25%) stays under 0.3 (afresh it would be 2 of 4)
    run = build_run(load_config(None, _overrides(model, late, out, "training.steps=1", "checkpoint.every=1",
                                                 "data.max_skip_fraction=0.3")))
    train(run)
    run = build_run(load_config(None, _overrides(model, late, out, "training.steps=2", "checkpoint.every=1",
                                                 "data.max_skip_fraction=0.3")))
    train(run)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert [(r["data/prompts"], r["data/prompt_failures"], r["data/skipped_total"]) for r in rows] == [
        (4.0, 0.0, 0.0), (4.0, 2.0, 2.0)]
    assert rows[-1]["data/skipped_fraction"] == 0.25
    assert run.skips.first == [(f"gone-{i}", run.skips.first[i][1]) for i in range(2)]
    assert all("file not found" in why for _, why in run.skips.first)


def test_past_the_fraction_the_run_stops_naming_the_samples(setup):
    root, model, late, _ = setup
    out = root / "stopped"
    run = build_run(load_config(None, _overrides(model, late, out, "training.steps=2")))  # default 0.01
    with pytest.raises(TooManySkipped) as e:
        train(run)
    message = str(e.value)
    assert isinstance(e.value, UserError) and "\n" not in message
    assert message.startswith("2 of the 8 samples tried so far were skipped (25.0%, over data.max_skip_fraction=0.01)")
    assert "'gone-0': cannot decode video" in message and "'gone-1': cannot decode video" in message
    assert "file not found" in message and "data.max_skip_fraction" in message
    assert run.step == 2 and len(run.history) == 1  # step 1 was logged; step 2 stopped before its update


def test_every_rank_stops_at_the_same_step(setup):
    """Rank 0 alone holds the missing video: the counts are reduced before the decision, so both
    ranks stop in step 1 (a per-rank decision would leave rank 1 in the next collective)."""
    root, model, _, early = setup
    out = root / "two"
    prefix = root / "two-stopped"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    p = forkserver.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                        str(HERE / "skip_worker.py"), str(prefix),
                        *_overrides(model, early, out, "training.steps=2", "checkpoint.resume=never")],
                       capture_output=True, text=True, env=env, timeout=TIMEOUT_S)  # a hang ends here
    assert p.returncode == 0, p.stderr[-6000:]
    ranks = [json.loads(Path(f"{prefix}-rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0] == ranks[1] and ranks[0]["step"] == 1 and ranks[0]["logged"] == 0, ranks
    assert ranks[0]["stopped"].startswith("1 of the 4 samples tried so far were skipped (25.0%")
    assert "'gone-0': cannot decode video" in ranks[0]["stopped"]
