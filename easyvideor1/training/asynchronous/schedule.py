"""Which weights generate which batch under separate placement: fixed by the steps, never the
timing (the package's docstring says why), so both sides know in advance which versions travel."""

from __future__ import annotations


def weight_version(step: int, k: int, every: int, start: int = 0) -> int:
    """The weights (after which step) batch `step` is generated with: step - 1 - k, but never
    older than the last checkpoint step before `step` (`every` = checkpoint.every) nor `start`."""
    last_checkpoint = (step - 1) // every * every if every else 0
    return max(step - 1 - k, last_checkpoint, start)


def broadcast_versions(start: int, steps: int, k: int, every: int, partial: bool = False) -> list[int]:
    """The versions sent after the initial one (`start`), in order: each needed by some batch. With
    partial rollouts (`rollout.partial`) every step's: batch s continues with those of step s - 1."""
    return sorted({weight_version(s, 0 if partial else k, every, start) for s in range(start + 1, steps + 1)}
                  - {start})


def switch_versions(step: int, version: int) -> list[int]:
    """Partial rollouts: the versions batch `step`, begun with `version`, switches to as it
    generates (every `rollout.partial_tokens` decode steps), oldest first: each one after `version`
    up to step - 1, the freshest weights a batch trained at step `step` can come from."""
    return list(range(version + 1, step))
