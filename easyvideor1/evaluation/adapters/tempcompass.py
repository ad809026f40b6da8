"""TempCompass: temporal perception (action, speed, direction, order, attribute change).

Official release (github.com/llyx97/TempCompass): `questions/<task>.json` with
`{video_id: {dimension: [{"question": ..., "answer": ...}, ...]}}` and videos at
`videos/<video_id>.mp4` (`<id>_reverse` etc. are the conflicting variants). Task formats read:
- `multi-choice`: the question ends with "A. ..." option lines; answer "B. text" -> letter B;
- `yes_no`: answer "yes"/"no" -> the boolean scorer;
- `caption_matching`: options written "Option 1:", "Caption A:" or "Sentence B:" -> letters
  A, B in order; the answer names one -> its letter; scored as multiple choice.
- `captioning`: the model writes a caption; an LLM judge answers the video's first
  multi-choice question of the same dimension (`multi-choice.json` beside it, as
  `eval_captioning.py` does) from the caption alone (`rewards.caption_mc`, problem type
  `caption-mc`). Without a judge these rows fail with a message saying to configure one.
A converted `tempcompass.json` in the sample schema (EasyVideoR1's) is read as it is.

Reported per dimension and task format; the headline is accuracy over all questions (the
official script's `avg`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from easyvideor1.data.loading import DataError
from easyvideor1.evaluation.adapters.base import Benchmark
from easyvideor1.records import Sample
from easyvideor1.rewards.multiple_choice import LETTERS

_MC_OPTION = re.compile(r"^\(?([A-J])[\.\)]\s*(.+)$")
_CM_OPTION = re.compile(r"^(?:Option|Caption|Sentence)\s+([A-J1-9])\s*:\s*(.+)$", re.IGNORECASE)
TASK_TYPES = ("multi-choice", "yes_no", "caption_matching", "captioning")


def _split(question: str, pattern: re.Pattern) -> tuple[str, list[tuple[str, str]]]:
    """Question stem and its (key, text) options (lines matching `pattern`)."""
    stem, options = [], []
    for line in question.splitlines():
        match = pattern.match(line.strip())
        if match:
            options.append((match.group(1), match.group(2).strip()))
        elif not options:
            stem.append(line)
    return "\n".join(stem).strip(), options


def _record(task: str, q: dict, where: str) -> tuple[str, str, str, list[str] | None]:
    """(problem, answer, problem_type, options) of one official question."""
    question, answer = q["question"], str(q["answer"]).strip()
    if task == "yes_no":
        if answer.lower() not in ("yes", "no"):
            raise DataError(f"{where}: yes_no answer {answer!r} is not yes/no")
        return question, answer.lower(), "boolean", None
    pattern = _MC_OPTION if task == "multi-choice" else _CM_OPTION
    stem, options = _split(question, pattern)
    match = pattern.match(answer)
    keys = [k for k, _ in options]
    if len(options) < 2 or not match or match.group(1) not in keys:
        raise DataError(f"{where}: cannot read the options or the answer {answer!r} of {question!r}")
    letters = [f"{LETTERS[i]}. {text}" for i, (_, text) in enumerate(options)]
    return stem, LETTERS[keys.index(match.group(1))], "multiple choice", letters


def import_tempcompass(path: Path, data_root: Path) -> list[Sample]:
    """Samples from one official `questions/<task>.json` (task from the file name)."""
    task = path.stem
    if task not in TASK_TYPES:
        raise DataError(f"{path}: TempCompass task file must be one of "
                        f"{', '.join(t + '.json' for t in TASK_TYPES)}")
    data = _read(path)
    mc = _read(path.with_name("multi-choice.json")) if task == "captioning" else {}
    samples = []
    for video_id, dims in data.items():
        for dim, questions in dims.items():
            for i, q in enumerate(questions):
                pid = f"{video_id}/{dim}/{i}"
                extra = {"dimension": dim, "task_type": task, "video_id": video_id, "original_answer": q["answer"]}
                if task == "captioning":
                    try:
                        first = mc[video_id][dim][0]
                    except (KeyError, IndexError):
                        raise DataError(f"{path} {pid}: multi-choice.json beside it has no question for "
                                        f"{video_id}/{dim}, which captioning is judged by") from None
                    problem, answer, ptype, options = q["question"], str(q["answer"]), "caption-mc", None
                    extra.update(mc_question=first["question"], mc_answer=str(first["answer"]))
                else:
                    problem, answer, ptype, options = _record(task, q, f"{path} {pid}")
                samples.append(Sample(
                    problem=problem, answer=answer, problem_type=ptype, data_type="video",
                    videos=[os.path.normpath(data_root / "videos" / f"{video_id}.mp4")], options=options,
                    problem_id=pid, data_source="TempCompass", extra=extra))
    return samples


def _read(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise DataError(f"{path} is missing (TempCompass captioning is judged against multi-choice.json's "
                        "questions; keep the questions/ folder whole)") from None
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected {{video_id: {{dimension: [questions]}}}}")
    return data


def tempcompass_labels(sample: Sample) -> dict[str, str]:
    """{"dimension": action|speed|direction|order|attribute_change, "task_type": ...}."""
    labels = {}
    for key in ("dimension", "dim"):
        if sample.extra.get(key):
            labels["dimension"] = str(sample.extra[key])
            break
    labels["task_type"] = str(sample.extra.get("task_type") or sample.problem_type)
    return labels


TEMPCOMPASS = Benchmark(
    name="tempcompass", title="TempCompass",
    files=("tempcompass.json", "questions/multi-choice.json"),
    source="github.com/llyx97/TempCompass questions/<task>.json (or a converted tempcompass.json)",
    breakdowns=("dimension", "task_type"), labels=tempcompass_labels, importer=import_tempcompass)
