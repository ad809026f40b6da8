"""Task-aware rewards: `score(response, sample) -> RewardResult`, routed by `problem_type`.

Import-light on purpose (no torch; rouge-score, math-verify, jiwer, cairosvg, numpy and httpx
are imported inside the families that need them, on first use).
"""

from easyvideor1.rewards.config import RewardConfig
from easyvideor1.rewards.dispatch import (
    ALIASES,
    TASK_FAMILIES,
    canonical_type,
    register,
    score,
)
from easyvideor1.rewards.forms import ANSWER_FORMS, AnswerForm
from easyvideor1.rewards.judge import JudgeConfig
from easyvideor1.rewards.verdict import Verdict

__all__ = [
    "ALIASES",
    "ANSWER_FORMS",
    "AnswerForm",
    "JudgeConfig",
    "RewardConfig",
    "TASK_FAMILIES",
    "Verdict",
    "canonical_type",
    "register",
    "score",
]
