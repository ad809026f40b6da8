"""Reasoning benchmarks with open-ended answers: VCR-Bench and VideoReasonBench.

Both are scored with an LLM judge in their papers. The `open-ended` scorer of the reward
library uses the judge when its `RewardConfig.judge` is set (pass such a scorer as `score_fn`);
without one it falls back to ROUGE, which is not comparable with published numbers: the
aggregate then names its metric "ROUGE" and carries a note saying so (`judge_or_rouge`).

- VCR-Bench (github.com/zhishuifeiqian/VCR-Bench): 1,034 questions, about half multiple
  choice; breakdowns by question type and by the dataset the video comes from (first folder of
  its path: videoEspresso, MMVU, COIN, ...).
- VideoReasonBench (github.com/llyx97/video_reason_bench): 1,440 open-ended questions over six
  scenes (card, chip, cup, file_sys, grid, hrd: the first folder of the video path); answers
  are lists of states ("1st: Queen of Clubs, pile0 ..."), judged as a whole.
"""

from __future__ import annotations

from easyvideor1.evaluation.adapters.base import Benchmark, video_parts
from easyvideor1.evaluation.aggregate import Aggregate, accuracy
from easyvideor1.evaluation.results import ResultRow
from easyvideor1.records import Sample

ROUGE_NOTE = ("No LLM judge was configured: open-ended answers were scored by ROUGE (mean of ROUGE-1/2/L F1), "
              "not by the judge the official protocol uses, so this score is not comparable with published "
              "numbers. Re-run with --judge-endpoint/--judge-model.")


def rouge_scored(rows: list[ResultRow]) -> int:
    """Open-ended rows whose score is ROUGE: scored, not an exact match, and no judge verdict."""
    return sum(r.status == "ok" and "rouge" in r.parts and "judge" not in r.parts and r.parts.get("exact") == 0.0
               for r in rows)


def judge_or_rouge(breakdowns: tuple[str, ...]):
    """Accuracy with `breakdowns`; named ROUGE, with `ROUGE_NOTE`, when any answer was scored by ROUGE."""

    def summarize(name: str, rows: list[ResultRow]) -> Aggregate:
        agg = accuracy(name, rows, breakdowns)
        n = rouge_scored(rows)
        if n:
            agg.metric = "accuracy, open-ended answers by ROUGE (not the official judge)"
            agg.notes.append(f"{n} of {len(rows)} answers scored by ROUGE. {ROUGE_NOTE}")
        return agg

    return summarize


def vcr_labels(sample: Sample) -> dict[str, str]:
    """Question type and the source dataset of the video (`video/<dataset>/...`)."""
    labels = {"question_type": sample.problem_type}
    rel = video_parts(sample)
    if len(rel) >= 3 and rel[0] == "video":
        labels["video_source"] = rel[1]
    return labels


def videoreason_labels(sample: Sample) -> dict[str, str]:
    """The scene (`card/...`, `chip/...`)."""
    rel = video_parts(sample)
    return {"scene": rel[0]} if len(rel) >= 2 else {}


VCRBENCH = Benchmark(
    name="vcrbench", title="VCR-Bench", files=("vcrbench.json",),
    source="converted file from github.com/cyuQ1n/EasyVideoR1; open-ended answers through the "
           "LLM judge (RewardConfig.judge) as in the VCR-Bench paper",
    breakdowns=("question_type", "video_source"), labels=vcr_labels,
    summarize=judge_or_rouge(("question_type", "video_source")))
VIDEOREASONBENCH = Benchmark(
    name="videoreasonbench", title="VideoReasonBench", files=("videoreasonbench.json",),
    source="converted file from github.com/cyuQ1n/EasyVideoR1; answers through the LLM judge "
           "(RewardConfig.judge) as in the VideoReasonBench paper",
    breakdowns=("scene",), labels=videoreason_labels, summarize=judge_or_rouge(("scene",)))
