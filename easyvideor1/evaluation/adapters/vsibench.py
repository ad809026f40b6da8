"""VSI-Bench: multiple-choice accuracy + regression MRA, combined the official way.

Official combination (github.com/vision-x-nyu/thinking-in-space, lmms-eval `vsibench`
`aggregate_results`): a score per question type (accuracy for the 6 multiple-choice types,
MRA over thresholds 0.50..0.95 for the 4 numerical ones); the three relative-direction levels
(easy/medium/hard) are averaged into one `object_rel_direction`; the overall score is the
unweighted mean of the resulting 8 type scores. MC accuracy and MRA over all their questions
are reported too.

The converted file keeps the type in `original_question_type` and mixes `multiple choice` and
`regression` records (the latter scored by the reward library's MRA).
"""

from __future__ import annotations

from easyvideor1.evaluation.adapters.base import Benchmark, extra_label
from easyvideor1.evaluation.aggregate import Aggregate, by_label, failed_count, label_means, mean
from easyvideor1.evaluation.bootstrap import Estimand, macro
from easyvideor1.evaluation.results import ResultRow

DIRECTION_LEVELS = ("object_rel_direction_easy", "object_rel_direction_medium", "object_rel_direction_hard")


def vsibench_summary(name: str, rows: list[ResultRow]) -> Aggregate:
    """Official overall; per-type table; MC accuracy and MRA as metrics."""
    per_type = by_label(rows, "question_type")
    scores = {k: c.score for k, c in per_type.items()}
    if all(level in scores for level in DIRECTION_LEVELS):
        scores["object_rel_direction"] = mean(scores.pop(level) for level in DIRECTION_LEVELS)
    metrics = {
        "mc_accuracy": mean(r.score for r in rows if r.problem_type.lower() == "multiple choice"),
        "mra": mean(r.score for r in rows if r.problem_type.lower() == "regression"),
        "micro": mean(r.score for r in rows),
    }
    return Aggregate(benchmark=name, metric="mean of question-type scores (official)",
                     overall=mean(scores.values()), count=len(rows), failed=failed_count(rows),
                     metrics=metrics, categories={"question_type": per_type})


def vsibench_estimands(rows: list[ResultRow]) -> dict[str, Estimand]:
    """Overall = mean of the type means, the three direction levels first averaged into one."""
    types = label_means(rows, "question_type")
    if all(level in types for level in DIRECTION_LEVELS):
        types["object_rel_direction"] = macro({level: types.pop(level) for level in DIRECTION_LEVELS})
    return {"overall": macro(types)}


VSIBENCH = Benchmark(
    name="vsibench", title="VSI-Bench", files=("vsibench.json",),
    source="converted file from github.com/cyuQ1n/EasyVideoR1; combination as "
           "vision-x-nyu/thinking-in-space",
    breakdowns=("question_type",), labels=extra_label("original_question_type", "question_type"),
    summarize=vsibench_summary, estimands=vsibench_estimands)
