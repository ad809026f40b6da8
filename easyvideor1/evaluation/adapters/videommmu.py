"""Video-MMMU: 900 questions on lecture videos in three tracks, reported per track.

Tracks (github.com/EvolvingLMMs-Lab/VideoMMMU): Perception, Comprehension, Adaptation.
The converted files keep no track field, but hold the three tracks as id blocks:
1-300 Adaptation (the questions whose image, `image_path` in `videommmu_with_image.json`, is
shown at the end of the video), 301-600 Comprehension, 601-900 Perception (checked against
the question texts). A record's own `track` field wins when it has one. 18 questions are
`numerical` and use the numerical scorer. The subject is read from the video name
(`validation_Architecture_and_Engineering_7.mp4` -> Architecture_and_Engineering).

Δknowledge (github.com/EvolvingLMMs-Lab/VideoMMMU README, "Knowledge Acquisition
Experiment"): the second pass is the benchmark `videommmu-question-only`, the 300 Adaptation
questions with only their question image and no video (the official "question_only" track
shows a 2-second video of that image; the image itself is what we show). Run both in one
results folder and the report adds, to Video-MMMU's metrics,
    delta_knowledge = (Acc_adaptation - Acc_question_only) / (1 - Acc_question_only)
(`add_delta_knowledge`; negative when the video hurt). It needs the `with_image` file.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from easyvideor1.evaluation.adapters.base import Benchmark, with_extra
from easyvideor1.evaluation.aggregate import Aggregate
from easyvideor1.records import Sample

TRACK_BLOCKS = ("Adaptation", "Comprehension", "Perception")  # ids 1-300, 301-600, 601-900
_SUBJECT = re.compile(r"^(?:dev|test|validation|new)_(?P<subject>.+)_\d+\.\w+$")


def videommmu_labels(sample: Sample) -> dict[str, str]:
    """{"track": ..., "subject": ...} (see the module docstring for where they come from)."""
    labels: dict[str, str] = {}
    pid = str(sample.extra.get("original_problem_id", sample.problem_id))
    if sample.extra.get("track"):
        labels["track"] = str(sample.extra["track"])
    elif pid.isdigit() and 1 <= int(pid) <= 300 * len(TRACK_BLOCKS):
        labels["track"] = TRACK_BLOCKS[(int(pid) - 1) // 300]
    match = _SUBJECT.match(PurePosixPath(sample.videos[0]).name) if sample.videos else None
    if match:
        labels["subject"] = match["subject"]
    return labels


def question_only(sample: Sample, data_root) -> Sample:
    """An Adaptation question with its image and without the video (the Δknowledge baseline)."""
    if not sample.images:
        return sample
    return with_extra(sample, videos=[], data_type="image")


def is_adaptation_with_image(sample: Sample) -> bool:
    """The samples of the question-only pass: Adaptation questions that carry their image."""
    return bool(sample.images) and videommmu_labels(sample).get("track") == "Adaptation"


def add_delta_knowledge(aggregates: dict[str, Aggregate]) -> None:
    """Add `delta_knowledge` to Video-MMMU's metrics when both passes are in `aggregates`."""
    video, baseline = aggregates.get("videommmu"), aggregates.get("videommmu-question-only")
    if video is None or baseline is None or "Adaptation" not in video.categories.get("track", {}):
        return
    after, before = video.categories["track"]["Adaptation"].score, baseline.overall
    if before >= 1.0:
        video.notes.append("Δknowledge undefined: the question-only pass scored 100%")
        return
    video.metrics["delta_knowledge"] = (after - before) / (1.0 - before)
    video.notes.append(f"delta_knowledge = (Adaptation {100 * after:.1f} - question-only {100 * before:.1f}) / "
                       f"(100 - {100 * before:.1f}), as the Video-MMMU README defines Δknowledge")


VIDEOMMMU = Benchmark(
    name="videommmu", title="Video-MMMU", files=("videommmu_with_image.json", "videommmu.json"),
    source="converted files from github.com/cyuQ1n/EasyVideoR1 (with_image: Adaptation images "
           "after the video); tracks as EvolvingLMMs-Lab/VideoMMMU",
    breakdowns=("track", "subject"), labels=videommmu_labels)
VIDEOMMMU_QUESTION_ONLY = Benchmark(
    name="videommmu-question-only", title="Video-MMMU question only (Δknowledge baseline)",
    files=("videommmu_with_image.json",),
    source="the Adaptation questions of the converted videommmu_with_image.json, image only, as the "
           "official question_only track (EvolvingLMMs-Lab/VideoMMMU)",
    breakdowns=("subject",), labels=videommmu_labels, prepare=question_only, select=is_adaptation_with_image)
