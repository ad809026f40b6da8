"""torchrun + FSDP2 on 2 CPU processes (gloo): a rank whose micro-batch has no vision input
trains without hanging, and the parameters after 2 steps equal those of the same run in 1
process, as do each step's policy loss and gradient norm (AdamW with clipping would end at the
same weights with a gradient off by the world size; those two metrics would not). Real
subprocesses, a real tiny model, real videos. The first test's ranks have string-hash secrets
of their own (tests/forkserver.py's `hash_seed`), so ranks that iterate a set differently fail it."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
import yaml
from safetensors.torch import load_file

from easyvideor1.data.synth import write_suite
from easyvideor1.models.tiny import build_tiny_model
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)

TEXT = [{"problem_id": f"text-{i}", "problem": f"What is {i} plus {i + 1}?", "answer": str(2 * i + 1),
         "problem_type": "numerical", "data_type": "text",
         "offline_output": f"<think>{i}+{i + 1}</think><answer>{2 * i + 1}</answer>"} for i in range(2)]
# Subprocess limit: ends a hang; never reached by a slow run (these take well under a minute
# here, a few on 2 busy cores).
TIMEOUT_S = 1800


def synth_rows(root, num_train=8):
    """The synthetic training rows written under `root/synth`, media paths made absolute."""
    rows = [json.loads(l) for l in write_suite(root / "synth", num_train=num_train, num_val=0, seed=0)["train"]
            .read_text().splitlines()]
    for r in rows:
        for key in ("videos", "images"):
            if key in r:
                r[key] = [str(root / "synth" / p) for p in r[key]]
    return rows


def write_config(root, model, data, out, steps=2, **extra):
    cfg = {
        "vision": {"family": "qwen2_5_vl", "max_frames": 8, "video_min_pixels": 3136, "video_max_pixels": 12544,
                   "image_min_pixels": 3136, "image_max_pixels": 12544},
        "model": {"path": str(model), "dtype": "float32"},
        "rollout": {"engine": "hf", "n": 2, "max_tokens": 12, "temperature": 1.0},
        "algorithm": {"adv_estimator": "grpo", "policy_loss": "ppo_clip", "loss_agg_mode": "token_mean",
                      "disable_kl": True},
        "training": {"steps": steps, "rollout_batch_size": 4, "mini_batch_size": 4, "micro_batch_size": 2,
                     "lr": 1e-3, "seed": 0},
        "hybrid": {"enable": True},
        "data": {"train_files": [str(data)], "shuffle": False},
        "logging": {"out_dir": str(out), "progress": False},
        "checkpoint": {"every": 0, "resume": "never"},
    }
    for key, value in extra.items():  # section__name=value sets one field; section=dict replaces it
        if "__" not in key:
            cfg[key] = value
            continue
        section, name = key.split("__")
        cfg[section][name] = value
    path = root / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    model = build_tiny_model("qwen2_5_vl", root / "model", seed=0)
    paths = write_suite(root / "synth", num_train=8, num_val=0, seed=0)
    rows = [json.loads(l) for l in paths["train"].read_text().splitlines()]
    video = [r for r in rows if r["data_type"] == "video"][:2]
    image = [r for r in rows if r["data_type"] == "image"][:2]
    # global batch = 4 prompts in file order; rank 0 gets 2 videos, rank 1 two text-only prompts
    # (no vision input at all: the masked dummy block keeps FSDP's collectives in step);
    # step 2: an image and a text prompt on rank 0, an image and a video on rank 1.
    ordered = video + TEXT + [image[0], TEXT[0] | {"problem_id": "text-9"}, image[1], video[0] | {"problem_id": "v9"}]
    for r in ordered:
        for key in ("videos", "images"):
            if key in r:
                r[key] = [str(root / "synth" / p) for p in r[key]]
    data = root / "mixed.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ordered))
    return root, model, data


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _weights(out):
    return load_file(str(out / "hf_model" / "model.safetensors"))


# What a uniform gradient-scale error (FSDP2 summing instead of averaging, a loss normaliser
# off by the world size) changes while the weights after AdamW + clipping stay put.
UPDATE_KEYS = ("actor/pg_loss", "update/grad_norm")


def same_steps(a, b, keys, steps):
    """The runs in folders `a` and `b` logged `steps` steps with equal `keys` at each (rtol 1e-4,
    atol 1e-5); returns both metrics lists."""
    ma = [json.loads(l) for l in (a / "metrics.jsonl").read_text().splitlines()]
    mb = [json.loads(l) for l in (b / "metrics.jsonl").read_text().splitlines()]
    assert len(ma) == len(mb) == steps
    for step, (ra, rb) in enumerate(zip(ma, mb), 1):
        for key in keys:
            assert abs(ra[key] - rb[key]) <= 1e-5 + 1e-4 * abs(ra[key]), (step, key, ra[key], rb[key])
    assert all(r["update/grad_norm"] > 1e-3 for r in ma)  # a gradient to compare: the check has teeth
    return ma, mb


def test_fsdp_two_processes_equal_one_process(setup):
    root, model, data = setup
    one = root / "one"
    two = root / "two"
    for out in (one, two):
        shutil.rmtree(out, ignore_errors=True)
    cfg1 = write_config(root, model, data, one, rollout__parity_check_every=1)
    cfg2 = write_config(root, model, data, two, rollout__parity_check_every=1)
    p1 = forkserver.run([sys.executable, "-m", "easyvideor1.cli", "train", str(cfg1)], capture_output=True,
                        text=True, env=_env(), timeout=TIMEOUT_S)
    assert p1.returncode == 0, p1.stderr[-4000:]
    # --standalone: the rendezvous takes a free port (a fixed one may be held by another run here).
    # hash_seed: each rank a fresh interpreter with a string-hash secret of its own (PYTHONHASHSEED
    # 1 and 2), as a user's ranks have; forked ranks share one and iterate any set of names alike
    p2 = forkserver.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                         "-m", "easyvideor1.cli", "train", str(cfg2)], capture_output=True, text=True,
                        env=_env(), timeout=TIMEOUT_S, hash_seed=1)
    assert p2.returncode == 0, p2.stderr[-6000:]
    assert "packed in one row, attention per sequence): on" in p2.stderr  # the default: padding-free rows
    w1, w2 = _weights(one), _weights(two)
    w0 = load_file(str(model / "model.safetensors"))
    assert set(w1) == set(w2)
    moved = 0
    for name in w1:
        assert torch.allclose(w1[name], w2[name], rtol=1e-4, atol=1e-5), name
        if name in w0 and not torch.equal(w0[name], w1[name]):
            moved += 1
    assert moved > len(w1) // 2  # training changed most tensors, vision tower included
    assert any("visual" in n and not torch.equal(w0[n], w2[n]) for n in w2 if n in w0)
    m1, m2 = same_steps(one, two, UPDATE_KEYS, 2)
    assert [round(r["reward/all"], 6) for r in m1] == [round(r["reward/all"], 6) for r in m2]
    # engine vs trainer log-probs: equal up to the banned vision pad tokens' mass (random model)
    gaps = [v for r in m1 + m2 for k, v in r.items() if k.startswith("parity/max_gap/")]
    assert gaps and max(gaps) < 0.05, gaps


def test_reinforce_plus_plus_two_processes_equal_one_process(setup):
    """REINFORCE++ whitens over the whole batch: with the batch split over 2 ranks (each
    whitening its own half would give other advantages) training ends where 1 process does."""
    root, model, data = setup
    outs = {k: root / f"rpp_{k}" for k in ("one", "two")}
    cfgs = {k: write_config(root, model, data, out, algorithm={"preset": "reinforce_plus_plus"})
            for k, out in outs.items()}
    p1 = forkserver.run([sys.executable, "-m", "easyvideor1.cli", "train", str(cfgs["one"])], capture_output=True,
                        text=True, env=_env(), timeout=TIMEOUT_S)
    assert p1.returncode == 0, p1.stderr[-4000:]
    p2 = forkserver.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                         "-m", "easyvideor1.cli", "train", str(cfgs["two"])], capture_output=True, text=True,
                        env=_env(), timeout=TIMEOUT_S)
    assert p2.returncode == 0, p2.stderr[-6000:]
    w1, w2 = _weights(outs["one"]), _weights(outs["two"])
    assert set(w1) == set(w2)
    for name in w1:
        assert torch.allclose(w1[name], w2[name], rtol=1e-4, atol=1e-5), name
    m1, m2 = same_steps(outs["one"], outs["two"], UPDATE_KEYS, 2)
    assert [round(r["reward/all"], 6) for r in m1] == [round(r["reward/all"], 6) for r in m2]
    assert all(r["advantage/abs_max"] > 0 for r in m1)
