"""`training.padding_free` on and off: 5 real training steps end with the same parameters; the
set-up says which path it took (Qwen3.5 packs too: tests/training/test_linear_attention_training.py).

Tiny Qwen2.5-VL, the HF engine generating with the very model that trains on packed rows, prompts
mixing video, image and text, hybrid groups, two mini-batches per step (so the old log-prob pass
runs), micro-batches of 3 that cut groups (group-shared rows, the default, packed as blocks),
gradient checkpointing, and a reference model with the exact KL as a reward penalty
(`kl_estimator: full`: the reference log-prob and full-KL passes pack too). The 2-process FSDP2
run (tests/training/test_distributed.py) and the LoRA runs (test_lora.py) take the default,
packed, path.
"""

import json
import logging

import pytest
import torch

from easyvideor1.config import load_config
from easyvideor1.models.packing import PACKED_ATTENTION, language_attention
from easyvideor1.training.setup import build_run
from easyvideor1.training.trainer import train
from test_distributed import write_config
from test_shared_prefix_training import data  # noqa: F401  (module fixture: tiny Qwen2.5-VL + mixed prompts)

LINE = "padding-free rows (micro-batch sequences packed in one row, attention per sequence): "


def _train(root, model, path, packed: bool):
    out = root / f"out_packed_{packed}"
    cfg = load_config(str(write_config(
        root, model, path, out, steps=5, rollout__n=4, training__padding_free=packed,
        training__rollout_batch_size=2, training__mini_batch_size=1, training__micro_batch_size=3,
        model__gradient_checkpointing=True, algorithm__disable_kl=False, algorithm__use_kl_loss=False,
        algorithm__kl_estimator="full", algorithm__kl_coef=0.1)))
    run = build_run(cfg)
    assert run.ctx.padding_free is packed and run.ctx.shared_prefix
    want = PACKED_ATTENTION  # packed rows and padded group-shared rows alike run as pieces
    assert language_attention(run.model) == language_attention(run.reference) == want
    before = {n: p.detach().clone() for n, p in run.model.named_parameters()}
    train(run)
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    after = {n: p.detach().clone() for n, p in run.model.named_parameters()}
    return after, rows, [n for n in after if not torch.equal(before[n], after[n])]


def test_five_steps_packed_equal_padded(data, caplog):  # noqa: F811
    root, model, path = data
    with caplog.at_level(logging.INFO, logger="easyvideor1.training.setup"):
        packed, rows_on, _ = _train(root, model, path, True)
        assert LINE + "on" in caplog.text
        caplog.clear()
        padded, rows_off, moved = _train(root, model, path, False)
        assert LINE + "off (training.padding_free=false)" in caplog.text
    assert len(rows_on) == len(rows_off) == 5
    # the same responses were sampled every step (the policies stayed equal)
    assert [r["reward/all"] for r in rows_on] == [r["reward/all"] for r in rows_off]
    assert [r["response/length"] for r in rows_on] == [r["response/length"] for r in rows_off]
    # the reference pass took part (k1 estimate: either sign), with the same values on both paths
    assert abs(rows_on[-1]["kl/policy_ref"]) > 1e-4
    assert [r["kl/policy_ref"] for r in rows_on] == pytest.approx([r["kl/policy_ref"] for r in rows_off], abs=1e-6)
    for name, p in padded.items():
        # Float summation order differs (per-sequence attention vs a padded batch: log-probs
        # ~5e-7 apart); Adam at lr 1e-3 over 5 steps turns that into at most this. A sequence
        # attending to its neighbour moves log-probs by ~0.1 and the first step's update visibly.
        torch.testing.assert_close(packed[name], p, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
    assert len(moved) > len(padded) // 2 and any("visual" in n for n in moved)
