"""Stage 2 of a step: prompts -> scored groups (rollout, hybrid slot, rewards, filtering).

`BatchScoreFn(responses, samples) -> list[RewardResult]` is injected, so the trainer never
knows which reward families exist; the rewards package's batch scorer is the default.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

import torch

from easyvideor1 import distributed
from easyvideor1.algorithms import BatchFiller, GroupFilter, filter_groups
from easyvideor1.algorithms.config import AlgorithmConfig
from easyvideor1.config import HybridConfig
from easyvideor1.records import RewardResult, Rollout, Sample
from easyvideor1.rollout.base import Prompt, RolloutEngine, SamplingParams
from easyvideor1.training.hybrid import HybridCounters, fill_groups, online_count

BatchScoreFn = Callable[[list[str], list[Sample]], list[RewardResult]]


@dataclass
class ScoredGroups:
    prompts: list[Prompt]
    groups: list[list[Rollout]]  # one per prompt
    results: list[list[RewardResult]]  # aligned with groups
    hybrid: HybridCounters = field(default_factory=HybridCounters)
    filter_metrics: dict[str, float] = field(default_factory=dict)


def _score(groups: list[list[Rollout]], prompts: list[Prompt], score_fn: BatchScoreFn) -> list[list[RewardResult]]:
    flat = [(g, r) for g, grp in enumerate(groups) for r in grp]
    results = score_fn([r.text for _, r in flat], [prompts[g].sample for g, _ in flat])
    out: list[list[RewardResult]] = [[] for _ in groups]
    for (g, _), res in zip(flat, results):
        out[g].append(res)
    return out


def generate_scored_groups(prompts: list[Prompt], engine: RolloutEngine, params: SamplingParams, n: int,
                           hybrid: HybridConfig, score_fn: BatchScoreFn, tokenizer, end_token: str) -> ScoredGroups:
    """Generate each prompt's group, place offline trajectories, and score every response."""
    counts = [online_count(p.sample, n, hybrid) for p in prompts]
    # Under FSDP an HF engine decodes in lockstep: a rank with no prompt still joins the call.
    online = engine.generate(prompts, counts, params) if prompts or distributed.is_distributed() else []
    online_results = _score(online, prompts, score_fn)
    counters = HybridCounters()
    accuracy = [[r.accuracy for r in res] for res in online_results]
    groups = fill_groups([p.sample for p in prompts], online, accuracy, hybrid, tokenizer, end_token,
                         params.max_tokens, counters)
    # Offline trajectories sit after the kept online responses of their group; score them in one call.
    kept = [sum(not r.offline for r in grp) for grp in groups]
    offline_results = _score([grp[k:] for grp, k in zip(groups, kept)], prompts, score_fn)
    results = [online_results[g][:k] + offline_results[g] for g, k in enumerate(kept)]
    counters.offline_reward_sum = sum(x.overall for res in offline_results for x in res)
    return ScoredGroups(prompts, groups, results, counters)


def fill_filtered_batch(make_prompts: Callable[[], list[Prompt]], engine: RolloutEngine, params: SamplingParams,
                        n: int, hybrid: HybridConfig, algo: AlgorithmConfig, score_fn: BatchScoreFn, tokenizer,
                        end_token: str, target_groups: int) -> ScoredGroups:
    """DAPO dynamic sampling: generate rounds of prompts until `target_groups` groups carry signal."""
    filler = BatchFiller(target_groups, algo.max_filter_tries, all_full=distributed.all_true)
    kept = ScoredGroups([], [], [])
    while True:
        round_ = generate_scored_groups(make_prompts(), engine, params, n, hybrid, score_fn, tokenizer, end_token)
        values = [getattr(r, algo.filter_key, None) if algo.filter_key in ("overall", "accuracy", "format")
                  else r.parts.get(algo.filter_key, 0.0) for res in round_.results for r in res]
        ids = [g for g, res in enumerate(round_.results) for _ in res]
        result = (filter_groups(torch.tensor(values, dtype=torch.float64), ids, low=algo.filter_low,
                                high=algo.filter_high)
                  if values else GroupFilter(torch.zeros(0, dtype=torch.bool), [], 0, 0, 0))  # nothing loaded
        for g in result.kept_groups[:target_groups - len(kept.groups)]:
            kept.prompts.append(round_.prompts[g])
            kept.groups.append(round_.groups[g])
            kept.results.append(round_.results[g])
        for name in ("groups_evaluated", "groups_replaced", "offline_truncated"):
            setattr(kept.hybrid, name, getattr(kept.hybrid, name) + getattr(round_.hybrid, name))
        kept.hybrid.offline_reward_sum += round_.hybrid.offline_reward_sum
        if filler.add(result):
            kept.filter_metrics = {f"filter/{k}": v for k, v in filler.metrics().items()}
            return kept


def pad_groups(scored: ScoredGroups, count: int, padding: Prompt, n: int) -> ScoredGroups:
    """Fill `scored` up to `count` groups with fully masked ones (`padding`'s prompt, n empty
    responses, reward 0), so every rank has the same number of groups and micro-batches after
    samples failed to load. Empty responses have no token in the loss, the normaliser or any
    masked statistic."""
    missing = count - len(scored.groups)
    for _ in range(missing):
        scored.prompts.append(padding)
        scored.groups.append([Rollout(prompt_index=len(scored.prompts) - 1, token_ids=[], text="",
                                      finish_reason="padding") for _ in range(n)])
        scored.results.append([RewardResult(overall=0.0, accuracy=0.0, format=0.0) for _ in range(n)])
    return scored


def reward_metrics(scored: ScoredGroups, gather=None) -> dict[str, float]:
    """Mean reward, accuracy and format per problem_type (online responses), response length,
    hybrid counters. `gather` merges the raw value lists of every data-parallel rank (None:
    this process only), so the logged means are those of the global batch."""
    values: dict[str, list[float]] = defaultdict(list)
    for prompt, grp, res in zip(scored.prompts, scored.groups, scored.results):
        if prompt.padding:
            continue
        ptype = prompt.sample.problem_type.lower().replace(" ", "_")
        for r, x in zip(grp, res):
            if r.offline:
                values["hybrid/offline_reward"].append(x.overall)
                continue
            for key, value in (("reward", x.overall), ("accuracy", x.accuracy), ("format", x.format)):
                values[f"{key}/{ptype}"].append(value)
                values[f"{key}/all"].append(value)
            values["response/length"].append(len(r.token_ids))
            values["response/clipped"].append(float(r.finish_reason == "length"))
            values["reward/errors"].append(float(x.error is not None))
    h = scored.hybrid
    for name in ("groups_evaluated", "groups_replaced", "offline_truncated"):
        values[f"hybrid/{name}"] = [1.0] * getattr(h, name)  # counted by length after the gather
    if gather is not None:
        values = gather(values)
    out = {k: sum(v) / len(v) for k, v in values.items() if v and not k.startswith("hybrid/")}
    out["reward/errors"] = sum(values.get("reward/errors", []))
    for name in ("groups_evaluated", "groups_replaced", "offline_truncated"):
        out[f"hybrid/{name}"] = float(len(values.get(f"hybrid/{name}", [])))
    offline = values.get("hybrid/offline_reward", [])
    out["hybrid/offline_reward"] = sum(offline) / len(offline) if offline else 0.0
    return {**out, **scored.filter_metrics}
