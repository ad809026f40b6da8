"""Stage 2 of a step: prompts -> scored groups (rollout, hybrid slot, rewards, filtering).

`RolloutStage` holds what this stage needs (engine, group size, hybrid mode, scorer, sampling
settings) once per run. `BatchScoreFn(responses, samples) -> list[RewardResult]` is injected, so
the trainer never knows which reward families exist (`training.setup.make_score_fn` hands in
the rewards package's batch scorer).

Under data parallelism every rank's stage ends with the same number of groups (padding groups
stand in for samples that failed, and dynamic sampling runs rounds until every rank is full),
so the update's collectives stay in step.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from easyvideor1 import distributed
from easyvideor1.algorithms import BatchFiller, GroupFilter, filter_groups
from easyvideor1.algorithms.config import AlgorithmConfig
from easyvideor1.config import HybridConfig, RolloutConfig
from easyvideor1.config_tree import ConfigError
from easyvideor1.prompts import Prompt
from easyvideor1.records import RewardResult, Rollout, Sample
from easyvideor1.rollout.base import RolloutEngine, SamplingParams
from easyvideor1.training.hybrid import HybridCounters, fill_groups, online_count

BatchScoreFn = Callable[[list[str], list[Sample]], list[RewardResult]]


@dataclass
class ScoredGroups:
    prompts: list[Prompt]
    groups: list[list[Rollout]]  # one per prompt
    results: list[list[RewardResult]]  # aligned with groups
    hybrid: HybridCounters = field(default_factory=HybridCounters)
    filter_metrics: dict[str, float] = field(default_factory=dict)
    # ReMax under separate placement: the greedy response's reward per prompt [G], made by the
    # rollout side with the batch's weights (`trainer.greedy_rewards`); None: the trainer makes it
    greedy: torch.Tensor | None = None
    # The first samples of the step skipped on any data-parallel rank, (id, why), for the run's
    # skip count (`training.skips`); their number is filter_metrics["data/prompt_failures"]
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def add(self, other: ScoredGroups, groups: list[int]) -> None:
        """Take `other`'s groups `groups` (indices) and its hybrid counts."""
        for g in groups:
            self.prompts.append(other.prompts[g])
            self.groups.append(other.groups[g])
            self.results.append(other.results[g])
        self.hybrid.merge(other.hybrid)


def _score(groups: list[list[Rollout]], prompts: list[Prompt], score_fn: BatchScoreFn) -> list[list[RewardResult]]:
    flat = [(g, r) for g, grp in enumerate(groups) for r in grp]
    results = score_fn([r.text for _, r in flat], [prompts[g].sample for g, _ in flat])
    out: list[list[RewardResult]] = [[] for _ in groups]
    for (g, _), res in zip(flat, results):
        out[g].append(res)
    return out


def stop_token_ids(stop_tokens: list[str], tokenizer) -> tuple[int, ...]:
    """Ids of `rollout.stop_tokens`; each must be one token of the tokenizer."""
    vocab = tokenizer.get_vocab()
    missing = [t for t in stop_tokens if t not in vocab]
    if missing:
        raise ConfigError(f"rollout.stop_tokens {missing} are not single tokens of the model's tokenizer; "
                          "name single tokens (e.g. </answer> where the tokenizer has it as one token)")
    return tuple(vocab[t] for t in stop_tokens)


@dataclass
class RolloutStage:
    """Prompts -> scored groups, with everything that takes (built once per run)."""

    engine: RolloutEngine
    score_fn: BatchScoreFn
    tokenizer: object
    end_token: str  # appended to offline trajectories, so they end like generated responses
    rollout: RolloutConfig  # group size and sampling settings
    hybrid: HybridConfig
    algo: AlgorithmConfig  # dynamic-sampling settings
    seed: int  # training.seed
    stop_ids: tuple[int, ...] = ()  # `stop_token_ids(rollout.stop_tokens, tokenizer)`, checked once
    # Sequence parallelism: (prompts, counts, params, generate) -> every response, each rank of the
    # group generating its share (`training.sequence_parallel.split_rollouts`); None: generate all.
    split: Callable[..., list[list[Rollout]]] | None = None
    count_group: Any = None  # ranks whose filter counts add up (the data-parallel ones under SP); None: all
    # `rollout.tools`: (prompt, offline rollout, max_tokens) -> the trajectory with its tool calls run
    # again on the video (`ToolEngine.replay`); None: offline trajectories stay single-turn text.
    replay: Callable[[Prompt, Rollout, int], Rollout] | None = None

    def params(self, step: int, temperature: float | None = None) -> SamplingParams:
        """The step's sampling settings (`temperature` 0: greedy, for validation and ReMax)."""
        r = self.rollout
        greedy = temperature == 0.0
        return SamplingParams(temperature=r.temperature if temperature is None else temperature,
                              top_p=1.0 if greedy else r.top_p, top_k=-1 if greedy else r.top_k,
                              max_tokens=r.max_tokens, seed=self.seed * 1_000_003 + step,
                              stop_token_ids=self.stop_ids,
                              include_stop_str_in_output=True)

    def generate(self, prompts: list[Prompt], n: list[int] | int, params: SamplingParams) -> list[list[Rollout]]:
        """The engine's responses; under FSDP an HF engine decodes in lockstep, so a rank with no
        prompt still joins the call."""
        return self.engine.generate(prompts, n, params) if prompts or distributed.is_distributed() else []

    def score(self, prompts: list[Prompt], groups: list[list[Rollout]]) -> list[list[RewardResult]]:
        return _score(groups, prompts, self.score_fn)

    def groups(self, prompts: list[Prompt], params: SamplingParams) -> ScoredGroups:
        """Generate each prompt's group, place offline trajectories, and score every response."""
        n, hybrid = self.rollout.n, self.hybrid
        counts = [online_count(p.sample, n, hybrid) for p in prompts]
        online = (self.generate(prompts, counts, params) if self.split is None
                  else self.split(prompts, counts, params, self.generate))
        online_results = self.score(prompts, online)
        counters = HybridCounters()
        accuracy = [[r.accuracy for r in res] for res in online_results]
        groups = fill_groups([p.sample for p in prompts], online, accuracy, hybrid, self.tokenizer, self.end_token,
                             params.max_tokens, counters)
        if self.replay is not None:
            groups = [[self.replay(prompts[g], r, params.max_tokens) if r.offline else r for r in grp]
                      for g, grp in enumerate(groups)]
        # Offline trajectories sit after the kept online responses of their group; score them in one call.
        kept = [sum(not r.offline for r in grp) for grp in groups]
        offline_results = self.score(prompts, [grp[k:] for grp, k in zip(groups, kept)])
        results = [online_results[g][:k] + offline_results[g] for g, k in enumerate(kept)]
        return ScoredGroups(prompts, groups, results, counters)

    def filtered_groups(self, next_prompts: Callable[[], list[Prompt]], params: SamplingParams,
                        target_groups: int) -> ScoredGroups:
        """DAPO dynamic sampling: rounds of prompts until every rank holds `target_groups` groups
        that carry signal (the stop decision is taken over all ranks)."""
        algo = self.algo
        filler = BatchFiller(target_groups, algo.max_filter_tries, all_full=distributed.all_true)
        kept = ScoredGroups([], [], [])
        while True:
            round_ = self.groups(next_prompts(), params)
            # A response whose reward function failed has no value: it neither adds nor hides signal.
            values = [getattr(r, algo.filter_key, None) if algo.filter_key in ("overall", "accuracy", "format")
                      else r.parts.get(algo.filter_key, 0.0) for res in round_.results for r in res if r.error is None]
            ids = [g for g, res in enumerate(round_.results) for r in res if r.error is None]
            result = (filter_groups(torch.tensor(values, dtype=torch.float64), ids, low=algo.filter_low,
                                    high=algo.filter_high)
                      if values else GroupFilter(torch.zeros(0, dtype=torch.bool), [], 0, 0, 0))  # nothing loaded
            kept.add(round_, result.kept_groups[:target_groups - len(kept.groups)])
            if filler.add(result):  # counts summed over ranks (the rounds are the same on every rank)
                counts = filler.metrics()
                summed = dict(zip(counts, distributed.all_reduce_floats(list(counts.values()), group=self.count_group)))
                kept.filter_metrics = {f"filter/{k}": v if k == "filter_tries" else summed[k] for k, v in counts.items()}
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
            # A failed reward function is counted in reward/errors, not averaged in as a 0.
            for key, value in (("reward", x.overall), ("accuracy", x.accuracy), ("format", x.format)):
                if x.error is None:
                    values[f"{key}/{ptype}"].append(value)
                    values[f"{key}/all"].append(value)
            values["response/length"].append(len(r.token_ids))
            values["response/clipped"].append(float(r.finish_reason == "length"))
            values["reward/errors"].append(float(x.error is not None))
    h = scored.hybrid
    for name in HybridCounters.COUNTS:
        values[f"hybrid/{name}"] = [1.0] * getattr(h, name)  # counted by length after the gather
    if gather is not None:
        values = gather(values)
    out = {k: sum(v) / len(v) for k, v in values.items() if v and not k.startswith("hybrid/")}
    out["reward/errors"] = sum(values.get("reward/errors", []))
    for name in HybridCounters.COUNTS:
        out[f"hybrid/{name}"] = float(len(values.get(f"hybrid/{name}", [])))
    offline = values.get("hybrid/offline_reward", [])
    out["hybrid/offline_reward"] = sum(offline) / len(offline) if offline else 0.0
    return {**out, **scored.filter_metrics}
