"""Parity check between a rollout engine and the trainer, per modality.

PPO-style ratios divide the trainer's recomputed probabilities by the engine's. If the two
disagree for reasons other than the weight update (different M-RoPE numbering, a processor
that resized frames, a bf16 kernel), the ratios are biased from the first step. This module
recomputes the trainer-side log-probs of a rollout batch and reports, per modality of the
prompt (video / image / image+video / text), the max and mean absolute gap to the engine's
behaviour log-probs, plus whether each response's text re-tokenizes to its token ids.

Expected gaps: ~1e-6 in float32 when weights are in sync and the sampling used no top-k/top-p
(the engines ban vision pad tokens, which adds `log(1 - p(pad tokens))`: a few 1e-3 for random
tiny models, ~0 for trained ones); bf16 engines give ~1e-2.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from easyvideor1.models.collate import collate
from easyvideor1.models.families import Family
from easyvideor1.models.inputs import append_response
from easyvideor1.models.logprobs import sequence_logprobs
from easyvideor1.models.mrope import MRopeSpec
from easyvideor1.records import Rollout
from easyvideor1.rollout.base import Prompt

LogprobFn = Callable[[list[Prompt], list[Rollout]], list[torch.Tensor]]


def trainer_logprob_fn(
    model,
    family: Family,
    spec: MRopeSpec,
    pad_token_id: int,
    temperature: float = 1.0,
    max_batch_size: int = 16,
) -> LogprobFn:
    """The trainer's log-prob pass as a `logprob_fn`: prompt + response through
    `append_response` (our position ids), right-padded `collate`, `sequence_logprobs` at
    `temperature` (use `SamplingParams.logprob_temperature`)."""

    def fn(prompts: list[Prompt], rollouts: list[Rollout]) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        param = next(model.parameters())
        for start in range(0, len(rollouts), max_batch_size):
            chunk = range(start, min(start + max_batch_size, len(rollouts)))
            items = [append_response(prompts[k].inputs, rollouts[k].token_ids, spec) for k in chunk]
            batch = collate(items, family, spec, pad_token_id, padding_side="right")
            batch = batch.to(param.device, dtype=param.dtype)
            with torch.no_grad():
                scored = sequence_logprobs(model, batch, temperature=temperature)
            for (row, begin, end), it in zip(batch.seq_spans, items):
                out.append(scored.logprobs[row, begin + it.prompt_len : end].float().cpu())
        return out

    return fn


def _gap_stats(gaps: list[torch.Tensor], responses: int) -> dict[str, float]:
    flat = torch.cat(gaps) if gaps else torch.zeros(0)
    return {
        "max_abs_gap": float(flat.max()) if flat.numel() else 0.0,
        "mean_abs_gap": float(flat.mean()) if flat.numel() else 0.0,
        "tokens": int(flat.numel()),
        "responses": responses,
    }


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
    per_modality: dict[str, list[torch.Tensor]] = {}
    counts: dict[str, int] = {}
    for prompt, r, lp in zip(flat_prompts, flat_rollouts, recomputed):
        lp = torch.as_tensor(lp, dtype=torch.float32).flatten()
        if len(lp) != len(r.token_ids) or len(r.logprobs) != len(r.token_ids):
            raise ValueError(
                f"sample {prompt.sample.problem_id!r}: {len(r.token_ids)} response tokens but "
                f"{len(r.logprobs)} engine and {len(lp)} recomputed log-probs"
            )
        gap = (lp - torch.tensor(r.logprobs, dtype=torch.float32)).abs()
        per_modality.setdefault(prompt.modality, []).append(gap)
        counts[prompt.modality] = counts.get(prompt.modality, 0) + 1
    report: dict = {m: _gap_stats(g, counts[m]) for m, g in sorted(per_modality.items())}
    report["all"] = _gap_stats([g for gs in per_modality.values() for g in gs], len(flat_rollouts))
    if tokenizer is not None:
        same = [_retokenizes(tokenizer, r) for group in rollouts for r in group]
        report["retokenize_agreement"] = sum(same) / len(same) if same else 1.0
    return report
