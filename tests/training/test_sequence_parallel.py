"""`training.sequence_parallel_size` through the trainer (real torchrun, gloo, FSDP2, the HF
engine, a tiny Qwen2.5-VL, real videos, images and text prompts): 2 processes with SP 2 end 3
steps where 1 process without SP does; 4 processes (data-parallel 2 x SP 2) where 2 data-parallel
processes do; 3 (an SP group of 2 training, a rollout rank generating: `rollout.placement=separate`)
where the colocated SP group does; the ranks of an SP group split the rollout; bad settings stop
with one clear line. Qwen3.5 (a "medium" tiny model: its linear-attention layers split by 2 key
heads) on the same prompts: SP 2 where 1 process does, DP 2 x SP 2 where DP 2 does."""

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from test_distributed import TIMEOUT_S, _env, _weights, same_steps, setup, write_config  # noqa: F401 (setup: fixture)

from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.training.sequence_parallel import rollout_share
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)


def _train(cfg, procs: int):
    launcher = [sys.executable] if procs == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                    "--nproc-per-node", str(procs)]
    return forkserver.run(launcher + ["-m", "easyvideor1.cli", "train", str(cfg)], capture_output=True, text=True,
                          env=_env(), timeout=TIMEOUT_S)


def _same_run(a, b):
    wa, wb = _weights(a), _weights(b)
    assert set(wa) == set(wb)
    for name in wa:
        assert torch.allclose(wa[name], wb[name], rtol=1e-4, atol=1e-5), name
    keys = ("reward/all", "response/length", "advantage/mean", "advantage/abs_max", "actor/pg_loss",
            "update/grad_norm", "hybrid/groups_evaluated", "data/prompt_failures")
    same_steps(a, b, keys, 3)  # the same responses, rewards, losses, gradient norm (copies counted once)


# One 1-vs-2-process pair checks SP with the reference, recompute and dynamic sampling at once (it
# was three pairs: each property costs nothing in a run that already happens): a KL loss of kind
# `full` (the reference runs under SP too, inside the update), gradient checkpointing on the SP side
# (each checkpointed layer repeats its all-to-alls in backward) and DAPO's online filtering (the
# ranks of a group filter the same responses, shared before scoring).
ALGO = {"adv_estimator": "grpo", "policy_loss": "ppo_clip", "loss_agg_mode": "token_mean", "disable_kl": False,
        "use_kl_loss": True, "kl_estimator": "full", "kl_coef": 0.1, "online_filtering": True}
SP2 = {"training__sequence_parallel_size": 2, "model__gradient_checkpointing": True, "algorithm": ALGO}


@pytest.fixture(scope="module")
def sp2(setup):
    """3 steps in 1 process without SP and in 2 processes with SP 2 (their folders), and the
    latter's log."""
    root, model, data = setup
    outs = {k: root / f"sp_{k}" for k in ("one", "sp2")}
    for out in outs.values():
        shutil.rmtree(out, ignore_errors=True)
    one = write_config(root, model, data, outs["one"], steps=3, algorithm=ALGO)
    sp2 = write_config(root, model, data, outs["sp2"], steps=3, **SP2)
    p = _train(one, 1)
    assert p.returncode == 0, p.stderr[-4000:]
    p = _train(sp2, 2)
    assert p.returncode == 0, p.stderr[-6000:]
    return outs, p.stderr


def test_sp2_trains_as_one_process(sp2):
    outs, log = sp2
    assert "sequence parallelism: 2 ranks per row, 1 data-parallel groups" in log
    # group-shared rows (a group's prompt once) stay on under SP: packed rows with segments
    assert "shared prefix (a group's prompt runs once per micro-batch): on" in log
    _same_run(outs["one"], outs["sp2"])


def test_sp2_with_reference_recompute_and_dynamic_sampling(sp2):
    """The pair's KL term is live (the policy moved away from the reference) and both runs kept the
    same groups, each counted once (copies of a group on the SP ranks would double the count)."""
    outs, _ = sp2
    rows = {k: [json.loads(l) for l in (outs[k] / "metrics.jsonl").read_text().splitlines()] for k in outs}
    assert rows["sp2"][-1]["actor/kl_loss"] > 0
    for a, b in zip(rows["one"], rows["sp2"]):
        assert a["filter/filter_groups_kept"] == b["filter/filter_groups_kept"] == 4  # of 4 groups a step


def test_sp2_with_a_rollout_rank_equals_colocated(setup, sp2):
    """Separate placement under torchrun, k = 0: ranks 0-1 train as one SP group of 2, rank 2
    generates and scores; both trainer ranks take the group's (data-parallel rank 0's) share of
    each batch. The run is the colocated SP run's: parameters, responses, rewards, policy loss
    and gradient norm at each step."""
    root, model, data = setup
    out = root / "sp_separate"
    shutil.rmtree(out, ignore_errors=True)
    cfg = write_config(root, model, data, out, steps=3, rollout__placement="separate", **SP2)
    p = _train(cfg, 3)
    assert p.returncode == 0, p.stderr[-6000:]
    assert "sequence parallelism: 2 ranks per row, 1 data-parallel groups" in p.stderr
    assert "rollout rank 2: serving 2 trainer rank(s) from step 0" in p.stderr
    _same_run(sp2[0]["sp2"], out)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["async/staleness_max"] for r in rows] == [0.0, 0.0, 0.0]


def test_dp2_sp2_trains_as_dp2(setup):
    root, model, data = setup
    outs = {k: root / f"dpsp_{k}" for k in ("dp2", "dp2sp2")}
    for out in outs.values():
        shutil.rmtree(out, ignore_errors=True)
    dp2 = write_config(root, model, data, outs["dp2"], steps=3)
    dp2sp2 = write_config(root, model, data, outs["dp2sp2"], steps=3, training__sequence_parallel_size=2)
    p = _train(dp2, 2)
    assert p.returncode == 0, p.stderr[-4000:]
    p = _train(dp2sp2, 4)
    assert p.returncode == 0, p.stderr[-6000:]
    _same_run(outs["dp2"], outs["dp2sp2"])


QWEN3_5_VISION = {"family": "qwen3_5", "max_frames": 8, "video_min_pixels": 4096, "video_max_pixels": 16384,
                  "image_min_pixels": 4096, "image_max_pixels": 16384}


@pytest.fixture(scope="module")
def qwen3_5_model(setup):
    return build_tiny_model("qwen3_5", setup[0] / "qwen3_5_medium", seed=0, size="medium")


def test_qwen3_5_dp2_sp2_trains_as_dp2(setup, qwen3_5_model):
    """3 steps of Qwen3.5 on 4 processes, data-parallel 2 x SP 2 (linear-attention layers exchanged
    around their token mixing, group-shared rows on), equal 2 data-parallel processes. (SP 2 against
    one process: `tests/models/test_ulysses.py::test_sp2_equals_one_process[qwen3_5]`, log-probs and
    3 steps of parameters.) Plain SGD: AdamW turns float32 noise in a near-zero gradient element into
    a step of up to lr (measured: 1 of 32,768 q_proj elements 3.6e-5 apart after 3 steps, all the
    rest within 1e-6)."""
    root, _, data = setup
    plain, split = 2, 4
    outs = {k: root / f"q35_{plain}_{k}" for k in ("plain", "sp2")}
    for out in outs.values():
        shutil.rmtree(out, ignore_errors=True)
    cfgs = {k: write_config(root, qwen3_5_model, data, out, steps=3, vision=QWEN3_5_VISION, training__optimizer="sgd",
                            training__lr=0.1,
                            **({"training__sequence_parallel_size": 2} if k == "sp2" else {}))
            for k, out in outs.items()}
    p = _train(cfgs["plain"], plain)
    assert p.returncode == 0, p.stderr[-4000:]
    p = _train(cfgs["sp2"], split)
    assert p.returncode == 0, p.stderr[-6000:]
    assert f"sequence parallelism: 2 ranks per row, {plain} data-parallel groups" in p.stderr
    assert "shared prefix (a group's prompt runs once per micro-batch): on" in p.stderr
    _same_run(outs["plain"], outs["sp2"])


def test_bad_sequence_parallel_settings_are_one_line(setup):
    root, model, data = setup
    out = root / "sp_bad"
    cfg = write_config(root, model, data, out, steps=1, training__sequence_parallel_size=2)
    p = _train(cfg, 1)  # one process cannot hold a group of 2
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert "sequence_parallel_size=2 must be >= 1 and divide the number of processes (1)" in p.stderr


def test_sp2_ranks_split_the_rollout(setup, tmp_path):
    """Each rank of an SP group generates half of the group's responses (12 here: 6 each, one
    prompt's responses split between the ranks); gathered, they are those of one engine call
    over every prompt (the same seeds per response, so the same tokens)."""
    _, model, _ = setup
    worker = str(Path(__file__).parent / "split_rollout_worker.py")
    p = forkserver.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        worker, str(model), str(tmp_path)], capture_output=True, text=True, env=_env(),
                       timeout=TIMEOUT_S)
    assert p.returncode == 0, p.stderr[-6000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["generated"] for r in ranks] == [[6], [6]]  # one engine call each, half the responses
    for r in ranks:
        assert r["split"] == r["whole"] == ranks[0]["whole"]
        assert [[i for i, _ in grp] for grp in r["split"]] == [[g] * 4 for g in range(3)]


def test_rollout_share_covers_every_response_once():
    for counts in ([4, 4, 4], [1], [3, 1, 5], [2, 2]):
        for k in (1, 2, 3, 4):
            shares = [rollout_share(counts, k, j) for j in range(k)]
            flat = [(i, first + x) for share in shares for i, first, c in share for x in range(c)]
            assert flat == [(i, j) for i, c in enumerate(counts) for j in range(c)], (counts, k)
            sizes = [sum(c for *_, c in share) for share in shares]
            assert max(sizes) - min(sizes) <= 1
