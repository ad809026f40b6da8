"""OVO-Bench: 12 online-video tasks in three modes, reported per task with macro averages.

Official layout (github.com/JoeLeelyf/OVO-Bench, `utils/OVOBenchScore.py`; table layout as in
lmms-eval `tasks/ovobench/README.md`): Backward = mean(EPM, ASI, HLD), Real-time =
mean(OCR, ACR, ATR, STU, FPD, OJR), Forward = mean(REC, SSR, CRR), each task's score the
accuracy over its questions; Overall = mean of the three mode averages.

The converted file (EasyVideoR1 `ovobench.json`) has one record per question, and for the
forward tasks one record per test point (`ovo_test_idx`, each a video chunk ending at that
point). Its `problem_type` is the task name for the forward tasks, which are not multiple
choice; they are scored as:
- REC (repetition counting, answer "1", "2", ...) -> `numerical` (exact integer);
- SSR (is this step happening now?) and CRR (is there enough to answer yet?) -> `boolean`
  (answers Yes/No).
Their question text is wrapped in the instructions of OVO-Bench's forward-active prompts
(paraphrased from the paper's appendix), since the bare text ("pull up the hair ...") does
not say what to decide. The original type and text stay in `extra`.

Forward scoring follows the official offline scorer (`utils/OVOBenchScore.py`,
`OVOBenchOfflineScore.calculate_score_forward`, read 2026-11 at commit c34093f): every test
point of every question is scored on its own and a task's accuracy is the mean over all test
points of the task (test points are pooled, not averaged per question first), which is what a
mean over the converted file's test-point records gives. The per-test-point rule is the
official one, applied to the answer (`rewards.format.answer_text`: the `<answer>` content, else
what follows `</think>`, else the whole response):
- REC: all digit runs of the answer joined (`"".join(re.findall(r"\d+", answer))`) must equal
  the count, so "3 times" is right and "3 or 4" wrong;
- SSR / CRR: the answer is exactly "Y"/"N" for Yes/No, or the ground truth ("Yes" / "No",
  case-sensitive) occurs in it.
The per-question view (mean over questions of their test-point means) is reported as the
extra metric `forward_per_question`; it is not an official number.
"""

from __future__ import annotations

import re
from pathlib import Path

from easyvideor1.evaluation.adapters.base import Benchmark, with_extra
from easyvideor1.evaluation.aggregate import (
    Aggregate,
    CategoryScore,
    by_label,
    failed_count,
    label_means,
    mean,
)
from easyvideor1.evaluation.bootstrap import Estimand, macro
from easyvideor1.evaluation.results import ResultRow
from easyvideor1.records import Sample
from easyvideor1.rewards.format import answer_text

MODES = {
    "backward": ("EPM", "ASI", "HLD"),
    "realtime": ("OCR", "ACR", "ATR", "STU", "FPD", "OJR"),
    "forward": ("REC", "SSR", "CRR"),
}
FORWARD_TYPES = {"REC": "numerical", "SSR": "boolean", "CRR": "boolean"}
FORWARD_PROMPTS = {
    "REC": ("You're watching a video in which people may perform a certain type of action "
            "repetitively. The people performing this action are referred to as 'they' in the "
            "question. Count how many times the action has been performed so far; one complete "
            "motion counts as one.\n{q}"),
    "SSR": ("You're watching a tutorial video which contains a sequence of steps. The following "
            "is one step of the procedure:\n{q}\nIs the person in the video currently carrying "
            "out this step? Answer Yes or No."),
    "CRR": ("The following question is about the latest frames, i.e. the end of the video:\n{q}\n"
            "Does the visual content so far, especially the latest frames, give enough "
            "information to answer it? Answer Yes or No."),
}


def ovo_prepare(sample: Sample, data_root: Path) -> Sample:
    """Map the forward tasks to the scorer that fits and wrap their instructions."""
    task = str(sample.extra.get("ovo_task", sample.problem_type))
    if task not in FORWARD_TYPES or sample.problem_type.lower() == FORWARD_TYPES[task]:
        return sample
    return with_extra(sample, problem_type=FORWARD_TYPES[task],
                      problem=FORWARD_PROMPTS[task].format(q=sample.problem))


def ovo_official_score(response: str, sample: Sample) -> float:
    """The official per-test-point rule of a forward task (see the module docstring).

    >>> s = Sample(problem="q", answer="3", problem_type="numerical", extra={"ovo_task": "REC"})
    >>> ovo_official_score("<answer>3 times</answer>", s), ovo_official_score("3 or 4", s)
    (1.0, 0.0)
    """
    task = str(sample.extra.get("ovo_task", ""))
    answer = answer_text(response)
    truth = answer_text(sample.answer).strip()
    if task == "REC":
        return float("".join(re.findall(r"\d+", answer)) == truth)
    if task in ("SSR", "CRR"):
        stripped = answer.strip()
        if (stripped == "N" and truth == "No") or (stripped == "Y" and truth == "Yes"):
            return 1.0
        return float(truth in answer)
    raise KeyError(task)


def ovo_score(response: str, sample: Sample) -> float | None:
    """`ovo_official_score` for forward test points, None (the scorer's accuracy) otherwise."""
    return ovo_official_score(response, sample) if sample.extra.get("ovo_task") in FORWARD_TYPES else None


def ovo_labels(sample: Sample) -> dict[str, str]:
    """{"task": EPM.., "mode": backward|realtime|forward}."""
    task = str(sample.extra.get("ovo_task", ""))
    mode = str(sample.extra.get("ovo_category", ""))
    if not mode:
        mode = next((m for m, tasks in MODES.items() if task in tasks), "")
    labels = {k: v for k, v in (("task", task), ("mode", mode)) if v}
    if task in FORWARD_TYPES and sample.extra.get("ovo_id") not in (None, ""):
        labels["question"] = f"{task}/{sample.extra['ovo_id']}"
    return labels


def ovo_summary(name: str, rows: list[ResultRow]) -> Aggregate:
    """Per-task accuracy; mode = mean of its tasks; overall = mean of the modes present."""
    tasks = by_label(rows, "task")
    modes: dict[str, CategoryScore] = {}
    for mode, names in MODES.items():
        present = [tasks[t] for t in names if t in tasks]
        if present:
            modes[mode] = CategoryScore(score=mean(c.score for c in present),
                                        count=sum(c.count for c in present),
                                        failed=sum(c.failed for c in present))
    metrics = {"micro": mean(r.score for r in rows)}
    per_question = by_label(rows, "question")
    if per_question:
        metrics["forward_per_question"] = mean(c.score for c in per_question.values())
    return Aggregate(benchmark=name, metric="mean of backward/realtime/forward averages",
                     overall=mean(c.score for c in modes.values()), count=len(rows),
                     failed=failed_count(rows), metrics=metrics,
                     categories={"mode": modes, "task": tasks})


def ovo_estimands(rows: list[ResultRow]) -> dict[str, Estimand]:
    """Mode = mean of its task means; overall = mean of the modes (as `ovo_summary`)."""
    tasks = label_means(rows, "task")
    modes = {mode: macro({t: tasks[t] for t in names if t in tasks}) for mode, names in MODES.items()
             if any(t in tasks for t in names)}
    return {"overall": macro(modes), **{f"mode={m}": e for m, e in modes.items()}}


OVOBENCH = Benchmark(
    name="ovobench", title="OVO-Bench", files=("ovobench.json",),
    source="converted file from github.com/cyuQ1n/EasyVideoR1; scoring as JoeLeelyf/OVO-Bench",
    breakdowns=("mode", "task"), labels=ovo_labels, prepare=ovo_prepare, summarize=ovo_summary,
    estimands=ovo_estimands,
    official_score=ovo_score)
