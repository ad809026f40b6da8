"""Video-MMMU: 900 questions on lecture videos in three tracks, reported per track.

Tracks (github.com/EvolvingLMMs-Lab/VideoMMMU): Perception, Comprehension, Adaptation.
The converted files keep no track field, but hold the three tracks as id blocks:
1-300 Adaptation (the questions whose image, `image_path` in `videommmu_with_image.json`, is
shown at the end of the video), 301-600 Comprehension, 601-900 Perception (checked against
the question texts). A record's own `track` field wins when it has one. 18 questions are
`numerical` and use the numerical scorer. The subject is read from the video name
(`validation_Architecture_and_Engineering_7.mp4` -> Architecture_and_Engineering).

Not computed: the paper's Δknowledge (needs a second run without the video).
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from easyvideor1.evaluation.adapters.base import Benchmark
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


VIDEOMMMU = Benchmark(
    name="videommmu", title="Video-MMMU", files=("videommmu_with_image.json", "videommmu.json"),
    source="converted files from github.com/cyuQ1n/EasyVideoR1 (with_image: Adaptation images "
           "after the video); tracks as EvolvingLMMs-Lab/VideoMMMU",
    breakdowns=("track", "subject"), labels=videommmu_labels)
