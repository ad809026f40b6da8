"""Separate rollout placement (`training.asynchronous`): real rollout processes, real weight
broadcasts over gloo, real kills."""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import torch
from safetensors.torch import load_file

from easyvideor1.data.synth import write_suite
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.config import load_config
from easyvideor1.config_tree import ConfigError
from easyvideor1.prompts import Prompt
from easyvideor1.records import RewardResult, Rollout, Sample
from easyvideor1.training.asynchronous.placement import check_placement
from easyvideor1.training.asynchronous.schedule import broadcast_versions, weight_version
from easyvideor1.training.asynchronous.shares import trainer_shares
from easyvideor1.training.groups import ScoredGroups
from easyvideor1.training.hybrid import HybridCounters
from easyvideor1.training.metrics import read_metrics
from test_distributed import UPDATE_KEYS, same_steps, write_config
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _train(cfg, *extra, env=ENV):
    return forkserver.Popen([sys.executable, "-m", "easyvideor1.cli", "train", str(cfg), *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc, timeout=600):
    out = proc.communicate(timeout=timeout)[0]
    assert proc.returncode == 0, out[-4000:]
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("async")
    # tied embeddings, as the small real checkpoints: training unties the head in any launch
    # (fsdp.untie_head), so the rollout side must hold and take a head of its own (review
    # gpu-scale-review-2, N4; with the head never sent, the k = 0 runs here differ from colocated)
    model = build_tiny_model("qwen2_5_vl", root / "model", seed=1, tie_embeddings=True)
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


def test_placement_errors_name_the_field():
    with pytest.raises(ConfigError, match="max_staleness=1 needs rollout.placement=separate"):
        check_placement(load_config(None, ["training.max_staleness=1"]), 1)
    with pytest.raises(ConfigError, match="rollout.processes=0 must be >= 1"):
        check_placement(load_config(None, ["rollout.placement=separate", "rollout.processes=0"]), 1)
    with pytest.raises(ConfigError, match="rollout.processes=2 under torchrun with 2 processes leaves no trainer"):
        check_placement(load_config(None, ["rollout.placement=separate", "rollout.processes=2"]), 2)
    with pytest.raises(ConfigError, match="rollout.tensor_parallel_size=2 must divide rollout.processes=3"):
        check_placement(load_config(None, ["rollout.placement=separate", "rollout.processes=3", "rollout.engine=vllm",
                                           "rollout.tensor_parallel_size=2"]), 1)
    check_placement(load_config(None, ["rollout.placement=separate", "training.max_staleness=2"]), 1)
    check_placement(load_config(None, ["rollout.placement=separate"]), 2)  # torchrun: 1 trainer + 1 rollout rank
    check_placement(load_config(None, ["rollout.placement=separate", "rollout.processes=2"]), 1)  # started by train
    check_placement(load_config(None, ["rollout.placement=separate", "rollout.processes=2"]), 3)  # 1 trainer + 2
    check_placement(load_config(None, ["rollout.placement=separate", "rollout.processes=2", "rollout.engine=vllm",
                                       "rollout.tensor_parallel_size=2"]), 1)  # one engine over both
    check_placement(load_config(None, ["rollout.placement=separate", "model.lora.rank=8"]), 1)  # adapters travel
    check_placement(load_config(None, ["rollout.placement=separate", "training.sequence_parallel_size=2"]), 3)
    partial = ["rollout.partial=true", "rollout.placement=separate", "training.max_staleness=1"]
    check_placement(load_config(None, partial), 1)
    check_placement(load_config(None, partial + ["rollout.tools=[crop_video]"]), 2)  # torchrun: one rollout rank
    with pytest.raises(ConfigError, match="rollout.partial=true .* needs rollout.placement=separate and training"):
        check_placement(load_config(None, partial[:2]), 1)
    with pytest.raises(ConfigError, match="rollout.partial=true runs on rollout.engine=hf only, not vllm"):
        check_placement(load_config(None, partial + ["rollout.engine=vllm"]), 1)
    with pytest.raises(ConfigError, match="rollout.partial=true runs with rollout.processes=1 only, not 2"):
        check_placement(load_config(None, partial + ["rollout.processes=2"]), 1)
    with pytest.raises(ValueError, match="rollout.partial_tokens must be >= 0"):
        load_config(None, partial + ["rollout.partial_tokens=-1"])


def _scored(slots, n=2):
    """Global scored groups as the rollout side makes them: one group per loaded slot, in slot
    order (seeds numbered by the slot), then a padding group per failed one. Prompts carry no
    pixels: the shares only move them."""
    samples = [Sample(problem=f"q{i}", answer="A", problem_type="multiple choice", problem_id=f"s{i}")
               for i in range(4)]
    pad = Prompt(Sample(problem="", answer="", problem_type="text"), [], None, padding=True)
    prompts = [Prompt(samples[i], [], None, seed_offset=i * n) for i in slots] + [pad] * (4 - len(slots))
    groups = [[Rollout(g, [1], "x") for _ in range(n)] for g in range(4)]
    results = [[RewardResult(float(g), 0.0, 0.0)] * n for g in range(4)]
    return ScoredGroups(prompts, groups, results, HybridCounters(groups_replaced=3), {"filter/x": 1.0}), samples, pad


def test_each_trainer_rank_takes_its_colocated_share():
    """Without dynamic sampling trainer rank r takes the slots a colocated run gives rank r (here
    contiguous: balance_ranks off), a failed sample's slot padded; with dynamic sampling equal
    consecutive parts. Hybrid counts (summed over ranks) go with rank 0, filter metrics with each."""
    scored, batch, pad = _scored([0, 2, 3])  # slot 1 failed to load
    cfg = load_config(None, ["training.rollout_batch_size=4", "training.mini_batch_size=4", "training.balance_ranks=false", "rollout.n=2"])
    shares = trainer_shares(scored, batch, 2, cfg, pad)
    assert [[p.sample.problem_id or "pad" for p in s.prompts] for s in shares] == [["s0", "pad"], ["s2", "s3"]]
    assert [[res[0].overall for res in s.results] for s in shares] == [[0.0, 0.0], [1.0, 2.0]]
    assert [s.hybrid.groups_replaced for s in shares] == [3, 0]
    assert all(s.filter_metrics == {"filter/x": 1.0} for s in shares)
    # 4 trainer ranks in sequence-parallel groups of 2: 2 data-parallel parts, each rank its group's
    sp = load_config(None, ["training.rollout_batch_size=4", "training.mini_batch_size=4",
                            "training.balance_ranks=false", "rollout.n=2", "training.sequence_parallel_size=2"])
    shares = trainer_shares(scored, batch, 4, sp, pad)
    ids = [[p.sample.problem_id or "pad" for p in s.prompts] for s in shares]
    assert ids == [["s0", "pad"], ["s0", "pad"], ["s2", "s3"], ["s2", "s3"]]
    assert [s.hybrid.groups_replaced for s in shares] == [3, 3, 0, 0]  # summed over one rank per SP group
    assert trainer_shares(scored, batch, 2, sp, pad) == [scored, scored]  # one SP group: the whole batch each
    filtered = load_config(None, ["training.rollout_batch_size=4", "training.mini_batch_size=4", "algorithm.online_filtering=true", "rollout.n=2"])
    scored, batch, pad = _scored([3, 0, 2, 1])  # kept over rounds: any order
    shares = trainer_shares(scored, batch, 2, filtered, pad)
    assert [[p.sample.problem_id for p in s.prompts] for s in shares] == [["s3", "s0"], ["s2", "s1"]]
    assert trainer_shares(scored, batch, 1, filtered, pad) == [scored]


def _on_policy_config(root, model, data, name, placement, processes=1):
    """3 steps, k = 0, hybrid groups and dynamic sampling (filled on the rollout side when separate)."""
    return write_config(root, model, data, root / name, steps=3,
                        rollout={"engine": "hf", "n": 2, "max_tokens": 12, "temperature": 1.0, "placement": placement,
                                 "processes": processes},
                        algorithm={"adv_estimator": "grpo", "policy_loss": "ppo_clip", "loss_agg_mode": "token_mean",
                                   "disable_kl": True, "online_filtering": True, "max_filter_tries": 3})


@pytest.fixture(scope="module")
def colocated(setup):
    """The one-process colocated run that every on-policy separate run must equal."""
    root, model, data = setup
    _finish(_train(_on_policy_config(root, model, data, "colocated", "colocated")))
    return root / "colocated"


def _equals_colocated(colocated, out, base, rtol, atol):
    """The run in `out` ended at the colocated run's parameters (within rtol, atol) after 3
    on-policy steps, with the same dynamic-sampling, hybrid and reward metrics each step, and the
    same policy loss and gradient norm each step (`test_distributed.same_steps`: AdamW with
    clipping ends at the same weights with a gradient off by a constant factor, e.g. the world
    size; these two would not)."""
    a = load_file(str(colocated / "hf_model" / "model.safetensors"))
    b = load_file(str(out / "hf_model" / "model.safetensors"))
    base = load_file(str(base / "model.safetensors"))
    assert any(not torch.equal(a[n], base[n]) for n in base)  # it trained (the tied base has no lm_head.weight)
    for n in a:
        torch.testing.assert_close(b[n], a[n], rtol=rtol, atol=atol, msg=n)
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["async/staleness_max"] for r in rows] == [0.0, 0.0, 0.0]
    assert all("time/rollout_wait" in r and "time/weight_sync" in r for r in rows[:-1])
    same = read_metrics(colocated / "metrics.jsonl")
    for a_row, b_row in zip(same, rows):  # dynamic sampling and hybrid groups ran on the rollout side alike
        keys = [k for k in a_row if k.startswith(("filter/", "hybrid/", "reward/"))]
        assert "filter/filter_groups_kept" in keys and b_row["hybrid/groups_replaced"] > 0
        assert {k: b_row[k] for k in keys} == {k: a_row[k] for k in keys}
    same_steps(colocated, out, UPDATE_KEYS, 3)


@pytest.fixture(scope="module")
def separate(setup):
    """The k = 0 run with one rollout process."""
    root, model, data = setup
    out = _finish(_train(_on_policy_config(root, model, data, "separate", "separate")))
    assert "the rollout process (pid" in out
    return root / "separate"


def test_separate_on_policy_equals_colocated(setup, colocated, separate):
    """k = 0 with a rollout process gives the parameters of the one-process run (3 steps), with
    hybrid groups and dynamic sampling filled on the rollout side."""
    _equals_colocated(colocated, separate, setup[1], rtol=1e-5, atol=1e-6)


def test_two_rollout_processes_equal_one_and_colocated(setup, colocated, separate):
    """k = 0 with 2 rollout processes (each generating half of every round's responses, dynamic
    sampling and hybrid groups decided on the gathered batch) ends at the parameters of one rollout
    process and of the colocated run, with the same filter, hybrid and reward metrics."""
    root, model, data = setup
    out = _finish(_train(_on_policy_config(root, model, data, "two", "separate", processes=2)))
    assert "rollout process 0 (pid" in out and "rollout process 1 (pid" in out
    assert "separate placement: 2 rollout process(es)" in out
    _equals_colocated(colocated, root / "two", model, rtol=1e-5, atol=1e-6)
    a = load_file(str(separate / "hf_model" / "model.safetensors"))
    b = load_file(str(root / "two" / "hf_model" / "model.safetensors"))
    for n in a:
        torch.testing.assert_close(b[n], a[n], rtol=1e-5, atol=1e-6, msg=n)


def test_torchrun_rollout_rank_equals_colocated(setup, colocated):
    """torchrun with 3 processes: ranks 0-1 train (FSDP2 over the two of them), rank 2 only
    generates and scores, each trainer rank taking its half of every batch; k = 0 ends at the
    one-process colocated run's parameters (FSDP's reduction order: rtol 1e-4, atol 1e-5, as
    `test_distributed`) with its policy loss and gradient norm at each step, and every rank exits 0."""
    root, model, data = setup
    cfg = _on_policy_config(root, model, data, "torchrun", "separate")
    # --standalone: the rendezvous takes a free port
    p = forkserver.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
                        "-m", "easyvideor1.cli", "train", str(cfg)], capture_output=True, text=True, env=ENV,
                       timeout=1800)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    assert "rollout rank 2: serving 2 trainer rank(s) from step 0" in p.stderr
    assert "trainer rank 1: the rollout rank 2 at" in p.stderr
    _equals_colocated(colocated, root / "torchrun", model, rtol=1e-4, atol=1e-5)


def test_torchrun_two_rollout_ranks_equal_colocated(setup, colocated):
    """torchrun with 3 processes and rollout.processes=2: rank 0 trains, ranks 1-2 generate (a pool:
    half of every round's responses each; rank 1 sends the batches); k = 0 ends at the one-process
    colocated run's parameters with its policy loss and gradient norm at each step, and every rank
    exits 0."""
    root, model, data = setup
    cfg = _on_policy_config(root, model, data, "torchrun2", "separate", processes=2)
    p = forkserver.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
                        "-m", "easyvideor1.cli", "train", str(cfg)], capture_output=True, text=True, env=ENV,
                       timeout=1800)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    for rank in (1, 2):
        assert f"rollout rank {rank}: serving 1 trainer rank(s) from step 0" in p.stderr
        assert f"trainer rank 0: the rollout rank {rank} at" in p.stderr
    _equals_colocated(colocated, root / "torchrun2", model, rtol=1e-4, atol=1e-5)


def _async_config(root, model, data, name, steps, processes=1, **extra):
    return write_config(root, model, data, root / name, steps=steps, training={
        "steps": steps, "rollout_batch_size": 4, "mini_batch_size": 4, "micro_batch_size": 2, "lr": 1e-3,
        "seed": 0, "max_staleness": 1}, rollout={"engine": "hf", "n": 2, "max_tokens": 12, "temperature": 1.0,
                                                  "placement": "separate", "processes": processes}, **extra)


def _gaps(out, step):
    """Batch `step`'s behaviour log-probs (the rollout's, on its generated tokens) against the
    trainer's own forward on those tokens, as the `trainer.logprobs` test hook saved them: the
    largest |gap| to the proximal policy (the weights after step - 1) and to the reference (the
    base model: the weights after step 0)."""
    saved = torch.load(out / f"logprobs-{step:06d}.rank0.pt")
    known = saved["known"]
    assert known.sum() > 10  # generated tokens to compare
    return tuple(float((saved["behaviour"] - saved[key])[known].abs().max()) for key in ("old", "ref"))


def _partial_gaps(out, step, head):
    """Batch `step` of a partial-rollouts run (a switch after `head` decode steps): the versions of
    its generated tokens by position (head, tail), and the largest |gap| of the behaviour log-probs
    to the proximal policy (after step - 1) and to the reference (after step 0) on each version's
    tokens."""
    saved = torch.load(out / f"logprobs-{step:06d}.rank0.pt")
    known, versions = saved["known"], saved["versions"]
    assert known.sum() > 10 and bool((versions[known] >= 0).all())
    by_place = (set(versions[:, :head][known[:, :head]].tolist()), set(versions[:, head:][known[:, head:]].tolist()))
    gaps = {}
    for v in set(versions[known].tolist()):
        on = known & (versions == v)
        gaps[v] = tuple(float((saved["behaviour"] - saved[key])[on].abs().max()) for key in ("old", "ref"))
    return by_place, gaps


def test_one_step_stale_uses_decoupled_ppo_and_resumes_exactly(setup):
    """k = 1: batch s comes from the weights after step s-2 (staleness 1 after the first step),
    shown on the batches' log-probs, and the rollout correction is on (token_tis against the
    proximal policy). With partial rollouts (a switch after 6 of the 12 tokens) a stale batch's
    first 6 tokens come from the weights after step s-2 and the rest from those after step s-1,
    each token's log-prob its version's, and a run SIGKILLed after its step-2 checkpoint and
    resumed ends with the parameters of an uninterrupted run. Switching as the weights arrive
    (partial_tokens 0), each token is still sampled from its recorded version: the next test."""
    root, model, data = setup
    steps = 4
    # a reference (the base model) and old log-probs every step (the parity check): the trainer's
    # forward at the weights after step 0 and after step s-1, on every batch
    witness = {"algorithm__disable_kl": False, "rollout__parity_check_every": 1}
    hook = ENV | {"EASYVIDEOR1_TEST_HOOK": "trainer.logprobs:1:save"}
    checkpoints = {"every": 2, "resume": "auto"}
    out = _finish(_train(_async_config(root, model, data, "k1", steps, checkpoint=checkpoints, **witness), env=hook))
    assert "rollout correction: token_tis (auto: the run is asynchronous" in out
    gaps = [_gaps(root / "k1", s) for s in range(1, steps + 1)]
    # checkpoint every 2: batch 3 is generated with step 2's weights (a checkpoint holds nothing in flight)
    on_policy, stale = (gaps[0], gaps[2]), (gaps[1], gaps[3])
    assert all(old < 1e-4 for old, _ in on_policy), gaps  # float32 decoding against the full forward: ~1e-6
    assert all(old > 1e-3 for old, _ in stale), gaps  # not the weights after step s-1 ...
    assert gaps[1][1] < 1e-4, gaps  # ... batch 2: the weights after step 0 (s-2), the base model's
    rows = read_metrics(root / "k1" / "metrics.jsonl")
    assert [r["async/staleness_max"] for r in rows] == [0.0, 1.0, 0.0, 1.0]  # what the rollout process says

    partial = {"rollout__partial": True, "rollout__partial_tokens": 6, **witness}
    _finish(_train(_async_config(root, model, data, "k1p", steps, checkpoint=checkpoints, **partial), env=hook))
    for s in range(1, steps + 1):
        by_place, gaps = _partial_gaps(root / "k1p", s, head=6)
        assert gaps[s - 1][0] < 1e-4, (s, gaps)  # the tokens of the weights after step s-1: the proximal policy's
        if s in (1, 3):  # on-policy (step 3: after a checkpoint): no switch
            assert by_place == ({s - 1}, {s - 1}), (s, by_place)
            continue
        assert by_place == ({s - 2}, {s - 1}), (s, by_place)
        assert gaps[s - 2][0] > 1e-3, (s, gaps)  # the head: older weights ...
    assert _partial_gaps(root / "k1p", 2, head=6)[1][0][1] < 1e-4  # ... batch 2's: the base model's
    rows = read_metrics(root / "k1p" / "metrics.jsonl")
    assert [r["async/staleness_max"] for r in rows] == [0.0, 1.0, 0.0, 1.0]
    assert all(0.0 < rows[i]["async/staleness_mean"] < 1.0 for i in (1, 3)), rows  # per token: head 1, tail 0

    killed = _async_config(root, model, data, "k1p_killed", steps, checkpoint=checkpoints, **partial)
    proc = _train(killed)
    ckpt = root / "k1p_killed" / "checkpoints" / "step-000002" / "state.json"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not ckpt.exists() and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert not (root / "k1p_killed" / "checkpoints" / f"step-{steps:06d}").exists(), "finished before the kill"
    out = _finish(_train(killed))
    assert "resumed from" in out
    a = load_file(str(root / "k1p" / "hf_model" / "model.safetensors"))
    b = load_file(str(root / "k1p_killed" / "hf_model" / "model.safetensors"))
    for n in a:
        assert torch.equal(a[n], b[n]), n


def test_partial_rollouts_switch_as_the_weights_arrive(setup):
    """k = 1, 3 steps, partial rollouts switching as each weight sync arrives (partial_tokens 0),
    the arrivals placed by the `partial.arrival` test hook (timing puts them anywhere, or nowhere, in
    a run this small). Batch 2's next weights (after step 1) come after its generation: all its
    tokens are the base model's, and the rollout side, not waiting at the batch's end, takes them
    before batch 3. Batch 3's next ones (after step 2) come 6 decode steps in: its first 6 tokens are
    from the weights after step 1, the rest from those after step 2. Each token's behaviour log-prob
    is its recorded version's."""
    root, model, data = setup
    witness = {"algorithm__disable_kl": False, "rollout__parity_check_every": 1}  # ref and old log-probs saved
    hooks = "trainer.logprobs:1:save,partial.arrival:2:after,partial.arrival:3:decode=6"
    arrival = {"rollout__partial": True, "rollout__partial_tokens": 0, **witness}
    _finish(_train(_async_config(root, model, data, "k1a", 3, **arrival), env=ENV | {"EASYVIDEOR1_TEST_HOOK": hooks}))
    (one, gaps1), (two, gaps2), (three, gaps3) = (_partial_gaps(root / "k1a", s, head=6) for s in (1, 2, 3))
    assert (one, two, three) == (({0}, {0}), ({0}, {0}), ({1}, {2}))  # the versions of head and tail
    assert gaps1[0][0] < 1e-4 and gaps2[0][1] < 1e-4, (gaps1, gaps2)  # batch 1 on-policy; batch 2 the base's ...
    assert gaps2[0][0] > 1e-3, gaps2  # ... not the weights after step 1 (its proximal policy)
    assert gaps3[2][0] < 1e-4, gaps3  # batch 3's tail: the weights after step 2, its proximal policy
    assert gaps3[1][0] > 1e-3 and gaps3[1][1] > 1e-3, gaps3  # its head: neither those nor the base's
    rows = read_metrics(root / "k1a" / "metrics.jsonl")
    assert [r["async/staleness_max"] for r in rows] == [0.0, 1.0, 1.0]
    assert rows[1]["async/staleness_mean"] == 1.0 and 0.0 < rows[2]["async/staleness_mean"] < 1.0, rows


def _rollout_pids(proc, n) -> list[int]:
    """The rollout processes' pids from the trainer's log (read until all n are started)."""
    lines, pids = [], []
    for line in proc.stdout:
        lines.append(line)
        found = re.search(r"rollout process (?:\d+ )?\(pid (\d+)\) started", line)
        if found:
            pids.append(int(found.group(1)))
            if len(pids) == n:
                return pids
    raise AssertionError("the rollout processes did not start:\n" + "".join(lines[-40:]))


def _first_step(out, timeout=300):
    """Wait until the run has logged a step (the rollout process is serving batches)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not (out / "metrics.jsonl").exists():
        time.sleep(0.1)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" in f.read()  # a zombie has ended
    except FileNotFoundError:
        return True


def test_a_dead_rollout_process_stops_the_trainer(setup):
    """Of 2 rollout processes the one that only generates (not the one sending batches) is killed."""
    root, model, data = setup
    proc = _train(_async_config(root, model, data, "dies", 200, processes=2))
    pids = _rollout_pids(proc, 2)
    _first_step(root / "dies")
    os.kill(pids[1], signal.SIGKILL)
    out = proc.communicate(timeout=60)[0]  # no hang: it stops within a minute
    assert proc.returncode != 0
    assert f"rollout process 1 (pid {pids[1]}) died with exit code -9" in out, out[-3000:]


def test_a_killed_trainer_takes_its_rollout_processes_with_it(setup):
    root, model, data = setup
    proc = _train(_async_config(root, model, data, "orphan", 200, processes=2))
    pids = _rollout_pids(proc, 2)
    _first_step(root / "orphan")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()  # the rollout processes hold the pipe too: no read to its end
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(_gone(pid) for pid in pids):
        time.sleep(0.1)
    assert all(_gone(pid) for pid in pids), f"rollout processes {pids} outlived their trainer"


def _vllm_config(root, model, data, name, processes=1, tensor_parallel_size=1):
    """2 steps, k = 0, the rollout side on vLLM in float32 (`test_vllm_trainer.VLLM`), with `processes`
    rollout processes."""
    from test_vllm_trainer import VLLM

    return write_config(root, model, data, root / name, steps=2, **VLLM, rollout__placement="separate",
                        rollout__processes=processes, rollout__tensor_parallel_size=tensor_parallel_size)


@pytest.fixture(scope="module")
def vllm_env(setup):
    """vLLM's CPU test environment (`test_vllm_trainer._env`), with a short socket folder of its own
    (conftest's `ipc_dir` is per test)."""
    pytest.importorskip("vllm")
    from test_vllm_trainer import _env

    ipc = tempfile.mkdtemp(prefix="ev1-ipc-")
    yield _env(setup[0], ipc, threads=2)
    shutil.rmtree(ipc, ignore_errors=True)


@pytest.fixture(scope="module")
def vllm_separate(setup, vllm_env):
    """The vLLM run with 2 rollout processes started by the trainer, one rank each of a vLLM pool
    (vLLM's external_launcher on the pool's own process group, an engine each at
    tensor_parallel_size 1, each generating half of every batch with the responses' own seeds)."""
    root, model, data = setup
    env = vllm_env | {"OMP_NUM_THREADS": "1"}  # 3 processes on the 2 cores (as the torchrun test below)
    out = _finish(_train(_vllm_config(root, model, data, "vllm", processes=2), env=env), timeout=900)
    assert "rollout process 0 (pid" in out and "rollout process 1 (pid" in out
    assert out.count("tensor_parallel_size=1") == 2, out[-4000:]  # vLLM's engine config: an engine per process
    assert "Traceback" not in out  # each engine shut down before its pool's group was left, not at exit
    return root / "vllm"


@pytest.mark.vllm
def test_separate_with_the_vllm_engine(vllm_separate):
    """2 rollout processes, a vLLM engine (float32) each: step 2's responses, half from each engine,
    come from the broadcast weights of step 1, so their log-probs match the trainer's within float32
    noise (an engine that missed a sync would not)."""
    rows = read_metrics(vllm_separate / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    gaps = [v for r in rows for k, v in r.items() if k.startswith("parity/max_gap/")]
    assert gaps and max(gaps) < 1e-4


def _equals_vllm_run(one, out, base):
    """The run in `out` generated what the vLLM run `one` generated (the same first group's responses
    each step, `examples.jsonl`, and the same response, reward and hybrid metrics) and ended at its
    parameters. Measured equal bit for bit; vLLM's batches differ (float32 sums in another order
    may), so within rtol 1e-4, atol 1e-5. The log-prob parity of every step holds in `out` too: each
    rollout process's engine took every weight sync."""
    a, b = (load_file(str(d / "hf_model" / "model.safetensors")) for d in (one, out))
    base = load_file(str(base / "model.safetensors"))
    assert any(not torch.equal(a[n], base[n]) for n in base)  # it trained
    for n in a:
        torch.testing.assert_close(b[n], a[n], rtol=1e-4, atol=1e-5, msg=n)
    assert (out / "examples.jsonl").read_text() == (one / "examples.jsonl").read_text()
    rows, same = read_metrics(out / "metrics.jsonl"), read_metrics(one / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for a_row, b_row in zip(same, rows):
        keys = [k for k in a_row if k.startswith(("response/", "reward/", "hybrid/"))]
        assert {"reward/all", "response/length", "hybrid/groups_replaced"} <= set(keys), keys
        assert {k: b_row[k] for k in keys} == {k: a_row[k] for k in keys}
        gaps = [v for k, v in b_row.items() if k.startswith("parity/max_gap/")]
        assert gaps and max(gaps) < 1e-4


@pytest.mark.vllm
def test_torchrun_two_vllm_rollout_ranks_one_tensor_parallel_engine(setup, vllm_env, vllm_separate):
    """torchrun with 3 processes, rollout.processes=2 and rollout.tensor_parallel_size=2: rank 0
    trains, ranks 1-2 are the pool and one vLLM engine over both (external_launcher sees the pool's
    ranks 0-1, not torchrun's 1-2; each rank's half of the responses exchanged within the engine):
    the responses and parameters of the spawned pool of two engines at tensor_parallel_size 1
    (`vllm_separate`; tensor-parallel sums: measured 5e-6 apart), and every rank exits 0."""
    root, model, data = setup
    cfg = _vllm_config(root, model, data, "vllm_torchrun2", processes=2, tensor_parallel_size=2)
    p = forkserver.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
                        "-m", "easyvideor1.cli", "train", str(cfg)], capture_output=True, text=True,
                       env=vllm_env | {"OMP_NUM_THREADS": "1"}, timeout=900)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    for rank in (1, 2):
        assert f"rollout rank {rank}: serving 1 trainer rank(s) from step 0" in p.stderr
    assert (p.stdout + p.stderr).count("tensor_parallel_size=2") == 2  # vLLM's engine config, on each pool rank
    _equals_vllm_run(vllm_separate, root / "vllm_torchrun2", model)
