"""Set-up of Ulysses sequence parallelism (`training.sequence_parallel_size`, `models.ulysses`).

The mesh is data-parallel x sequence-parallel: rank r = dp_rank * k + sp_rank, the k consecutive
ranks of a group hold the same prompts (the loader slices by dp_rank) and split each packed row.
FSDP2 still shards over the whole world. The k ranks of a group split its rollout work
(`split_rollouts`): rank j generates the j-th contiguous k-th of the group's responses (each with
the seed it has in one process), then they are gathered within the group, so every rank scores,
filters and trains on the same responses and rollout throughput is not divided by k. Every rank
still calls the engine (the HF engine's forwards are collectives of the whole world). The group's
first rank's rewards replace the others' (`share_scored`), so the k copies are identical even where
a reward is not bitwise reproducible across ranks.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import transformers

from easyvideor1 import distributed
from easyvideor1.config import Config
from easyvideor1.config_tree import ConfigError
from easyvideor1.models.packing import packing_blocker
from easyvideor1.models.ulysses import SequenceParallel, use_ulysses_attention
from easyvideor1.prompts import Prompt
from easyvideor1.records import Rollout
from easyvideor1.rollout.base import SamplingParams, sample_seeds
from easyvideor1.training.groups import ScoredGroups


@dataclass(frozen=True)
class DataParallel:
    """This rank's data-parallel coordinates (rank and world of the prompts it holds)."""

    rank: int
    world: int
    group: Any = None
    """Ranks holding different prompts (one per sequence-parallel group); None: the whole world."""


def data_parallel(cfg: Config, rank: int, world: int) -> DataParallel:
    """Check `training.sequence_parallel_size` against the world; this rank's data-parallel place."""
    k = cfg.training.sequence_parallel_size
    if k < 1 or world % k:
        raise ConfigError(f"training.sequence_parallel_size={k} must be >= 1 and divide the number of processes "
                          f"({world}); launch a multiple of {k} processes")
    return DataParallel(rank // k, world // k)


def sequence_parallel_blocker(config, k: int) -> str | None:
    """Why a model with HF `config` cannot split its rows over k ranks, or None."""
    text = config.get_text_config()
    why = packing_blocker(config)
    if why is not None:
        return f"sequence parallelism splits packed rows, and this model cannot pack: {why}"
    if text.num_attention_heads % k:
        return f"its {text.num_attention_heads} attention heads do not divide by sequence_parallel_size={k}"
    if "linear_attention" in (getattr(text, "layer_types", None) or ()):
        hk, hv = text.linear_num_key_heads, text.linear_num_value_heads
        if hk % k or hv % k:  # never repeated: see models.ulysses.ulysses_linear_attention
            return (f"its {hk} linear-attention key heads and {hv} value heads must both divide by "
                    f"sequence_parallel_size={k}; choose a k that divides {math.gcd(hk, hv)}")
    return None


def setup_sequence_parallel(cfg: Config, models: list, rank: int, pad_token_id: int
                            ) -> tuple[SequenceParallel | None, DataParallel]:
    """The groups and the attention of sequence parallelism (None when off), and the data-parallel
    place. Call before sharding (`training.fsdp.shard(vision_unit=True)`, then `run_root_once`)."""
    world = distributed.world_size()
    dp = data_parallel(cfg, rank, world)
    k = cfg.training.sequence_parallel_size
    if k == 1:
        return None, dp
    if cfg.model.lora.rank:
        raise ConfigError("training.sequence_parallel_size > 1 with LoRA (model.lora.rank > 0) is not supported; "
                          "set one of them off")
    for m in models:
        why = sequence_parallel_blocker(m.config, k)
        if why is not None:
            raise ConfigError(f"training.sequence_parallel_size={k}: {why}")
        if "mm_encoder_outputs" not in inspect.signature(type(m.model).forward).parameters:
            raise ConfigError(f"training.sequence_parallel_size={k}: {type(m.model).__name__}.forward in transformers "
                              f"{transformers.__version__} takes no mm_encoder_outputs (precomputed vision features; "
                              "5.19 has it), which sequence parallelism hands it")
    sp = SequenceParallel(distributed.new_subgroups(k), rank % k, k, pad_token_id)
    dp = DataParallel(dp.rank, dp.world, distributed.strided_subgroups(k))
    for m in models:
        use_ulysses_attention(m)
    return sp, dp


def _first_rank(sp: SequenceParallel, prompts: list[Prompt], value):
    ids = [p.sample.problem_id for p in prompts]
    first_ids, first_value = distributed.all_gather_objects((ids, value), sp.group)[0]
    if first_ids != ids:
        raise RuntimeError("the ranks of a sequence-parallel group built different prompts; they must share a data "
                           "slice (training.rank_balance.rank_slots by data-parallel rank)")
    return first_value


def rollout_share(counts: list[int], k: int, j: int) -> list[tuple[int, int, int]]:
    """Rank j's share of the responses `counts[i]` of prompts i, as (prompt, first, count) runs:
    the j-th of k contiguous, near-equal slices of the responses in (prompt, response) order."""
    total = sum(counts)
    lo, hi = total * j // k, total * (j + 1) // k
    runs, at = [], 0
    for i, c in enumerate(counts):
        first, last = max(lo, at), min(hi, at + c)
        if first < last:
            runs.append((i, first - at, last - first))
        at += c
    return runs


def split_rollouts(sp: SequenceParallel, prompts: list[Prompt], counts: list[int], params: SamplingParams,
                   generate: Callable) -> list[list[Rollout]]:
    """`generate(prompts, counts, params)` with the work split over the sequence-parallel group
    (`RolloutStage.split`): this rank generates its `rollout_share`, each response seeded as in one
    call over all prompts (`rollout.base.sample_seeds`), then the group gathers the pieces."""
    seeds = sample_seeds(counts, params.seed, [p.seed_offset for p in prompts])
    runs = rollout_share(counts, sp.size, sp.rank)
    mine = [replace(prompts[i], seed_offset=None if params.seed is None else seeds[i][first] - params.seed)
            for i, first, _ in runs]
    pieces = generate(mine, [c for *_, c in runs], params)
    ids = [p.sample.problem_id for p in prompts]
    gathered = distributed.all_gather_objects((ids, runs, pieces), sp.group)
    if any(other != ids for other, _, _ in gathered):
        raise RuntimeError("the ranks of a sequence-parallel group built different prompts; they must share a data "
                           "slice (training.rank_balance.rank_slots by data-parallel rank)")
    groups: list[list[Rollout]] = [[] for _ in prompts]
    for _, rank_runs, rank_pieces in gathered:  # rank order = response order
        for (i, _, _), piece in zip(rank_runs, rank_pieces):
            groups[i].extend(replace(r, prompt_index=i) for r in piece)
    return groups


def share_scored(scored: ScoredGroups, sp: SequenceParallel | None) -> ScoredGroups:
    """The group's first rank's groups and rewards on every rank of the sequence-parallel group
    (a reward that is not reproducible, e.g. a judge model, could otherwise differ)."""
    if sp is None:
        return scored
    scored.groups, scored.results = _first_rank(sp, scored.prompts, (scored.groups, scored.results))
    return scored
