"""The threading policy every command sets before torch is imported (`cli.main`).

- `OMP_WAIT_POLICY=PASSIVE`: an OpenMP thread that waits sleeps instead of spinning, so a
  command beside other work does not burn a core per idle thread (a busy neighbour made an
  active-waiting demo step 2-3x slower).
- `OMP_NUM_THREADS` (torch's intra-op threads): the usable cores (CPU affinity) left after the
  command's own worker processes or loading threads, split among the local ranks under
  torchrun (`LOCAL_WORLD_SIZE`), at least 1. Decided from the core count only, never from the
  load, so one machine kind always runs with the same threads (and the same float sums). The
  demo runs one thread on every machine: its tiny model's ops are too small to split (a second
  thread made its step 1.8x slower, `benchmarks/demo_step.py`).

A value the user set in the environment is kept. No torch import here: it must run first.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from dataclasses import dataclass

HELP = ("Threads: every command sets OMP_WAIT_POLICY=PASSIVE and OMP_NUM_THREADS (torch's intra-op threads) "
        "to the usable cores left after its own worker processes or loading threads (cache --workers, "
        "score --workers, eval --load-workers, pass-rate and trajectories --load-workers + --score-workers), "
        "divided by the local ranks under torchrun, at least 1 (demo: exactly 1, its ops are too small to split), "
        "before torch is imported. Values already set in the environment are kept.")


@dataclass(frozen=True)
class ThreadPolicy:
    """What a command runs with."""

    wait_policy: str
    """OMP_WAIT_POLICY in effect."""
    intra_op_threads: int
    """OMP_NUM_THREADS in effect."""
    user_set: tuple[str, ...]
    """The variables the user had set (kept as they were)."""


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def intra_op_threads(cores: int, workers: int, local_ranks: int = 1) -> int:
    """Cores left after `workers` busy workers, shared by `local_ranks` processes; at least 1."""
    return max(1, (cores - max(0, workers)) // max(1, local_ranks))


def apply(workers: int = 0, environ: MutableMapping[str, str] = os.environ, most: int | None = None) -> ThreadPolicy:
    """Set the policy in `environ` (before torch is imported) where the user set nothing; `most`
    caps the intra-op threads (a command whose ops are too small to split)."""
    user_set = tuple(k for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS") if environ.get(k))
    environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if not environ.get("OMP_NUM_THREADS"):
        ranks = int(environ.get("LOCAL_WORLD_SIZE") or 1)
        threads = intra_op_threads(usable_cores(), workers, ranks)
        environ["OMP_NUM_THREADS"] = str(threads if most is None else max(1, min(most, threads)))
    first = environ["OMP_NUM_THREADS"].split(",")[0].strip()  # OpenMP also takes a nested list
    return ThreadPolicy(environ["OMP_WAIT_POLICY"], int(first) if first.isdigit() else 0, user_set)
