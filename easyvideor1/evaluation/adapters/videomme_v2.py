"""Video-MME-v2: groups of 4 related questions per video, scored non-linearly per group.

Official release (huggingface.co/datasets/MME-Benchmarks/Video-MME-v2): `test.parquet`, 3,200
rows, 4 per video, columns `video_id`, `question`, `options`, `answer` (a letter A-H),
`level` (1-3), `group_type` (`relevance` | `logic`), `group_structure`, `second_head`,
`third_head`; videos `videos/<video_id>.mp4`. Scoring as the official
`evaluation/test_video_mme_v2.py` (github.com/MME-Benchmarks/Video-MME-v2):
- rows i, i+1, i+2, i+3 (i a multiple of 4, file order) form a group;
- consistency (`relevance`) groups score (correct/4)^2;
- coherence (`logic`) groups score by the length of the leading run of correct answers
  (first-error truncation), with the structure's table: [1,2,3,4] -> k^2/16;
  [1,[2,3],4] -> 0, 1/12, 4/12, 7/12, 1 (questions 2 and 3 are parallel: q1 right, q2 wrong,
  q3 right counts as two); [[1,2],3,4] -> 0, 1/10, 2/10, 5/10, 1 (q1 wrong, q2 right counts
  as one);
- Non-Lin score = mean over groups; also per level and per second/third-level head; the
  linear per-question accuracy is reported as `avg_accuracy`.
A group missing some of its rows (an unfinished run) scores its missing questions as wrong.
A converted file in the sample schema works too if each record carries the group fields
above plus `group` (the group id) and `position` (0-3, the question's place in its group).
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

from easyvideor1.data.loading import DataError
from easyvideor1.evaluation.adapters.base import Benchmark
from easyvideor1.evaluation.aggregate import (
    Aggregate,
    CategoryScore,
    cluster_of,
    failed_count,
    mean,
)
from easyvideor1.evaluation.bootstrap import Estimand, unit_mean
from easyvideor1.evaluation.results import ResultRow
from easyvideor1.records import Sample

GROUP_SIZE = 4
LOGIC_TABLES = {
    "[1, 2, 3, 4]": (0.0, 1 / 16, 4 / 16, 9 / 16, 1.0),
    "[1, [2, 3], 4]": (0.0, 1 / 12, 4 / 12, 7 / 12, 1.0),
    "[[1, 2], 3, 4]": (0.0, 1 / 10, 2 / 10, 5 / 10, 1.0),
}
GROUP_FIELDS = ("level", "group_type", "group_structure", "second_head", "third_head")


def relevance_score(correct: list[bool]) -> float:
    """Consistency group: (number correct / 4) squared."""
    return (sum(correct) / GROUP_SIZE) ** 2


def logic_score(correct: list[bool], structure: str) -> float:
    """Coherence group: table value at the length of the leading run of correct answers."""
    key = str(ast.literal_eval(structure)) if isinstance(structure, str) else str(structure)
    if key not in LOGIC_TABLES:
        raise ValueError(f"unknown Video-MME-v2 group_structure {structure!r}; known: {', '.join(LOGIC_TABLES)}")
    run = 0
    while run < len(correct) and correct[run]:
        run += 1
    if key == "[1, [2, 3], 4]" and run == 1 and len(correct) > 2 and correct[2]:
        run = 2
    elif key == "[[1, 2], 3, 4]" and run == 0 and len(correct) > 1 and correct[1]:
        run = 1
    return LOGIC_TABLES[key][run]


def _options(value: object) -> list[str]:
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return [line.strip() for line in value.splitlines() if line.strip()]
    return [str(v) for v in list(value)]  # list, tuple or numpy array


def _text(value: object) -> str:
    """A parquet cell as text: None -> "", 1.0 -> "1" (levels may be stored as floats)."""
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def import_videomme_v2(path: Path, data_root: Path) -> list[Sample]:
    """Samples from the official `test.parquet` (group = file position // 4)."""
    import pyarrow.parquet as pq

    rows = pq.read_table(path).to_pylist()
    samples = []
    for i, r in enumerate(rows):
        missing = [k for k in ("video_id", "question", "options", "answer", "group_type") if k not in r]
        if missing:
            raise DataError(f"{path} row {i}: missing {', '.join(missing)}; is this Video-MME-v2's test.parquet?")
        vid = str(r["video_id"])
        video = data_root / "videos" / f"{vid}.mp4"
        extra = {k: _text(r.get(k)) for k in GROUP_FIELDS}
        extra.update(group=str(i // GROUP_SIZE), position=str(i % GROUP_SIZE), video_id=vid)
        samples.append(Sample(
            problem=str(r["question"]), answer=str(r["answer"]).strip(), problem_type="multiple choice",
            data_type="video", videos=[os.path.normpath(video if video.exists() else data_root / f"{vid}.mp4")],
            options=_options(r["options"]), problem_id=str(i), data_source="Video-MME-v2", extra=extra))
    return samples


def videomme_v2_labels(sample: Sample) -> dict[str, str]:
    """Group id, position in the group and the group's fields (not reported as tables)."""
    keys = ("group", "position", *GROUP_FIELDS)
    return {k: str(sample.extra[k]) for k in keys if sample.extra.get(k) not in (None, "")}


def group_scores(rows: list[ResultRow]) -> list[tuple[str, ResultRow, float]]:
    """(group id, a member row, the group's score) per group, in first-seen order."""
    groups: dict[str, dict[int, ResultRow]] = {}
    for r in rows:
        groups.setdefault(r.labels.get("group", r.id), {})[int(r.labels.get("position", 0))] = r
    scored = []
    for group, members in groups.items():
        correct = [members[p].score == 1.0 if p in members else False for p in range(GROUP_SIZE)]
        first = next(iter(members.values()))
        if first.labels.get("group_type") == "logic":
            value = logic_score(correct, first.labels.get("group_structure", "[1, 2, 3, 4]"))
        else:
            value = relevance_score(correct)
        scored.append((group, first, value))
    return scored


def videomme_v2_summary(name: str, rows: list[ResultRow]) -> Aggregate:
    """Non-Lin score (mean group score); per level, group type and heads."""
    scored = [(first.labels, value) for _, first, value in group_scores(rows)]

    def table(key: str) -> dict[str, CategoryScore]:
        out: dict[str, list[float]] = {}
        for info, value in scored:
            if info.get(key):
                out.setdefault(info[key], []).append(value)
        return {k: CategoryScore(score=mean(v), count=len(v)) for k, v in sorted(out.items())}

    relevance = [v for info, v in scored if info.get("group_type") != "logic"]
    logic = [v for info, v in scored if info.get("group_type") == "logic"]
    metrics = {"avg_accuracy": mean(r.score for r in rows), "relevance_score": mean(relevance),
               "logic_score": mean(logic)}
    return Aggregate(benchmark=name, metric="Non-Lin score (mean over groups)",
                     overall=mean(v for _, v in scored), count=len(rows), failed=failed_count(rows),
                     metrics=metrics, categories={"level": table("level"), "second_head": table("second_head"),
                                                  "third_head": table("third_head")})


def videomme_v2_estimands(rows: list[ResultRow]) -> dict[str, Estimand]:
    """Units are the groups (scored as a whole), clustered by their video; so are the tables'."""
    scored = group_scores(rows)

    def groups_mean(picked: list[tuple[str, ResultRow, float]]) -> Estimand:
        return unit_mean([f"group:{g}" for g, _, _ in picked], [v for _, _, v in picked],
                         [cluster_of(first) for _, first, _ in picked])

    cells = {}
    for key in ("level", "second_head", "third_head"):
        for value in sorted({first.labels[key] for _, first, _ in scored if first.labels.get(key)}):
            cells[f"{key}={value}"] = groups_mean([s for s in scored if s[1].labels.get(key) == value])
    return {"overall": groups_mean(scored), **cells}


VIDEOMME_V2 = Benchmark(
    name="videomme_v2", title="Video-MME-v2", files=("videomme_v2.json", "videomme_v2.jsonl", "test.parquet"),
    source="huggingface.co/datasets/MME-Benchmarks/Video-MME-v2 test.parquet; scoring as "
           "github.com/MME-Benchmarks/Video-MME-v2 evaluation/test_video_mme_v2.py",
    breakdowns=("level", "second_head", "third_head"), labels=videomme_v2_labels,
    summarize=videomme_v2_summary, estimands=videomme_v2_estimands, importer=import_videomme_v2)
