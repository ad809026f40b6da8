"""MINERVA and LongVideo-Reason: their release files, and the breakdowns those carry.

EasyVideoR1's converted files (minerva.json, longvideoreason.json) keep question, options and
answer only, so with them both benchmarks report overall accuracy and a note saying which
file gives the breakdown. With the release file under the data root (or passed as the
annotation file) the importers below read it, keep each question's labels in `extra`, and the
summaries report the tables below. A record the importer cannot read (a missing field, an
answer that is not one of its options) becomes a failed row named by its id: the others are
scored and the denominator stays the release's. Sources (read 2026-12):

- MINERVA (github.com/google-deepmind/neptune, `README.md` section "MINERVA", commit
  bdde4b1): `minerva.json`, a list of questions {key, video_id (the YouTube id), question,
  answer, answer_choice_0..answer_choice_4, answer_id (index of the right choice), reasoning,
  "question type" (a comma-separated list of the skills the question needs), split (coarse
  video domain), category (fine-grained video domain)}. The release has no scoring script;
  the scripts in use are lmms-eval's (github.com/EvolvingLMMs-Lab/lmms-eval,
  `lmms_eval/tasks/minerva/utils.py`, commit 75571cf) and VLMEvalKit's
  (github.com/zyuhan1999/VLMEvalKit `vlmeval/dataset/minerva.py`, commit 683170a). Both
  read the skills as `question_type` (lmms-eval falls back to "question type"), the gold
  letter from `answer_id` (lmms-eval: else the choice equal to `answer`), and report accuracy
  overall (the headline), per `question_type` string, per `split` and per `category`. The
  `question_type` table groups by the whole string, i.e. by combination of skills (here the
  skills rejoined by ", ", so spacing in the file does not split a group); we add `skill`,
  where a question counts once in each of its skills (as LVBench's types do), the per-skill
  reading of the README's definition.
- LongVideo-Reason (github.com/NVlabs/Long-RL, `eval/eval.py` and `eval/README.md`, commit
  97abc84): the test split of huggingface.co/datasets/LongVideo-Reason/longvideo-reason
  (`test.jsonl`, 1,000 questions) {problem_id, problem (the question, then one "A. ..." line
  per option), data_type, problem_type (the reasoning perspective: temporal, goal, spatial or
  plot), reasoning, videos ("longvila_videos/<id>.<ext>"), answer ("<answer>B</answer>")};
  field names and the four values as lmms-eval reads them
  (`lmms_eval/tasks/longvideo_reason/utils.py`, commit 843d010). The official script reports
  `accuracy` and `format_accuracy` (responses matching `<think>.*?</think>\\s*<answer>.*?
  </answer>` from the start); the paper (arXiv 2507.07966) and lmms-eval add accuracy per
  perspective ("Temporal, Goal and Purpose, Spatial, and Plot and Narrative", the card of
  huggingface.co/LongVideo-Reason), reported here as `perspective`. (Later Long-RL commits
  move the script to `longvideo-reason/eval.py`; lmms-eval ports that one.) lmms-eval notes five test rows (problem_id 147,
  379, 743, 825, 857) whose option block is broken or missing: here each is a failed row
  when its options do not read as A., B., C., ... lines (still in the denominator, as
  upstream keeps all 1,000).

Departure: the official LongVideo-Reason script compares the text inside `<answer>` with the
gold letter as strings (after a math_verify attempt), so `<answer>B.</answer>` scores 0
there; our multiple-choice scorer reads the letter (1 here). With the bare letter in the
tags, as the official prompt asks, the two agree. Failed generations count as 0 here; the
official script drops them from its denominator.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any

from easyvideor1.data.loading import DataError, LoadResult, Problem, make_id_unique, read_records
from easyvideor1.evaluation.adapters.base import Benchmark
from easyvideor1.evaluation.adapters.official import MULTI_SEP, _video
from easyvideor1.evaluation.aggregate import Aggregate, accuracy, by_labels, mean, multi_label_estimands
from easyvideor1.evaluation.results import ResultRow
from easyvideor1.records import Sample
from easyvideor1.rewards.multiple_choice import LETTERS

MINERVA_CHOICES = 5
MINERVA_LABELS = ("question_type", "skill", "split", "category")
LONGVIDEOREASON_PERSPECTIVES = ("temporal", "goal", "spatial", "plot")
_OPTION_LINE = re.compile(r"\n[ \t]*([A-Z])\.[ \t]+")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_OFFICIAL_FORMAT = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)
_YOUTUBE_ID = re.compile(r"(?:v=|youtu\.be/)([\w-]+)")


def _import(path: Path, data_root: Path, id_field: str, read) -> LoadResult:
    """Every record of `path` through `read(record, data_root)`; a record it refuses (DataError)
    is a Problem naming the record's position and id."""
    result = LoadResult()
    seen: dict[str, int] = {}
    for index, raw in read_records(path):
        if isinstance(raw, str):  # a JSONL line that is not JSON
            result.problems.append(Problem(index, "", raw))
            continue
        rid = str(raw.get(id_field, "")) if isinstance(raw, dict) else ""
        try:
            sample = read(raw, data_root)
        except DataError as e:
            result.problems.append(Problem(index, rid, str(e)))
            continue
        make_id_unique(sample, seen)
        result.samples.append(sample)
        result.indices.append(index)
    return result


def _require(raw: Any, keys: tuple[str, ...], what: str) -> dict:
    if not isinstance(raw, dict):
        raise DataError(f"not a JSON object; is this {what}?")
    missing = [k for k in keys if k not in raw]
    if missing:
        raise DataError(f"missing {', '.join(missing)}; is this {what}?")
    return raw


def _minerva_answer(r: dict, choices: list[str]) -> int:
    """`answer_id` (an int or a digit string), else the one choice equal to `answer`."""
    answer_id = r.get("answer_id")
    if isinstance(answer_id, str) and answer_id.strip().isdigit():
        answer_id = int(answer_id)
    if isinstance(answer_id, int) and not isinstance(answer_id, bool) and 0 <= answer_id < len(choices):
        return answer_id
    text = str(r.get("answer", "")).strip()
    if text and choices.count(text) == 1:
        return choices.index(text)
    raise DataError(f"answer_id {answer_id!r} is not 0-{len(choices) - 1} and answer {text[:60]!r} is none "
                    "of the answer choices")


def minerva_sample(raw: Any, data_root: Path) -> Sample:
    """One question of MINERVA's minerva.json (see the module docstring)."""
    keys = ("key", "video_id", "question", *(f"answer_choice_{i}" for i in range(MINERVA_CHOICES)))
    r = _require(raw, keys, "a question of MINERVA's minerva.json")
    choices = [str(r[f"answer_choice_{i}"] or "").strip() for i in range(MINERVA_CHOICES)]
    empty = [i for i, c in enumerate(choices) if not c]
    if empty:
        raise DataError(f"answer_choice_{empty[0]} is empty")
    answer = _minerva_answer(r, choices)
    vid = str(r["video_id"]).strip()
    vid = m[1] if (m := _YOUTUBE_ID.search(vid)) else vid
    skills_text = r.get("question_type", r.get("question type")) or ""
    skills = [s.strip() for s in str(skills_text).split(",") if s.strip()]
    extra = {"question_type": ", ".join(skills), "skill": MULTI_SEP.join(skills),
             "split": str(r.get("split") or ""), "category": str(r.get("category") or ""), "video_id": vid}
    return Sample(problem=str(r["question"]), answer=LETTERS[answer], problem_type="multiple choice",
                  data_type="video", videos=[_video(data_root, vid, data_root / "videos" / f"{vid}.mp4",
                                                    data_root / f"{vid}.mp4")],
                  options=[f"{LETTERS[i]}. {c}" for i, c in enumerate(choices)], problem_id=str(r["key"]),
                  data_source="MINERVA", extra=extra)


def import_minerva(path: Path, data_root: Path) -> LoadResult:
    """Samples from MINERVA's minerva.json, and a Problem for each record that is not one."""
    return _import(path, data_root, "key", minerva_sample)


def minerva_labels(sample: Sample) -> dict[str, str]:
    """Skills (as written, and one by one), split and category, when imported officially."""
    return {k: str(sample.extra[k]) for k in MINERVA_LABELS if sample.extra.get(k)}


def _overall_only(agg: Aggregate, rows: list[ResultRow], labels: tuple[str, ...], note: str) -> Aggregate:
    if rows and not any(k in r.labels for r in rows for k in labels):
        agg.notes.append(note)
    return agg


def minerva_summary(name: str, rows: list[ResultRow]) -> Aggregate:
    """Accuracy; per question_type string, per skill (a question once in each), split, category."""
    agg = accuracy(name, rows, ("question_type", "split", "category"))
    agg.categories = {"question_type": agg.categories["question_type"], "skill": by_labels(rows, "skill", MULTI_SEP),
                      "split": agg.categories["split"], "category": agg.categories["category"]}
    return _overall_only(agg, rows, MINERVA_LABELS, (
        "Accuracy overall only: these rows carry no skills or video domains (EasyVideoR1's converted "
        "minerva.json drops them). For MINERVA's breakdowns by question type, skill, split and category, "
        "evaluate the release file (minerva.json, linked from github.com/google-deepmind/neptune) under the "
        "data root or passed as the annotation file."))


def longvideoreason_sample(raw: Any, data_root: Path) -> Sample:
    """One question of LongVideo-Reason's test.jsonl (see the module docstring)."""
    r = _require(raw, ("problem_id", "problem", "problem_type", "videos", "answer"),
                 "a question of LongVideo-Reason's test.jsonl")
    perspective = str(r["problem_type"])
    if perspective not in LONGVIDEOREASON_PERSPECTIVES:
        raise DataError(f"problem_type {perspective!r} is not a reasoning perspective "
                        f"({', '.join(LONGVIDEOREASON_PERSPECTIVES)})")
    parts = _OPTION_LINE.split(str(r["problem"]))
    question, letters, texts = parts[0].strip(), parts[1::2], parts[2::2]
    if len(letters) < 2 or letters != list(LETTERS[: len(letters)]):
        found = "".join(letters) or "none"
        raise DataError(f"options are not written as lines 'A. ...', 'B. ...', ... after the question "
                        f"(option letters found: {found})")
    match = _ANSWER_TAG.search(str(r["answer"]))
    truth = (match[1] if match else str(r["answer"])).strip()
    if truth not in letters:
        raise DataError(f"answer {r['answer']!r} is not one of its option letters {''.join(letters)}")
    video = r["videos"][0] if isinstance(r["videos"], list) and r["videos"] else r["videos"]
    rel = PurePosixPath(str(video))
    return Sample(problem=question, answer=truth, problem_type="multiple choice", data_type="video",
                  videos=[_video(data_root, rel.stem, data_root / rel, data_root / "longvila_videos" / rel.name,
                                 data_root / "videos" / rel.name)],
                  options=[f"{k}. {t.strip()}" for k, t in zip(letters, texts)], problem_id=str(r["problem_id"]),
                  data_source="LongVideo-Reason", extra={"perspective": perspective})


def import_longvideoreason(path: Path, data_root: Path) -> LoadResult:
    """Samples from LongVideo-Reason's test.jsonl, and a Problem for each record that is not one."""
    return _import(path, data_root, "problem_id", longvideoreason_sample)


def is_longvideoreason_release(path: Path) -> bool:
    """The release writes `problem_type` too (the perspective); it has no `options` field."""
    for _, raw in read_records(path):
        return isinstance(raw, dict) and "options" not in raw and ("videos" in raw or "problem_type" not in raw)
    return False


def longvideoreason_labels(sample: Sample) -> dict[str, str]:
    """The reasoning perspective, when imported officially."""
    return {"perspective": str(sample.extra["perspective"])} if sample.extra.get("perspective") else {}


def official_format(response: str) -> bool:
    """Long-RL's `format_reward`: `<think>...</think>` then `<answer>...</answer>`, from the start."""
    return bool(_OFFICIAL_FORMAT.match(response or ""))


def longvideoreason_summary(name: str, rows: list[ResultRow]) -> Aggregate:
    """Accuracy, per perspective; `format_accuracy` as the official script reports it."""
    agg = accuracy(name, rows, ("perspective",))
    agg.metrics["format_accuracy"] = mean(float(official_format(r.response)) for r in rows)
    return _overall_only(agg, rows, ("perspective",), (
        "Accuracy overall only: these rows carry no reasoning perspective (EasyVideoR1's converted "
        "longvideoreason.json drops it). For the temporal / goal / spatial / plot breakdown, evaluate the "
        "release's test.jsonl (huggingface.co/datasets/LongVideo-Reason/longvideo-reason) under "
        "longvideo-reason/ in the data root or passed as the annotation file."))


_CONVERTED = "converted file from github.com/cyuQ1n/EasyVideoR1 eval/data/valid_data"

MINERVA = Benchmark(
    name="minerva", title="MINERVA", files=("minerva.json",),
    source="github.com/google-deepmind/neptune minerva.json (question types, skills, split, category; "
           f"the release and the converted file share the name), or the {_CONVERTED} (overall only)",
    breakdowns=MINERVA_LABELS, labels=minerva_labels, summarize=minerva_summary,
    estimands=multi_label_estimands("skill", MULTI_SEP), importer=import_minerva)
LONGVIDEOREASON = Benchmark(
    name="longvideoreason", title="LongVideo-Reason",
    files=("longvideo-reason/test.jsonl", "longvideoreason.json"),
    source="huggingface.co/datasets/LongVideo-Reason/longvideo-reason test.jsonl (perspectives; "
           f"github.com/NVlabs/Long-RL eval/eval.py), or the {_CONVERTED} (overall only)",
    breakdowns=("perspective",), labels=longvideoreason_labels, summarize=longvideoreason_summary,
    importer=import_longvideoreason, official_layout=is_longvideoreason_release)
