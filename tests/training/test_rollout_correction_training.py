"""Rollout correction in the real loop with the HF engine on a float32 tiny policy: the engine's
log-probs equal the trainer's (ratios 1 within 1e-4, per modality), so `token_tis` changes
nothing: the same parameters as `none` after two steps (hybrid groups included: offline
trajectories carry no rollout log-probs and are left out)."""

import pytest
import torch

from test_distributed import write_config

from easyvideor1.config import load_config
from easyvideor1.data.synth import write_suite
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.training.setup import build_run
from easyvideor1.training.trainer import train


def test_hf_engine_fp32_ratios_are_one_and_token_tis_changes_nothing(tmp_path):
    model = build_tiny_model("qwen2_5_vl", tmp_path / "model", seed=0)
    data = write_suite(tmp_path / "synth", num_train=8, num_val=0, seed=0)["train"]
    runs, last, start = {}, {}, {}
    for mode in ("none", "token_tis"):
        # SGD, not AdamW: Adam's first steps are ~lr*sign(g), so a 1e-6 gradient difference on a
        # near-zero component could move a weight by lr; SGD moves it by lr*1e-6.
        path = write_config(tmp_path, model, data, tmp_path / mode, steps=2, algorithm__rollout_correction=mode,
                            training__optimizer="sgd", training__lr=0.1)
        runs[mode] = run = build_run(load_config(str(path), ["checkpoint.export_hf=false"]))
        assert isinstance(run.optimizer, torch.optim.SGD)
        assert runs[mode].rollout_correction == mode
        if not start:
            start.update({n: p.detach().clone() for n, p in run.model.named_parameters()})
        last[mode] = train(runs[mode])
    m = last["token_tis"]
    assert abs(m["mismatch/ratio_max"] - 1) < 1e-4 and abs(m["mismatch/ratio_mean"] - 1) < 1e-4
    assert 0 <= m["mismatch/kl"] < 1e-8 and m["mismatch/corrected_frac"] == 0.0
    modal = [k for k in m if k.startswith("mismatch/ratio_max/")]
    assert modal and all(abs(m[k] - 1) < 1e-4 for k in modal)
    # weights 1 +- 1e-6 in float32: two SGD steps end within lr * 1e-6 of each other
    moved = 0
    for (name, a), (_, b), w0 in zip(runs["none"].model.named_parameters(), runs["token_tis"].model.named_parameters(),
                                     start.values()):
        assert torch.allclose(a, b, atol=1e-6), (name, float((a - b).abs().max()))
        moved += not torch.equal(a.detach(), w0)
    assert moved > 0  # the updates did something
    assert m["actor/pg_loss"] == pytest.approx(last["none"]["actor/pg_loss"], abs=1e-6)
    assert m["update/grad_norm"] == pytest.approx(last["none"]["update/grad_norm"], rel=1e-4)
    auto = build_run(load_config(str(write_config(tmp_path, model, data, tmp_path / "auto", steps=1)),
                                 ["checkpoint.export_hf=false"]))
    assert auto.rollout_correction == "none"  # auto with the hf engine
