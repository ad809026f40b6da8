"""Benchmark summaries: the `Aggregate` record and the averaging helpers adapters build on.

Every mean here runs over all rows, failed ones included with score 0: a sample that could
not be loaded or generated counts against the model, as in the official scripts that score
an empty prediction as wrong. Scores stay in [0, 1]; reports multiply by 100.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from easyvideor1.evaluation.results import ResultRow


@dataclass
class CategoryScore:
    """Mean score of the rows carrying one label value."""

    score: float
    """Mean score in [0, 1] (failed rows count as 0)."""
    count: int
    """Rows with this label value."""
    failed: int = 0
    """How many of them failed."""


@dataclass
class Aggregate:
    """A benchmark's summary: the headline number, further metrics, and breakdowns."""

    benchmark: str
    """Registry name (or `file-<stem>` for a file benchmark)."""
    metric: str
    """What `overall` is, in words (e.g. "accuracy", "mIoU", "mean of task scores")."""
    overall: float
    """Headline score in [0, 1]."""
    count: int
    """Rows aggregated."""
    failed: int
    """Failed rows among them (scored 0)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Further official numbers in [0, 1] (e.g. R@0.5, MC accuracy, MRA)."""
    categories: dict[str, dict[str, CategoryScore]] = field(default_factory=dict)
    """Breakdown name -> label value -> score."""
    notes: list[str] = field(default_factory=list)
    """What a reader comparing with published numbers must know (e.g. a fallback metric)."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Aggregate:
        """Inverse of `to_dict`."""
        cats = {name: {k: CategoryScore(**v) for k, v in table.items()}
                for name, table in d.get("categories", {}).items()}
        return cls(benchmark=d["benchmark"], metric=d["metric"], overall=d["overall"],
                   count=d["count"], failed=d["failed"], metrics=dict(d.get("metrics", {})),
                   categories=cats, notes=list(d.get("notes", [])))


def mean(values: Iterable[float]) -> float:
    """Arithmetic mean; 0.0 for no values (an empty benchmark scores 0, not NaN)."""
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def by_label(rows: list[ResultRow], label: str,
             value: Callable[[ResultRow], float] = lambda r: r.score) -> dict[str, CategoryScore]:
    """Mean of `value` per value of `rows[i].labels[label]` (rows without the label are skipped),
    sorted by label."""
    groups: dict[str, list[ResultRow]] = {}
    for row in rows:
        if label in row.labels:
            groups.setdefault(str(row.labels[label]), []).append(row)
    return {k: CategoryScore(score=mean(value(r) for r in g), count=len(g),
                             failed=sum(r.status == "failed" for r in g))
            for k, g in sorted(groups.items())}


def by_labels(rows: list[ResultRow], label: str, sep: str) -> dict[str, CategoryScore]:
    """Like `by_label` for multi-valued labels (`"a|b"` with sep "|"): a row counts once in
    each of its values (LVBench's question types), sorted by value."""
    groups: dict[str, list[ResultRow]] = {}
    for row in rows:
        for value in str(row.labels.get(label, "")).split(sep):
            if value:
                groups.setdefault(value, []).append(row)
    return {k: CategoryScore(score=mean(r.score for r in g), count=len(g),
                             failed=sum(r.status == "failed" for r in g))
            for k, g in sorted(groups.items())}


def macro(table: dict[str, CategoryScore]) -> float:
    """Unweighted mean of the category scores (each category counts once)."""
    return mean(c.score for c in table.values())


def failed_count(rows: list[ResultRow]) -> int:
    """Rows with status `failed`."""
    return sum(r.status == "failed" for r in rows)


def accuracy(name: str, rows: list[ResultRow], breakdowns: tuple[str, ...] = ()) -> Aggregate:
    """The default summary: mean score over all rows, plus a table per breakdown label."""
    return Aggregate(benchmark=name, metric="accuracy", overall=mean(r.score for r in rows),
                     count=len(rows), failed=failed_count(rows),
                     categories={b: by_label(rows, b) for b in breakdowns})


def macro_over(name: str, rows: list[ResultRow], label: str, breakdowns: tuple[str, ...] = ()) -> Aggregate:
    """Headline = unweighted mean over the values of `label` (e.g. MVBench's mean of task
    accuracies); the plain mean over rows is kept as metric `micro`."""
    agg = accuracy(name, rows, tuple(dict.fromkeys((label, *breakdowns))))
    agg.metric = f"mean of {label} scores"
    agg.metrics["micro"] = agg.overall
    agg.overall = macro(agg.categories[label])
    return agg
