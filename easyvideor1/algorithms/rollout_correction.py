"""Rollout correction: importance weights for the gap between the engine that sampled the
responses (pi_rollout) and the trainer's old policy (pi_old), as pure tensor functions.

    log_ratio = old_log_probs - rollout_log_probs          # [N, T], log(pi_old / pi_rollout)
    weights, corrected = ROLLOUT_CORRECTIONS[mode](log_ratio, known, C, geometric)
    per-token policy loss *= weights                       # detached (policy_losses._finish)

Modes (C = `algorithm.rollout_correction_threshold`):

- `none`: weights 1.
- `token_tis` (truncated IS): w_t = min(r_t, C), r_t = pi_old(y_t) / pi_rollout(y_t).
- `seq_tis`: w = min(r_seq, C) on every token of the response, r_seq = prod_t r_t, or with
  `geometric` the geometric mean exp(mean_t log r_t).
- `token_mis` (masked IS, rejection): w_t = 1 if r_t in [1/C, C], else 0.
- `seq_mis`: w = 1 on every token if r_seq in [1/C, C], else 0 on the whole response.

Definitions matched: verl `docs/algo/rollout_corr.md` (decoupled mode, the ratio pi_old /
pi_rollout): TIS = `rollout_is: token | sequence` (ratios bounded to exp(+-20), then
`.clamp(max=rollout_is_threshold)`, no lower truncation); MIS = `rollout_rs: token_k1 |
seq_sum_k1 | seq_mean_k1` with threshold C (lower bound its reciprocal): a binary keep mask, no
reweighting of kept tokens; `geometric` is verl's `seq_mean_k1` (product: `seq_sum_k1`). TRL's
GRPO `vllm_importance_sampling_mode` `token_truncate` / `sequence_truncate` (cap C) are the same
TIS. Departures: (1) a rejected token keeps its place in the loss normaliser and its KL and
entropy terms (only its policy-gradient term is zeroed, as TRL's `*_mask` modes do; verl drops
it from the response mask), since our normaliser is fixed per mini-batch before any micro-batch
runs; (2) MIS masks on both sides, [1/C, C] (verl `*_k1`), where TRL's `*_mask` masks only
r > C and keeps r as the weight otherwise.

Tokens without rollout log-probs (`known` False: offline trajectories of hybrid groups,
responses whose reward failed, padding) get weight 1 and enter neither a sequence's ratio nor
the metrics: there is no behaviour distribution to correct against.

`mismatch_row_stats` gives, per response, what the `mismatch/*` metrics are made of: the k3
estimate of KL(pi_rollout || pi_old) (r - 1 - log r, samples from pi_rollout), the ratio sum
and max, the corrected (clipped or masked) tokens and the known tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

LOG_RATIO_BOUND = 20.0  # ratios are bounded to exp(+-20) before any use (verl's safety bound)


@dataclass
class Correction:
    """The correction of one batch of responses ([N, T] each)."""

    weights: torch.Tensor  # float32, detached: multiplies each token's policy-gradient loss
    log_ratio: torch.Tensor  # float32: log(pi_old / pi_rollout), bounded; 0 where not known
    known: torch.Tensor  # bool: response tokens that have a rollout log-prob
    corrected: torch.Tensor  # bool: known tokens whose weight the mode clipped or masked


def _seq_log_ratio(log_ratio: torch.Tensor, known: torch.Tensor, geometric: bool) -> torch.Tensor:
    """[N]: log of the product of the known tokens' ratios, or of their geometric mean."""
    total = torch.where(known, log_ratio, 0.0).sum(-1)
    if geometric:
        total = total / known.sum(-1).clamp(min=1)
    return total.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def none(log_ratio, known, threshold: float, geometric: bool):
    """No correction: weight 1 everywhere."""
    return torch.ones_like(log_ratio), torch.zeros_like(known)


def token_tis(log_ratio, known, threshold: float, geometric: bool):
    """w_t = min(r_t, C)."""
    ratio = log_ratio.exp()
    clipped = known & (ratio > threshold)
    return torch.where(known, ratio.clamp(max=threshold), 1.0), clipped


def seq_tis(log_ratio, known, threshold: float, geometric: bool):
    """w = min(r_seq, C) on every token of the response."""
    seq = _seq_log_ratio(log_ratio, known, geometric)  # [N]
    clipped = known & (seq > math.log(threshold))[:, None]
    return torch.where(known, seq.exp().clamp(max=threshold)[:, None], 1.0), clipped


def token_mis(log_ratio, known, threshold: float, geometric: bool):
    """w_t = 1 if r_t in [1/C, C] else 0."""
    masked = known & (log_ratio.abs() > math.log(threshold))
    return torch.where(masked, 0.0, 1.0), masked


def seq_mis(log_ratio, known, threshold: float, geometric: bool):
    """w = 1 on the response if r_seq in [1/C, C] else 0."""
    seq = _seq_log_ratio(log_ratio, known, geometric)  # [N]
    masked = known & (seq.abs() > math.log(threshold))[:, None]
    return torch.where(masked, 0.0, 1.0), masked


def rollout_correction(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, known: torch.Tensor,
                       mode: str, threshold: float, geometric: bool = False) -> Correction:
    """The weights of `mode` (a key of `ROLLOUT_CORRECTIONS`) for responses whose old-policy
    and rollout log-probs are `old_log_probs` and `rollout_log_probs` [N, T] on the `known`
    tokens [N, T] bool (module docstring)."""
    if not old_log_probs.shape == rollout_log_probs.shape == known.shape:
        raise ValueError(f"rollout_correction: old_log_probs {tuple(old_log_probs.shape)}, rollout_log_probs "
                         f"{tuple(rollout_log_probs.shape)} and known {tuple(known.shape)} must all be [N, T]")
    if mode not in ROLLOUT_CORRECTIONS:
        raise ValueError(f"unknown rollout correction {mode!r}; valid: {', '.join(ROLLOUT_CORRECTIONS)}")
    known = known.bool()
    diff = old_log_probs.detach().float() - rollout_log_probs.detach().float().to(old_log_probs.device)
    log_ratio = torch.where(known, diff, 0.0).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)  # [N, T]
    weights, corrected = ROLLOUT_CORRECTIONS[mode](log_ratio, known, threshold, geometric)
    return Correction(weights=weights.detach(), log_ratio=log_ratio, known=known, corrected=corrected)


def mismatch_row_stats(c: Correction) -> torch.Tensor:
    """[N, 5] per response: k3 sum, ratio sum, ratio max (0 when no known token), corrected
    tokens, known tokens."""
    ratio = c.log_ratio.exp()
    k3 = torch.where(c.known, ratio - 1.0 - c.log_ratio, 0.0)
    return torch.stack([k3.sum(-1), torch.where(c.known, ratio, 0.0).sum(-1),
                        torch.where(c.known, ratio, 0.0).amax(-1) if ratio.shape[-1] else ratio.new_zeros(len(ratio)),
                        c.corrected.sum(-1).float(), c.known.sum(-1).float()], dim=-1)


ROLLOUT_CORRECTIONS = {
    "none": none,
    "token_tis": token_tis,
    "seq_tis": seq_tis,
    "token_mis": token_mis,
    "seq_mis": seq_mis,
}


def resolve_rollout_correction(requested: str, engine: str, asynchronous: bool = False) -> tuple[str, str]:
    """(mode, why) for `algorithm.rollout_correction` = `requested`: `auto` is `token_tis` when
    the engine is vLLM or the run is asynchronous (their log-probs differ from the trainer's),
    else `none` (the HF engine samples with the trainer's own weights and kernels)."""
    if requested != "auto":
        return requested, "set by algorithm.rollout_correction"
    if asynchronous:
        return "token_tis", "auto: the run is asynchronous (responses come from older weights)"
    if engine == "vllm":
        return "token_tis", "auto: the vllm engine's log-probs differ from the trainer's (kernels, precision)"
    return "none", f"auto: the {engine} engine samples from the trainer's own weights and kernels"
