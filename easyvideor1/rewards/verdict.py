"""What a task family returns to the dispatcher before weighting: accuracy and answer validity."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Verdict:
    """One family's judgement of one response.

    `valid` says whether the content of the `<answer>` tag has the shape the task asks for
    (a letter, a number, JSON of the right shape...); the format reward uses it. It is False
    when there is no `<answer>` tag.
    """

    accuracy: float
    valid: bool
    parts: dict[str, float] = field(default_factory=dict)
