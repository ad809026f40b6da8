"""The asynchronous evaluation pipeline (paper section 3.3.1), done without serial stalls.

    loading pool (frames from the cache or decoders + processor) --bounded queue-->
    engine (requests submitted as soon as their inputs are ready) --> scorer --> results JSONL

- Loading runs in a thread pool of `load_workers`; at most `prefetch` prepared prompts wait
  for the engine (back-pressure keeps memory bounded on long benchmarks). Loads complete in
  any order and are handed on in completion order (upstream awaited each load in turn).
- Samples are ordered longest video first, so the slowest ones do not straggle at the end.
- The engine side is a `Backend`: `HFBatchBackend` batches whatever prompts are ready
  (up to `max_batch`), `AsyncEngineBackend` submits each request to an asynchronous engine
  (`rollout.vllm_engine.AsyncVLLMEngine`, vLLM's `AsyncLLM`) on arrival and consumes results as
  they finish (`max_concurrency` in flight).
- Every sample ends as one result row: scored, or failed with its reason (load or generate),
  never dropped from the denominator.
- Rows are scored and written as each output finishes. Scores that wait on an LLM judge go
  to a `JudgeQueue` (its own threads, bounded concurrency), so a slow judge never stalls
  loading or generation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Protocol

from easyvideor1.prompts import Prompt
from easyvideor1.records import Rollout, Sample
from easyvideor1.rollout.base import RolloutEngine, SamplingParams

log = logging.getLogger(__name__)

Prepare = Callable[["Item"], Prompt]  # raises with a reason when the sample cannot be prepared


@dataclass
class Item:
    """One sample on its way through the pipeline."""

    key: Any  # (benchmark name, sample id): where the result goes
    sample: Sample
    prompt: Prompt | None = None
    error: str | None = None
    timing: dict[str, float] = field(default_factory=dict)


@dataclass
class GenerationOutcome:
    """What became of one item: its rollout, or why generating it failed."""

    item: Item
    rollout: Rollout | None
    error: str | None


class Backend(Protocol):
    def run(self, items: AsyncIterator[Item], params: SamplingParams) -> AsyncIterator[GenerationOutcome]:
        """Consume prepared items as they arrive; yield outcomes as they finish."""
        ...


class AsyncEngineBackend:
    """An asynchronous engine (`rollout.vllm_engine.AsyncVLLMEngine`): each item is submitted as
    soon as its prompt is ready, at most `max_concurrency` in flight; outcomes are yielded as
    requests finish."""

    def __init__(self, engine, max_concurrency: int = 64):
        self.engine, self.max_concurrency = engine, max_concurrency

    async def run(self, items: AsyncIterator[Item], params: SamplingParams) -> AsyncIterator[GenerationOutcome]:
        slots = asyncio.Semaphore(self.max_concurrency)
        finished: asyncio.Queue = asyncio.Queue()
        end = object()  # put after the last outcome

        async def one(item):
            try:
                outcome = GenerationOutcome(item, await self.engine.generate_one(item.prompt, params), None)
            except Exception as e:  # noqa: BLE001 - a failed request fails its sample only
                outcome = GenerationOutcome(item, None, f"generation failed: {type(e).__name__}: {e}")
            finally:
                slots.release()
            await finished.put(outcome)

        async def submit_all():
            # beside the consumer below, so a finished request is handed on at once, not when
            # the next input happens to arrive
            tasks = []
            try:
                async for item in items:
                    await slots.acquire()
                    tasks.append(asyncio.create_task(one(item)))
                await asyncio.gather(*tasks)
            finally:
                await finished.put(end)

        feeder = asyncio.create_task(submit_all())
        while (outcome := await finished.get()) is not end:
            yield outcome
        await feeder  # re-raises what failed while feeding

    def close(self) -> None:
        self.engine.close()


class HFBatchBackend:
    """Batches whatever prompts are ready (up to `max_batch`) on a synchronous engine: the HF
    engine, or with `--tools` the tool loop around it or around training's `VLLMEngine`."""

    def __init__(self, engine: RolloutEngine, max_batch: int = 8):
        self.engine, self.max_batch = engine, max_batch

    async def run(self, items: AsyncIterator[Item], params: SamplingParams) -> AsyncIterator[GenerationOutcome]:
        # bounded: the loading pool's prefetch limit holds only if this queue does not drain it
        pending: asyncio.Queue = asyncio.Queue(maxsize=self.max_batch)
        done = asyncio.Event()

        async def pump():
            async for it in items:
                await pending.put(it)
            done.set()

        pumper = asyncio.create_task(pump())
        while not (done.is_set() and pending.empty()):
            try:
                first = await asyncio.wait_for(pending.get(), timeout=0.05)
            except asyncio.TimeoutError:
                continue
            batch = [first]
            while len(batch) < self.max_batch and not pending.empty():
                batch.append(pending.get_nowait())
            start = time.perf_counter()
            try:
                groups = await asyncio.to_thread(self.engine.generate, [b.prompt for b in batch], 1, params)
                outs = [GenerationOutcome(b, g[0], None) for b, g in zip(batch, groups)]
            except Exception as e:  # noqa: BLE001 - a failed batch fails its samples, not the run
                outs = [GenerationOutcome(b, None, f"generation failed: {type(e).__name__}: {e}") for b in batch]
            for o in outs:
                o.item.timing["generate_s"] = time.perf_counter() - start
                yield o
        await pumper


class JudgeQueue:
    """Scoring that waits on an LLM judge, beside generation and off the result callback.

    `submit(fn, *args)` queues `fn(*args)` (score one response and write its row) on a pool
    of `concurrency` threads with its own unbounded queue of small tasks (a response and its
    sample: the prompt's frames are already freed); `drain()` waits for every queued task.
    The judge client retries timeouts, transport errors, 429 and 5xx itself
    (`rewards.judge`); what still fails becomes a failed row through the benchmark's
    `result_row`, so nothing raised here is expected; `drain` re-raises if it was.
    """

    def __init__(self, concurrency: int = 16):
        self.pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="eval-judge")
        self.futures: list = []

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        self.futures.append(self.pool.submit(fn, *args))

    def pending(self) -> int:
        """Tasks queued or running."""
        return sum(not f.done() for f in self.futures)

    def drain(self) -> None:
        try:
            for f in self.futures:
                f.result()
        finally:
            self.pool.shutdown(wait=True)


def longest_first(items: list[Item], seconds: Callable[[str], float]) -> list[Item]:
    """Items ordered by the total video seconds of their sample, longest first (stable)."""
    return sorted(items, key=lambda it: -sum(seconds(v) for v in it.sample.videos))


def split_longest_first(items: list[Item], n: int, seconds: Callable[[str], float]) -> list[list[Item]]:
    """`items` (longest first) dealt into `n` shares of nearly equal video seconds: each item,
    longest first, goes to the share with the fewest seconds so far (ties: the lower index).
    Deterministic, so every machine of a sharded run computes the same split."""
    shares: list[list[Item]] = [[] for _ in range(n)]
    load = [0.0] * n
    for it in items:
        k = min(range(n), key=lambda j: (load[j], j))
        shares[k].append(it)
        load[k] += sum(seconds(v) for v in it.sample.videos) or 1.0  # a text/image sample still costs
    return shares


async def _prepared(items: list[Item], prepare: Prepare, load_workers: int, prefetch: int) -> AsyncIterator[Item]:
    """Prepare items in a thread pool; yield them in completion order, at most `prefetch` ahead."""
    loop = asyncio.get_running_loop()
    slots = asyncio.Semaphore(max(1, prefetch))

    def load(it: Item) -> Item:
        start = time.perf_counter()
        try:
            it.prompt = prepare(it)
        except Exception as e:  # noqa: BLE001 - reported per sample
            it.error = f"load failed: {type(e).__name__}: {e}"
        it.timing["load_s"] = time.perf_counter() - start
        return it

    with ThreadPoolExecutor(max_workers=max(1, load_workers), thread_name_prefix="eval-load") as pool:
        async def submit(it: Item):
            await slots.acquire()  # released when the consumer takes the item
            return await loop.run_in_executor(pool, load, it)

        tasks = [asyncio.ensure_future(submit(it)) for it in items]
        for fut in asyncio.as_completed(tasks):
            it = await fut
            slots.release()
            yield it


async def run_async(items: list[Item], prepare: Prepare, backend: Backend, params: SamplingParams,
                    on_outcome: Callable[[GenerationOutcome], None], load_workers: int = 4, prefetch: int = 16) -> None:
    """Drive `items` through loading, generation and `on_outcome` (which scores and writes)."""
    async def good_items() -> AsyncIterator[Item]:
        async for it in _prepared(items, prepare, load_workers, prefetch):
            if it.error is not None:
                on_outcome(GenerationOutcome(it, None, it.error))
            else:
                yield it

    async for outcome in backend.run(good_items(), params):
        on_outcome(outcome)


def run_sync_batches(items: list[Item], prepare: Prepare, engine: RolloutEngine, params: SamplingParams,
                     on_outcome: Callable[[GenerationOutcome], None], batch_size: int = 8) -> None:
    """The vanilla loop (for comparison and for `--no-async`): load a fixed batch, generate it,
    wait for the whole batch, repeat."""
    for k in range(0, len(items), batch_size):
        chunk = items[k:k + batch_size]
        ready = []
        for it in chunk:
            start = time.perf_counter()
            try:
                it.prompt = prepare(it)
                ready.append(it)
            except Exception as e:  # noqa: BLE001
                it.error = f"load failed: {type(e).__name__}: {e}"
                on_outcome(GenerationOutcome(it, None, it.error))
            it.timing["load_s"] = time.perf_counter() - start
        if not ready:
            continue
        start = time.perf_counter()
        try:
            groups = engine.generate([it.prompt for it in ready], 1, params)
            outs = [GenerationOutcome(it, g[0], None) for it, g in zip(ready, groups)]
        except Exception as e:  # noqa: BLE001
            outs = [GenerationOutcome(it, None, f"generation failed: {type(e).__name__}: {e}") for it in ready]
        for o in outs:
            o.item.timing["generate_s"] = time.perf_counter() - start
            on_outcome(o)
