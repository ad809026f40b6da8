"""Reward settings: weights, the format rule, and per-family knobs, in one dataclass.

Every field has a default that matches the paper (0.9 accuracy + 0.1 format); the other knobs
exist where upstream hard-coded a value that users' data disagrees with.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from easyvideor1.rewards.judge import JudgeConfig

THINK_MODES = ("required", "optional")


@dataclass(frozen=True)
class RewardConfig:
    """How a response is scored. `overall = accuracy_weight * accuracy + format_weight * format`."""

    accuracy_weight: float = 0.9
    """Weight of task accuracy in `overall`."""
    format_weight: float = 0.1
    """Weight of the format reward in `overall` (weights must be >= 0 and sum to <= 1)."""
    think: str = "required"
    """`required`: format needs `<think>...</think>` before `<answer>`; `optional`: it may be absent."""
    require_answer_tag: bool = False
    """True: no `<answer>` tag means accuracy 0 (strict training); False: read untagged answers too."""
    numerical_rel_tol: float = 0.01
    """Relative tolerance for non-integer numerical answers (integers must match exactly)."""
    mra_thresholds: tuple[float, ...] = (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
    """Confidence thresholds of regression's mean relative accuracy (VSI-Bench paper's set)."""
    math_timeout_s: int = 5
    """math-verify parse/compare limit in seconds (SIGALRM: only enforced in the main thread)."""
    code_timeout_s: float = 10.0
    """Wall-clock limit for one sandboxed Python run (response plus all its tests)."""
    code_memory_mb: int = 1024
    """Address-space limit of the sandboxed Python process."""
    svg_render_px: int = 128
    """Both SVGs are rendered to a square of this many pixels before comparison."""
    svg_max_chars: int = 200_000
    """A longer SVG response is treated as invalid (not rendered)."""
    html_window: tuple[int, int] = (640, 480)
    """Chromium window (width, height) used for both HTML screenshots."""
    html_timeout_s: float = 30.0
    """Limit for one headless Chromium screenshot."""
    chromium: str | None = None
    """Chromium executable; None looks up `chromium`, `chromium-browser`, `google-chrome` on PATH."""
    judge: JudgeConfig | None = None
    """LLM-as-judge for open-ended answers; None scores them with ROUGE."""
    extra: dict = field(default_factory=dict, hash=False, compare=False)
    """Free-form settings for user-registered families."""

    def __post_init__(self) -> None:
        if self.accuracy_weight < 0 or self.format_weight < 0:
            raise ValueError("reward weights must be >= 0")
        if self.accuracy_weight + self.format_weight > 1 + 1e-9:
            raise ValueError(
                f"accuracy_weight + format_weight = {self.accuracy_weight + self.format_weight} "
                "> 1: overall would leave [0, 1]; lower one of them"
            )
        if self.think not in THINK_MODES:
            raise ValueError(f"think={self.think!r}: choose one of {THINK_MODES}")
        if not self.numerical_rel_tol >= 0:
            raise ValueError("numerical_rel_tol must be >= 0")
        if not self.mra_thresholds or not all(0 <= t < 1 for t in self.mra_thresholds):
            raise ValueError("mra_thresholds must be a non-empty tuple of values in [0, 1)")
