"""Advantage estimators against hand-computed values, plus the invariances every one must keep."""

import math

import pytest
import torch

from easyvideor1.algorithms import ADVANTAGES, AlgorithmConfig
from easyvideor1.algorithms.advantages import ADVANTAGE_INPUTS
from easyvideor1.distributed import all_reduce_floats

# Group "a": rewards [1, 0, 0.5]; group "b": one response; group "c": two equal rewards.
REWARDS = torch.tensor([1.0, 0.0, 0.5, 2.0, 0.3, 0.3])
GROUPS = ["a", "a", "a", "b", "c", "c"]
MASK = torch.tensor([
    [1, 1, 1],
    [1, 1, 0],
    [1, 0, 0],
    [1, 1, 1],
    [1, 1, 0],
    [1, 0, 0],
])
EPS = 1e-6


def per_response(adv: torch.Tensor, mask: torch.Tensor = MASK) -> list[float]:
    """Check the advantage is constant over each response's tokens and 0 on padding; return it."""
    out = []
    for row, m in zip(adv, mask.bool(), strict=True):
        assert torch.all(row[~m] == 0)
        assert torch.allclose(row[m], row[m][0].expand(int(m.sum())))
        out.append(float(row[m][0]) if m.any() else 0.0)
    return out


def call(name, **kw):
    base = dict(rewards=REWARDS, group_ids=GROUPS, response_mask=MASK)
    return ADVANTAGES[name](**{**base, **kw})


def test_grpo_hand_values():
    # group a: mean 0.5, unbiased std sqrt((0.25 + 0.25 + 0) / 2) = 0.5
    std_a = math.sqrt((0.5**2 + 0.5**2 + 0.0**2) / 2)
    adv = per_response(call("grpo", eps=EPS))
    assert adv[:3] == pytest.approx([0.5 / (std_a + EPS), -0.5 / (std_a + EPS), 0.0], abs=1e-6)
    assert adv[3:] == [0.0, 0.0, 0.0]  # size-1 group and constant group: exactly zero


def test_dr_grpo_hand_values():
    adv = per_response(call("dr_grpo"))
    assert adv == pytest.approx([0.5, -0.5, 0.0, 0.0, 0.0, 0.0], abs=1e-7)


def test_grpo_passk_only_the_best_is_positive():
    adv = per_response(call("grpo_passk", eps=EPS))
    # best of group a is r=1, second best 0.5: (1 - 0.5) / (0.5 + eps)
    assert adv == pytest.approx([0.5 / (0.5 + EPS), 0, 0, 0, 0, 0], abs=1e-6)
    tied = per_response(ADVANTAGES["grpo_passk"](rewards=torch.tensor([1.0, 1.0, 0.0]), group_ids=[0, 0, 0],
                                                 response_mask=torch.ones(3, 1)), torch.ones(3, 1))
    assert tied == [0.0, 0.0, 0.0]  # r_max == r_second


def test_rloo_leave_one_out():
    adv = per_response(call("rloo"))
    # 1 - (0 + 0.5)/2 = 0.75 ; 0 - (1 + 0.5)/2 = -0.75 ; 0.5 - (1 + 0)/2 = 0
    assert adv == pytest.approx([0.75, -0.75, 0.0, 0.0, 0.0, 0.0], abs=1e-7)


def test_remax_subtracts_greedy_reward():
    greedy = torch.tensor([0.5, 0.5, 0.5, 1.0, 0.0, 1.0])
    adv = per_response(call("remax", greedy_rewards=greedy))
    assert adv == pytest.approx([0.5, -0.5, 0.0, 1.0, 0.3, -0.7], abs=1e-6)
    with pytest.raises(ValueError, match="greedy_rewards"):
        call("remax")


def test_reinforce_plus_plus_discounted_kl_whitened():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    kl_pen = torch.tensor([[0.1, 0.2, 9.0], [0.4, 9.0, 9.0]])  # 9s sit on padding: ignored
    adv = ADVANTAGES["reinforce_plus_plus"](rewards=torch.tensor([1.0, 0.0]), group_ids=[0, 1], response_mask=mask,
                                            kl_penalty=kl_pen, gamma=0.5, eps=EPS)
    # token rewards: resp0 [-0.1, 1 - 0.2 = 0.8], resp1 [0 - 0.4]
    # returns: resp0 G1 = 0.8, G0 = -0.1 + 0.5 * 0.8 = 0.3 ; resp1 G0 = -0.4
    g = [0.3, 0.8, -0.4]
    mean = sum(g) / 3
    std = math.sqrt(sum((x - mean) ** 2 for x in g) / 2)
    expect = [(x - mean) / (std + EPS) for x in g]
    assert adv[0, :2].tolist() == pytest.approx(expect[:2], abs=1e-6)
    assert adv[1, 0].item() == pytest.approx(expect[2], abs=1e-6)
    assert adv[0, 2] == 0 and torch.all(adv[1, 1:] == 0)


def test_reinforce_plus_plus_baseline_keeps_constant_groups_at_zero():
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 0]])
    adv = ADVANTAGES["reinforce_plus_plus_baseline"](rewards=torch.tensor([1.0, 0.0, 0.7, 0.7]),
                                                     group_ids=[0, 0, 1, 1], response_mask=mask, eps=EPS)
    # centred [0.5, -0.5, 0, 0]; returns (gamma 1) on tokens: [.5, .5], [-.5], [0, 0], [0]
    vals = [0.5, 0.5, -0.5, 0.0, 0.0, 0.0]
    mean = sum(vals) / 6
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / 5)
    assert adv[0].tolist() == pytest.approx([0.5 / (std + EPS)] * 2, abs=1e-6)
    assert adv[1, 0].item() == pytest.approx(-0.5 / (std + EPS), abs=1e-6)
    assert torch.all(adv[2:] == 0)


def test_gdpo_normalises_each_key_then_whitens_and_keeps_kl():
    acc = torch.tensor([1.0, 0.0, 1.0, 1.0])
    fmt = torch.tensor([1.0, 1.0, 0.0, 1.0])
    mask = torch.ones(4, 2)
    kw = dict(rewards=acc + fmt, group_ids=[0, 0, 1, 1], response_mask=mask,
              reward_parts={"accuracy": acc, "format": fmt}, eps=EPS)
    # accuracy per group: [+h, -h] and [0, 0]; format: [0, 0] and [-h, +h]; h = 0.5 / (std 0.7071 + eps)
    h = 0.5 / (math.sqrt(0.5) + EPS)
    total = [h, -h, -h, h]
    std = math.sqrt(sum(t * t for t in total) / 3)  # mean is 0
    adv = per_response(ADVANTAGES["gdpo"](**kw), mask)
    assert adv == pytest.approx([t / (std + EPS) for t in total], abs=1e-6)

    # with the KL-in-reward term: summed per-response penalties [0.1, 0, 0, 0.3] are subtracted
    kl_pen = torch.tensor([[0.05, 0.05], [0.0, 0.0], [0.0, 0.0], [0.1, 0.2]])
    total = [h - 0.1, -h, -h, h - 0.3]
    mean = sum(total) / 4
    std = math.sqrt(sum((t - mean) ** 2 for t in total) / 3)
    adv = per_response(ADVANTAGES["gdpo"](**kw, kl_penalty=kl_pen), mask)
    assert adv == pytest.approx([(t - mean) / (std + EPS) for t in total], abs=1e-6)

    weighted = per_response(ADVANTAGES["gdpo"](**kw, reward_weights=(1.0, 0.0)), mask)
    # only accuracy: [h, -h, 0, 0], whitened: mean 0, std sqrt(2 h^2 / 3)
    s = math.sqrt(2 * h * h / 3)
    assert weighted == pytest.approx([h / (s + EPS), -h / (s + EPS), 0, 0], abs=1e-6)


def test_gdpo_errors_name_the_missing_key():
    with pytest.raises(ValueError, match="reward_parts"):
        call("gdpo")
    with pytest.raises(ValueError, match=r"\['format'\]"):
        call("gdpo", reward_parts={"accuracy": REWARDS})


def test_kl_penalty_is_subtracted_per_response():
    kl_pen = torch.zeros(6, 3)
    kl_pen[0, :3] = 0.1  # response 0: reward 1 - 0.3 = 0.7
    kl_pen[1, 2] = 5.0  # on padding: ignored
    adv = per_response(call("dr_grpo", kl_penalty=kl_pen))
    # group a rewards [0.7, 0, 0.5], mean 0.4
    assert adv[:3] == pytest.approx([0.3, -0.4, 0.1], abs=1e-6)


def test_string_and_int_group_ids_agree():
    ints = torch.tensor([7, 7, 7, 3, 9, 9])
    assert torch.equal(call("grpo", group_ids=ints), call("grpo"))


GROUP_RELATIVE = [n for n in ADVANTAGES if n not in ("reinforce_plus_plus", "remax")]


@pytest.mark.parametrize("name", GROUP_RELATIVE)
def test_constant_and_singleton_groups_zero_and_finite(name):
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.9, 0.3, 0.3])  # 0.1 * 3 is inexact in float: must still give 0
    groups = [0, 0, 0, 1, 2, 2]
    extra = dict(reward_parts={"accuracy": rewards, "format": rewards})
    adv = ADVANTAGES[name](rewards=rewards, group_ids=groups, response_mask=MASK, **extra,
                           **AlgorithmConfig().estimator_kwargs())
    assert adv.shape == MASK.shape and adv.dtype == torch.float32
    assert torch.all(adv == 0), adv


def test_batch_level_estimators_zero_for_equal_rewards():
    """REINFORCE++ has no group baseline: a batch of equal outcomes whitens to zero; ReMax is 0
    when the sampled response scores like the greedy one."""
    rewards = torch.full((6,), 0.1)
    assert torch.all(call("reinforce_plus_plus", rewards=rewards) == 0)
    assert torch.all(call("remax", rewards=rewards, greedy_rewards=rewards.clone()) == 0)


@pytest.mark.parametrize("name", list(ADVANTAGES))
def test_empty_masks_and_single_tokens_are_finite(name):
    mask = torch.tensor([[0, 0], [1, 0], [1, 0], [0, 0]])
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.5])
    extra = dict(greedy_rewards=torch.zeros(4), reward_parts={"accuracy": rewards, "format": 1 - rewards})
    adv = ADVANTAGES[name](rewards=rewards, group_ids=[0, 0, 0, 0], response_mask=mask, **extra)
    assert torch.isfinite(adv).all()
    assert torch.all(adv[mask == 0] == 0)
    empty = ADVANTAGES[name](rewards=rewards, group_ids=[0, 0, 0, 0], response_mask=torch.zeros(4, 2), **extra)
    assert torch.all(empty == 0)


@pytest.mark.parametrize("name", list(ADVANTAGES))
def test_uniform_calling_convention(name):
    """Every estimator accepts every known input and rejects unknown ones."""
    everything = dict(kl_penalty=torch.zeros(6, 3), greedy_rewards=torch.zeros(6),
                      reward_parts={"accuracy": REWARDS, "format": REWARDS}, all_reduce_floats=all_reduce_floats,
                      **AlgorithmConfig().estimator_kwargs())
    assert set(everything) | {"rewards", "group_ids", "response_mask"} == ADVANTAGE_INPUTS
    assert torch.isfinite(call(name, **everything)).all()
    with pytest.raises(TypeError, match="gama"):
        call(name, **everything, gama=0.9)


def test_bad_inputs_say_what_to_fix():
    with pytest.raises(ValueError, match=r"responses \[1\] are NaN"):
        call("grpo", rewards=torch.tensor([0.0, float("nan"), 0, 0, 0, 0]))
    with pytest.raises(ValueError, match="one group id per response"):
        call("grpo", group_ids=["a", "b"])
    with pytest.raises(ValueError, match=r"rewards must be \[N\]"):
        call("grpo", rewards=torch.zeros(5))
