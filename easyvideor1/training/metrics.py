"""A step's bookkeeping: stage timers, numbers combined over ranks, and the metrics sink
(console line, JSONL file, TensorBoard / W&B when enabled).

The only module that imports tensorboard or wandb (lazily, when enabled).
"""

from __future__ import annotations

import json
import math
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from easyvideor1 import distributed


class StageTimer:
    """Seconds per stage of a step, as `time/<stage>` (a stage timed twice adds up)."""

    def __init__(self):
        self.times: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def add(self, name: str, seconds: float) -> None:
        self.times[f"time/{name}"] = self.times.get(f"time/{name}", 0.0) + seconds


class StepMetrics:
    """One step's numbers: `glob` ones are already over every rank (the same on each), `local`
    ones are this rank's and get averaged over the ranks by `finish`."""

    def __init__(self):
        self.timer = StageTimer()
        self.glob: dict[str, float] = {}
        self.local: dict[str, float] = {}

    def finish(self, tokens: int, world: int) -> dict[str, float]:
        """All numbers of the step: timers, step time and throughput (all ranks' tokens) included."""
        step_time = sum(self.timer.times.values())
        local = {**self.local, **self.timer.times, "time/step": step_time,
                 "perf/tokens_per_s": tokens / max(step_time, 1e-9)}
        out = {**self.glob, **mean_over_ranks(local)}
        out["perf/tokens_per_s"] *= world  # every rank processed its share in that time
        return out


class MetricsSink:
    """Writes one record per step to `<out_dir>/metrics.jsonl` and to the enabled backends.

    A JSONL row is `step`, `timestamp` (Unix seconds when written), then the metrics: among
    them `time/step` (the sum of the stage timers) and `time/wall` (wall clock since the
    previous row, see `trainer.train`)."""

    def __init__(self, out_dir: str | Path, tensorboard: bool = False, wandb: bool = False,
                 wandb_project: str = "easyvideor1", config: dict[str, Any] | None = None,
                 enabled: bool = True):
        self.enabled = enabled
        self.path = Path(out_dir) / "metrics.jsonl"
        self._tb = self._wandb = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise RuntimeError("logging.tensorboard=true needs `pip install tensorboard`") from e
            self._tb = SummaryWriter(str(Path(out_dir) / "tensorboard"))
        if wandb:
            try:
                import wandb as wandb_mod
            except ImportError as e:
                raise RuntimeError("logging.wandb=true needs `pip install wandb`") from e
            self._wandb = wandb_mod.init(project=wandb_project, config=config, dir=str(out_dir))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        clean = {k: (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
                 for k, v in metrics.items()}
        # Unix time of the row: to line runs up with other tools' logs (TensorBoard and W&B keep their own)
        row = {"step": step, "timestamp": round(time.time(), 3), **clean}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row, allow_nan=True) + "\n")
        numeric = {k: v for k, v in clean.items() if isinstance(v, float) and math.isfinite(v)}
        if self._tb is not None:
            for k, v in numeric.items():
                self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def gather_values(values: dict[str, list[float]], group=None) -> dict[str, list[float]]:
    """Every data-parallel rank's value lists, concatenated per key (identity in one process);
    `group`: the data-parallel ranks when not the whole world (sequence parallelism)."""
    merged: dict[str, list[float]] = {}
    for part in distributed.all_gather_objects(dict(values), group):
        for k, v in part.items():
            merged.setdefault(k, []).extend(v)
    return merged


def mean_over_ranks(metrics: dict[str, float]) -> dict[str, float]:
    """Each scalar averaged over the data-parallel ranks (identity in one process)."""
    parts = distributed.all_gather_objects(metrics)
    keys = sorted({k for p in parts for k in p})
    return {k: sum(p[k] for p in parts if k in p) / sum(1 for p in parts if k in p) for k in keys}


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl file (a resumed run's repeated steps: the last wins)."""
    rows: dict[int, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                rows[row["step"]] = row
    return [rows[k] for k in sorted(rows)]


def console_line(metrics: dict[str, Any], keys: tuple[str, ...]) -> str:
    """`name=value` pairs for the progress bar: "reward/all" shows as reward, "time/step" as step."""
    parts = []
    for k in keys:
        value = metrics.get(k)
        if isinstance(value, (int, float)):
            section, _, name = k.rpartition("/")
            parts.append(f"{section if name == 'all' else name}={value:.3g}")
    return "  ".join(parts)


def skipped_note(metrics: dict[str, Any]) -> str:
    """The run's skipped samples for the progress bar ("  skipped=3 (1.2%)"), once there are any."""
    skipped = metrics.get("data/skipped_total")
    if not skipped:
        return ""
    return f"  skipped={skipped:.0f} ({metrics.get('data/skipped_fraction', 0.0):.1%})"
