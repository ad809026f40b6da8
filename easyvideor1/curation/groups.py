"""k responses per sample through the evaluation pipeline's backends, streamed.

    items (iterator) --loading pool, at most `prefetch` ahead--> prepared item
        --k copies, each with its own seed--> Backend (HF batches / async vLLM / endpoint)
        --> outcomes collected per sample --> Group (k rollouts, or the first error)

`prepare` returns the `Prompt` the engines take, or the endpoint's `ChatRequest`.

Departures from `evaluation.pipeline.run_async`: items are pulled from an iterator as loading
slots free up (the evaluator schedules its whole list, longest video first, which would hold
every sample of a 100k-sample file); samples go in file order. A sample is prepared once and
its prompt shared by its k copies (copy j samples with seed `seed + seed_offset + j`, where
`seed_offset` comes from the sample id, so a resumed run draws the same responses). Only the
items in flight are held: those loading, those waiting in the backend, and the groups whose k
responses are not all back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
import zlib
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from easyvideor1.evaluation.pipeline import Backend, Item, Prepare
from easyvideor1.records import Rollout
from easyvideor1.rollout.base import SamplingParams

@dataclass
class Group:
    """One sample's k responses, or why it has none."""

    item: Item
    rollouts: list[Rollout]
    error: str | None = None


def seed_offset(sample_id: str, k: int) -> int:
    """First seed slot of a sample's k responses: fixed by its id, not by the order of the run."""
    return zlib.crc32(sample_id.encode("utf-8")) * k


def _load(item: Item, prepare: Prepare) -> Item:
    start = time.perf_counter()
    try:
        item.prompt = prepare(item)
    except Exception as e:  # noqa: BLE001 - reported per sample, the run goes on
        item.error = f"load failed: {type(e).__name__}: {e}"
    item.timing["load_s"] = time.perf_counter() - start
    return item


async def prepared(items: Iterator[Item], prepare: Prepare, load_workers: int, prefetch: int) -> AsyncIterator[Item]:
    """Prepare items in a thread pool, pulling the next one only when fewer than `prefetch` are
    loading; yield them as they finish."""
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(max_workers=max(1, load_workers), thread_name_prefix="curate-load") as pool:
        running: set[asyncio.Future] = set()
        exhausted = False
        while True:
            while not exhausted and len(running) < max(1, prefetch):
                item = next(items, None)
                if item is None:
                    exhausted = True
                else:
                    running.add(loop.run_in_executor(pool, _load, item, prepare))
            if not running:
                return
            done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                yield fut.result()


async def generate_groups(items: Iterator[Item], prepare: Prepare, backend: Backend, params: SamplingParams,
                          k: int, load_workers: int = 4, prefetch: int = 16) -> AsyncIterator[Group]:
    """Yield one `Group` per item: its k responses, or its load/generation error."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    open_groups: dict[int, tuple[Item, list]] = {}  # slot -> (item, outcomes so far)
    load_failures: list[Group] = []
    slots = itertools.count()

    async def copies() -> AsyncIterator[Item]:
        async for item in prepared(items, prepare, load_workers, prefetch):
            if item.error is not None:
                load_failures.append(Group(item, [], item.error))
                continue
            slot = next(slots)
            open_groups[slot] = (item, [])
            base = seed_offset(item.sample.problem_id, k)
            for j in range(k):
                prompt = dataclasses.replace(item.prompt, seed_offset=base + j)
                yield Item(key=(slot, j), sample=item.sample, prompt=prompt, timing=item.timing)

    async for outcome in backend.run(copies(), params):
        while load_failures:
            yield load_failures.pop()
        slot, j = outcome.item.key
        item, outcomes = open_groups[slot]
        outcomes.append(outcome)
        if len(outcomes) == k:
            del open_groups[slot]
            item.prompt = None  # free frames and pixel values as soon as the group is complete
            errors = [o.error or "no output" for o in outcomes if o.error is not None or o.rollout is None]
            rollouts = [] if errors else [o.rollout for o in sorted(outcomes, key=lambda o: o.item.key[1])]
            yield Group(item, rollouts, errors[0] if errors else None)
    while load_failures:
        yield load_failures.pop()
    if open_groups:  # a backend that drops outcomes is a bug; never lose the samples silently
        for item, outcomes in open_groups.values():
            yield Group(item, [], f"generation failed: {len(outcomes)} of {k} responses came back")
