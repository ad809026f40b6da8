"""Benchmarks whose questions are about a segment of a long video: LiveSports-3K QA, ODV-Bench.

Upstream EasyVideoR1 cut every segment into its own file with ffmpeg before evaluating
(`eval/preprocess/cilp.py`); its converted records name those clip files, with the segment
encoded in the name. Here the segment is sampled from the source video instead (no files are
cut, and `-c copy` cutting snaps to keyframes, so the clip was not the stated interval):
when the source video is found under the data root, the sample reads it with
`video_start`/`video_end` set to the segment; when only the clip file is there, the clip is
used as it is.

Clip names (from cilp.py):
- LiveSports-3K: `{video_id}_{begin}_{end}.mp4`, source `{video_id}.mp4`
  (https://huggingface.co/datasets/stdKonjac/LiveSports-3K).
- ODV-Bench: `{index}_{video_stem}_s{start}_e{end}.mp4`, source found by stem anywhere under
  the data root (https://huggingface.co/datasets/MCG-NJU/ODV-Bench).

ODV-Bench's official release (`ODVbench.json` beside TS_Retrieval/, TOI_Recognition/,
TR_Analysis/ extracted from their zips) is read too: one record per question with `video`
(path under the data root), `question`, `candidates`, `answer` (the option text, always one of
the candidates), `start` (always 0) and `end` (the question's timestamp: the model may only see
[0, end], which is what the segment bounds enforce), `subtask` (12 values), `task` (3 values);
format as described by the StreamForest release (github.com/MCG-NJU/StreamForest).
"""

from __future__ import annotations

import json
import os
import re
from functools import lru_cache
from pathlib import Path

from easyvideor1.data.loading import DataError
from easyvideor1.evaluation.adapters.base import Benchmark, with_extra
from easyvideor1.evaluation.adapters.multiple_choice import livesports_labels
from easyvideor1.records import Sample
from easyvideor1.rewards.multiple_choice import LETTERS

VIDEO_SUFFIXES = (".mp4", ".mkv", ".webm", ".avi", ".mov")
LIVESPORTS_CLIP = re.compile(r"^(?P<stem>.+)_(?P<start>\d+(?:\.\d+)?)_(?P<end>\d+(?:\.\d+)?)\.mp4$")
ODV_CLIP = re.compile(r"^(?P<index>\d+)_(?P<stem>.+)_s(?P<start>\d+(?:\.\d+)?)_e(?P<end>\d+(?:\.\d+)?)\.mp4$")


@lru_cache(maxsize=8)
def video_index(root: str) -> dict[str, str]:
    """{file stem: path} of every video under `root` (first found wins), built once per root."""
    index: dict[str, str] = {}
    for dirpath, _, names in os.walk(root):
        for name in sorted(names):
            if name.lower().endswith(VIDEO_SUFFIXES):
                index.setdefault(Path(name).stem, os.path.join(dirpath, name))
    return index


def segment_from_clip(sample: Sample, data_root: Path, pattern: re.Pattern) -> Sample:
    """Point a clip record at its source video and segment when the source is under `data_root`."""
    if not sample.videos or sample.video_start is not None:
        return sample
    match = pattern.match(Path(sample.videos[0]).name)
    if not match:
        return sample
    source = video_index(str(data_root)).get(match["stem"])
    if source is None:
        return sample  # only the clip (or nothing) is there: use the clip path as given
    return with_extra(sample, videos=[source], video_start=float(match["start"]),
                      video_end=float(match["end"]))


def livesports_prepare(sample: Sample, data_root: Path) -> Sample:
    """LiveSports-3K clip -> source video + segment."""
    return segment_from_clip(sample, data_root, LIVESPORTS_CLIP)


def odv_prepare(sample: Sample, data_root: Path) -> Sample:
    """ODV-Bench clip -> source video + segment."""
    return segment_from_clip(sample, data_root, ODV_CLIP)


def odv_labels(sample: Sample) -> dict[str, str]:
    """ODV-Bench's 12 subtasks and 3 task groups, when the record keeps them."""
    return {k: str(sample.extra[k]) for k in ("subtask", "task") if sample.extra.get(k) not in (None, "")}


def import_odvbench(path: Path, data_root: Path) -> list[Sample]:
    """Samples from the official `ODVbench.json` (see the module docstring)."""
    with open(path, encoding="utf-8") as f:
        records = json.load(f)
    if not isinstance(records, list):
        raise DataError(f"{path}: expected ODV-Bench's list of question records")
    samples = []
    for i, r in enumerate(records):
        where = f"{path} record {i}"
        missing = [k for k in ("video", "question", "candidates", "answer", "end") if k not in r]
        if missing:
            raise DataError(f"{where}: missing {', '.join(missing)}; is this ODV-Bench's ODVbench.json?")
        if r["answer"] not in r["candidates"] or len(r["candidates"]) > len(LETTERS):
            raise DataError(f"{where}: answer {r['answer']!r} is not one of its candidates")
        letter = LETTERS[r["candidates"].index(r["answer"])]
        start = float(r.get("start") or 0.0)
        samples.append(Sample(
            problem=r["question"], answer=letter, problem_type="multiple choice", data_type="video",
            videos=[os.path.normpath(data_root / r["video"])],
            options=[f"{LETTERS[j]}. {c}" for j, c in enumerate(r["candidates"])],
            problem_id=str(i), data_source="ODV-Bench",
            video_start=start, video_end=float(r["end"]) if float(r["end"]) > start else None,
            extra={"subtask": r.get("subtask", ""), "task": r.get("task", ""),
                   "original_answer": r["answer"]}))
    return samples


LIVESPORTS = Benchmark(
    name="livesports3k_qa", title="LiveSports-3K QA", files=("livesports3k_qa.json",),
    source="converted file from github.com/cyuQ1n/EasyVideoR1; clips of "
           "huggingface.co/datasets/stdKonjac/LiveSports-3K sampled from their source videos",
    breakdowns=("question_type", "ocr"), labels=livesports_labels, prepare=livesports_prepare)
ODVBENCH = Benchmark(
    name="odvbench", title="ODV-Bench", files=("odvbench.json", "ODVbench.json"),
    source="huggingface.co/datasets/MCG-NJU/ODV-Bench (ODVbench.json) or the EasyVideoR1 "
           "converted odvbench.json; segments sampled, not cut",
    breakdowns=("task", "subtask"), labels=odv_labels, prepare=odv_prepare, importer=import_odvbench)
