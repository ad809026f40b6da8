"""The policy update: PPO epochs over mini-batches of groups, micro-batches within.

The loss of each micro-batch is divided by the mini-batch's global normaliser
(`algorithms.loss_normalizer`), so the gradient is the same whatever the micro-batch split
and the number of data-parallel ranks. A step whose gradient norm is not finite is skipped
(counted in the metrics), never applied.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from easyvideor1 import distributed
from easyvideor1.algorithms import POLICY_LOSSES, loss_normalizer
from easyvideor1.algorithms.config import AlgorithmConfig
from easyvideor1.training.sequences import ForwardContext, RolloutBatch, forward_logprobs, micro_batches


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


def policy_update(model, optimizer: torch.optim.Optimizer, batch: RolloutBatch, algo: AlgorithmConfig,
                  ctx: ForwardContext, *, ppo_epochs: int, n_mini: int, grad_clip: float, max_len: int,
                  kl_coef: float, generator: torch.Generator | None = None, reference=None) -> dict[str, float]:
    """Run the PPO epochs on `batch` (ref log-probs and advantages already filled).

    `batch.old_log_probs` None means strictly on-policy (one epoch, one mini-batch): the
    current log-probs, detached, are the old ones. With a KL loss of kind `full`, each
    micro-batch's forward also runs `reference` (no gradient) for the exact per-token KL.
    """
    if batch.old_log_probs is None and (ppo_epochs > 1 or n_mini > 1):
        raise ValueError("old log-probs are needed for more than one update per rollout batch")
    params = [p for p in model.parameters() if p.requires_grad]
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    need_entropy = algo.entropy_coef > 0
    full_kl_loss = algo.use_kl_loss and not algo.disable_kl and algo.kl_estimator == "full"
    if full_kl_loss and reference is None:
        raise ValueError("kl_estimator 'full' with use_kl_loss needs the reference model in policy_update")
    for _ in range(ppo_epochs):
        for mini in mini_batches(batch, n_mini, generator):
            micros = micro_batches(mini, ctx.micro_batch_size)
            normalizer = loss_normalizer([batch.response_mask[m] for m in micros], algo.loss_agg_mode,
                                         max_len=max_len, all_reduce=distributed.is_distributed())
            optimizer.zero_grad(set_to_none=True)
            for idx in micros:
                logp, ent, full_kl = forward_logprobs(model, batch, idx, ctx, with_entropy=need_entropy,
                                                      reference=reference if full_kl_loss else None)
                dev = logp.device
                loss, metrics = POLICY_LOSSES[algo.policy_loss](
                    log_probs=logp,
                    old_log_probs=(logp.detach() if batch.old_log_probs is None  # strictly on-policy
                                   else batch.old_log_probs[idx].to(dev)),
                    advantages=batch.advantages[idx].to(dev),
                    response_mask=batch.response_mask[idx].to(dev),
                    cfg=algo,
                    normalizer=normalizer,
                    entropy=ent,
                    ref_log_probs=batch.ref_log_probs[idx].to(dev) if batch.ref_log_probs is not None else None,
                    full_kl=full_kl,
                    kl_coef=kl_coef,
                    offline_mask=batch.offline[idx].to(dev)[:, None].expand_as(logp),
                    behaviour_log_probs=None,
                )
                loss.backward()
                for k, v in metrics.items():
                    sums[k] += float(v)
                    counts[k] += 1
            grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
            grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
            if math.isfinite(grad_norm):
                optimizer.step()
            else:
                optimizer.zero_grad(set_to_none=True)
                sums["update/skipped_nonfinite"] += 1
            sums["update/grad_norm"] += grad_norm if math.isfinite(grad_norm) else 0.0
            counts["update/grad_norm"] += 1
    out = {f"actor/{k}" if "/" not in k else k: v / max(counts.get(k, 1), 1) for k, v in sums.items()}
    out["update/skipped_nonfinite"] = sums.get("update/skipped_nonfinite", 0.0)
    return out
