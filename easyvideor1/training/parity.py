"""Parity check between a rollout engine and the trainer, per modality: the one home of it.

PPO-style ratios divide the trainer's recomputed probabilities by the engine's. If the two
disagree for reasons other than the weight update (different M-RoPE numbering, a processor
that resized frames, a bf16 kernel), the ratios are biased from the first step. Both uses
compare the engine's behaviour log-probs with the trainer's log-prob pass
(`training.sequences.all_logprobs`) through `modality_gaps`, per modality of the prompt
(video / image / image+video / text): `parity_metrics` inside the loop (on the old log-probs
the step computes anyway), `parity_report` on any engine's rollouts (it runs the pass itself),
also saying whether each response's text re-tokenizes to its token ids.

Expected gaps: ~1e-6 in float32 when weights are in sync and the sampling used no top-k/top-p
(the loop's pass bans the vision pad tokens as the engines do; a pass that does not, e.g.
`trainer_logprob_fn` without `banned_ids`, adds `log(1 - p(pad tokens))`: a few 1e-3 for
random tiny models, ~0 for trained ones); bf16 engines give ~1e-2. `MismatchMetrics` logs the
same comparison every step as ratios (`mismatch/*`), beside the rollout correction.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from easyvideor1 import distributed
from easyvideor1.models.families import Family
from easyvideor1.models.mrope import MRopeSpec
from easyvideor1.prompts import Prompt
from easyvideor1.records import Rollout
from easyvideor1.training.sequences import ForwardContext, RolloutBatch, all_logprobs, make_batch

LogprobFn = Callable[[list[Prompt], list[Rollout]], list[torch.Tensor]]


def trainer_logprob_fn(
    model,
    family: Family,
    spec: MRopeSpec,
    pad_token_id: int,
    temperature: float = 1.0,
    max_batch_size: int = 16,
    banned_ids: tuple[int, ...] = (),
) -> LogprobFn:
    """The trainer's log-prob pass (`all_logprobs`, the loop's own) as a `logprob_fn`, at
    `temperature` (use `SamplingParams.logprob_temperature`), with `banned_ids` at probability
    0 (the loop bans the vision pad tokens, `rollout.base.banned_token_ids`, as the engines do)."""

    def fn(prompts: list[Prompt], rollouts: list[Rollout]) -> list[torch.Tensor]:
        param = next(model.parameters())
        ctx = ForwardContext(family=family, spec=spec, pad_token_id=pad_token_id, micro_batch_size=max_batch_size,
                             temperature=temperature, device=param.device, pixel_dtype=param.dtype,
                             banned_ids=tuple(banned_ids))
        batch = make_batch(prompts, [[r] for r in rollouts])
        logps = all_logprobs(model, batch, ctx)
        return [logps[i, : len(r.token_ids)].float() for i, r in enumerate(rollouts)]

    return fn


def _gap_stats(gaps: list[torch.Tensor], responses: int) -> dict[str, float]:
    flat = torch.cat(gaps) if gaps else torch.zeros(0)
    return {
        "max_abs_gap": float(flat.max()) if flat.numel() else 0.0,
        "mean_abs_gap": float(flat.mean()) if flat.numel() else 0.0,
        "tokens": int(flat.numel()),
        "responses": responses,
    }


def modality_gaps(gaps: list[tuple[str, torch.Tensor]]) -> dict[str, dict]:
    """`{modality: {max_abs_gap, mean_abs_gap, tokens, responses}, ..., "all": {...}}` from each
    response's modality and absolute per-token gap."""
    per_modality: dict[str, list[torch.Tensor]] = {}
    for modality, gap in gaps:
        per_modality.setdefault(modality, []).append(gap)
    report = {m: _gap_stats(g, len(g)) for m, g in sorted(per_modality.items())}
    report["all"] = _gap_stats([g for _, g in gaps], len(gaps))
    return report


MODALITIES = ("video", "image", "image+video", "text")  # what `Prompt.modality` can be


def parity_metrics(batch: RolloutBatch) -> dict[str, float]:
    """The loop's parity metrics over every rank: `parity/max_gap/<modality>` and
    `parity/mean_gap/<modality>` (token mean) of the engine's log-probs against the step's old
    log-probs, generated responses only; modalities no rank saw are left out."""
    sums = {m: [0.0, 0.0, 0.0] for m in MODALITIES}  # |gap| sum, tokens, max
    for i, r in enumerate(batch.rollouts):
        if r.offline or r.logprobs is None or not r.token_ids:
            continue
        n = len(r.token_ids)
        gap = (batch.behaviour_log_probs[i, :n] - batch.old_log_probs[i, :n]).abs()
        acc = sums[batch.prompts[int(batch.group_ids[i])].modality]
        acc[0], acc[1], acc[2] = acc[0] + float(gap.sum()), acc[1] + n, max(acc[2], float(gap.max()))
    totals = distributed.all_reduce_floats([x for m in MODALITIES for x in sums[m][:2]])
    highs = distributed.all_reduce_floats([sums[m][2] for m in MODALITIES], "max")
    out = {}
    for k, m in enumerate(MODALITIES):
        gap_sum, tokens = totals[2 * k], totals[2 * k + 1]
        if tokens:
            out[f"parity/max_gap/{m}"] = highs[k]
            out[f"parity/mean_gap/{m}"] = gap_sum / tokens
    return out


class MismatchMetrics:
    """The `mismatch/*` metrics of one update (`training.update`): the engine's log-probs
    against the old policy's on every generated token, from `mismatch_row_stats` of the rollout
    correction, per modality (`mismatch/<name>/<modality>`) and over all (`mismatch/<name>`),
    over every rank: `kl` (k3 estimate of KL(rollout || old)), `ratio_mean`, `ratio_max`
    (ratio = pi_old / pi_rollout) and `corrected_frac` (tokens the correction clipped or masked)."""

    def __init__(self):
        self.sums = {m: [0.0, 0.0, 0.0, 0.0] for m in MODALITIES}  # k3, ratio, corrected, tokens
        self.highs = {m: 0.0 for m in MODALITIES}

    def add(self, modalities: list[str], rows: torch.Tensor) -> None:
        """Responses of `modalities` with their `mismatch_row_stats` rows [n, 5]."""
        for m, (k3, ratio, high, corrected, tokens) in zip(modalities, rows.tolist()):
            if tokens:
                acc = self.sums[m]
                acc[0], acc[1], acc[2], acc[3] = acc[0] + k3, acc[1] + ratio, acc[2] + corrected, acc[3] + tokens
                self.highs[m] = max(self.highs[m], high)

    def result(self) -> dict[str, float]:
        totals = distributed.all_reduce_floats([x for m in MODALITIES for x in self.sums[m]])
        highs = distributed.all_reduce_floats([self.highs[m] for m in MODALITIES], "max")
        per = {m: (totals[4 * k:4 * k + 4], highs[k]) for k, m in enumerate(MODALITIES)}
        per["all"] = ([sum(totals[j::4]) for j in range(4)], max(highs))
        out = {}
        for m, ((k3, ratio, corrected, tokens), high) in per.items():
            if tokens:
                suffix = "" if m == "all" else f"/{m}"
                out |= {f"mismatch/kl{suffix}": k3 / tokens, f"mismatch/ratio_mean{suffix}": ratio / tokens,
                        f"mismatch/ratio_max{suffix}": high, f"mismatch/corrected_frac{suffix}": corrected / tokens}
        return out


def _retokenizes(tokenizer, rollout: Rollout) -> bool:
    """The response text encodes back to the token ids (a final special token aside)."""
    ids = list(rollout.token_ids)
    if ids and ids[-1] in tokenizer.all_special_ids:
        ids = ids[:-1]
    return tokenizer.encode(rollout.text, add_special_tokens=False) == ids


def parity_report(
    prompts: list[Prompt],
    rollouts: list[list[Rollout]],
    logprob_fn: LogprobFn,
    tokenizer=None,
) -> dict:
    """Compare the engine's log-probs in `rollouts` (as `generate` returns them: one list per
    prompt) with `logprob_fn`'s (e.g. `trainer_logprob_fn(...)`).

    Returns `{modality: {max_abs_gap, mean_abs_gap, tokens, responses}, ..., "all": {...}}`
    and, when `tokenizer` is given, `"retokenize_agreement"`: the fraction of responses whose
    text encodes back to their token ids. Responses without engine log-probs (offline
    trajectories) are skipped.
    """
    if len(rollouts) != len(prompts):
        raise ValueError(f"got rollouts for {len(rollouts)} prompts, but {len(prompts)} prompts")
    flat_prompts, flat_rollouts = [], []
    for prompt, group in zip(prompts, rollouts):
        for r in group:
            if r.logprobs is not None and r.token_ids:
                flat_prompts.append(prompt)
                flat_rollouts.append(r)
    recomputed = logprob_fn(flat_prompts, flat_rollouts)
    gaps = []
    for prompt, r, lp in zip(flat_prompts, flat_rollouts, recomputed):
        lp = torch.as_tensor(lp, dtype=torch.float32).flatten()
        if len(lp) != len(r.token_ids) or len(r.logprobs) != len(r.token_ids):
            raise ValueError(
                f"sample {prompt.sample.problem_id!r}: {len(r.token_ids)} response tokens but "
                f"{len(r.logprobs)} engine and {len(lp)} recomputed log-probs"
            )
        gaps.append((prompt.modality, (lp - torch.tensor(r.logprobs, dtype=torch.float32)).abs()))
    report: dict = modality_gaps(gaps)
    if tokenizer is not None:
        same = [_retokenizes(tokenizer, r) for group in rollouts for r in group]
        report["retokenize_agreement"] = sum(same) / len(same) if same else 1.0
    return report
