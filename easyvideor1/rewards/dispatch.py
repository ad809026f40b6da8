"""The reward dispatcher: route a sample to its task family by `problem_type`, weight, combine.

`TASK_FAMILIES` maps each canonical problem type to its scorer, a plain function
`fn(response: str, sample: Sample, cfg: RewardConfig) -> Verdict`. `ALIASES` maps the other
names users' data already uses to a canonical type. Lookup ignores case and treats "-", "_"
and spaces alike ("Multiple-Choice" == "multiple choice"). An unknown type is an error that
lists the known ones (upstream silently scored it as open-ended). Add a family with `register`.
What each family reads as an answer, with an example record, is in `forms.ANSWER_FORMS`.

overall = accuracy_weight * accuracy + format_weight * format (0.9 / 0.1 by default).
"""

from __future__ import annotations

import re
from typing import Callable

from easyvideor1.records import RewardResult, Sample
from easyvideor1.rewards import (
    boolean,
    caption_mc,
    html_code,
    math_answer,
    multiple_choice,
    numerical,
    ocr,
    open_ended,
    preference,
    python_code,
    regression,
    spatial_grounding,
    spatiotemporal_grounding,
    svg_code,
    temporal_grounding,
    tracking,
)
from easyvideor1.rewards.config import RewardConfig
from easyvideor1.rewards.format import answer_content, format_score
from easyvideor1.rewards.forms import ANSWER_FORMS, AnswerForm
from easyvideor1.rewards.verdict import Verdict

Scorer = Callable[[str, Sample, RewardConfig], Verdict]
DEFAULT_CONFIG = RewardConfig()


def _key(name: str) -> str:
    return " ".join(re.sub(r"[-_]", " ", str(name).lower()).split())


def canonical_type(problem_type: str) -> str:
    """The canonical family name of a problem type (alias resolved); ValueError if unknown."""
    key = _key(problem_type)
    for name in TASK_FAMILIES:
        if _key(name) == key:
            return name
    for alias, name in ALIASES.items():
        if _key(alias) == key:
            return name
    known = sorted({*TASK_FAMILIES, *ALIASES})
    raise ValueError(
        f"unknown problem_type {problem_type!r}; known types: {', '.join(known)}. "
        "Fix the data, or add a family with easyvideor1.rewards.register(name, fn)."
    )


def scorer_for(problem_type: str) -> Scorer:
    """The scorer function of a problem type (ValueError listing known types if unknown)."""
    return TASK_FAMILIES[canonical_type(problem_type)]


def register(name: str, fn: Scorer, aliases: tuple[str, ...] = (), form: AnswerForm | None = None) -> None:
    """Add (or replace) a family: `fn(response, sample, cfg) -> Verdict`, under `name` and `aliases`;
    `form` says what answers it reads (the data-format page lists it)."""
    TASK_FAMILIES[name] = fn
    if form is not None:
        ANSWER_FORMS[name] = form
    for alias in aliases:
        ALIASES[alias] = name


def score(response: str, sample: Sample, cfg: RewardConfig | None = None) -> RewardResult:
    """Score one response against its sample.

    Raises ValueError for an unknown `problem_type` or an unreadable ground truth, and
    TimeoutError when a bounded scorer (math) runs out of time; `batch.score_batch` turns
    those into counted, logged per-sample errors.

    >>> from easyvideor1.records import Sample
    >>> s = Sample(problem="How many?", answer="<answer>3</answer>", problem_type="numerical")
    >>> r = score("<think>I count three.</think><answer>3</answer>", s)
    >>> (r.overall, r.accuracy, r.format)
    (1.0, 1.0, 1.0)
    """
    cfg = cfg or DEFAULT_CONFIG
    verdict = scorer_for(sample.problem_type)(response, sample, cfg)
    accuracy = min(1.0, max(0.0, float(verdict.accuracy)))
    if cfg.require_answer_tag and answer_content(response) is None:
        accuracy = 0.0
    fmt = format_score(response, verdict.valid, cfg.think)
    overall = min(1.0, max(0.0, cfg.accuracy_weight * accuracy + cfg.format_weight * fmt))
    parts = {k: min(1.0, max(0.0, float(v))) for k, v in verdict.parts.items()}
    return RewardResult(overall=overall, accuracy=accuracy, format=fmt, parts=parts)


TASK_FAMILIES: dict[str, Scorer] = {
    "multiple choice": multiple_choice.score,
    "numerical": numerical.score,
    "regression": regression.score,
    "temporal grounding": temporal_grounding.score,
    "spatial-temporal grounding": spatiotemporal_grounding.score,
    "spatial grounding": spatial_grounding.score,
    "tracking": tracking.score,
    "open-ended": open_ended.score,
    "caption-mc": caption_mc.score,
    "math": math_answer.score,
    "ocr": ocr.score,
    "boolean": boolean.score,
    "code": python_code.score,
    "svg-code": svg_code.score,
    "html-code": html_code.score,
    "preference": preference.score,
}

ALIASES: dict[str, str] = {
    "mc": "multiple choice",
    "multiple-choice": "multiple choice",
    "spatiotemporal grounding": "spatial-temporal grounding",
    "stvg": "spatial-temporal grounding",
    "video qa": "open-ended",
    "video description": "open-ended",
    "free-form": "open-ended",
    "caption": "open-ended",  # Video-MMLU's type
    "yes/no": "boolean",
    "python": "code",
    "llava": "preference",
    "critic": "preference",
}
