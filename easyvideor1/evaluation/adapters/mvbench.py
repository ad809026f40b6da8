"""MVBench: 20 temporal tasks of up to 200 questions; the official score is the mean of the
task accuracies (github.com/OpenGVLab/Ask-Anything, video_chat2/MVBENCH.md).

Quirks of the converted file (EasyVideoR1's `mvbench.json`), handled without editing it:
- `answer` holds the option text and `solution` the letter: the loader takes `solution` as the
  ground truth and keeps the text as `extra["original_answer"]`;
- 788 records carry `start`/`end` clip bounds, which the loader maps to the segment to sample;
- the task name is not kept, but problem ids run in blocks of 200 per task in alphabetical
  task order (ids 1-200 action_antonym, 201-400 action_count, ...; the blocks of the two tasks
  whose videos are not distributed, episodic_reasoning and fine_grained_pose, are absent).
  The block gives the task; a record's own `task` / `task_type` field wins when it has one.
"""

from __future__ import annotations

from easyvideor1.evaluation.adapters.base import Benchmark
from easyvideor1.evaluation.aggregate import Aggregate, macro_estimands, macro_over
from easyvideor1.evaluation.results import ResultRow
from easyvideor1.records import Sample

MVBENCH_TASKS = (
    "action_antonym", "action_count", "action_localization", "action_prediction",
    "action_sequence", "character_order", "counterfactual_inference", "egocentric_navigation",
    "episodic_reasoning", "fine_grained_action", "fine_grained_pose", "moving_attribute",
    "moving_count", "moving_direction", "object_existence", "object_interaction",
    "object_shuffle", "scene_transition", "state_change", "unexpected_action",
)  # fmt: skip
BLOCK = 200  # questions per task in the official release


def mvbench_task(sample: Sample) -> str:
    """The record's task (own field, else its id block), or "unknown"."""
    for key in ("task", "task_type"):
        if sample.extra.get(key):
            return str(sample.extra[key])
    pid = str(sample.extra.get("original_problem_id", sample.problem_id))
    if pid.isdigit() and 1 <= int(pid) <= BLOCK * len(MVBENCH_TASKS):
        return MVBENCH_TASKS[(int(pid) - 1) // BLOCK]
    return "unknown"


def mvbench_labels(sample: Sample) -> dict[str, str]:
    """{"task": ...}."""
    return {"task": mvbench_task(sample)}


def mvbench_summary(name: str, rows: list[ResultRow]) -> Aggregate:
    """Mean of the per-task accuracies (micro mean kept as a metric)."""
    return macro_over(name, rows, "task")


MVBENCH = Benchmark(
    name="mvbench", title="MVBench", files=("mvbench.json",),
    source="converted file from github.com/cyuQ1n/EasyVideoR1; metric as OpenGVLab/Ask-Anything "
           "MVBench (mean of task accuracies)",
    breakdowns=("task",), labels=mvbench_labels, summarize=mvbench_summary,
    estimands=macro_estimands("task"))
