"""Every algorithm that needs more than rewards trains in the real loop: ReMax (greedy
baseline rollouts), the exact full-vocabulary KL (as a loss and as a reward penalty), the
adaptive KL controller, REINFORCE++ and GDPO (batch whitening). Each runs 2 steps of
`build_run` + `train` in this process (what `easyvideor1 train` does, minus report and
export) on a tiny real model and real synthetic videos; ReMax also with a rollout process
(separate placement), which must equal the colocated run."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from easyvideor1.config import load_config
from easyvideor1.data.synth import write_suite
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.training.setup import build_run
from easyvideor1.training.trainer import train
from test_distributed import UPDATE_KEYS, same_steps, write_config

KL_LOSS = {"adv_estimator": "grpo", "policy_loss": "ppo_clip", "loss_agg_mode": "token_mean", "use_kl_loss": True}

CASES = {
    "remax": {"preset": "remax"},
    "full_kl_loss": {**KL_LOSS, "kl_estimator": "full", "kl_coef": 0.1},
    "full_kl_reward": {**KL_LOSS, "use_kl_loss": False, "kl_estimator": "full", "kl_coef": 0.1},
    # a short horizon, so the coefficient moves visibly in one step
    "adaptive_kl": {**KL_LOSS, "kl_controller": "adaptive", "kl_coef": 0.5, "kl_target": 0.1, "kl_horizon": 10.0},
    "reinforce_plus_plus": {"preset": "reinforce_plus_plus"},
    "gdpo": {"preset": "gdpo"},
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("algos")
    model = build_tiny_model("qwen2_5_vl", root / "model", seed=0)
    data = write_suite(root / "synth", num_train=8, num_val=0, seed=0)["train"]
    return root, model, data


def _trained(root, model, data, name, **extra):
    run = build_run(load_config(str(write_config(root, model, data, root / name, **extra))))
    train(run)
    return run


@pytest.fixture(scope="module")
def remax(setup):
    """The colocated ReMax run (also the reference of the separate-placement one)."""
    return _trained(*setup, "remax", algorithm=CASES["remax"])


@pytest.mark.parametrize("case", list(CASES))
def test_algorithm_trains_two_steps(setup, case, request):
    root, model, data = setup
    run = request.getfixturevalue("remax") if case == "remax" else _trained(root, model, data, case,
                                                                           algorithm=CASES[case])
    rows = run.history
    assert len(rows) == 2
    for row in rows:
        assert all(math.isfinite(v) for v in row.values() if isinstance(v, float)), row
    w0 = load_file(str(model / "model.safetensors"))
    moved = [n for n, p in run.model.named_parameters() if n in w0 and not torch.equal(w0[n], p.detach())]
    assert moved, "training left every parameter unchanged"
    first, second = rows
    if case == "remax":
        # one greedy response per prompt, scored; its mean reward is logged, never trained on
        assert all(0.0 <= r["remax/greedy_reward"] <= 1.0 and r["time/greedy_rollout"] > 0 for r in rows)
    if case == "full_kl_loss":
        # step 1: policy == reference, the exact KL is 0 up to rounding; step 2: > 0 (KL >= 0 always)
        assert abs(first["actor/kl_loss"]) < 1e-6
        assert second["actor/kl_loss"] > 1e-9
        # `kl/policy_ref` is always the k1 estimate (one named estimator), whatever the loss uses
        assert first["kl/policy_ref"] == pytest.approx(0.0, abs=1e-6) and second["kl/policy_ref"] != 0.0
    if case == "adaptive_kl":
        # Ziegler et al.: coef *= 1 + clip(kl / target - 1, +-0.2) * samples / horizon; 8 samples a step
        error = min(max(first["kl/policy_ref"] / 0.1 - 1.0, -0.2), 0.2)
        assert first["actor/kl_coef"] == 0.5
        assert second["actor/kl_coef"] == pytest.approx(0.5 * (1 + error * 8 / 10.0), rel=1e-12)
    if case == "reinforce_plus_plus":
        # returns are whitened over the batch's tokens: their token mean is 0
        assert all(abs(r["advantage/mean"]) < 1e-5 and r["advantage/abs_max"] > 0 for r in rows)


def test_remax_with_a_sample_that_fails_to_load(setup, tmp_path):
    """A corrupt video becomes a padding group; ReMax's greedy baseline decodes and scores only
    the real prompts (the padding prompt has no problem type a scorer knows)."""
    root, model, data = setup
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    video = next(r for r in rows if r.get("videos"))
    corrupt = tmp_path / "corrupt.mp4"
    corrupt.write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 8)
    bad = {**video, "problem_id": "corrupt-video",
           "videos": [str(corrupt)]}
    for r in rows:  # the suite's media paths are relative to its folder
        for key in ("videos", "images"):
            if key in r:
                r[key] = [str(data.parent / p) for p in r[key]]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(json.dumps(r) + "\n" for r in [bad] + rows))
    path = write_config(tmp_path, model, mixed, tmp_path / "out", algorithm={"preset": "remax"},
                        data__shuffle=False, data__on_error="skip", data__max_skip_fraction=1.0)
    run = build_run(load_config(str(path)))
    train(run)
    first, second = run.history
    assert first["data/prompt_failures"] == 1.0 and second["data/prompt_failures"] == 0.0
    assert all(0.0 <= r["remax/greedy_reward"] <= 1.0 and math.isfinite(r["actor/pg_loss"]) for r in run.history)


def test_remax_separate_placement_equals_colocated(setup, remax):
    """ReMax with a rollout process at k = 0: the rollout side generates the greedy baseline with
    the batch's weights and sends it with the batch, so the advantages, each step's policy loss and
    gradient norm, and the parameters after 2 steps are the colocated run's. (The trainer and the
    rollout process take one thread each, colocated two: sums in another order, hence rtol 1e-4,
    atol 1e-5, as `test_distributed`.)"""
    root, model, data = setup
    run = _trained(root, model, data, "remax_separate", algorithm=CASES["remax"], rollout__placement="separate")
    separate = dict(run.model.named_parameters())
    for name, p in remax.model.named_parameters():
        torch.testing.assert_close(separate[name], p, rtol=1e-4, atol=1e-5, msg=name)
    same_steps(root / "remax", root / "remax_separate", UPDATE_KEYS, 2)
    for a, b in zip(remax.history, run.history):
        assert b["remax/greedy_reward"] == a["remax/greedy_reward"] and b["async/greedy_rollout_s"] > 0
        assert b["async/staleness_max"] == 0.0 and b["advantage/abs_max"] == pytest.approx(a["advantage/abs_max"])
