"""AlgorithmConfig validation, presets, and one uniform end-to-end call per preset."""

import ast
import dataclasses
import inspect

import pytest
import torch

from easyvideor1.algorithms import (
    ADVANTAGES,
    ALGORITHM_PRESETS,
    POLICY_LOSSES,
    AlgorithmConfig,
    LossInputs,
    filter_groups,
    from_preset,
    kl_reward_penalty,
    loss_normalizer,
)
from easyvideor1.algorithms import config as config_module
from easyvideor1.algorithms import policy_losses
from easyvideor1.algorithms.policy_losses import LossSettings


def call_loss(name, *, cfg, normalizer, kl_coef=None, **inputs):
    """A policy loss with keyword inputs, called as `training.update` calls it (a `LossInputs`)."""
    return POLICY_LOSSES[name](LossInputs(**inputs), cfg, normalizer, kl_coef=kl_coef)


def test_every_field_has_a_one_line_docstring():
    tree = ast.parse(inspect.getsource(config_module))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "AlgorithmConfig")
    documented = set()
    for stmt, nxt in zip(cls.body, cls.body[1:], strict=False):
        if isinstance(stmt, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            assert "\n" not in nxt.value.value.strip(), stmt.target.id
            documented.add(stmt.target.id)
    assert documented == {f.name for f in dataclasses.fields(AlgorithmConfig)}


@pytest.mark.parametrize("field, registry", [
    ("adv_estimator",
     "grpo, dr_grpo, grpo_passk, rloo, reinforce_plus_plus, reinforce_plus_plus_baseline, remax, gdpo"),
    ("policy_loss", "ppo_clip, gspo, gspo_token, cispo, luffy"),
    ("loss_agg_mode", "token_mean, seq_mean_token_mean, seq_mean_token_sum, seq_mean_token_sum_norm"),
    ("kl_estimator", "k1, abs, mse, low_var_kl, full"),
    ("kl_controller", "fixed, adaptive"),
])
def test_unknown_names_list_the_valid_ones(field, registry):
    with pytest.raises(ValueError, match=f"algorithm.{field}='nope' is unknown; valid: {registry}"):
        AlgorithmConfig(**{field: "nope"})


@pytest.mark.parametrize("overrides, field", [
    ({"gamma": 0.0}, "gamma"),
    ({"clip_ratio_low": 1.5}, "clip_ratio_low"),
    ({"clip_ratio_c": 0.9}, "clip_ratio_c"),
    ({"filter_low": 0.9, "filter_high": 0.1}, "filter_high"),
    ({"kl_coef": -1.0}, "kl_coef"),
    ({"luffy_gamma": 0.0}, "luffy_gamma"),
    ({"gdpo_reward_weights": (1.0,)}, "gdpo_reward_weights"),
])
def test_bad_values_name_the_field(overrides, field):
    with pytest.raises(ValueError, match=f"algorithm.{field}"):
        AlgorithmConfig(**overrides)


def test_presets_name_the_recipes():
    assert set(ALGORITHM_PRESETS) == {"grpo", "dapo", "dr_grpo", "gspo", "cispo", "reinforce_plus_plus", "rloo",
                                      "remax", "gdpo", "luffy"}
    dapo = from_preset("dapo")
    assert (dapo.clip_ratio_low, dapo.clip_ratio_high, dapo.loss_agg_mode) == (0.2, 0.28, "token_mean")
    assert dapo.disable_kl and dapo.online_filtering and not dapo.needs_reference
    dr = from_preset("dr_grpo")
    assert (dr.adv_estimator, dr.loss_agg_mode) == ("dr_grpo", "seq_mean_token_sum_norm")
    assert from_preset("reinforce_plus_plus").kl_in_reward
    assert from_preset("remax").needs_greedy_rollout
    assert from_preset("gspo", clip_ratio_high=5e-4).clip_ratio_high == 5e-4
    with pytest.raises(ValueError, match="unknown algorithm preset 'ppo'; valid: grpo, dapo"):
        from_preset("ppo")
    with pytest.raises(ValueError, match=r"unknown algorithm field\(s\) \['kl_cof'\]"):
        from_preset("grpo", kl_cof=0.1)


@pytest.mark.parametrize("preset", list(ALGORITHM_PRESETS))
def test_each_preset_runs_through_the_uniform_calls(preset):
    """The trainer's calls from the package docstring, unchanged for every recipe."""
    cfg = from_preset(preset)
    g = torch.Generator().manual_seed(0)
    n, t = 8, 5
    mask = (torch.arange(t)[None] < torch.tensor([5, 3, 1, 4, 5, 2, 2, 5])[:, None]).long()
    uids = ["p0"] * 4 + ["p1"] * 4
    acc = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    fmt = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0])
    old = -torch.rand(n, t, generator=g) - 0.2
    ref = old - 0.1 * torch.rand(n, t, generator=g)
    if cfg.online_filtering:
        assert filter_groups(acc, uids, low=cfg.filter_low, high=cfg.filter_high).keep.all()
    kl_penalty = (kl_reward_penalty(old, ref, mask, kind=cfg.kl_estimator, coef=cfg.kl_coef)
                  if cfg.kl_in_reward else None)
    adv = ADVANTAGES[cfg.adv_estimator](
        rewards=acc + fmt, group_ids=uids, response_mask=mask, kl_penalty=kl_penalty,
        greedy_rewards=torch.full((n,), 1.0) if cfg.needs_greedy_rollout else None,
        reward_parts={"accuracy": acc, "format": fmt}, **cfg.estimator_kwargs())
    assert adv.abs().sum() > 0
    lp = (old + 0.05 * torch.randn(n, t, generator=g)).requires_grad_(True)
    normalizer = loss_normalizer(mask, cfg.loss_agg_mode, max_len=t)
    loss, metrics = call_loss(cfg.policy_loss, log_probs=lp, old_log_probs=old, advantages=adv, response_mask=mask, cfg=cfg, normalizer=normalizer,
        entropy=None, ref_log_probs=ref if cfg.needs_reference else None, full_kl=None, kl_coef=None,
        offline_mask=torch.tensor([1, 0, 0, 0, 0, 0, 0, 0]), behaviour_log_probs=None)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(lp.grad).all() and lp.grad.abs().sum() > 0
    assert torch.all(lp.grad[mask == 0] == 0)
    assert {"pg_loss", "clip_frac", "ratio_mean", "approx_kl"} <= set(metrics)


def test_the_config_has_every_setting_a_policy_loss_reads():
    """The losses type `cfg` as `LossSettings` (they must not import the config, which imports
    them): every `cfg.<name>` they read is declared there, with the config's own type."""
    fields = {f.name: f.type for f in dataclasses.fields(AlgorithmConfig)}
    assert LossSettings.__annotations__.items() <= fields.items()
    read = {node.attr for node in ast.walk(ast.parse(inspect.getsource(policy_losses)))
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "cfg"}
    assert read and read <= LossSettings.__annotations__.keys()
