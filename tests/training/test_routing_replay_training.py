"""Routing replay and the load-balancing loss in the trainer: tiny qwen3_vl_moe (and qwen3_5_moe on
packed, group-shared rows), HF engine, float32, `build_run` + `train` in this process (`models.routing`)."""

import json
import logging

import pytest

from easyvideor1.config import load_config
from easyvideor1.models.routing import moe_routers
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.training.setup import build_run
from easyvideor1.training.trainer import train
from test_distributed import synth_rows, write_config

MOE_METRICS = ("moe/router_agreement", "moe/expert_load_cv", "moe/aux_loss")
# Top-2 of 4 experts: a layer's N tokens fill 2N slots, at most N per expert, so the tokens-per-expert
# coefficient of variation is at most 1 (every token on the same two experts) and 0 only when balanced.
MAX_LOAD_CV = 1.0


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    root = tmp_path_factory.mktemp("routing")
    data = root / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in synth_rows(root)))
    return build_tiny_model("qwen3_vl_moe", root / "model", seed=0), data


def _run(tmp_path, moe, name, steps, **algorithm):
    model, data = moe
    extra = {f"algorithm__{k}": v for k, v in algorithm.items()}
    cfg = load_config(str(write_config(tmp_path, model, data, tmp_path / name, steps=steps,
                                       vision__family="qwen3_vl_moe", **extra)))
    run = build_run(cfg)
    return run, train(run)


def test_router_metrics_are_logged_each_step(moe, tmp_path):
    run, _ = _run(tmp_path, moe, "out", steps=2)
    assert run.ctx.routing_replay and run.ctx.router_shape == (2, 2)  # `rollout` is the default
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert all(k in row for k in MOE_METRICS), sorted(row)
        # the HF engine decodes with the policy itself, so every replayed (token, layer) route is the
        # trainer's own top-k (its KV-cache rounding flipped none: measured exactly 1.0)
        assert row["moe/router_agreement"] == 1.0, row["moe/router_agreement"]
        assert 0 < row["moe/expert_load_cv"] <= MAX_LOAD_CV, row["moe/expert_load_cv"]
        assert row["moe/aux_loss"] > 0


def test_aux_loss_changes_the_router_update(moe, tmp_path):
    """One step with the load-balancing loss off and one with it on (coefficient 1) from the same
    start: the same rollouts and forward (the same aux loss logged), but the routers move differently
    (two runs without it are bit-identical: a run is deterministic)."""
    off, metrics_off = _run(tmp_path, moe, "off", steps=1, router_aux_loss_coef=0.0)
    on, metrics_on = _run(tmp_path, moe, "on", steps=1, router_aux_loss_coef=1.0)
    assert metrics_off["moe/aux_loss"] == pytest.approx(metrics_on["moe/aux_loss"])  # the same forward
    assert metrics_off["moe/expert_load_cv"] == metrics_on["moe/expert_load_cv"]  # the same routes
    moved = max(float((a.weight - b.weight).abs().max()) for a, b in zip(moe_routers(off.model), moe_routers(on.model)))
    assert moved > 1e-4, moved


def test_qwen3_5_moe_replays_on_packed_shared_rows(moe, tmp_path, caplog):
    """Tiny qwen3_5_moe (Gated DeltaNet layers, gated shared expert) with `training.padding_free` and
    `training.shared_prefix` on: both take effect (log lines, context flags), the routes ride the
    packed, group-shared rows and every step's replayed routes are the trainer's own (agreement 1.0)."""
    _, data = moe
    model = build_tiny_model("qwen3_5_moe", tmp_path / "model", seed=0)
    out = tmp_path / "out"
    cfg = load_config(str(write_config(tmp_path, model, data, out, vision__family="qwen3_5_moe",
                                       training__padding_free=True, training__shared_prefix=True,
                                       algorithm__routing_replay="rollout")))
    with caplog.at_level(logging.INFO, logger="easyvideor1.training.setup"):
        run = build_run(cfg)
    assert "padding-free rows (micro-batch sequences packed in one row, attention per sequence): on" in caplog.text
    assert "shared prefix (a group's prompt runs once per micro-batch): on" in caplog.text
    assert run.ctx.padding_free and run.ctx.shared_prefix and run.ctx.routing_replay
    assert run.ctx.router_shape == (2, 2)
    train(run)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert all(k in row for k in MOE_METRICS), sorted(row)
        assert row["moe/router_agreement"] == 1.0, row["moe/router_agreement"]  # measured exactly 1.0
        assert 0 < row["moe/expert_load_cv"] <= MAX_LOAD_CV, row["moe/expert_load_cv"]
        assert row["update/grad_norm"] > 0
