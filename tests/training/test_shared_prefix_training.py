"""`training.shared_prefix` on and off: 5 real training steps end with the same parameters.

Tiny Qwen2.5-VL, the HF engine, prompts mixing video, image and text, hybrid groups (the offline
response is one more response of its group), two mini-batches per step (so the old log-prob pass
runs too), a micro-batch that holds one group, and gradient checkpointing. The 2-process FSDP2
run (tests/training/test_distributed.py) runs with the default, shared, path.
"""

import json
import logging

import pytest
import torch

from easyvideor1.config import load_config
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.training.setup import build_run
from easyvideor1.training.trainer import train
from test_distributed import TEXT, synth_rows, write_config


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("shared")
    rows = synth_rows(root)
    video = [r for r in rows if r["data_type"] == "video"]
    image = [r for r in rows if r["data_type"] == "image"]
    path = root / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [video[0], image[0], TEXT[0], video[1]]))
    return root, build_tiny_model("qwen2_5_vl", root / "model", seed=0), path


def _train(root, model, data, shared: bool):
    out = root / f"out_{shared}"
    cfg = load_config(str(write_config(
        root, model, data, out, steps=5, rollout__n=4, training__shared_prefix=shared,
        training__rollout_batch_size=2, training__mini_batch_size=1, training__micro_batch_size=4,
        model__gradient_checkpointing=True)))
    run = build_run(cfg)
    assert run.ctx.shared_prefix is shared
    before = {n: p.detach().clone() for n, p in run.model.named_parameters()}
    train(run)
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    after = {n: p.detach().clone() for n, p in run.model.named_parameters()}
    return after, rows, [n for n in after if not torch.equal(before[n], after[n])]


def test_five_steps_shared_equal_plain(data, caplog):
    root, model, path = data
    with caplog.at_level(logging.INFO, logger="easyvideor1.training.setup"):
        shared, rows_on, _ = _train(root, model, path, True)
    assert "shared prefix (a group's prompt runs once per micro-batch): on" in caplog.text
    plain, rows_off, moved = _train(root, model, path, False)
    assert len(rows_on) == len(rows_off) == 5
    # the same responses were sampled every step (the policies stayed equal)
    assert [r["reward/all"] for r in rows_on] == [r["reward/all"] for r in rows_off]
    assert [r["response/length"] for r in rows_on] == [r["response/length"] for r in rows_off]
    for name, p in plain.items():
        # Adam over 5 steps turns float-summation-order differences (~1e-7) into at most this
        torch.testing.assert_close(shared[name], p, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
    assert len(moved) > len(plain) // 2 and any("visual" in n for n in moved)
