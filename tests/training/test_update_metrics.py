"""The update's logged metrics do not depend on how a mini-batch is split into micro-batches:
loss terms (already divided by the mini-batch normaliser) are summed, token means weighted by
their token counts. Real loop, tiny model, one step each with micro-batch sizes 1, 4 and 8. After
the step no parameter holds a gradient (`zero_grad(set_to_none=True)` after the optimizer step)."""

import pytest

from test_distributed import write_config

from easyvideor1.config import load_config
from easyvideor1.data.synth import write_suite
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.training.setup import build_run
from easyvideor1.training.trainer import train

KEYS = ("actor/pg_loss", "actor/kl_loss", "actor/approx_kl", "actor/clip_frac", "actor/ratio_mean",
        "actor/ratio_max", "kl/policy_ref", "update/grad_norm")


def test_update_metrics_do_not_depend_on_the_micro_batch_size(tmp_path):
    model = build_tiny_model("qwen2_5_vl", tmp_path / "model", seed=0)
    data = write_suite(tmp_path / "synth", num_train=8, num_val=0, seed=0)["train"]
    rows = {}
    for micro in (1, 4, 8):
        path = write_config(tmp_path, model, data, tmp_path / f"out{micro}", steps=1,
                            training__micro_batch_size=micro, training__ppo_epochs=2,
                            algorithm__disable_kl=False, algorithm__use_kl_loss=True)
        cfg = load_config(str(path), ["checkpoint.export_hf=false", "algorithm.kl_estimator=low_var_kl"])
        run = build_run(cfg)
        assert run.model.is_gradient_checkpointing  # model.gradient_checkpointing auto: 8192-token prompt cap
        rows[micro] = train(run)
        # freed after each optimizer step: no gradient sits through the weight sync and the next rollout
        assert all(p.grad is None for p in run.model.parameters())
    for key in KEYS:
        values = [rows[m][key] for m in (1, 4, 8)]
        # the same tokens summed in another order: float32 rounding only
        assert values == pytest.approx([values[0]] * 3, rel=1e-4, abs=1e-6), (key, values)
    assert rows[1]["actor/pg_loss"] != 0.0 and rows[1]["actor/kl_loss"] > 0.0  # the second epoch moved off-policy
