"""DAPO online filtering: which groups stay, why the others go, and the try limit."""

import pytest
import torch

from easyvideor1.algorithms import BatchFiller, filter_groups


def test_keeps_groups_strictly_between_bounds():
    acc = [1, 1, 1,  0, 0,  1, 0, 0,  0.995, 1.0,  0.5]
    ids = ["A", "A", "A", "B", "B", "C", "C", "C", "D", "D", "E"]
    res = filter_groups(acc, ids, low=0.01, high=0.99)
    # means: A 1 (all correct), B 0 (all wrong), C 1/3 (kept), D 0.9975 (>= 0.99: dropped), E 0.5 (kept)
    assert res.kept_groups == ["C", "E"]
    assert res.keep.tolist() == [False] * 5 + [True] * 3 + [False, False, True]
    assert (res.dropped_all_correct, res.dropped_all_wrong, res.num_groups) == (2, 1, 5)
    assert res.metrics()["groups_kept"] == 2.0


def test_bounds_are_exclusive():
    res = filter_groups(torch.tensor([0.25, 0.75, 0.5, 0.5]), torch.tensor([0, 0, 1, 1]), low=0.5, high=0.9)
    # both groups have mean exactly 0.5 == low: dropped as all-wrong
    assert res.kept_groups == [] and res.dropped_all_wrong == 2


def test_batch_filler_counts_and_stops():
    good = filter_groups([1, 0, 1, 0], [0, 0, 1, 1], low=0.01, high=0.99)  # 2 kept
    bad = filter_groups([1, 1, 0, 0], [0, 0, 1, 1], low=0.01, high=0.99)  # 0 kept: 1 all correct, 1 all wrong
    filler = BatchFiller(target_groups=3, max_tries=3)
    assert filler.add(good) is False
    assert filler.add(bad) is False
    with pytest.raises(RuntimeError, match=r"only 2 of 3 groups kept after 3 generation rounds \(2 groups all "
                                           r"correct, 2 all wrong\).*max_filter_tries"):
        filler.add(bad)
    filler = BatchFiller(target_groups=3, max_tries=3)
    assert filler.add(good) is False and filler.add(good) is True
    assert filler.metrics()["filter_tries"] == 2.0
    unlimited = BatchFiller(target_groups=1, max_tries=0)
    assert not any(unlimited.add(bad) for _ in range(50))


def test_bad_input_errors():
    with pytest.raises(ValueError, match="low < high"):
        filter_groups([1.0], [0], low=0.9, high=0.1)
    with pytest.raises(ValueError, match="NaN"):
        filter_groups([float("nan")], [0], low=0.1, high=0.9)
    with pytest.raises(ValueError, match="one group id per response"):
        filter_groups([1.0, 0.0], [0], low=0.1, high=0.9)
