"""The prompt loader: seeded epoch permutations, a position that checkpoints exactly.

Every rank walks the same global order; `next_batch` returns the global batch of
`batch_size` samples and each rank takes its share of it (`training.rank_balance`; `rank_slice`
is the contiguous share), so 1 process and N processes see the same prompts in the same step
(the multi-process test relies on it).
"""

from __future__ import annotations

from typing import Any

import torch

from easyvideor1 import testhooks
from easyvideor1.records import Sample


class PromptLoader:
    def __init__(self, samples: list[Sample], batch_size: int, seed: int = 0, shuffle: bool = True):
        if not samples:
            raise ValueError("no training samples: check data.train_files (and the load report)")
        self.samples, self.batch_size, self.seed, self.shuffle = samples, batch_size, seed, shuffle
        self.epoch, self.index = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        if testhooks.armed("loader.set_order"):  # a planted bug, for tests only (testhooks)
            return testhooks.set_order([s.problem_id for s in self.samples])
        if not self.shuffle:
            return list(range(len(self.samples)))
        g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        return torch.randperm(len(self.samples), generator=g).tolist()

    def next_batch(self) -> list[Sample]:
        """The next `batch_size` samples, wrapping into a new (re-shuffled) epoch as needed."""
        out = []
        while len(out) < self.batch_size:
            if self.index >= len(self._order):
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            out.append(self.samples[self._order[self.index]])
            self.index += 1
        return out

    def peek_batch(self) -> list[Sample]:
        """The batch `next_batch` will return, without advancing."""
        state, order = self.state_dict(), self._order
        batch = self.next_batch()
        self.epoch, self.index, self._order = state["epoch"], state["index"], order
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.index = state["epoch"], state["index"]
        self._order = self._permutation(self.epoch)


def rank_slice(items: list, rank: int, world: int) -> list:
    """Rank `rank`'s contiguous share of `items` (len(items) must divide by `world`)."""
    if len(items) % world:
        raise ValueError(f"{len(items)} items cannot be split evenly over {world} ranks; make the "
                         "batch size a multiple of the number of processes")
    per = len(items) // world
    return items[rank * per:(rank + 1) * per]
