"""Named points where a test can pause or kill a command (`EASYVIDEOR1_TEST_HOOK`).

The chaos and concurrency tests need to SIGKILL a run *inside* a checkpoint write or a results
flush, or hold one process inside a locked section while another arrives. Timing alone hits
such windows by luck; these points hit them by name. Unset (every real run), `hit` is a dict
lookup and returns.

    EASYVIDEOR1_TEST_HOOK="checkpoint.write:2:kill"    SIGKILL self at the 2nd pass
    EASYVIDEOR1_TEST_HOOK="cache.merge:1:sleep=2.5"    sleep 2.5 s at the 1st pass
    several, comma-separated

Points: `checkpoint.write` (model written, optimizer and state not yet, before the rename),
`results.flush` (a result row half written, not yet flushed whole), `cache.entry` (an entry's
temporary file written, before its rename), `cache.merge` (inside the cache folder's lock,
between reading and writing the manifest, then the failures). `trainer.logprobs` (armed, not
hit: `trainer.logprobs:1:save`) saves each step's behaviour, old and reference log-probs to the
run folder, so tests/training/test_async_training.py can show which weights generated a batch.
`partial.arrival` (the rollout side of `rollout.partial_tokens=0`, passed once per batch it
generates) places trainer rank 0's word that it sends the batch's next weights: `decode=N` N decode
steps into the batch (hidden before, waited for there: a switch at token N), `after` once the
batch's generation has ended (the next batch takes them first). `partial.arrival:2:after` holds
them back from this process's 2nd batch.

One point plants a bug instead: named (`loader.set_order:1:on`; count and action unread),
`loader.set_order` makes the prompt loader order the samples as a `set` of their ids iterates,
which depends on the interpreter's string-hash secret (PYTHONHASHSEED). Ranks or a resumed run
with secrets of their own then disagree on the data; tests/test_forkserver.py checks that the
tests can see it.
"""

from __future__ import annotations

import os
import signal
import sys
import time

ENV = "EASYVIDEOR1_TEST_HOOK"
_counts: dict[str, int] = {}


def armed(point: str) -> bool:
    """Whether the environment names `point` (to set up a window only a test needs)."""
    return f"{point}:" in os.environ.get(ENV, "")


def action(point: str) -> str | None:
    """Pass named point `point`: the action the environment names for this pass (None: none)."""
    spec = os.environ.get(ENV)
    if not spec:
        return None
    _counts[point] = _counts.get(point, 0) + 1
    for rule in spec.split(","):
        name, nth, act = rule.split(":", 2)
        if name == point and int(nth) == _counts[point]:
            return act
    return None


def hit(point: str) -> None:
    """Pass named point `point`: pause or die here if the environment asks for it."""
    act = action(point)
    if act == "kill":
        sys.stdout.flush(), sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    elif act is not None and act.startswith("sleep="):
        time.sleep(float(act.split("=", 1)[1]))


def set_order(keys: list[str]) -> list[int]:
    """The indices of `keys` in the order a `set` of them iterates (the planted `loader.set_order`
    bug): a different order under another string-hash secret."""
    first = {key: k for k, key in enumerate(set(keys))}
    return sorted(range(len(keys)), key=lambda i: first[keys[i]])
