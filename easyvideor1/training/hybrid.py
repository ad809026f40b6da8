"""Hybrid offline/online groups (paper section 3.2.1), done without waste.

For a sample that carries an `offline_output`, the engine generates n-1 responses and the
offline trajectory takes the last slot of the group (upstream generated n and threw one
away). In `threshold` mode the engine generates all n and the last one is replaced only when
the group's online accuracy is below the threshold; the replaced response is the one cost.

The offline text is tokenized with the chat template's end-of-turn token appended, so it
ends exactly like a generated response; longer than the response limit, it is truncated
with a counted warning (upstream crashed).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from easyvideor1.config import HybridConfig
from easyvideor1.records import Rollout, Sample

log = logging.getLogger(__name__)


@dataclass
class HybridCounters:
    groups_evaluated: int = 0  # groups whose sample has an offline trajectory
    groups_replaced: int = 0  # groups that received it
    offline_truncated: int = 0  # trajectories cut to the response limit

    COUNTS = ("groups_evaluated", "groups_replaced", "offline_truncated")  # the logged counts

    def merge(self, other: HybridCounters) -> None:
        """Add `other`'s counts (another generation round of the same step) to these."""
        self.groups_evaluated += other.groups_evaluated
        self.groups_replaced += other.groups_replaced
        self.offline_truncated += other.offline_truncated


def has_offline(sample: Sample) -> bool:
    return bool(sample.has_offline_trajectory and sample.offline_output)


def online_count(sample: Sample, n: int, cfg: HybridConfig) -> int:
    """How many responses the engine must generate for this sample."""
    return n - 1 if cfg.enable and cfg.mode == "always" and has_offline(sample) else n


def offline_rollout(sample: Sample, prompt_index: int, tokenizer, end_token: str, max_tokens: int,
                    counters: HybridCounters) -> Rollout:
    """The sample's offline trajectory as a Rollout (end-of-turn appended, cut to `max_tokens`)."""
    ids = tokenizer.encode(sample.offline_output + end_token, add_special_tokens=False)
    truncated = len(ids) > max_tokens
    if truncated:
        counters.offline_truncated += 1
        log.warning("offline trajectory of sample %s has %d tokens > response limit %d: truncated "
                    "(raise rollout.max_tokens or shorten offline_output)", sample.problem_id, len(ids), max_tokens)
        ids = ids[:max_tokens]
    return Rollout(prompt_index=prompt_index, token_ids=ids, text=tokenizer.decode(ids, skip_special_tokens=True),
                   logprobs=None, finish_reason="offline", offline=True, truncated=truncated)


def fill_groups(samples: list[Sample], online: list[list[Rollout]], online_accuracy: list[list[float]] | None,
                cfg: HybridConfig, tokenizer, end_token: str, max_tokens: int,
                counters: HybridCounters) -> list[list[Rollout]]:
    """Complete each group with its offline trajectory where the mode says so.

    `online[i]` are sample i's generated responses; `online_accuracy[i]` their accuracies
    (needed in threshold mode only).
    """
    groups = []
    for i, (sample, rollouts) in enumerate(zip(samples, online)):
        group = list(rollouts)
        if cfg.enable and has_offline(sample):
            counters.groups_evaluated += 1
            if cfg.mode == "always":
                use = True
            else:
                acc = online_accuracy[i] if online_accuracy is not None else []
                use = (sum(acc) / len(acc) if acc else 0.0) < cfg.threshold
                if use:
                    group = group[:-1]
            if use:
                group.append(offline_rollout(sample, i, tokenizer, end_token, max_tokens, counters))
                counters.groups_replaced += 1
        groups.append(group)
    return groups
