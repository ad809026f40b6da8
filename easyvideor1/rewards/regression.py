"""Regression (VSI-Bench style): mean relative accuracy (MRA) of a predicted number.

MRA = mean over thresholds t in C of 1[ |pred - truth| / |truth| <= 1 - t ], with
C = {0.50, 0.55, ..., 0.95} (the VSI-Bench paper). A truth of 0 needs an exact 0.

Departure: VSI-Bench's released code builds C with `np.linspace(.5, .95, int(.45/.05 + 2))`,
which is 11 thresholds spaced 0.045, not the paper's 10; set `RewardConfig.mra_thresholds` to
those 11 values to reproduce published numbers exactly. Thresholds are compared with a 1e-9
slack so that 1 - 0.8 = 0.19999999999999996 does not fail an error of exactly 0.2.
"""

from __future__ import annotations

from easyvideor1.records import Sample
from easyvideor1.rewards.config import RewardConfig
from easyvideor1.rewards.numerical import (
    read_prediction,
    read_truth,
    valid_number_answer,
)
from easyvideor1.rewards.verdict import Verdict


def mean_relative_accuracy(pred: float, truth: float, thresholds: tuple[float, ...]) -> float:
    """MRA of one prediction.

    >>> mean_relative_accuracy(12.0, 10.0, (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95))
    0.7
    """
    if truth == 0:
        return 1.0 if pred == 0 else 0.0
    error = abs(pred - truth) / abs(truth)
    return sum(error <= 1 - t + 1e-9 for t in thresholds) / len(thresholds)


def score(response: str, sample: Sample, cfg: RewardConfig) -> Verdict:
    """Accuracy = MRA of the last number in the answer against the ground truth."""
    truth = read_truth(sample, "regression")
    pred = read_prediction(response)
    accuracy = (
        0.0 if pred is None else mean_relative_accuracy(pred.value, truth.value, cfg.mra_thresholds)
    )
    return Verdict(accuracy=accuracy, valid=valid_number_answer(response), parts={"mra": accuracy})
