"""DAPO dynamic sampling (online filtering): keep only groups that carry a learning signal.

A group whose responses are all right (or all wrong) has zero group-relative advantage and
only dilutes the batch. `filter_groups` keeps the groups whose mean of a chosen reward key
(`cfg.filter_key`, e.g. accuracy) lies strictly between `low` and `high`, and says why the
others were dropped. The trainer calls it on each freshly generated batch and accumulates
the kept groups until it has enough, counting generation rounds with `BatchFiller`, which
stops with a clear error after `max_tries` rounds.

Departure from DAPO: the paper keeps 0 < accuracy < 1 exactly; the bounds are configurable
(EasyR1's `filter_low` / `filter_high`, default 0.01 / 0.99) so graded rewards can be filtered too.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch

from easyvideor1.algorithms.grouping import group_index, group_stats
from easyvideor1.errors import UserError


@dataclass
class GroupFilter:
    """Outcome of one filtering pass over N responses in G groups."""

    keep: torch.Tensor  # [N] bool, responses of the kept groups
    kept_groups: list  # ids of the kept groups, in order of first appearance
    num_groups: int  # G, groups seen in this pass
    dropped_all_correct: int  # groups with mean >= high
    dropped_all_wrong: int  # groups with mean <= low

    def metrics(self) -> dict[str, float]:
        """Counts for logging."""
        return {
            "groups_seen": float(self.num_groups),
            "groups_kept": float(len(self.kept_groups)),
            "groups_dropped_all_correct": float(self.dropped_all_correct),
            "groups_dropped_all_wrong": float(self.dropped_all_wrong),
        }


def filter_groups(values: torch.Tensor | Sequence[float], group_ids: torch.Tensor | Sequence[Hashable], *,
                  low: float, high: float) -> GroupFilter:
    """Keep the groups whose mean of `values` [N] (one reward key per response) is in (low, high)."""
    if not low < high:
        raise ValueError(f"filter_groups: need low < high, got low={low}, high={high}")
    v = torch.as_tensor(values, dtype=torch.float64)
    if v.dim() != 1:
        raise ValueError(f"filter_groups: values must be [N], got shape {tuple(v.shape)}")
    if not bool(torch.isfinite(v).all()):
        raise ValueError("filter_groups: values contain NaN/inf; fix the reward function")
    index, num_groups, ids = group_index(group_ids, v.shape[0])
    mean = group_stats(v, index, num_groups).mean  # [N]
    mean_g = torch.zeros(num_groups, dtype=torch.float64).index_copy_(0, index, mean)  # [G]
    too_high, too_low = mean_g >= high, mean_g <= low
    keep_g = ~(too_high | too_low)  # [G]
    return GroupFilter(
        keep=keep_g[index],
        kept_groups=[ids[g] for g in range(num_groups) if keep_g[g]],
        num_groups=num_groups,
        dropped_all_correct=int(too_high.sum()),
        dropped_all_wrong=int(too_low.sum()),
    )


class FilteringError(UserError, RuntimeError):
    """Dynamic sampling could not fill a batch: the data is too easy or too hard for the policy."""


@dataclass
class BatchFiller:
    """Counts kept groups over generation rounds until a batch is full.

    `add(result)` returns True once `target_groups` groups were kept; a round that leaves the
    batch short after `max_tries` rounds raises (max_tries <= 0: no limit). With data-parallel
    ranks, `all_full` turns this rank's "full" into the decision of all ranks (e.g.
    `distributed.all_true`): every rank then runs the same number of rounds, and a short batch
    raises on every rank at once.
    """

    target_groups: int
    max_tries: int
    all_full: Callable[[bool], bool] = bool
    groups: int = 0
    tries: int = 0
    dropped_all_correct: int = 0
    dropped_all_wrong: int = 0

    def add(self, result: GroupFilter) -> bool:
        """Record one filtered round; True when the batch has enough groups."""
        self.tries += 1
        self.groups += len(result.kept_groups)
        self.dropped_all_correct += result.dropped_all_correct
        self.dropped_all_wrong += result.dropped_all_wrong
        if self.all_full(self.groups >= self.target_groups):
            return True
        if 0 < self.max_tries <= self.tries:
            raise FilteringError(
                f"dynamic sampling: only {self.groups} of {self.target_groups} groups kept after {self.tries} "
                f"generation rounds ({self.dropped_all_correct} groups all correct, {self.dropped_all_wrong} all "
                "wrong); the data is too easy or too hard for the policy: raise algorithm.max_filter_tries, "
                "widen filter_low/filter_high, or turn online_filtering off (counts of this rank; every rank "
                "stops together)")
        return False

    def metrics(self) -> dict[str, float]:
        """Totals over the rounds of this batch, for logging."""
        return {
            "filter_tries": float(self.tries),
            "filter_groups_kept": float(self.groups),
            "filter_dropped_all_correct": float(self.dropped_all_correct),
            "filter_dropped_all_wrong": float(self.dropped_all_wrong),
        }
