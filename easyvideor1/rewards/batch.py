"""Score many responses in a process pool with a per-sample timeout; metrics per problem_type.

Each sample is scored in a worker process (spawned: safe beside CUDA and threads). A worker
still busy after `timeout_s` is killed with its whole process group (the sandbox or Chromium
child it started goes too) and replaced; a scorer that raises, times out or kills its worker
yields a zero RewardResult whose `error` names the sample, is logged as a warning, and is
counted in the metrics (never a silent 0).

`ScoringPool` keeps its workers between calls (a trainer scores every step);
`score_batch` is the one-shot form, and `workers=0` scores in this process, with no timeout
beyond math-verify's own, for debugging. With an LLM judge configured, verdicts for all
open-ended samples are fetched first, concurrently, into the judge's disk cache; the workers
then read them from there.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import wait

from easyvideor1.records import RewardResult, Sample
from easyvideor1.rewards import open_ended
from easyvideor1.rewards.config import RewardConfig
from easyvideor1.rewards.dispatch import DEFAULT_CONFIG, canonical_type, score
from easyvideor1.rewards.judge import judge_many

log = logging.getLogger(__name__)
ScoreOutcome = tuple[RewardResult | None, str | None]  # (result, error message)


@dataclass
class TypeMetrics:
    """Means over the samples of one problem_type (errors count as zeros)."""

    count: int
    reward: float
    accuracy: float
    format: float
    errors: int


def sample_label(sample: Sample, index: int) -> str:
    """How logs and errors name a sample: its problem_id, else its position."""
    return repr(sample.problem_id) if sample.problem_id else f"#{index}"


def _worker(conn, cfg: RewardConfig, scratch: str) -> None:
    # Own process group, so a kill on timeout also takes the sandbox/Chromium child it started;
    # own temp dir, so what that child left behind is removed with it.
    os.setpgrp()
    tempfile.tempdir = scratch
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        index, response, sample = task
        try:
            conn.send((index, score(response, sample, cfg), None))
        except BaseException as e:  # noqa: BLE001 - every failure becomes a counted error
            conn.send((index, None, f"{type(e).__name__}: {e}"))


class _Slot:
    """One worker process and the task it is running."""

    def __init__(self, ctx, cfg: RewardConfig):
        self.conn, child = ctx.Pipe()
        self.scratch = tempfile.mkdtemp(prefix="ev1-score-")
        self.proc = ctx.Process(target=_worker, args=(child, cfg, self.scratch), daemon=True)
        self.proc.start()
        child.close()
        self.task: int | None = None
        self.started = 0.0

    def give(self, index: int, response: str, sample: Sample) -> None:
        self.task, self.started = index, time.monotonic()
        self.conn.send((index, response, sample))

    def stop(self, kill: bool = False) -> None:
        if kill:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        else:
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()
        shutil.rmtree(self.scratch, ignore_errors=True)


class ScoringPool:
    """Worker processes that score (response, sample) pairs with a per-sample timeout.

    >>> with ScoringPool(workers=2, timeout_s=30) as pool:  # doctest: +SKIP
    ...     results = pool.score(responses, samples)
    """

    def __init__(
        self, cfg: RewardConfig | None = None, workers: int | None = None, timeout_s: float = 60.0
    ):
        self.cfg = cfg or DEFAULT_CONFIG
        self.timeout_s = timeout_s
        self._ctx = multiprocessing.get_context("spawn")
        count = min(8, os.cpu_count() or 1) if workers is None else workers
        if count < 1:
            raise ValueError(
                "ScoringPool needs workers >= 1 (use score_batch(workers=0) to score in-process)"
            )
        self._slots = [_Slot(self._ctx, self.cfg) for _ in range(count)]

    def __enter__(self) -> ScoringPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers (killing any still busy)."""
        for slot in self._slots:
            slot.stop(kill=slot.task is not None)
        self._slots = []

    def score(self, responses: list[str], samples: list[Sample]) -> list[RewardResult]:
        """RewardResults in order; see `score_batch` for the checks and the error contract."""
        _check(responses, samples, self.cfg)
        return _finish(self._run(responses, samples), samples)

    def _replace(self, k: int) -> _Slot:
        self._slots[k].stop(kill=True)
        self._slots[k] = _Slot(self._ctx, self.cfg)
        return self._slots[k]

    def _run(self, responses: list[str], samples: list[Sample]) -> list[ScoreOutcome]:
        out: list[ScoreOutcome] = [(None, None)] * len(samples)
        pending = list(range(len(samples)))[::-1]
        for slot in self._slots:
            if pending:
                i = pending.pop()
                slot.give(i, responses[i], samples[i])
        while any(slot.task is not None for slot in self._slots):
            busy = [s for s in self._slots if s.task is not None]
            deadline = min(s.started for s in busy) + self.timeout_s
            ready = wait([s.conn for s in busy], timeout=max(0.0, deadline - time.monotonic()))
            for k, slot in enumerate(self._slots):
                if slot.task is None:
                    continue
                if slot.conn in ready:
                    try:
                        index, result, error = slot.conn.recv()
                    except (EOFError, OSError):
                        index, result = slot.task, None
                        error = f"scorer process died (exit code {slot.proc.exitcode})"
                        slot = self._replace(k)
                    out[index] = (result, error)
                elif time.monotonic() - slot.started >= self.timeout_s:
                    out[slot.task] = (
                        None,
                        f"TimeoutError: scoring took longer than {self.timeout_s} s",
                    )
                    slot = self._replace(k)
                else:
                    continue
                slot.task = None
                if pending:
                    i = pending.pop()
                    slot.give(i, responses[i], samples[i])
        return out


def _check(responses: list[str], samples: list[Sample], cfg: RewardConfig) -> None:
    """Fail fast on a length mismatch or an unknown problem_type; prefetch judge verdicts."""
    if len(responses) != len(samples):
        raise ValueError(f"{len(responses)} responses for {len(samples)} samples")
    for i, sample in enumerate(samples):
        try:
            canonical_type(sample.problem_type)
        except ValueError as e:
            raise ValueError(f"sample {sample_label(sample, i)}: {e}") from None
    if cfg.judge is not None:
        _prefetch_judge(responses, samples, cfg)


def _prefetch_judge(responses: list[str], samples: list[Sample], cfg: RewardConfig) -> None:
    items = [
        open_ended.judge_item(r, s)
        for r, s in zip(responses, samples)
        if canonical_type(s.problem_type) == "open-ended"
    ]
    items = [item for item in items if item is not None]
    if items:
        failed = sum(isinstance(v, Exception) for v in judge_many(cfg.judge, items))
        if failed:
            log.warning(
                "judge prefetch: %d of %d verdicts failed; their samples ask again",
                failed,
                len(items),
            )


def _finish(outcomes: list[ScoreOutcome], samples: list[Sample]) -> list[RewardResult]:
    results = []
    for i, (result, error) in enumerate(outcomes):
        if error is not None or result is None:
            message = f"sample {sample_label(samples[i], i)} ({samples[i].problem_type}): {error}"
            log.warning("reward error: %s", message)
            result = RewardResult(overall=0.0, accuracy=0.0, format=0.0, parts={}, error=message)
        results.append(result)
    return results


def score_batch(
    responses: list[str],
    samples: list[Sample],
    cfg: RewardConfig | None = None,
    workers: int | None = None,
    timeout_s: float = 60.0,
) -> list[RewardResult]:
    """RewardResults for `responses[i]` against `samples[i]`, in order (see module docstring).

    `workers=None` uses min(8, CPU count) processes, 0 scores in this process. An unknown
    problem_type anywhere is raised at once (ValueError naming the sample and listing known
    types), before any scoring; everything else becomes a per-sample error result.
    """
    cfg = cfg or DEFAULT_CONFIG
    if workers is not None and workers <= 0:
        _check(responses, samples, cfg)
        outcomes: list[ScoreOutcome] = []
        for response, sample in zip(responses, samples):
            try:
                outcomes.append((score(response, sample, cfg), None))
            except Exception as e:  # noqa: BLE001 - every failure becomes a counted error
                outcomes.append((None, f"{type(e).__name__}: {e}"))
        return _finish(outcomes, samples)
    workers = min(8, os.cpu_count() or 1) if workers is None else workers
    workers = min(workers, max(1, len(samples)))
    _check(responses, samples, cfg)  # before spawning anything
    with ScoringPool(cfg, workers, timeout_s) as pool:
        return _finish(pool._run(responses, samples), samples)


def metrics_by_type(results: list[RewardResult], samples: list[Sample]) -> dict[str, TypeMetrics]:
    """Mean reward / accuracy / format and error count per problem_type, plus "all"."""
    groups: dict[str, list[RewardResult]] = {}
    for result, sample in zip(results, samples):
        groups.setdefault(sample.problem_type, []).append(result)
    groups = dict(sorted(groups.items()))
    if results:
        groups["all"] = list(results)
    return {
        name: TypeMetrics(
            count=len(rs),
            reward=sum(r.overall for r in rs) / len(rs),
            accuracy=sum(r.accuracy for r in rs) / len(rs),
            format=sum(r.format for r in rs) / len(rs),
            errors=sum(r.error is not None for r in rs),
        )
        for name, rs in groups.items()
    }
