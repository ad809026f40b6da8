"""The loop both commands share: stream the pending records, generate k responses each, score
them with the project's rewards, hand each sample's outcome to the command's writer.

Every input record ends as exactly one call of `write` (scored, or failed with its reason:
malformed record, unreadable media, generation or endpoint failure, scoring error), so nothing
is dropped silently; the writer appends it to a file keyed by id, which a re-run skips.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

from easyvideor1.curation.groups import Group, generate_groups
from easyvideor1.curation.records_io import InputRecord, count_records, progress, stream_records
from easyvideor1.curation.sources import Source
from easyvideor1.evaluation.pipeline import Item
from easyvideor1.records import RewardResult
from easyvideor1.rewards.batch import ScoringPool, score_batch
from easyvideor1.rewards.config import RewardConfig
from easyvideor1.rollout.base import SamplingParams


@dataclass
class Outcome:
    """One input record's result: its k responses and their rewards, or why there are none."""

    record: InputRecord
    texts: list[str]
    finish_reasons: list[str]
    rewards: list[RewardResult]
    error: str | None = None


@dataclass
class RunOptions:
    """Throughput knobs (they do not change the results)."""

    load_workers: int = 4
    """Threads reading frames and building prompts."""
    prefetch: int = 16
    """Samples loading ahead of the engine, at most."""
    score_workers: int = 2
    """Reward worker processes (0: score in this process, no timeout)."""
    score_timeout_s: float = 60.0
    """Per-response scoring limit (worker processes only)."""


def _scorer(cfg: RewardConfig, o: RunOptions):
    if o.score_workers > 0:
        pool = ScoringPool(cfg, o.score_workers, o.score_timeout_s)
        return pool.score, pool.close
    return partial(score_batch, cfg=cfg, workers=0), lambda: None


def run(data: str | os.PathLike, data_root: str | os.PathLike | None, source: Source, params: SamplingParams,
        k: int, done: set[str], write: Callable[[Outcome], None], desc: str, o: RunOptions | None = None,
        reward_cfg: RewardConfig | None = None) -> None:
    """Run every record of `data` whose id is not in `done` through `source`; `write` each outcome."""
    o = o or RunOptions()
    total = count_records(data)
    bar = progress(total, min(len(done), total), desc)
    score, close_scorer = _scorer(reward_cfg or RewardConfig(), o)

    def items(records: Iterator[InputRecord]) -> Iterator[Item]:
        for rec in records:
            if rec.id in done:
                continue
            if rec.sample is None:
                write(Outcome(rec, [], [], [], f"bad record: {rec.problem}"))
                bar.update(1)
                continue
            yield Item(key=rec, sample=rec.sample)

    async def drive() -> None:
        records = stream_records(data, data_root)
        async for group in generate_groups(items(records), source.prepare, source.backend, params, k,
                                           o.load_workers, o.prefetch):
            write(await _scored(group, k, score))
            bar.update(1)

    try:
        asyncio.run(drive())
    finally:
        bar.close()
        close_scorer()
        close = getattr(source.backend, "close", None)
        if close is not None:
            close()


async def _scored(group: Group, k: int, score) -> Outcome:
    rec: InputRecord = group.item.key
    if group.error is not None:
        return Outcome(rec, [], [], [], group.error)
    texts = [r.text for r in group.rollouts]
    finishes = [r.finish_reason for r in group.rollouts]
    try:
        rewards = await asyncio.to_thread(score, texts, [group.item.sample] * k)
    except Exception as e:  # noqa: BLE001 - e.g. an unknown problem_type: this sample fails, not the run
        return Outcome(rec, texts, finishes, [], f"scoring failed: {type(e).__name__}: {e}")
    errors = [r.error for r in rewards if r.error is not None]
    return Outcome(rec, texts, finishes, rewards, f"reward errors: {errors[0]}" if errors else None)
