"""Plain multiple-choice benchmarks: accuracy, with the breakdowns their records carry.

All read the converted files EasyVideoR1 ships (`eval/data/valid_data/` of
github.com/cyuQ1n/EasyVideoR1), in the sample schema. Where the official breakdown needs a
field the converted file dropped, the closest field the file keeps is reported instead, and
the docstring of the label function says so.
"""

from __future__ import annotations

from easyvideor1.evaluation.adapters.base import Benchmark, extra_label, video_parts
from easyvideor1.records import Sample


def videomme_labels(sample: Sample) -> dict[str, str]:
    """Video-MME's official breakdowns: duration (short/medium/long), domain, task type."""
    keys = {"duration": "duration", "domain": "domain", "sub_category": "sub_category",
            "task_type": "task_type"}
    return {name: str(sample.extra[k]) for name, k in keys.items() if sample.extra.get(k) not in (None, "")}


def mmvu_labels(sample: Sample) -> dict[str, str]:
    """MMVU's discipline (the video's folder, e.g. videos/Chemistry/0.mp4) and question type."""
    parts = video_parts(sample)
    labels = {"question_type": sample.problem_type}
    if len(parts) >= 2:
        labels["discipline"] = parts[-2]
    return labels


def livesports_labels(sample: Sample) -> dict[str, str]:
    """LiveSports-3K QA's question type (Who/When/What) and whether it needs on-screen text."""
    labels = extra_label("q_type_livesports", "question_type")(sample)
    if "ocr_livesports" in sample.extra:
        labels["ocr"] = "ocr" if sample.extra["ocr_livesports"] else "no ocr"
    return labels


_CONVERTED = "converted file from github.com/cyuQ1n/EasyVideoR1 eval/data/valid_data"

VIDEOMME = Benchmark(
    name="videomme", title="Video-MME", files=("videomme.json",),
    source=f"{_CONVERTED}; breakdowns as github.com/MME-Benchmarks/Video-MME (duration, domain, task)",
    breakdowns=("duration", "domain", "task_type"), labels=videomme_labels)
MOTIONBENCH = Benchmark(
    name="motionbench", title="MotionBench", files=("motionbench.json",),
    source=f"{_CONVERTED}; categories from the record's original_question_type",
    breakdowns=("question_type",), labels=extra_label("original_question_type", "question_type"))
MMVU = Benchmark(name="mmvu", title="MMVU (multiple choice)", files=("mmvu.json", "mmvu-mc.json"),
                 source=_CONVERTED, breakdowns=("discipline",), labels=mmvu_labels)
MMVU_ALL = Benchmark(name="mmvu-all", title="MMVU (all)", files=("mmvu-all.json",),
                     source=f"{_CONVERTED}; open-ended questions scored by the open-ended scorer "
                            "(LLM judge when configured)",
                     breakdowns=("question_type", "discipline"), labels=mmvu_labels)
