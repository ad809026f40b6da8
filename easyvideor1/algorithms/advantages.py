"""Advantage estimators: rewards per response -> advantages per token `[N, T]`.

Every estimator is called the same way (see the package docstring):

    ADVANTAGES[name](rewards=[N], group_ids=[N], response_mask=[N, T],
                     kl_penalty=None | [N, T], greedy_rewards=None | [N],
                     reward_parts=None | {key: [N]}, all_reduce_floats=None | fn,
                     **cfg.estimator_kwargs())

and returns float32 advantages `[N, T]`, zero on padding. Each uses the inputs it needs and
ignores the other known ones; an unknown keyword is an error (typos never pass silently).
All of them run without gradients.

Batch statistics are global. With N data-parallel ranks each rank holds a slice of the
batch (whole groups: a group never spans ranks, so group statistics stay local). The batch
whitening of `reinforce_plus_plus`, `reinforce_plus_plus_baseline` and `gdpo` reduces its
counts, sums, extremes and sums of squared deviations with `all_reduce_floats(values, op)`
(`distributed.all_reduce_floats`), so every rank whitens with the statistics of the whole
batch and the result does not depend on the number of ranks. Without it (None) this
process holds the whole batch; the estimators stay pure functions.

`kl_penalty` is `coef * KL` per token (`kl.kl_reward_penalty`), given when the KL is applied
as a reward penalty: both REINFORCE++ variants subtract it per token before the return; every
other estimator subtracts its sum over the response from the response's reward, as verl does
when it sums token-level rewards.

Groups of size 1 and groups whose rewards are all equal get an exact zero advantage (no 0/eps
noise, no NaN) in grpo, dr_grpo, grpo_passk, rloo and reinforce_plus_plus_baseline (without a
KL penalty, which makes rewards differ). gdpo's final batch whitening subtracts the batch mean,
which is 0 up to rounding without a KL penalty; reinforce_plus_plus and remax have no group
baseline by design.

Departures from the papers / upstream:
- `gdpo` keeps the KL-in-reward term (upstream verl-GDPO recomputes the advantage from the
  raw reward keys and drops it): the response's summed penalty is subtracted from the sum of
  the normalised per-key advantages, before batch whitening, so `kl_coef` keeps its meaning
  relative to unit-scale advantages.
- `reinforce_plus_plus_baseline` divides by the batch std without re-centring: the group mean
  is already subtracted, and a token-weighted batch mean would hand constant groups a
  non-zero advantage that depends on the lengths of other responses.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import torch

from easyvideor1.algorithms.grouping import group_index, group_stats

# Keywords the trainer may pass to any estimator; each estimator ignores those it does not use.
ADVANTAGE_INPUTS = frozenset({
    "rewards", "group_ids", "response_mask", "kl_penalty", "greedy_rewards", "reward_parts", "all_reduce_floats",
    "eps", "gamma", "reward_keys", "reward_weights",
})

GroupIds = torch.Tensor | Sequence[Hashable]
AllReduce = Callable[[list[float], str], list[float]]  # (values, "sum" | "max") -> reduced over ranks


def _this_process(values: list[float], op: str) -> list[float]:
    """The reduction over one rank: the values themselves."""
    return [float(v) for v in values]


def _check_inputs(name: str, rewards: torch.Tensor, response_mask: torch.Tensor, other: dict[str, Any]) -> None:
    unknown = sorted(set(other) - ADVANTAGE_INPUTS)
    if unknown:
        raise TypeError(f"advantage estimator {name!r} got unknown keyword(s) {unknown}; "
                        f"known: {', '.join(sorted(ADVANTAGE_INPUTS))}")
    if response_mask.dim() != 2:
        raise ValueError(f"{name}: response_mask must be [N, T], got shape {tuple(response_mask.shape)}")
    if rewards.shape != response_mask.shape[:1]:
        raise ValueError(f"{name}: rewards must be [N] = [{response_mask.shape[0]}] (one per response), "
                         f"got shape {tuple(rewards.shape)}")
    bad = (~torch.isfinite(rewards)).nonzero().flatten().tolist()
    if bad:
        raise ValueError(f"{name}: rewards at responses {bad[:10]} are NaN/inf; fix the reward function "
                         "(a scorer error should give 0, not NaN)")


def _outcome(rewards: torch.Tensor, kl_penalty: torch.Tensor | None, mask: torch.Tensor) -> torch.Tensor:
    """Reward per response [N] (float64), minus the summed KL penalty when given."""
    r = rewards.detach().to(torch.float64)
    if kl_penalty is None:
        return r
    if kl_penalty.shape != mask.shape:
        raise ValueError(f"kl_penalty must be [N, T] like response_mask {tuple(mask.shape)}, "
                         f"got {tuple(kl_penalty.shape)}")
    return r - torch.where(mask, kl_penalty.detach().to(torch.float64), 0.0).sum(-1)


def _to_tokens(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[N] per-response advantage -> [N, T] float32, zero on padding."""
    return torch.where(mask, adv[:, None], 0.0).to(torch.float32)


def _group_normalised(r: torch.Tensor, group_ids: GroupIds, eps: float, scale: bool) -> torch.Tensor:
    """(r - group mean) [/ (group std + eps)], exactly 0 for constant groups. r: [N] float64."""
    index, num_groups, _ = group_index(group_ids, r.shape[0])
    st = group_stats(r, index, num_groups)
    adv = r - st.mean  # [N]
    if scale:
        adv = adv / (st.std + eps)
    return torch.where(st.constant, 0.0, adv)


def _whiten(values: torch.Tensor, mask: torch.Tensor, eps: float, shift: bool = True,
            all_reduce_floats: AllReduce | None = None) -> torch.Tensor:
    """(x - mean) / (std + eps) over the valid entries of `values` ([N] or [N, T], float64) of
    the global batch: every rank's entries when `all_reduce_floats` sums / maxes over the ranks.

    Unbiased std; fewer than 2 valid entries or all-equal values (globally) give zeros. Every
    rank issues the same three reductions (the early returns depend on global values only).
    """
    reduce = all_reduce_floats or _this_process
    valid = values[mask]
    count, total = reduce([float(valid.numel()), float(valid.sum())], "sum")
    if count < 2:
        return torch.zeros_like(values)
    has = valid.numel() > 0
    high, neg_low = reduce([float(valid.max()) if has else -math.inf, float(-valid.min()) if has else -math.inf],
                           "max")
    if high == -neg_low:
        return torch.zeros_like(values)
    mean = total / count
    squares = reduce([float((valid - mean).square().sum())], "sum")[0]  # two passes: no cancellation
    std = math.sqrt(squares / (count - 1))
    centred = values - mean if shift else values
    return torch.where(mask, centred / (std + eps), 0.0)


def _discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = sum_{s >= t, valid} gamma^(#valid tokens between) r_s, over valid tokens only. [N, T]."""
    r = torch.where(mask, token_rewards, 0.0)
    if gamma == 1.0:
        return torch.where(mask, r.flip(-1).cumsum(-1).flip(-1), 0.0)
    returns = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])
    for t in reversed(range(r.shape[1])):
        candidate = r[:, t] + gamma * running
        running = torch.where(mask[:, t], candidate, running)  # masked holes are skipped, not reset
        returns[:, t] = candidate
    return torch.where(mask, returns, 0.0)


def _token_rewards(outcome: torch.Tensor, kl_penalty: torch.Tensor | None, mask: torch.Tensor) -> torch.Tensor:
    """Outcome on each response's last valid token, minus the per-token KL penalty. [N, T] float64."""
    t = mask.shape[1]
    positions = torch.arange(t).expand_as(mask)
    last = torch.where(mask, positions, -1).max(-1).values  # [N], -1 when empty
    r = torch.zeros(mask.shape, dtype=torch.float64)
    has = last >= 0
    r[has.nonzero().flatten(), last[has]] = outcome[has]
    if kl_penalty is not None:
        r = r - torch.where(mask, kl_penalty.detach().to(torch.float64), 0.0)
    return r


@torch.no_grad()
def grpo(*, rewards: torch.Tensor, group_ids: GroupIds, response_mask: torch.Tensor,
         kl_penalty: torch.Tensor | None = None, eps: float = 1e-6, **other: Any) -> torch.Tensor:
    """GRPO: (r - group mean) / (group std + eps), broadcast over the response's tokens."""
    _check_inputs("grpo", rewards, response_mask, other)
    mask = response_mask.bool()
    r = _outcome(rewards, kl_penalty, mask)
    return _to_tokens(_group_normalised(r, group_ids, eps, scale=True), mask)


@torch.no_grad()
def dr_grpo(*, rewards: torch.Tensor, group_ids: GroupIds, response_mask: torch.Tensor,
            kl_penalty: torch.Tensor | None = None, **other: Any) -> torch.Tensor:
    """Dr.GRPO: r - group mean, no std scaling (pair it with `seq_mean_token_sum_norm`)."""
    _check_inputs("dr_grpo", rewards, response_mask, other)
    mask = response_mask.bool()
    r = _outcome(rewards, kl_penalty, mask)
    return _to_tokens(_group_normalised(r, group_ids, 0.0, scale=False), mask)


@torch.no_grad()
def grpo_passk(*, rewards: torch.Tensor, group_ids: GroupIds, response_mask: torch.Tensor,
               kl_penalty: torch.Tensor | None = None, eps: float = 1e-6, **other: Any) -> torch.Tensor:
    """Pass@k GRPO: the best response of each group gets (r_max - r_second) / (std + eps), others 0.

    Ties for the best give 0 (r_max == r_second); the first of the tied responses is "best".
    """
    _check_inputs("grpo_passk", rewards, response_mask, other)
    mask = response_mask.bool()
    r = _outcome(rewards, kl_penalty, mask)
    index, num_groups, _ = group_index(group_ids, r.shape[0])
    st = group_stats(r, index, num_groups)
    adv = torch.zeros_like(r)
    for g in range(num_groups):
        members = (index == g).nonzero().flatten()
        if members.numel() < 2:
            continue
        top = torch.topk(r[members], k=2)
        best = members[top.indices[0]]
        adv[best] = (top.values[0] - top.values[1]) / (st.std[best] + eps)
    return _to_tokens(torch.where(st.constant, 0.0, adv), mask)


@torch.no_grad()
def rloo(*, rewards: torch.Tensor, group_ids: GroupIds, response_mask: torch.Tensor,
         kl_penalty: torch.Tensor | None = None, **other: Any) -> torch.Tensor:
    """RLOO: r_i - mean of the other responses of the group (0 for groups of size 1)."""
    _check_inputs("rloo", rewards, response_mask, other)
    mask = response_mask.bool()
    r = _outcome(rewards, kl_penalty, mask)
    index, num_groups, _ = group_index(group_ids, r.shape[0])
    st = group_stats(r, index, num_groups)
    baseline = (st.sum - r) / (st.count - 1).clamp(min=1)
    adv = torch.where(st.constant, 0.0, r - baseline)
    return _to_tokens(adv, mask)


@torch.no_grad()
def reinforce_plus_plus(*, rewards: torch.Tensor, group_ids: GroupIds, response_mask: torch.Tensor,
                        kl_penalty: torch.Tensor | None = None, gamma: float = 1.0, eps: float = 1e-6,
                        all_reduce_floats: AllReduce | None = None, **other: Any) -> torch.Tensor:
    """REINFORCE++: discounted return of (outcome on the last token - per-token KL penalty),
    whitened over all valid tokens of the (global) batch. `group_ids` is not used."""
    _check_inputs("reinforce_plus_plus", rewards, response_mask, other)
    mask = response_mask.bool()
    returns = _discounted_returns(_token_rewards(rewards.to(torch.float64), kl_penalty, mask), mask, gamma)
    return _whiten(returns, mask, eps, all_reduce_floats=all_reduce_floats).to(torch.float32)


@torch.no_grad()
def reinforce_plus_plus_baseline(*, rewards: torch.Tensor, group_ids: GroupIds, response_mask: torch.Tensor,
                                 kl_penalty: torch.Tensor | None = None, gamma: float = 1.0, eps: float = 1e-6,
                                 all_reduce_floats: AllReduce | None = None, **other: Any) -> torch.Tensor:
    """REINFORCE++-baseline: subtract the group mean reward, then the REINFORCE++ return, then
    divide by the (global) batch std (no re-centring, see module docstring)."""
    _check_inputs("reinforce_plus_plus_baseline", rewards, response_mask, other)
    mask = response_mask.bool()
    centred = _group_normalised(rewards.to(torch.float64), group_ids, eps, scale=False)  # [N]
    returns = _discounted_returns(_token_rewards(centred, kl_penalty, mask), mask, gamma)
    return _whiten(returns, mask, eps, shift=False, all_reduce_floats=all_reduce_floats).to(torch.float32)


@torch.no_grad()
def remax(*, rewards: torch.Tensor, group_ids: GroupIds, response_mask: torch.Tensor,
          greedy_rewards: torch.Tensor | None = None, kl_penalty: torch.Tensor | None = None,
          **other: Any) -> torch.Tensor:
    """ReMax: r - r_greedy, where r_greedy [N] is the reward of the greedy response to the same
    prompt (the trainer generates and scores it; `cfg.needs_greedy_rollout`)."""
    _check_inputs("remax", rewards, response_mask, other)
    if greedy_rewards is None:
        raise ValueError("remax needs greedy_rewards=[N]: the reward of a greedy (temperature 0) "
                         "response to each response's prompt")
    if greedy_rewards.shape != rewards.shape:
        raise ValueError(f"remax: greedy_rewards shape {tuple(greedy_rewards.shape)} != rewards "
                         f"shape {tuple(rewards.shape)}")
    mask = response_mask.bool()
    adv = _outcome(rewards, kl_penalty, mask) - greedy_rewards.to(torch.float64)
    return _to_tokens(adv, mask)


@torch.no_grad()
def gdpo(*, rewards: torch.Tensor, group_ids: GroupIds, response_mask: torch.Tensor,
         reward_parts: Mapping[str, torch.Tensor] | None = None, reward_keys: Sequence[str] = ("accuracy", "format"),
         reward_weights: Sequence[float] | None = None, kl_penalty: torch.Tensor | None = None,
         eps: float = 1e-6, all_reduce_floats: AllReduce | None = None, **other: Any) -> torch.Tensor:
    """GDPO: per reward key, (r_k - group mean) / (group std + eps); weighted sum over keys;
    minus the summed KL penalty when given; then whitened over the (global) batch's responses.

    `rewards` (the overall reward) is checked but not used: the keys come from `reward_parts`.
    """
    _check_inputs("gdpo", rewards, response_mask, other)
    if reward_parts is None:
        raise ValueError(f"gdpo needs reward_parts={{key: [N]}} with keys {list(reward_keys)}")
    missing = [k for k in reward_keys if k not in reward_parts]
    if missing:
        raise ValueError(f"gdpo: reward keys {missing} missing from reward_parts (have "
                         f"{sorted(reward_parts)}); set algorithm.gdpo_reward_keys to keys the reward returns")
    weights = [1.0] * len(reward_keys) if reward_weights is None else list(reward_weights)
    if len(weights) != len(reward_keys):
        raise ValueError(f"gdpo: {len(weights)} reward_weights for {len(reward_keys)} reward_keys")
    mask = response_mask.bool()
    total = torch.zeros(rewards.shape, dtype=torch.float64)
    for key, w in zip(reward_keys, weights, strict=True):
        part = reward_parts[key]
        _check_inputs(f"gdpo[{key}]", part, response_mask, {})
        total = total + w * _group_normalised(part.to(torch.float64), group_ids, eps, scale=True)
    if kl_penalty is not None:
        total = _outcome(total, kl_penalty, mask)  # total - sum_t kl_penalty
    has_tokens = mask.any(-1)
    return _to_tokens(_whiten(total, has_tokens, eps, all_reduce_floats=all_reduce_floats), mask)


ADVANTAGES = {
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "grpo_passk": grpo_passk,
    "rloo": rloo,
    "reinforce_plus_plus": reinforce_plus_plus,
    "reinforce_plus_plus_baseline": reinforce_plus_plus_baseline,
    "remax": remax,
    "gdpo": gdpo,
}
