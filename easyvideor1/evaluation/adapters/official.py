"""Importers of official releases whose breakdowns the converted files drop, and their summaries.

The converted files EasyVideoR1 ships keep question, options and answer only, so the official
per-category tables cannot be computed from them. When the official annotation file is under
the data root (or passed as the annotation file), these importers read it and the summaries
report what the official scripts report. Each rule names its source (read 2026-11):

- LVBench (github.com/THUDM/LVBench, `lvbench/metrics/compute_accuracy.py`, commit f998d95):
  `data/video_info.meta.jsonl`, one line per video {key, type, qa: [{uid, question (options
  inline as "\n(A) ..."), answer (letter), question_type (a list), time_reference}]}.
  Overall = accuracy over all questions; per question type = accuracy over the questions
  carrying that type, a question counted once in each of its types (so the type table's
  counts sum to more than the questions). `scripts/test_acc.py` names the six types
  (key information retrieval, event understanding, summarization, entity recognition,
  reasoning, temporal grounding).
- LongVideoBench (github.com/longvideobench/LongVideoBench, `longvideobench_dataset.py`,
  commit fc3c553): `lvb_val.json`, one record per question {id, video_path (under videos/),
  question, candidates, correct_choice (index), duration_group (15/60/600/3600: the 8-15 s,
  15-60 s, 180-600 s and 900-3600 s groups), question_category (17 referring-reasoning
  categories such as S2E, T3O)}. Reported: accuracy overall, per duration group and per
  question category (the leaderboard's and the paper's tables). The test split withholds
  `correct_choice` (online submission only) and is refused.
- Video-Holmes (github.com/TencentARC/Video-Holmes, `evaluate.py`): `test_Video-Holmes.json`
  {"video ID", "Question ID", "Question Type" (SR, IMC, TCI, TA, MHR, PAR, CTI), "Question",
  "Options" {letter: text}, "Answer" (letter)}, videos at `videos/<video ID>.mp4`. Overall =
  correct / all questions; per question type = accuracy within the type.
- MLVU (github.com/JUNJIE99/MLVU, `evaluation/multiple_choice_evaluation/choice_bench.py`,
  commit fd060c1): dev tasks in `json/<n>_<task>.json` {video, duration, question,
  candidates, answer (the text), question_type}, videos in `video/<n>_<task>/`. Per task =
  accuracy; the headline (M-Avg) = the unweighted mean over the seven multiple-choice task
  accuracies. The generation tasks (8_sub_scene, 9_summary: GPT-4 scored G-Avg) are not read.

Departure: our multiple-choice scorer reads the option letter (tags, "(B)", "B." ...), where
the official scripts use their own string rules on free text; with answers in `<answer>`
tags the two agree.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from easyvideor1.data.loading import DataError
from easyvideor1.evaluation.adapters.base import Benchmark
from easyvideor1.evaluation.adapters.clips import video_index
from easyvideor1.evaluation.aggregate import (
    Aggregate,
    accuracy,
    by_label,
    by_labels,
    macro_estimands,
    macro_score,
    multi_label_estimands,
)
from easyvideor1.evaluation.results import ResultRow
from easyvideor1.records import Sample
from easyvideor1.rewards.multiple_choice import LETTERS

log = logging.getLogger(__name__)

MULTI_SEP = "|"  # joins the several types of one LVBench question in its label
_INLINE_OPTION = re.compile(r"\n\(([A-J])\)\s*")
MLVU_TASK_FILE = re.compile(r"^(\d+)_(\w+)\.json$")
MLVU_GENERATION_TASKS = ("sub_scene", "summary")


def _video(root: Path, stem: str, *candidates: Path) -> str:
    """The first candidate path that exists, else the video named `stem` anywhere under
    `root`, else the first candidate (a missing video then fails its sample when loaded)."""
    for c in candidates:
        if c.is_file():
            return str(c)
    return video_index(str(root)).get(stem) or str(candidates[0])


def _letters(options: list[str]) -> list[str]:
    return [f"{LETTERS[i]}. {text}" for i, text in enumerate(options)]


def _records(path: Path, kind: str) -> list:
    try:
        if path.suffix == ".jsonl":
            return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise DataError(f"{path}: cannot read {kind}'s annotation file: {e}") from e


def _need(record: dict, keys: tuple[str, ...], where: str, what: str) -> None:
    missing = [k for k in keys if k not in record]
    if missing:
        raise DataError(f"{where}: missing {', '.join(missing)}; is this {what}?")


def import_lvbench(path: Path, data_root: Path) -> list[Sample]:
    """Samples from LVBench's `video_info.meta.jsonl` (see the module docstring)."""
    samples = []
    for i, video in enumerate(_records(path, "LVBench")):
        _need(video, ("key", "qa"), f"{path} line {i + 1}", "LVBench's video_info.meta.jsonl")
        key = str(video["key"])
        source = _video(data_root, key, data_root / "videos" / f"{key}.mp4", data_root / f"{key}.mp4")
        for qa in video["qa"]:
            where = f"{path} video {key} question {qa.get('uid')}"
            _need(qa, ("uid", "question", "answer", "question_type"), where, "an LVBench question")
            parts = _INLINE_OPTION.split(qa["question"])
            question, pairs = parts[0].strip(), list(zip(parts[1::2], parts[2::2]))
            if not pairs or [p[0] for p in pairs] != list(LETTERS[: len(pairs)]):
                raise DataError(f"{where}: options are not written as '\\n(A) ...' in the question")
            types = qa["question_type"] if isinstance(qa["question_type"], list) else [qa["question_type"]]
            samples.append(Sample(
                problem=question, answer=str(qa["answer"]).strip(), problem_type="multiple choice",
                data_type="video", videos=[source], options=[f"{k}. {t.strip()}" for k, t in pairs],
                problem_id=str(qa["uid"]), data_source="LVBench",
                extra={"question_type": MULTI_SEP.join(str(t) for t in types), "video_type": video.get("type", ""),
                       "time_reference": qa.get("time_reference", "")}))
    return samples


def lvbench_labels(sample: Sample) -> dict[str, str]:
    """The question's types (joined by `|`) and the video's type, when imported officially."""
    return {k: str(sample.extra[k]) for k in ("question_type", "video_type") if sample.extra.get(k)}


def lvbench_summary(name: str, rows: list[ResultRow]) -> Aggregate:
    """Accuracy; per question type counting each question once in each of its types."""
    agg = accuracy(name, rows, ("video_type",))
    types = by_labels(rows, "question_type", MULTI_SEP)
    agg.categories = {"question_type": types, **({"video_type": agg.categories["video_type"]}
                                                 if agg.categories["video_type"] else {})}
    return agg


def import_longvideobench(path: Path, data_root: Path) -> list[Sample]:
    """Samples from LongVideoBench's `lvb_val.json` (see the module docstring)."""
    samples = []
    for i, r in enumerate(_records(path, "LongVideoBench")):
        where = f"{path} record {i}"
        if "correct_choice" not in r and "question" in r:
            raise DataError(f"{where}: no correct_choice: the test split withholds answers (submit it to "
                            "the LongVideoBench leaderboard); evaluate lvb_val.json")
        _need(r, ("video_path", "question", "candidates", "correct_choice"), where, "LongVideoBench's lvb_val.json")
        rel = Path(r["video_path"])
        samples.append(Sample(
            problem=r["question"], answer=LETTERS[int(r["correct_choice"])], problem_type="multiple choice",
            data_type="video", videos=[_video(data_root, rel.stem, data_root / "videos" / rel, data_root / rel)],
            options=_letters(r["candidates"]), problem_id=str(r.get("id", i)), data_source="LongVideoBench",
            extra={k: r[k] for k in ("duration_group", "question_category", "topic_category", "level", "duration")
                   if k in r}))
    return samples


def longvideobench_labels(sample: Sample) -> dict[str, str]:
    """Duration group (seconds, as the file writes it) and question category."""
    return {k: str(sample.extra[k]) for k in ("duration_group", "question_category")
            if sample.extra.get(k) not in (None, "")}


def import_holmes(path: Path, data_root: Path) -> list[Sample]:
    """Samples from Video-Holmes' `test_Video-Holmes.json` (see the module docstring)."""
    samples = []
    for i, r in enumerate(_records(path, "Video-Holmes")):
        where = f"{path} record {i}"
        _need(r, ("video ID", "Question ID", "Question Type", "Question", "Options", "Answer"), where,
              "Video-Holmes' test_Video-Holmes.json")
        vid = str(r["video ID"])
        options = r["Options"]
        samples.append(Sample(
            problem=r["Question"], answer=str(r["Answer"]).strip(), problem_type="multiple choice",
            data_type="video", videos=[_video(data_root, vid, data_root / "videos" / f"{vid}.mp4")],
            options=[f"{k}. {v}" for k, v in options.items()], problem_id=str(r["Question ID"]),
            data_source="Video-Holmes", extra={"question_type": str(r["Question Type"])}))
    return samples


def import_mlvu(path: Path, data_root: Path) -> list[Sample]:
    """Samples from MLVU's per-task files: `path` and every `<n>_<task>.json` beside it (or
    one file whose records carry `question_type`); see the module docstring."""
    files = [path]
    if MLVU_TASK_FILE.match(path.name):
        files = sorted((p for p in path.parent.iterdir() if MLVU_TASK_FILE.match(p.name)),
                       key=lambda p: int(MLVU_TASK_FILE.match(p.name)[1]))
    samples = []
    for f in files:
        task_dir = f.stem
        if MLVU_TASK_FILE.match(f.name) and MLVU_TASK_FILE.match(f.name)[2] in MLVU_GENERATION_TASKS:
            log.warning("%s: MLVU generation task (GPT-scored G-Avg) not read; M-Avg covers the "
                        "multiple-choice tasks only", f)
            continue
        for i, r in enumerate(_records(f, "MLVU")):
            where = f"{f} record {i}"
            _need(r, ("video", "question", "candidates", "answer", "question_type"), where, "an MLVU task file")
            if r["answer"] not in r["candidates"]:
                raise DataError(f"{where}: answer {r['answer']!r} is not one of its candidates")
            video = str(r["video"])
            samples.append(Sample(
                problem=r["question"], answer=LETTERS[r["candidates"].index(r["answer"])],
                problem_type="multiple choice", data_type="video",
                videos=[_video(data_root, Path(video).stem, data_root / "video" / task_dir / video,
                               data_root / "video" / video, data_root / video)],
                options=_letters(r["candidates"]), problem_id=str(r.get("question_id", f"{task_dir}/{i}")),
                data_source="MLVU", extra={"task": str(r["question_type"]), "duration": r.get("duration")}))
    return samples


def mlvu_summary(name: str, rows: list[ResultRow]) -> Aggregate:
    """M-Avg (mean of the task accuracies) when rows carry the task; else plain accuracy by the
    converted file's video source group."""
    tasks = by_label(rows, "task")
    if not tasks:
        return accuracy(name, rows, ("source",))
    agg = accuracy(name, rows, ("task",))
    agg.metric, agg.metrics["micro"], agg.overall = "M-Avg (mean of task accuracies)", agg.overall, macro_score(tasks)
    return agg


def holmes_labels(sample: Sample) -> dict[str, str]:
    """Video-Holmes' question type, when imported officially."""
    return {"question_type": sample.extra["question_type"]} if sample.extra.get("question_type") else {}


def mlvu_labels(sample: Sample) -> dict[str, str]:
    """MLVU's task (official layout); for the converted files, which drop it, the video's
    source group (the file name prefix: needle, count, order, ego, surveil, movie101...)."""
    if sample.extra.get("task"):
        return {"task": str(sample.extra["task"])}
    name = os.path.basename(sample.videos[0]) if sample.videos else ""
    stem = re.sub(r"^test_", "", re.sub(r"[_\-]?\d+\.\w+$", "", name))
    return {"source": stem or "other"}


_CONVERTED = "converted file from github.com/cyuQ1n/EasyVideoR1 eval/data/valid_data"

LVBENCH = Benchmark(
    name="lvbench", title="LVBench", files=("video_info.meta.jsonl", "data/video_info.meta.jsonl", "lvbench.json"),
    source="github.com/THUDM/LVBench video_info.meta.jsonl (question types), or the "
           f"{_CONVERTED} (overall only)",
    breakdowns=("question_type", "video_type"), labels=lvbench_labels, summarize=lvbench_summary,
    estimands=multi_label_estimands("question_type", MULTI_SEP), importer=import_lvbench)
LONGVIDEOBENCH = Benchmark(
    name="longvideobench", title="LongVideoBench", files=("lvb_val.json", "longvideobench.json"),
    source="github.com/longvideobench/LongVideoBench lvb_val.json (duration groups, question "
           f"categories), or the {_CONVERTED} (overall only)",
    breakdowns=("duration_group", "question_category"), labels=longvideobench_labels,
    importer=import_longvideobench)
HOLMES = Benchmark(
    name="holmes", title="Video-Holmes", files=("test_Video-Holmes.json", "holmes.json"),
    source="github.com/TencentARC/Video-Holmes test_Video-Holmes.json (question types), or the "
           f"{_CONVERTED} (overall only)",
    breakdowns=("question_type",), labels=holmes_labels, importer=import_holmes)
MLVU = Benchmark(
    name="mlvu", title="MLVU (test)", files=("mlvu.json", "mlvu-test.json"),
    source=f"{_CONVERTED} (video source groups; the task is dropped), or MLVU task files passed as "
           "the annotation file",
    breakdowns=("task", "source"), labels=mlvu_labels, summarize=mlvu_summary,
    estimands=macro_estimands("task"), importer=import_mlvu)
MLVU_DEV = Benchmark(
    name="mlvu-dev", title="MLVU (dev)", files=("json/1_plotQA.json", "1_plotQA.json", "mlvu-dev.json"),
    source="github.com/JUNJIE99/MLVU json/<n>_<task>.json (M-Avg over tasks), or the "
           f"{_CONVERTED} (video source groups)",
    breakdowns=("task", "source"), labels=mlvu_labels, summarize=mlvu_summary,
    estimands=macro_estimands("task"), importer=import_mlvu)
