"""VideoMathQA: MCQ accuracy and multi-binary (MBin) accuracy, by category and video length.

Official metrics (github.com/mbzuai-oryx/VideoMathQA): each of the 420 questions is asked
once with five options (MCQ) and as four two-option variants (MBin); a question counts as
correct under MBin only when all its binary variants are answered correctly.

The converted file (`videomathqa.jsonl`) holds both: MCQ records have no `mbinary_id`, binary
records do, and share the MCQ record's `problem_id` (the loader appends `#2`, `#3`, ... to
repeated ids and keeps the original in `extra["original_problem_id"]`, which groups them).
The headline is MCQ accuracy; MBin accuracy is a metric; the category and length tables are
over the MCQ records.
"""

from __future__ import annotations

from easyvideor1.evaluation.adapters.base import Benchmark
from easyvideor1.evaluation.aggregate import Aggregate, by_label, failed_count, label_means, mean, row_mean
from easyvideor1.evaluation.bootstrap import Estimand
from easyvideor1.evaluation.results import ResultRow
from easyvideor1.records import Sample


def videomathqa_labels(sample: Sample) -> dict[str, str]:
    """Format (mcq / mbin), question group, category and length."""
    labels = {"format": "mbin" if sample.extra.get("mbinary_id") is not None else "mcq",
              "question": str(sample.extra.get("original_problem_id", sample.problem_id))}
    for key in ("category", "length"):
        if sample.extra.get(key):
            labels[key] = str(sample.extra[key])
    return labels


def mcq_rows(rows: list[ResultRow]) -> list[ResultRow]:
    """The five-option records (the headline's and the tables' rows)."""
    return [r for r in rows if r.labels.get("format") == "mcq"]


def videomathqa_summary(name: str, rows: list[ResultRow]) -> Aggregate:
    """MCQ accuracy headline; MBin = share of questions with every binary variant right."""
    mcq = mcq_rows(rows)
    groups: dict[str, list[ResultRow]] = {}
    for r in rows:
        if r.labels.get("format") == "mbin":
            groups.setdefault(r.labels.get("question", r.id), []).append(r)
    mbin = mean(1.0 if all(r.score == 1.0 for r in g) else 0.0 for g in groups.values())
    return Aggregate(benchmark=name, metric="MCQ accuracy", overall=mean(r.score for r in mcq),
                     count=len(rows), failed=failed_count(rows),
                     metrics={"mbin": mbin, "micro": mean(r.score for r in rows)},
                     categories={"category": by_label(mcq, "category"), "length": by_label(mcq, "length")})


def videomathqa_estimands(rows: list[ResultRow]) -> dict[str, Estimand]:
    """The headline and the tables are over the MCQ records only."""
    mcq = mcq_rows(rows)
    cells = {f"{key}={k}": e for key in ("category", "length") for k, e in label_means(mcq, key).items()}
    return {"overall": row_mean(mcq), **cells}


VIDEOMATHQA = Benchmark(
    name="videomathqa", title="VideoMathQA", files=("videomathqa.jsonl",),
    source="converted file from github.com/cyuQ1n/EasyVideoR1; metrics as mbzuai-oryx/VideoMathQA",
    breakdowns=("category", "length"), labels=videomathqa_labels, summarize=videomathqa_summary,
    estimands=videomathqa_estimands)
