"""Group bookkeeping shared by the group-relative estimators and dynamic sampling.

Responses to the same prompt share a group id (an int tensor or any hashable per response,
e.g. the prompt's uid string). Statistics are computed per group, in float64, with a
vectorised scatter (no Python loop over responses), and broadcast back to the responses.

The standard deviation is the unbiased one (Bessel, `torch.std`'s default), as in EasyR1 and
verl. A group of size 1 has std 0 and mean equal to its reward, and a group whose rewards are
all equal is flagged `constant`, so callers can give those groups an exact zero advantage
instead of 0/eps noise.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch


def group_index(group_ids: torch.Tensor | Sequence[Hashable], n: int) -> tuple[torch.Tensor, int, list]:
    """Map group ids to dense indices 0..G-1 in order of first appearance.

    Returns `(index [N] long, G, ids)` where `ids[g]` is the original id of group g.
    """
    if isinstance(group_ids, torch.Tensor):
        if group_ids.dim() != 1:
            raise ValueError(f"group_ids must be 1-D [N], got shape {tuple(group_ids.shape)}")
        ids_list = group_ids.tolist()
    else:
        ids_list = list(group_ids)
    if len(ids_list) != n:
        raise ValueError(f"group_ids has {len(ids_list)} entries but there are {n} responses; "
                         "pass one group id per response")
    first: dict[Hashable, int] = {}
    index = [first.setdefault(g, len(first)) for g in ids_list]
    return torch.tensor(index, dtype=torch.long), len(first), list(first)


@dataclass
class GroupStats:
    """Per-response view of its group's statistics (all [N], float64 unless noted)."""

    mean: torch.Tensor  # [N] group mean of the values
    std: torch.Tensor  # [N] unbiased group std (0 for groups of size 1)
    count: torch.Tensor  # [N] long, group size
    constant: torch.Tensor  # [N] bool, every value in the group is equal (incl. size 1)
    sum: torch.Tensor  # [N] group sum


def group_stats(values: torch.Tensor, index: torch.Tensor, num_groups: int) -> GroupStats:
    """Mean, unbiased std, size and constancy of each response's group."""
    v = values.detach().to(torch.float64)  # [N]
    count_g = torch.bincount(index, minlength=num_groups)  # [G]
    sum_g = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, index, v)  # [G]
    mean_g = sum_g / count_g.clamp(min=1)  # [G]
    sq_g = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, index, (v - mean_g[index]) ** 2)
    var_g = torch.where(count_g > 1, sq_g / (count_g - 1).clamp(min=1), torch.zeros_like(sq_g))  # [G]
    max_g = torch.full((num_groups,), -torch.inf, dtype=torch.float64).scatter_reduce(0, index, v, "amax")
    min_g = torch.full((num_groups,), torch.inf, dtype=torch.float64).scatter_reduce(0, index, v, "amin")
    return GroupStats(
        mean=mean_g[index],
        std=var_g.sqrt()[index],
        count=count_g[index],
        constant=(max_g == min_g)[index],
        sum=sum_g[index],
    )
