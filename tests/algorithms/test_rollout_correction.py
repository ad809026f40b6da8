"""Rollout correction: weights and masks of every mode against hand computations on fixed
log-probs, the known-token rule, the metrics' row statistics, the policy-loss hook, `auto`."""

import math

import pytest
import torch

from easyvideor1.algorithms import POLICY_LOSSES, LossInputs
from easyvideor1.algorithms.config import AlgorithmConfig
from easyvideor1.algorithms.rollout_correction import (
    ROLLOUT_CORRECTIONS,
    mismatch_row_stats,
    resolve_rollout_correction,
    rollout_correction,
)

# Row 0: ratios 3, 1, 0.25 (log 3, 0, log 0.25); row 1: ratios 1.5, 1.5, padding;
# row 2: an offline trajectory (not known); row 3: ratio 0.6 then padding.
LOG_R = torch.tensor([[math.log(3.0), 0.0, math.log(0.25)],
                      [math.log(1.5), math.log(1.5), 0.0],
                      [math.log(9.0), math.log(9.0), 0.0],
                      [math.log(0.6), 0.0, 0.0]])
ROLLOUT = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, 0.0], [-1.0, -1.0, 0.0], [-2.0, 0.0, 0.0]])
OLD = ROLLOUT + LOG_R
MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 0, 0]], dtype=torch.bool)
KNOWN = MASK & torch.tensor([True, True, False, True])[:, None]
C = 2.0

# Hand values (C = 2): sequence products 0.75, 2.25, -, 0.6; geometric means 0.75**(1/3), 1.5, -, 0.6.
EXPECTED = {
    "none": ([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 1]], [[0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]]),
    "token_tis": ([[2, 1, 0.25], [1.5, 1.5, 1], [1, 1, 1], [0.6, 1, 1]], [[1, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]]),
    "seq_tis": ([[0.75] * 3, [2, 2, 1], [1, 1, 1], [0.6, 1, 1]], [[0, 0, 0], [1, 1, 0], [0, 0, 0], [0, 0, 0]]),
    "token_mis": ([[0, 1, 0], [1, 1, 1], [1, 1, 1], [1, 1, 1]], [[1, 0, 1], [0, 0, 0], [0, 0, 0], [0, 0, 0]]),
    "seq_mis": ([[1, 1, 1], [0, 0, 1], [1, 1, 1], [1, 1, 1]], [[0, 0, 0], [1, 1, 0], [0, 0, 0], [0, 0, 0]]),
}


@pytest.mark.parametrize("mode", list(ROLLOUT_CORRECTIONS))
def test_weights_and_masks_equal_the_hand_computation(mode):
    c = rollout_correction(OLD, ROLLOUT, KNOWN, mode, C)
    weights, corrected = EXPECTED[mode]
    assert torch.allclose(c.weights, torch.tensor(weights, dtype=torch.float32), atol=1e-6), c.weights
    assert c.corrected.tolist() == [[bool(x) for x in row] for row in corrected]
    assert not c.weights.requires_grad


def test_geometric_mean_for_sequence_modes():
    geo = 0.75 ** (1 / 3)  # row 0; row 1: 1.5, row 3: 0.6
    tis = rollout_correction(OLD, ROLLOUT, KNOWN, "seq_tis", C, geometric=True)
    assert torch.allclose(tis.weights, torch.tensor([[geo] * 3, [1.5, 1.5, 1], [1, 1, 1], [0.6, 1, 1]]), atol=1e-6)
    assert not tis.corrected.any()
    mis = rollout_correction(OLD, ROLLOUT, KNOWN, "seq_mis", 1.4, geometric=True)  # [1/1.4, 1.4]: rows 1, 3 out
    assert mis.weights.tolist() == [[1, 1, 1], [0, 0, 1], [1, 1, 1], [0, 1, 1]]


def test_mismatch_row_stats_by_hand():
    rows = mismatch_row_stats(rollout_correction(OLD, ROLLOUT, KNOWN, "token_tis", C))
    k3 = lambda r: r - 1 - math.log(r)  # noqa: E731
    expected = [[k3(3) + k3(1) + k3(0.25), 4.25, 3.0, 1, 3], [2 * k3(1.5), 3.0, 1.5, 0, 2],
                [0, 0, 0, 0, 0], [k3(0.6), 0.6, 0.6, 0, 1]]
    assert torch.allclose(rows, torch.tensor(expected), atol=1e-5), rows


def test_weights_multiply_the_policy_gradient_term_only():
    """ppo_clip on-policy with rollout weights: the gradient is the hand-weighted -A * w * d log pi."""
    cfg = AlgorithmConfig(disable_kl=True)
    lp = OLD.clone().requires_grad_(True)
    adv = torch.tensor([1.0, -1.0, 0.5, 2.0])
    corr = rollout_correction(OLD, ROLLOUT, KNOWN, "token_tis", C)
    loss, _ = POLICY_LOSSES["ppo_clip"](LossInputs(log_probs=lp, old_log_probs=lp.detach(), advantages=adv,
                                                   response_mask=MASK, rollout_weights=corr.weights),
                                        cfg, normalizer=float(MASK.sum()))
    loss.backward()
    hand = torch.where(MASK, -adv[:, None] * corr.weights, 0.0) / MASK.sum()
    assert torch.allclose(lp.grad, hand, atol=1e-6)


def test_auto_and_config_checks():
    assert resolve_rollout_correction("auto", "vllm")[0] == "token_tis"
    assert resolve_rollout_correction("auto", "hf")[0] == "none"
    assert resolve_rollout_correction("auto", "hf", asynchronous=True)[0] == "token_tis"
    assert resolve_rollout_correction("seq_mis", "vllm") == ("seq_mis", "set by algorithm.rollout_correction")
    assert AlgorithmConfig().rollout_correction == "auto"
    with pytest.raises(ValueError, match="rollout_correction='tis' is unknown; valid: auto, none, token_tis"):
        AlgorithmConfig(rollout_correction="tis")
    with pytest.raises(ValueError, match="rollout_correction_threshold=1.0 must be > 1"):
        AlgorithmConfig(rollout_correction_threshold=1.0)
