"""Samples skipped at run time, counted over the whole run, and the stop past
`data.max_skip_fraction`.

A sample whose media cannot be read or whose prompt runs over `data.max_prompt_tokens` is
skipped where its prompt is built (`prompts.PromptBuilder.build_many`; its slot is padded). The
rollout stage reduces each step's counts over the data-parallel ranks and gathers the first
reasons (`trainer.rollout_stage`, or the rollout side's under separate placement, whose batch
brings them), so every trainer rank adds the same numbers here and takes the same decision.
The counts are trainer state: a resumed run goes on counting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from easyvideor1.errors import UserError

SHOWN = 5  # reasons kept (and named when the run stops)


class TooManySkipped(UserError):
    """More of the samples tried were skipped than `data.max_skip_fraction` allows."""


@dataclass
class SkipLedger:
    """The run's skipped and tried samples so far (every rank alike), and the first reasons."""

    tried: int = 0
    skipped: int = 0
    first: list[tuple[str, str]] = field(default_factory=list)
    """(sample id, why) of the first skipped samples, at most `SHOWN`, each id once."""

    def count(self, tried: float, skipped: float, reasons: list[tuple[str, str]],
              max_fraction: float) -> dict[str, float]:
        """Add a step's global counts and reasons; its metrics, or `TooManySkipped` when the
        run's skipped fraction passes `max_fraction`."""
        self.tried += int(tried)
        self.skipped += int(skipped)
        known = {sid for sid, _ in self.first}
        for sid, why in reasons:
            if len(self.first) < SHOWN and sid not in known:
                self.first.append((sid, why.removeprefix(f"sample {sid!r}: ")))
                known.add(sid)
        if self.fraction > max_fraction:
            raise TooManySkipped(self.message(max_fraction))
        return {"data/skipped_total": float(self.skipped), "data/skipped_fraction": self.fraction}

    @property
    def fraction(self) -> float:
        return self.skipped / self.tried if self.tried else 0.0

    def message(self, max_fraction: float) -> str:
        shown = "; ".join(f"{sid!r}: {why}" for sid, why in self.first)
        return (f"{self.skipped} of the {self.tried} samples tried so far were skipped ({self.fraction:.1%}, over "
                f"data.max_skip_fraction={max_fraction:g}); the first: {shown}. Fix or drop those samples "
                f"(`easyvideor1 check-data FILE` lists the bad records), or raise data.max_skip_fraction "
                f"(1: never stop)")

    def state_dict(self) -> dict[str, Any]:
        return {"tried": self.tried, "skipped": self.skipped, "first": [list(x) for x in self.first]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tried, self.skipped = int(state["tried"]), int(state["skipped"])
        self.first = [(str(sid), str(why)) for sid, why in state["first"]]
