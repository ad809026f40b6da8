"""Policy losses: log-probs and advantages -> (scalar loss, metrics).

Every loss is called the same way (see the package docstring):

    loss, metrics = POLICY_LOSSES[cfg.policy_loss](
        LossInputs(log_probs=[N, T], old_log_probs=[N, T], advantages=[N, T] or [N], response_mask=[N, T],
                   entropy=None | [N, T], ref_log_probs=None | [N, T], full_kl=None | [N, T],
                   offline_mask=None | [N] or [N, T], behaviour_log_probs=None | [N, T],
                   rollout_weights=None | [N, T]),
        cfg, normalizer,                                     # global normaliser, see aggregation.py
        kl_coef=None | float)

The returned loss is the policy-gradient term, plus `kl_coef * KL` when `cfg.use_kl_loss`
(and not `cfg.disable_kl`), minus `cfg.entropy_coef * entropy` when that coefficient is set,
each aggregated with `cfg.loss_agg_mode` and the same global normaliser; `rollout_weights`
(the rollout correction, `algorithms.rollout_correction`) multiply the policy-gradient term
of each token, detached, before aggregation. Metrics are Python
floats over this micro-batch's valid tokens (ratio stats, clip fractions, approx KL to the old
policy) and the three loss terms as they enter the loss.

The KL term uses `ref_log_probs` with the token estimators (k1, abs, mse, low_var_kl). With
`kl_estimator: full` it is `full_kl`: the exact KL(pi || pi_ref) over the vocabulary at each
response token, with gradient, which `models.logprobs` computes chunk by chunk inside the
policy's log-prob pass (no [N, T, V] tensor is ever built).

Padding positions are zeroed before any arithmetic (they may hold -inf or NaN), and log-ratios
are clamped to +-`cfg.log_ratio_clamp` before exp, so huge ratios give neither inf nor NaN
values or gradients. Half-precision log-probs are computed in float32.

- `ppo_clip`: PPO with asymmetric clipping (DAPO clip-higher) and dual clip for A < 0.
- `gspo` / `gspo_token`: GSPO's sequence-level ratio exp(mean_t log-ratio), clipped per sequence;
  the token variant is s_i,t = sg(s_i) * pi_t / sg(pi_t) (GSPO paper, eq. 13), which allows
  token-level advantages.
- `cispo`: -sg(clip(ratio)) * A * log pi (MiniMax-M1): every token keeps a gradient.
- `luffy`: off-policy tokens (from an offline trajectory) use the shaped ratio f(x) = x/(x+gamma)
  of x = pi / pi_behaviour (pi_behaviour = 1 when unknown, as in the LUFFY paper), no clipping;
  on-policy tokens use `ppo_clip`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from easyvideor1.algorithms.aggregation import aggregate, masked_mean
from easyvideor1.algorithms.kl import kl_estimate


class LossSettings(Protocol):
    """The settings a policy loss reads from `cfg`: the trainer passes its `AlgorithmConfig`,
    which has these fields (declared here because `algorithms.config` imports `POLICY_LOSSES`
    to check names, and this module must not import it back)."""

    loss_agg_mode: str
    clip_ratio_low: float
    clip_ratio_high: float
    clip_ratio_c: float | None
    log_ratio_clamp: float
    luffy_gamma: float
    entropy_coef: float
    disable_kl: bool
    use_kl_loss: bool
    kl_estimator: str
    kl_coef: float


@dataclass
class LossInputs:
    """One micro-batch's tensors for a policy loss ([N, T] unless noted); each loss reads what it uses."""

    log_probs: torch.Tensor  # the current policy's, with gradient
    old_log_probs: torch.Tensor  # the policy that generated (or the detached current, on-policy)
    advantages: torch.Tensor  # [N, T] or [N]
    response_mask: torch.Tensor  # response tokens that count
    entropy: torch.Tensor | None = None  # needed when cfg.entropy_coef != 0
    ref_log_probs: torch.Tensor | None = None  # the KL loss with a token estimator
    full_kl: torch.Tensor | None = None  # the KL loss with kl_estimator 'full': exact per-token KL, with gradient
    offline_mask: torch.Tensor | None = None  # [N] or [N, T]: LUFFY's offline (off-policy) tokens
    behaviour_log_probs: torch.Tensor | None = None  # LUFFY's pi_behaviour of offline tokens (None: 1)
    rollout_weights: torch.Tensor | None = None  # [N, T] rollout correction (`rollout_correction`), None: 1


def _prepare(name: str, x: LossInputs) -> tuple[torch.Tensor, ...]:
    """Check shapes; return (lp, old, adv [N, T], mask [N, T] bool)."""
    log_probs, old_log_probs, advantages, response_mask = x.log_probs, x.old_log_probs, x.advantages, x.response_mask
    if log_probs.dim() != 2 or log_probs.shape != response_mask.shape or old_log_probs.shape != log_probs.shape:
        raise ValueError(f"{name}: log_probs {tuple(log_probs.shape)}, old_log_probs {tuple(old_log_probs.shape)} "
                         f"and response_mask {tuple(response_mask.shape)} must all be [N, T]")
    if advantages.shape == log_probs.shape[:1]:
        advantages = advantages[:, None].expand_as(log_probs)
    elif advantages.shape != log_probs.shape:
        raise ValueError(f"{name}: advantages must be [N] or [N, T] = {tuple(log_probs.shape)}, "
                         f"got {tuple(advantages.shape)}")
    if log_probs.dtype in (torch.float16, torch.bfloat16):
        log_probs = log_probs.float()  # ratios in half precision lose the clip band
    mask = response_mask.bool()
    # Padding may hold anything (-inf, NaN): zero it first, so no NaN reaches values or gradients.
    lp = torch.where(mask, log_probs, 0.0)
    old = torch.where(mask, old_log_probs.detach().to(lp.dtype), 0.0)
    adv = torch.where(mask, advantages.detach().to(lp.dtype), 0.0)
    return lp, old, adv, mask


def _ratio_metrics(ratio: torch.Tensor, log_ratio: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Ratio mean/min/max and approx KL(old || new) = E[ratio - 1 - log ratio] (k3)."""
    ratio, log_ratio = ratio.detach(), log_ratio.detach()
    if not mask.any():
        return {"ratio_mean": 1.0, "ratio_min": 1.0, "ratio_max": 1.0, "approx_kl": 0.0}
    return {
        "ratio_mean": float(masked_mean(ratio, mask)),
        "ratio_min": float(ratio[mask].min()),
        "ratio_max": float(ratio[mask].max()),
        "approx_kl": float(masked_mean(ratio - 1 - log_ratio, mask)),
    }


def _ppo_token_loss(log_ratio: torch.Tensor, adv: torch.Tensor, cfg: LossSettings
                    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token clipped PPO loss [N, T] and where each clip is active ([N, T] bool each)."""
    ratio = log_ratio.exp()  # [N, T]
    low, high = 1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high
    unclipped = -adv * ratio  # [N, T]
    clipped = -adv * ratio.clamp(low, high)  # [N, T]; no gradient outside [low, high]
    loss = torch.maximum(unclipped, clipped)
    active = {"clip_frac_high": (adv > 0) & (ratio > high), "clip_frac_low": (adv < 0) & (ratio < low)}
    if cfg.clip_ratio_c is not None:
        dual = -adv * cfg.clip_ratio_c  # [N, T]; caps the loss of A < 0 tokens with huge ratios
        active["dual_clip_frac"] = (adv < 0) & (ratio > cfg.clip_ratio_c)
        loss = torch.where(adv < 0, torch.minimum(loss, dual), loss)
    return loss, active


def _finish(pg_token_loss: torch.Tensor, metrics: dict[str, float], x: LossInputs, log_probs: torch.Tensor,
            mask: torch.Tensor, cfg: LossSettings, normalizer: float, kl_coef: float | None
            ) -> tuple[torch.Tensor, dict[str, float]]:
    """Aggregate the policy-gradient term, add the KL loss and entropy bonus, fill metrics
    (`log_probs`, `mask`: `_prepare`'s)."""
    entropy, ref_log_probs, full_kl = x.entropy, x.ref_log_probs, x.full_kl
    if x.rollout_weights is not None:  # the behaviour correction, on the policy-gradient term only
        if x.rollout_weights.shape != mask.shape:
            raise ValueError(f"rollout_weights must be [N, T] = {tuple(mask.shape)}, "
                             f"got {tuple(x.rollout_weights.shape)}")
        pg_token_loss = pg_token_loss * torch.where(mask, x.rollout_weights.detach().to(pg_token_loss.dtype), 0.0)
    pg = aggregate(pg_token_loss, mask, cfg.loss_agg_mode, normalizer)
    loss = pg
    metrics["pg_loss"] = float(pg.detach())
    if cfg.use_kl_loss and not cfg.disable_kl:
        if cfg.kl_estimator == "full":
            if full_kl is None or full_kl.shape != mask.shape:
                raise ValueError("kl_estimator 'full' needs full_kl=[N, T] (the exact per-token KL to the reference "
                                 "with gradient, from models.logprobs with a reference), got "
                                 f"{None if full_kl is None else tuple(full_kl.shape)}")
            kl = full_kl.to(log_probs.dtype)  # [N, T]
        else:
            if ref_log_probs is None:
                raise ValueError("use_kl_loss is set but ref_log_probs was not passed to the policy loss; "
                                 "compute the reference log-probs, or set algorithm.disable_kl")
            kl = kl_estimate(log_probs, ref_log_probs.detach().to(log_probs.dtype), cfg.kl_estimator)  # [N, T]
        coef = cfg.kl_coef if kl_coef is None else kl_coef
        kl_term = aggregate(kl, mask, cfg.loss_agg_mode, normalizer)
        loss = loss + coef * kl_term
        metrics["kl_loss"] = float(kl_term.detach())
        metrics["kl_coef"] = float(coef)
    if cfg.entropy_coef != 0.0:
        if entropy is None:
            raise ValueError(f"entropy_coef={cfg.entropy_coef} but entropy=[N, T] was not passed to the policy loss")
        ent = aggregate(entropy, mask, cfg.loss_agg_mode, normalizer)
        loss = loss - cfg.entropy_coef * ent
    if entropy is not None:
        metrics["entropy"] = float(masked_mean(entropy.detach(), mask))
    return loss, metrics


def ppo_clip(x: LossInputs, cfg: LossSettings, normalizer: float, kl_coef: float | None = None
             ) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with clip_ratio_low/high (clip-higher) and dual clip clip_ratio_c."""
    lp, old, adv, mask = _prepare("ppo_clip", x)
    log_ratio = (lp - old).clamp(-cfg.log_ratio_clamp, cfg.log_ratio_clamp)  # [N, T]
    token_loss, active = _ppo_token_loss(log_ratio, adv, cfg)
    metrics = _ratio_metrics(log_ratio.exp(), log_ratio, mask)
    metrics.update({k: float(masked_mean(v.float(), mask)) for k, v in active.items()})
    metrics["clip_frac"] = metrics["clip_frac_high"] + metrics["clip_frac_low"]
    return _finish(token_loss, metrics, x, lp, mask, cfg, normalizer, kl_coef)


def _row_means(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the valid tokens of each row [N, T] -> [N] (0 for empty rows)."""
    return torch.where(mask, values, 0.0).sum(-1) / mask.sum(-1).clamp(min=1)


def _gspo_common(name: str, token_variant: bool, x: LossInputs, cfg: LossSettings, normalizer: float,
                 kl_coef: float | None) -> tuple[torch.Tensor, dict[str, float]]:
    """Shared body of `gspo` and `gspo_token`; clip metrics count sequences, not tokens."""
    lp, old, adv, mask = _prepare(name, x)
    token_log_ratio = (lp - old).clamp(-cfg.log_ratio_clamp, cfg.log_ratio_clamp)  # [N, T], metrics only
    seq_log_ratio = _row_means(lp - old, mask).clamp(-cfg.log_ratio_clamp, cfg.log_ratio_clamp)  # [N]
    seq_adv = _row_means(adv, mask)  # [N]
    low, high = 1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high
    if token_variant:
        # value s_i on every token, gradient s_i * d log pi_t (stop-gradient on the sequence part)
        log_s = seq_log_ratio.detach()[:, None] + lp - lp.detach()  # [N, T]
        a = adv  # [N, T]
    else:
        log_s = seq_log_ratio[:, None].expand_as(lp)  # [N, T], the same value on every token
        a = seq_adv[:, None].expand_as(lp)  # [N, T]
    s = log_s.exp()  # [N, T]
    token_loss = torch.maximum(-a * s, -a * s.clamp(low, high))  # [N, T]
    seq_ratio = seq_log_ratio.detach().exp()  # [N]
    has = mask.any(-1)  # [N]
    n_seq = max(int(has.sum()), 1)
    metrics = _ratio_metrics(token_log_ratio.exp(), token_log_ratio, mask)
    metrics["seq_ratio_mean"] = float(seq_ratio[has].mean()) if bool(has.any()) else 1.0
    metrics["clip_frac_high"] = float(((seq_adv > 0) & (seq_ratio > high) & has).sum()) / n_seq
    metrics["clip_frac_low"] = float(((seq_adv < 0) & (seq_ratio < low) & has).sum()) / n_seq
    metrics["clip_frac"] = metrics["clip_frac_high"] + metrics["clip_frac_low"]
    return _finish(token_loss, metrics, x, lp, mask, cfg, normalizer, kl_coef)


def gspo(x: LossInputs, cfg: LossSettings, normalizer: float, kl_coef: float | None = None
         ) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO: sequence ratio s_i = exp(mean_t log-ratio), clipped per sequence; the sequence
    advantage is the mean of its token advantages. Use `seq_mean_token_mean` (GSPO preset) to
    average over sequences as the paper does."""
    return _gspo_common("gspo", False, x, cfg, normalizer, kl_coef)


def gspo_token(x: LossInputs, cfg: LossSettings, normalizer: float, kl_coef: float | None = None
               ) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO-token: s_i,t = sg(s_i) * pi_t / sg(pi_t) with token advantages; equals `gspo` (value
    and gradient) when the advantage is constant over each sequence."""
    return _gspo_common("gspo_token", True, x, cfg, normalizer, kl_coef)


def cispo(x: LossInputs, cfg: LossSettings, normalizer: float, kl_coef: float | None = None
          ) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO: -sg(clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)) * A * log pi."""
    lp, old, adv, mask = _prepare("cispo", x)
    log_ratio = (lp - old).clamp(-cfg.log_ratio_clamp, cfg.log_ratio_clamp)  # [N, T]
    ratio = log_ratio.exp().detach()
    low, high = 1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high
    weight = ratio.clamp(low, high)  # [N, T], no gradient
    token_loss = -weight * adv * lp  # [N, T]
    metrics = _ratio_metrics(ratio, log_ratio, mask)
    metrics["clip_frac_high"] = float(masked_mean((ratio > high).float(), mask))
    metrics["clip_frac_low"] = float(masked_mean((ratio < low).float(), mask))
    metrics["clip_frac"] = metrics["clip_frac_high"] + metrics["clip_frac_low"]
    return _finish(token_loss, metrics, x, lp, mask, cfg, normalizer, kl_coef)


def luffy(x: LossInputs, cfg: LossSettings, normalizer: float, kl_coef: float | None = None
          ) -> tuple[torch.Tensor, dict[str, float]]:
    """LUFFY: `ppo_clip` on on-policy tokens; on offline tokens (offline_mask [N] or [N, T])
    -A * f(x), f(x) = x / (x + cfg.luffy_gamma), x = pi / pi_behaviour, unclipped. Without
    behaviour_log_probs [N, T] the behaviour probability is taken as 1 (x = pi)."""
    lp, old, adv, mask = _prepare("luffy", x)
    offline_mask, behaviour_log_probs = x.offline_mask, x.behaviour_log_probs
    if offline_mask is None:
        offline = torch.zeros_like(mask)
    elif offline_mask.shape == mask.shape[:1]:
        offline = offline_mask.bool()[:, None].expand_as(mask)
    elif offline_mask.shape == mask.shape:
        offline = offline_mask.bool()
    else:
        raise ValueError(f"luffy: offline_mask must be [N] or [N, T] = {tuple(mask.shape)}, "
                         f"got {tuple(offline_mask.shape)}")
    log_ratio = (lp - old).clamp(-cfg.log_ratio_clamp, cfg.log_ratio_clamp)  # [N, T]
    on_loss, active = _ppo_token_loss(log_ratio, adv, cfg)  # [N, T]
    behaviour = torch.zeros_like(lp) if behaviour_log_probs is None else behaviour_log_probs.detach().to(lp.dtype)
    if behaviour.shape != lp.shape:
        raise ValueError(f"luffy: behaviour_log_probs must be [N, T] = {tuple(lp.shape)}, got {tuple(behaviour.shape)}")
    rb = (lp - behaviour).clamp(-cfg.log_ratio_clamp, cfg.log_ratio_clamp).exp()  # [N, T]: pi / pi_behaviour
    shaped = rb / (rb + cfg.luffy_gamma)  # [N, T], policy shaping: boosts low-probability tokens
    token_loss = torch.where(offline, -adv * shaped, on_loss)
    on_mask, off_mask = mask & ~offline, mask & offline
    metrics = _ratio_metrics(log_ratio.exp(), log_ratio, on_mask)
    metrics.update({k: float(masked_mean(v.float(), on_mask)) for k, v in active.items()})
    metrics["clip_frac"] = metrics["clip_frac_high"] + metrics["clip_frac_low"]
    metrics["offline_token_frac"] = float(masked_mean(offline.float(), mask))
    metrics["offline_shaped_mean"] = float(masked_mean(shaped.detach(), off_mask))
    return _finish(token_loss, metrics, x, lp, mask, cfg, normalizer, kl_coef)


METRIC_REDUCTIONS: dict[str, str] = {"pg_loss": "sum", "kl_loss": "sum", "ratio_min": "min", "ratio_max": "max"}
"""How the update combines a loss metric over the micro-batches of a mini-batch. `sum`: the value
is already divided by the mini-batch normaliser, so the micro-batches' sum is the mini-batch's
value; `min` / `max`: extremes. Every other metric is a mean over the micro-batch's response
tokens, combined weighted by token count."""


POLICY_LOSSES = {
    "ppo_clip": ppo_clip,
    "gspo": gspo,
    "gspo_token": gspo_token,
    "cispo": cispo,
    "luffy": luffy,
}
