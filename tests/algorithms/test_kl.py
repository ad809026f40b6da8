"""KL estimators, the reward penalty and the coefficient controllers, against hand values."""

import math

import pytest
import torch

from easyvideor1.algorithms import AlgorithmConfig, kl_estimate, kl_reward_penalty, make_kl_controller
from easyvideor1.algorithms.kl import KL_ESTIMATORS

LN2 = math.log(2.0)

# token 0: pi = 0.5, pi_ref = 0.25 ; token 1: pi = 0.25, pi_ref = 0.5
LP = torch.tensor([[math.log(0.5), math.log(0.25)]], dtype=torch.float64)
REF = torch.tensor([[math.log(0.25), math.log(0.5)]], dtype=torch.float64)


@pytest.mark.parametrize("kind, expect", [
    ("k1", [LN2, -LN2]),
    ("abs", [LN2, LN2]),
    ("mse", [0.5 * LN2**2, 0.5 * LN2**2]),
    # k3: d = log(pi_ref / pi); exp(d) - d - 1 -> token 0: 0.5 + ln2 - 1, token 1: 2 - ln2 - 1
    ("low_var_kl", [0.5 + LN2 - 1, 2 - LN2 - 1]),
])
def test_token_estimators_hand_values(kind, expect):
    assert kl_estimate(LP, REF, kind)[0].tolist() == pytest.approx(expect, abs=1e-12)


def test_full_kl_over_the_vocabulary():
    p = torch.tensor([[[0.5, 0.5], [1.0, 0.0]]], dtype=torch.float64)
    q = torch.tensor([[[0.25, 0.75], [0.5, 0.5]]], dtype=torch.float64)
    kl = kl_estimate(p.log(), q.log(), "full")  # p.log() holds -inf: must not give NaN
    # 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75) ; 1 * ln(1/0.5) + 0
    assert kl[0].tolist() == pytest.approx([0.5 * LN2 + 0.5 * math.log(2 / 3), LN2], abs=1e-12)
    with pytest.raises(ValueError, match=r"\[N, T, V\]"):
        kl_estimate(LP, REF, "full")


def test_k3_is_clamped_for_huge_log_ratios():
    lp = torch.tensor([[-1e4, 0.0, 50.0]])
    ref = torch.tensor([[0.0, -1e4, 0.0]])
    kl = kl_estimate(lp, ref, "low_var_kl")
    assert torch.isfinite(kl).all() and kl.max() <= 10.0
    # d = -50 (clamped to -20): exp(-20) + 20 - 1 -> clamped to 10
    assert kl[0, 2].item() == pytest.approx(10.0)


@pytest.mark.parametrize("kind", ["k1", "mse", "low_var_kl"])
def test_gradcheck_token_estimators(kind):
    lp = torch.tensor([[-0.3, -1.2, -2.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-0.5, -0.9, -2.5]], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda x: KL_ESTIMATORS[kind](x, ref), (lp,))


def test_gradcheck_full():
    logits = torch.randn(1, 2, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    ref = torch.log_softmax(torch.randn(1, 2, 4, dtype=torch.float64), -1)
    logits.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: kl_estimate(torch.log_softmax(x, -1), ref, "full"), (logits,))


def test_reward_penalty_is_coef_times_kl_on_valid_tokens():
    mask = torch.tensor([[1, 0]])
    pen = kl_reward_penalty(LP, REF, mask, kind="k1", coef=0.1)
    assert pen[0].tolist() == pytest.approx([0.1 * LN2, 0.0])
    assert not pen.requires_grad


def test_reward_penalty_full_takes_the_exact_per_token_kl():
    mask = torch.tensor([[1, 1, 0]])
    full_kl = torch.tensor([[0.2, 0.4, 7.0]])  # what training.sequences.all_full_kl returns
    pen = kl_reward_penalty(None, None, mask, kind="full", coef=0.5, full_kl=full_kl)
    assert pen[0].tolist() == pytest.approx([0.1, 0.2, 0.0])
    with pytest.raises(ValueError, match="full_kl"):
        kl_reward_penalty(LP, REF, mask[:, :2], kind="full", coef=0.5)


def test_controller_state_roundtrip():
    """The coefficient an adaptive controller reached survives a checkpoint (state_dict)."""
    cfg = AlgorithmConfig(kl_coef=0.1, kl_controller="adaptive", kl_target=0.1, kl_horizon=100)
    ada = make_kl_controller(cfg)
    ada.update(0.2, 10)
    again = make_kl_controller(cfg)
    again.load_state_dict(ada.state_dict())
    assert again.coef == ada.coef == pytest.approx(0.102)
    fixed = make_kl_controller(AlgorithmConfig(kl_coef=0.3))
    assert fixed.state_dict() == {"coef": 0.3}


def test_controllers_hand_values():
    fixed = make_kl_controller(AlgorithmConfig(kl_coef=0.1))
    fixed.update(5.0, 1000)
    assert fixed.coef == 0.1
    ada = make_kl_controller(AlgorithmConfig(kl_coef=0.1, kl_controller="adaptive", kl_target=0.1, kl_horizon=100))
    ada.update(0.2, 10)  # error = clip(0.2 / 0.1 - 1, -0.2, 0.2) = 0.2 -> coef * (1 + 0.2 * 10 / 100)
    assert ada.coef == pytest.approx(0.1 * 1.02)
    ada.update(0.05, 10)  # error = clip(-0.5) = -0.2 -> coef * (1 - 0.02)
    assert ada.coef == pytest.approx(0.1 * 1.02 * 0.98)


def test_unknown_estimator_lists_valid_names():
    with pytest.raises(ValueError, match="k1, abs, mse, low_var_kl, full"):
        kl_estimate(LP, REF, "k3")
