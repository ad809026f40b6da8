"""Token-budget micro-batches under torchrun (2 CPU processes, gloo, FSDP2) with very unequal
sequence lengths per rank.

Step 1: rank 0 holds two video prompts with a long question (rows far over the budget: one
micro-batch each, per response), rank 1 two short text prompts (all four responses fit in one
micro-batch). Step 2 the other way round. Rank 1 must split down to rank 0's count, or FSDP's
collectives mismatch and the run hangs or aborts. The run finishes, both ranks issue the same
sequence of collectives, and the parameters equal those of a 1-process run with the fixed
`micro_batch_size` split (the loss normaliser is exact for any split). That run keeps contiguous
rank slices (`training.balance_ranks: false`); with the default, balanced slices
(`training.rank_balance`), each rank takes one long and one short prompt: the token imbalance
falls to about 1 and the parameters are again those of one process.

Fillers (`training.micro_batches`): a rank holding fewer responses than another's micro-batch
count (never in the trainer, whose ranks hold equal numbers) runs zero-loss micro-batches;
`filler_worker.py` runs one update so, under FSDP2, against one process.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from test_distributed import TEXT, synth_rows, write_config

from easyvideor1.models.tiny import build_tiny_model
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)

HERE = Path(__file__).parent
TIMEOUT_S = 900  # ends a hang (a count mismatch); these runs take about a minute here
BUDGET = 300  # tokens: a long prompt's row is over it alone, rank 1's four short rows fit in one


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("balance")
    model = build_tiny_model("qwen2_5_vl", root / "model", seed=0)
    rows = synth_rows(root)
    video = [r for r in rows if r["data_type"] == "video"][:2]
    long = [r | {"problem": "Describe each frame, every object, its colour and its motion. " * 12 + r["problem"]}
            for r in video]
    short = [t | {"problem": f"{i}?"} for i, t in enumerate(TEXT)]
    later = [l | {"problem_id": l["problem_id"] + "-b"} for l in long]
    ordered = long + short + [s | {"problem_id": s["problem_id"] + "-b"} for s in short] + later
    data = root / "unequal.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ordered))
    return root, model, data


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def test_unequal_ranks_make_equal_micro_batch_counts(setup):
    root, model, data = setup
    one, two, balanced = root / "fixed_one", root / "budget_two", root / "budget_balanced"
    for out in (one, two, balanced):
        shutil.rmtree(out, ignore_errors=True)
    # parity: an old log-prob pass. SGD: its update is linear in the gradient, so the parameters
    # compare the gradients themselves (Adam's first steps are ~lr*sign(g): a 1e-9 difference on a
    # near-zero gradient component moved one weight by 1.4e-5, and a scale error would not show)
    common = dict(training__shared_prefix=False, rollout__parity_check_every=1, training__optimizer="sgd")
    cfg1 = write_config(root, model, data, one, **common)
    cfg2 = write_config(root, model, data, two, training__micro_batch_tokens=BUDGET, training__balance_ranks=False,
                        **common)
    p1 = forkserver.run([sys.executable, "-m", "easyvideor1.cli", "train", str(cfg1)], capture_output=True,
                        text=True, env=_env(), timeout=TIMEOUT_S)
    assert p1.returncode == 0, p1.stderr[-4000:]
    p2 = forkserver.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                         str(HERE / "record_collectives.py"), str(cfg2)], capture_output=True, text=True,
                        env=_env(), timeout=TIMEOUT_S)
    assert p2.returncode == 0, p2.stderr[-6000:]
    assert "over training.micro_batch_tokens=300" in p2.stderr  # the long rows, named

    m1 = [json.loads(l) for l in (one / "metrics.jsonl").read_text().splitlines()]
    m2 = [json.loads(l) for l in (two / "metrics.jsonl").read_text().splitlines()]
    assert len(m1) == len(m2) == 2
    for a, b in zip(m1, m2):
        assert a["reward/all"] == pytest.approx(b["reward/all"], abs=1e-6)  # the same responses
        assert a["actor/pg_loss"] == pytest.approx(b["actor/pg_loss"], rel=1e-4, abs=1e-6)
        # one rank computes several times the other's tokens: the lengths really are unequal
        assert b["perf/rank_token_imbalance"] > 1.5
        assert b["perf/micro_batches"] == 4.0  # rank 0: 4 rows over the budget; rank 1 split 1 -> 4

    records = [json.loads((two / f"collectives-rank{r}.json").read_text())["records"] for r in (0, 1)]
    assert [x["fn"] for x in records[0]] == [x["fn"] for x in records[1]]  # the same collectives, in order

    w0 = load_file(str(model / "model.safetensors"))
    w1 = load_file(str(one / "hf_model" / "model.safetensors"))
    w2 = load_file(str(two / "hf_model" / "model.safetensors"))
    assert set(w1) == set(w2)
    for name in w1:  # same gradients up to float summation order, SGD over 2 steps
        torch.testing.assert_close(w2[name], w1[name], rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
    assert sum(not torch.equal(w0[n], w2[n]) for n in w2 if n in w0) > len(w2) // 2

    cfg3 = write_config(root, model, data, balanced, training__micro_batch_tokens=BUDGET, **common)
    p3 = forkserver.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                         "-m", "easyvideor1.cli", "train", str(cfg3)], capture_output=True, text=True, env=_env(),
                        timeout=TIMEOUT_S)
    assert p3.returncode == 0, p3.stderr[-6000:]
    m3 = [json.loads(l) for l in (balanced / "metrics.jsonl").read_text().splitlines()]
    for a, b, c in zip(m1, m2, m3):
        assert a["reward/all"] == pytest.approx(c["reward/all"], abs=1e-6)  # seeds follow the sample, not the rank
        assert c["perf/rank_token_imbalance"] < 1.1 < b["perf/rank_token_imbalance"]
    w3 = load_file(str(balanced / "hf_model" / "model.safetensors"))
    for name in w1:
        torch.testing.assert_close(w3[name], w1[name], rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")


def test_rank_with_fewer_responses_runs_zero_loss_fillers(setup, tmp_path):
    """Rank 0 holds 3 responses, rank 1 one; every row is over a 1-token budget, so rank 0 runs 3
    micro-batches and rank 1 its one plus 2 fillers. Fillers count zero (loss, normaliser): one
    update ends where one process with all 4 responses in one micro-batch does."""
    _, model, _ = setup
    worker = str(HERE / "filler_worker.py")
    p1 = forkserver.run([sys.executable, worker, str(model), str(tmp_path / "one"), "0"], capture_output=True,
                        text=True, env=_env(), timeout=TIMEOUT_S)
    assert p1.returncode == 0, p1.stderr[-4000:]
    p2 = forkserver.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                         worker, str(model), str(tmp_path / "two"), "1"], capture_output=True, text=True,
                        env=_env(), timeout=TIMEOUT_S)
    assert p2.returncode == 0, p2.stderr[-6000:]
    plans = [json.loads((tmp_path / "two" / f"plan-rank{r}.json").read_text()) for r in (0, 1)]
    assert plans == [{"micro_batches": 3, "fillers": 0}, {"micro_batches": 3, "fillers": 2}]
    w0 = torch.load(tmp_path / "one" / "initial.pt")
    w1 = torch.load(tmp_path / "one" / "params.pt")
    w2 = torch.load(tmp_path / "two" / "params.pt")
    assert set(w1) == set(w2)
    for name in w1:  # the same gradient up to float summation order, one SGD step
        torch.testing.assert_close(w2[name], w1[name], rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
    language = [n for n in w1 if "visual" not in n]  # text prompts: the vision tower sees only dummies
    assert language and all(not torch.equal(w0[n], w1[n]) for n in language)
    m1 = json.loads((tmp_path / "one" / "metrics.json").read_text())
    m2 = json.loads((tmp_path / "two" / "metrics.json").read_text())
    assert m2["actor/pg_loss"] == pytest.approx(m1["actor/pg_loss"], rel=1e-5, abs=1e-7)
