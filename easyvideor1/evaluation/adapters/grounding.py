"""Grounding benchmarks: Charades-STA (temporal) and STVG (spatio-temporal).

Charades-STA reports mIoU and R@{0.3, 0.5, 0.7} (the share of queries whose predicted moment
has IoU >= the threshold with the ground truth; one prediction per query, i.e. "R@1").
The converted file's ground truth is `<think>{"time": [s, e], "boxes": {}}</think>` plus a
placeholder token with no `<answer>` tag; the temporal-grounding scorer reads that form.

STVG (the ST-Align benchmark file EasyVideoR1 ships) reports m_tIoU (temporal IoU) and mIoU
(box IoU averaged over the ground-truth frames); the headline is the scorer's
0.5 * tIoU + 0.5 * box IoU. Records without ground-truth boxes (71 in the file) count in
m_tIoU only.
"""

from __future__ import annotations

from easyvideor1.evaluation.adapters.base import Benchmark
from easyvideor1.evaluation.aggregate import Aggregate, failed_count, mean
from easyvideor1.evaluation.results import ResultRow
from easyvideor1.records import Sample
from easyvideor1.rewards.spatiotemporal_grounding import read_tube

RECALL_THRESHOLDS = (0.3, 0.5, 0.7)


def charades_summary(name: str, rows: list[ResultRow]) -> Aggregate:
    """mIoU headline; R@0.3/0.5/0.7 as metrics (failed rows have IoU 0)."""
    ious = [r.score for r in rows]
    metrics = {f"R@{t}": mean(1.0 if iou >= t else 0.0 for iou in ious) for t in RECALL_THRESHOLDS}
    return Aggregate(benchmark=name, metric="mIoU", overall=mean(ious), count=len(rows),
                     failed=failed_count(rows), metrics=metrics)


def stvg_labels(sample: Sample) -> dict[str, str]:
    """Whether the ground truth has boxes (decides the mIoU denominator; not a breakdown)."""
    tube = read_tube(sample.answer)
    return {"has_boxes": "yes" if tube and tube["boxes"] else "no"}


def stvg_summary(name: str, rows: list[ResultRow]) -> Aggregate:
    """Mean scorer accuracy headline; m_tIoU over all rows, mIoU over rows with truth boxes."""
    boxed = [r for r in rows if r.labels.get("has_boxes") == "yes"]
    metrics = {"m_tIoU": mean(r.parts.get("tiou", 0.0) for r in rows),
               "mIoU": mean(r.parts.get("box_iou", 0.0) for r in boxed)}
    return Aggregate(benchmark=name, metric="0.5 tIoU + 0.5 box IoU", overall=mean(r.score for r in rows),
                     count=len(rows), failed=failed_count(rows), metrics=metrics)


CHARADES_STA = Benchmark(
    name="charades_sta", title="Charades-STA", files=("charades_sta.json",),
    source="converted file from github.com/cyuQ1n/EasyVideoR1; metrics as Charades-STA "
           "(Gao et al. 2017): mIoU, R@1 at IoU 0.3/0.5/0.7",
    summarize=charades_summary)
STVG = Benchmark(
    name="stvg", title="STVG", files=("stvg.json",),
    source="converted ST-Align benchmark file from github.com/cyuQ1n/EasyVideoR1",
    labels=stvg_labels, summarize=stvg_summary)
