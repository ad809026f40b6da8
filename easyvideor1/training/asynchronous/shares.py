"""Each trainer rank's part of a batch the rollout side made as one process."""

from __future__ import annotations

from easyvideor1.config import Config
from easyvideor1.prompts import Prompt
from easyvideor1.records import Sample
from easyvideor1.training.groups import ScoredGroups, pad_groups
from easyvideor1.training.hybrid import HybridCounters
from easyvideor1.training.rank_balance import rank_slots


def trainer_shares(scored: ScoredGroups, batch: list[Sample], trainers: int, cfg: Config,
                   padding: Prompt) -> list[ScoredGroups]:
    """Each of the `trainers` ranks' part of a step's global `scored` groups (made by the rollout
    side as one process: slot order). The parts are those of the data-parallel ranks (trainers /
    `training.sequence_parallel_size`); every rank of a sequence-parallel group takes its
    data-parallel rank's part (trainer rank r: part r // size, as `sequence_parallel.data_parallel`).
    Without dynamic sampling part d holds the slots a colocated run gives data-parallel rank d
    (`rank_slots` of the step's `batch`; a group's slot is its prompt's `seed_offset` / n), so the
    same prompts, responses and token balance; with dynamic sampling, which fills the batch as one
    colocated process does, equal contiguous parts. Each part is padded where samples failed. The
    hybrid counts (which data-parallel ranks sum) go with the first part; the filter metrics and
    the skipped samples, already the batch's, with every part."""
    size = cfg.training.sequence_parallel_size
    dp = trainers // size
    if dp == 1:
        return [scored] * trainers
    per, n = cfg.training.rollout_batch_size // dp, cfg.rollout.n
    if cfg.algorithm.online_filtering:
        parts = [range(d * per, (d + 1) * per) for d in range(dp)]
    else:
        group_of = {p.seed_offset // n: g for g, p in enumerate(scored.prompts) if not p.padding}
        vision = cfg.vision if cfg.training.balance_ranks else None
        parts = [[group_of[s] for s in rank_slots(batch, d, dp, vision) if s in group_of] for d in range(dp)]
    shares = [pad_groups(ScoredGroups([scored.prompts[g] for g in part], [scored.groups[g] for g in part],
                                      [scored.results[g] for g in part],
                                      scored.hybrid if d == 0 else HybridCounters(), dict(scored.filter_metrics),
                                      skipped=list(scored.skipped)),
                         per, padding, n)
              for d, part in enumerate(parts)]
    return [shares[r // size] for r in range(trainers)]
