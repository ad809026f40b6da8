"""Loss aggregation: from a per-token loss matrix to the scalar that is back-propagated.

Four modes (`AGGREGATIONS`):

- `token_mean`: sum over all valid tokens / number of valid tokens (DAPO).
- `seq_mean_token_mean`: each sequence's token mean, summed / number of sequences (GRPO paper).
- `seq_mean_token_sum`: each sequence's token sum, summed / number of sequences.
- `seq_mean_token_sum_norm`: sum over all valid tokens / (number of sequences * max_len), with
  `max_len` a constant (the rollout's max response length), per Dr.GRPO.

**Where we depart from upstream.** EasyR1/verl divide each *micro-batch* by its own count (and
average sequences with `.mean()` over the micro-batch), so the gradient changes with the
micro-batch split and the number of data-parallel ranks. Here the denominator is always the
count over the whole *mini-batch* (all micro-batches, all ranks), computed once by
`loss_normalizer` before the micro-batch loop; each micro-batch then contributes
`its own numerator / normalizer`, and accumulated gradients equal the full-batch gradient.
Data-parallel gradient all-reduce *averages* over ranks (DDP/FSDP), so the normaliser is the
global count divided by the number of ranks.

Sequences with no valid token count for nothing (not even in the sequence modes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from easyvideor1 import distributed


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` where `mask` is true; 0 when the mask is empty (never NaN)."""
    mask = mask.bool()
    total = torch.where(mask, values, torch.zeros_like(values)).sum()
    return total / mask.sum().clamp(min=1)


def _sum_tokens(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, loss, torch.zeros_like(loss)).sum()


def _sum_seq_means(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    per_seq = torch.where(mask, loss, torch.zeros_like(loss)).sum(-1)  # [N]
    return (per_seq / mask.sum(-1).clamp(min=1)).sum()


def _count_tokens(mask: torch.Tensor, max_len: int | None) -> float:
    return float(mask.sum())


def _count_seqs(mask: torch.Tensor, max_len: int | None) -> float:
    return float((mask.sum(-1) > 0).sum())


def _count_seqs_times_max_len(mask: torch.Tensor, max_len: int | None) -> float:
    if max_len is None or max_len <= 0:
        raise ValueError("loss_agg_mode 'seq_mean_token_sum_norm' needs max_len > 0: pass the "
                         "rollout's max response length to loss_normalizer(..., max_len=...)")
    return _count_seqs(mask, None) * max_len


@dataclass(frozen=True)
class Aggregation:
    """One aggregation mode: a per-micro-batch numerator and the count it is divided by."""

    numerator: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (loss [N, T], mask [N, T] bool) -> scalar
    count: Callable[[torch.Tensor, int | None], float]  # (mask [N, T] bool, max_len) -> count


AGGREGATIONS: dict[str, Aggregation] = {
    "token_mean": Aggregation(_sum_tokens, _count_tokens),
    "seq_mean_token_mean": Aggregation(_sum_seq_means, _count_seqs),
    "seq_mean_token_sum": Aggregation(_sum_tokens, _count_seqs),
    "seq_mean_token_sum_norm": Aggregation(_sum_tokens, _count_seqs_times_max_len),
}


def get_aggregation(mode: str) -> Aggregation:
    """The aggregation called `mode`; an unknown name is an error listing the valid ones."""
    try:
        return AGGREGATIONS[mode]
    except KeyError:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; valid: {', '.join(AGGREGATIONS)}") from None


def normalizer_count(masks: torch.Tensor | Sequence[torch.Tensor], mode: str, max_len: int | None = None) -> float:
    """This rank's count (tokens or sequences) over all its micro-batch masks ([n_i, T_i] each)."""
    if isinstance(masks, torch.Tensor):
        masks = [masks]
    agg = get_aggregation(mode)
    return sum(agg.count(m.bool(), max_len) for m in masks)


def normalizer_from_counts(counts: Sequence[float]) -> float:
    """The normaliser from every data-parallel rank's `normalizer_count` (one entry per rank).

    Global count / number of ranks, because the gradient all-reduce averages over ranks.
    An empty mini-batch gives the count 1, so the (zero) loss stays finite.
    """
    if len(counts) == 0:
        raise ValueError("normalizer_from_counts needs one count per data-parallel rank, got none")
    return max(float(sum(counts)), 1.0) / len(counts)


def loss_normalizer(
    masks: torch.Tensor | Sequence[torch.Tensor],
    mode: str,
    *,
    max_len: int | None = None,
    all_reduce: bool = False,
    group: object | None = None,
) -> float:
    """The global normaliser for `aggregate`, computed once per mini-batch before its micro-batches.

    `masks` are this rank's response masks of every micro-batch of the mini-batch. With
    `all_reduce=True` (torch.distributed initialised) the count is summed over the ranks of
    `group` and divided by its size; without it, this process is the only rank.
    """
    count = normalizer_count(masks, mode, max_len)
    if not all_reduce:
        return normalizer_from_counts([count])
    if not distributed.is_initialized():
        raise RuntimeError("loss_normalizer(all_reduce=True) needs torch.distributed to be initialised; "
                           "call it with all_reduce=False in a single process")
    total = distributed.all_reduce_floats([count], "sum", group)[0]
    return max(total, 1.0) / distributed.world_size(group)


def aggregate(loss: torch.Tensor, response_mask: torch.Tensor, mode: str, normalizer: float) -> torch.Tensor:
    """Scalar loss of one micro-batch: `numerator(loss [N, T], mask [N, T]) / normalizer`.

    Masked positions never reach the result (NaN/inf there is ignored). `normalizer` comes
    from `loss_normalizer` (or `normalizer_from_counts`) over the whole mini-batch.
    """
    if loss.shape != response_mask.shape:
        raise ValueError(f"aggregate: loss shape {tuple(loss.shape)} != response_mask shape "
                         f"{tuple(response_mask.shape)}")
    if not normalizer > 0:
        raise ValueError(f"aggregate: normalizer must be > 0, got {normalizer}; compute it with loss_normalizer")
    return get_aggregation(mode).numerator(loss, response_mask.bool()) / normalizer
