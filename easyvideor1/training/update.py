"""The policy update: PPO epochs over mini-batches of groups, micro-batches within.

The loss of each micro-batch is divided by the mini-batch's global normaliser
(`algorithms.loss_normalizer`), so the gradient is the same whatever the micro-batch split
and the number of data-parallel ranks. A step whose gradient norm is not finite is skipped
(counted in the metrics), never applied.

The logged metrics are as split-invariant as the gradient (`UpdateMetrics`): loss terms are
summed over micro-batches (each is already divided by the mini-batch normaliser), token means
are weighted by token count, extremes take the extreme, all over every rank; then averaged over
the optimizer steps of the update.

Micro-batches come from `pass_micro_batches` (a fixed count, or a token budget: as many on every
rank). A *filler* micro-batch (`training.micro_batches`: a rank with fewer responses than the
others' micro-batch count) runs forward and backward with its loss times zero, outside the
normaliser and the metrics, only so that every rank makes the same collectives.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from easyvideor1 import distributed
from easyvideor1.algorithms import POLICY_LOSSES, loss_normalizer
from easyvideor1.algorithms.kl import k1_sums
from easyvideor1.algorithms.policy_losses import METRIC_REDUCTIONS, LossInputs
from easyvideor1.algorithms.config import AlgorithmConfig
from easyvideor1.algorithms.rollout_correction import mismatch_row_stats, rollout_correction
from easyvideor1.models.routing import RouterStats, aux_loss, aux_loss_coef, release, router_stats
from easyvideor1.training.micro_batches import balance_metrics
from easyvideor1.training.parity import MismatchMetrics
from easyvideor1.training.sequences import ForwardContext, RolloutBatch, forward_logprobs, pass_micro_batches


def mini_batches(batch: RolloutBatch, n_mini: int, generator: torch.Generator | None = None) -> list[list[int]]:
    """Split response indices into `n_mini` mini-batches of whole groups (shuffled by group)."""
    groups = sorted(set(batch.group_ids.tolist()))
    if generator is not None:
        groups = [groups[i] for i in torch.randperm(len(groups), generator=generator).tolist()]
    per = math.ceil(len(groups) / n_mini)
    out = []
    for k in range(0, len(groups), per):
        chosen = set(groups[k:k + per])
        out.append([i for i, g in enumerate(batch.group_ids.tolist()) if g in chosen])
    return out


class UpdateMetrics:
    """Metrics of one `policy_update`, combined as `METRIC_REDUCTIONS` says (see module docstring)."""

    def __init__(self):
        self.sums: dict[str, float] = defaultdict(float)  # sum-kind: summed over micro-batches and steps
        self.weights: dict[str, float] = defaultdict(float)  # mean-kind: token weights
        self.extremes: dict[str, float] = {}
        self.steps = 0
        self.policy_ref_kl = [0.0, 0.0]  # k1 sum, tokens (strictly on-policy: old = current log-probs)

    def add_micro(self, metrics: dict[str, float], tokens: int) -> None:
        for k, v in metrics.items():
            how = METRIC_REDUCTIONS.get(k, "mean")
            if how == "sum":
                self.sums[k] += float(v)
            elif how == "mean":
                self.sums[k] += float(v) * tokens
                self.weights[k] += tokens
            elif tokens:  # an empty micro-batch (padding group) has no extreme
                pick = min if how == "min" else max
                self.extremes[k] = pick(self.extremes.get(k, float(v)), float(v))

    def add_step(self, grad_norm: float) -> None:
        self.steps += 1
        finite = math.isfinite(grad_norm)
        self.sums["update/grad_norm"] += grad_norm if finite else 0.0
        self.sums["update/skipped_nonfinite"] += 0.0 if finite else 1.0

    def result(self) -> dict[str, float]:
        """The metrics over every rank (the same on each; one round of collectives)."""
        keys = sorted(set().union(*distributed.all_gather_objects(sorted(self.sums) + sorted(self.extremes))))
        kind = {k: METRIC_REDUCTIONS.get(k, "mean") if not k.startswith("update/") else "step" for k in keys}
        world = distributed.world_size()
        sums = distributed.all_reduce_floats([self.sums.get(k, 0.0) for k in keys] +
                                             [self.weights.get(k, 0.0) for k in keys] + self.policy_ref_kl)
        lows = distributed.all_reduce_floats([self.extremes.get(k, math.inf) for k in keys], "min")
        highs = distributed.all_reduce_floats([self.extremes.get(k, -math.inf) for k in keys], "max")
        steps = max(self.steps, 1)
        out: dict[str, float] = {}
        for i, k in enumerate(keys):
            total, weight = sums[i], sums[len(keys) + i]
            name = k if "/" in k else f"actor/{k}"
            if kind[k] == "sum":  # each rank's sum is the loss over normaliser/world: average the ranks
                out[name] = total / world / steps
            elif kind[k] == "mean":
                if weight > 0:
                    out[name] = total / weight
            elif kind[k] == "step":
                out[name] = total / world / (1 if k == "update/skipped_nonfinite" else steps)
            elif math.isfinite(lows[i] if kind[k] == "min" else highs[i]):
                out[name] = lows[i] if kind[k] == "min" else highs[i]
        kl_sum, kl_tokens = sums[-2], sums[-1]
        if kl_tokens > 0:
            out["kl/policy_ref"] = kl_sum / kl_tokens
        return out


def policy_update(model, optimizer: torch.optim.Optimizer, batch: RolloutBatch, algo: AlgorithmConfig,
                  ctx: ForwardContext, *, ppo_epochs: int, n_mini: int, grad_clip: float, max_len: int,
                  kl_coef: float, generator: torch.Generator | None = None, reference=None,
                  correction: str = "none") -> dict[str, float]:
    """Run the PPO epochs on `batch` (ref log-probs and advantages already filled).

    `batch.old_log_probs` None means strictly on-policy (one epoch, one mini-batch): the
    current log-probs, detached, are the old ones. With a KL loss of kind `full`, each
    micro-batch's forward also runs `reference` (no gradient) for the exact per-token KL.
    `correction` (a key of `ROLLOUT_CORRECTIONS`, `auto` resolved) weights each token's policy
    loss by the old policy against the engine's log-probs; the `mismatch/*` metrics are logged
    whatever it is (first epoch: the old and the engine's log-probs do not change across epochs).
    """
    if batch.old_log_probs is None and (ppo_epochs > 1 or n_mini > 1):
        raise ValueError("old log-probs are needed for more than one update per rollout batch")
    params = [p for p in model.parameters() if p.requires_grad]
    stats = UpdateMetrics()
    need_entropy = algo.entropy_coef > 0
    full_kl_loss = algo.use_kl_loss and not algo.disable_kl and algo.kl_estimator == "full"
    if full_kl_loss and reference is None:
        raise ValueError("kl_estimator 'full' with use_kl_loss needs the reference model in policy_update")
    planned = []  # every micro-batch run, for the balance metrics
    mismatch = MismatchMetrics()
    known = batch.behaviour_known()  # [N, T]
    modalities = [batch.prompts[g].modality for g in batch.group_ids.tolist()]
    moe = ctx.router_shape is not None
    routing, aux_coef = RouterStats(), aux_loss_coef(algo.router_aux_loss_coef, model) if moe else 0.0
    for epoch in range(ppo_epochs):
        for mini in mini_batches(batch, n_mini, generator):
            micros = pass_micro_batches(batch, mini, ctx)
            planned += micros
            normalizer = loss_normalizer([batch.response_mask[m.indices] for m in micros if not m.filler],
                                         algo.loss_agg_mode, max_len=max_len, all_reduce=distributed.is_distributed())
            optimizer.zero_grad(set_to_none=True)
            mini_tokens = max(1, sum(int(batch.response_mask[m.indices].sum()) for m in micros if not m.filler))
            for mb in micros:
                idx = mb.indices
                logp, ent, full_kl = forward_logprobs(model, batch, idx, ctx, with_entropy=need_entropy,
                                                      reference=reference if full_kl_loss else None)
                dev = logp.device
                mask = batch.response_mask[idx].to(dev)
                ref = batch.ref_log_probs[idx].to(dev) if batch.ref_log_probs is not None else None
                old = logp.detach() if batch.old_log_probs is None else batch.old_log_probs[idx].to(dev)  # on-policy
                corr = rollout_correction(old, batch.behaviour_log_probs[idx].to(dev), known[idx].to(dev), correction,
                                          algo.rollout_correction_threshold, algo.rollout_correction_geometric)
                inputs = LossInputs(
                    log_probs=logp,
                    old_log_probs=old,
                    advantages=batch.advantages[idx].to(dev),
                    response_mask=mask,
                    entropy=ent,
                    ref_log_probs=ref,
                    full_kl=full_kl,
                    offline_mask=batch.offline[idx].to(dev),
                    rollout_weights=corr.weights,
                )
                loss, metrics = POLICY_LOSSES[algo.policy_loss](inputs, algo, normalizer, kl_coef=kl_coef)
                aux = aux_loss(model) if moe else None
                if aux is not None:  # load balancing: the micro-batch's aux loss weighted by its share of the tokens
                    if aux_coef > 0:
                        loss = loss + aux_coef * aux * (int(mask.sum()) / mini_tokens)
                    if not mb.filler:
                        router_stats(model, routing).aux.append(float(aux.detach()))
                if mb.filler:  # the other ranks' collectives, no gradient
                    (loss * 0.0).backward()
                    release(model)
                    continue
                loss.backward()
                if moe:
                    release(model)  # the routes served the backward's recompute; no later forward takes them
                stats.add_micro(metrics, int(mask.sum()))
                if epoch == 0:
                    mismatch.add([modalities[i] for i in idx], mismatch_row_stats(corr).cpu())
                if batch.old_log_probs is None and ref is not None:  # the policy-ref KL of this batch (k1)
                    total, tokens = k1_sums(logp.detach(), ref, mask)
                    stats.policy_ref_kl[0] += total
                    stats.policy_ref_kl[1] += tokens
            grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
            grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
            if math.isfinite(grad_norm):
                optimizer.step()
            # freed now, not at the next mini-batch: the last step's gradients would otherwise sit
            # through the weight sync and the next rollout (4 GB per rank for 8B on 8 ranks)
            optimizer.zero_grad(set_to_none=True)
            stats.add_step(grad_norm)
    return stats.result() | mismatch.result() | balance_metrics(planned) | (moe_metrics(routing) if moe else {})


def moe_metrics(routing: RouterStats) -> dict[str, float]:
    """`RouterStats.metrics` over every rank (one all-reduce)."""
    sums = distributed.all_reduce_floats([routing.agreed, routing.replayed, routing.cv_sum, float(routing.layers),
                                          sum(routing.aux), float(len(routing.aux))])
    total = RouterStats(sums[0], sums[1], sums[2], int(sums[3]))
    total.aux = [sums[4] / sums[5]] if sums[5] else []
    return total.metrics()
