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

Departure: the official forward score of a question is computed over all its test points
together; here each test point is a question, so a task's score is the mean over test points.
"""

from __future__ import annotations

from pathlib import Path

from easyvideor1.evaluation.adapters.base import Benchmark, with_extra
from easyvideor1.evaluation.aggregate import (
    Aggregate,
    CategoryScore,
    by_label,
    failed_count,
    mean,
)
from easyvideor1.evaluation.results import ResultRow
from easyvideor1.records import Sample

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


def ovo_labels(sample: Sample) -> dict[str, str]:
    """{"task": EPM.., "mode": backward|realtime|forward}."""
    task = str(sample.extra.get("ovo_task", ""))
    mode = str(sample.extra.get("ovo_category", ""))
    if not mode:
        mode = next((m for m, tasks in MODES.items() if task in tasks), "")
    return {k: v for k, v in (("task", task), ("mode", mode)) if v}


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
    return Aggregate(benchmark=name, metric="mean of backward/realtime/forward averages",
                     overall=mean(c.score for c in modes.values()), count=len(rows),
                     failed=failed_count(rows), metrics={"micro": mean(r.score for r in rows)},
                     categories={"mode": modes, "task": tasks})


OVOBENCH = Benchmark(
    name="ovobench", title="OVO-Bench", files=("ovobench.json",),
    source="converted file from github.com/cyuQ1n/EasyVideoR1; scoring as JoeLeelyf/OVO-Bench",
    breakdowns=("mode", "task"), labels=ovo_labels, prepare=ovo_prepare, summarize=ovo_summary)
