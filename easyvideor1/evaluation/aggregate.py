"""Benchmark summaries: the `Aggregate` record and the averaging helpers adapters build on.

Every mean here runs over all rows, failed ones included with score 0: a sample that could
not be loaded or generated counts against the model, as in the official scripts that score
an empty prediction as wrong. Scores stay in [0, 1]; reports multiply by 100.

`row_mean` and `label_means` write the same means as `Estimand`s (bootstrap.py), the form the
confidence intervals are computed from; a row's cluster is its video (`cluster_of`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from easyvideor1.evaluation.bootstrap import Estimand, ScoreInterval, macro, unit_mean
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
    ci: ScoreInterval | None = None
    """95% confidence interval of `score` (added by the report; intervals.py)."""


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
    ci: ScoreInterval | None = None
    """95% confidence interval of `overall` (added by the report; intervals.py)."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Aggregate:
        """Inverse of `to_dict`."""
        def ci(v: dict[str, Any] | None) -> ScoreInterval | None:
            return ScoreInterval(**v) if v else None

        cats = {name: {k: CategoryScore(**{**v, "ci": ci(v.get("ci"))}) for k, v in table.items()}
                for name, table in d.get("categories", {}).items()}
        return cls(benchmark=d["benchmark"], metric=d["metric"], overall=d["overall"],
                   count=d["count"], failed=d["failed"], metrics=dict(d.get("metrics", {})),
                   categories=cats, notes=list(d.get("notes", [])), ci=ci(d.get("ci")))


def mean(values: Iterable[float]) -> float:
    """Arithmetic mean; 0.0 for no values (an empty benchmark scores 0, not NaN)."""
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def groups_of(rows: list[ResultRow], label: str, sep: str | None = None) -> dict[str, list[ResultRow]]:
    """Rows per value of `rows[i].labels[label]`, sorted by value (rows without the label are
    skipped); with `sep`, a multi-valued label (`"a|b"`) puts its row in each of its values."""
    groups: dict[str, list[ResultRow]] = {}
    for row in rows:
        if sep is None:
            if label in row.labels:
                groups.setdefault(str(row.labels[label]), []).append(row)
            continue
        for value in str(row.labels.get(label, "")).split(sep):
            if value:
                groups.setdefault(value, []).append(row)
    return dict(sorted(groups.items()))


def by_label(rows: list[ResultRow], label: str,
             value: Callable[[ResultRow], float] = lambda r: r.score) -> dict[str, CategoryScore]:
    """Mean of `value` per value of `rows[i].labels[label]` (rows without the label are skipped),
    sorted by label."""
    return {k: CategoryScore(score=mean(value(r) for r in g), count=len(g),
                             failed=sum(r.status == "failed" for r in g))
            for k, g in groups_of(rows, label).items()}


def by_labels(rows: list[ResultRow], label: str, sep: str) -> dict[str, CategoryScore]:
    """Like `by_label` for multi-valued labels (`"a|b"` with sep "|"): a row counts once in
    each of its values (LVBench's question types), sorted by value."""
    return {k: CategoryScore(score=mean(r.score for r in g), count=len(g),
                             failed=sum(r.status == "failed" for r in g))
            for k, g in groups_of(rows, label, sep).items()}


def macro_score(table: dict[str, CategoryScore]) -> float:
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
    agg.overall = macro_score(agg.categories[label])
    return agg


def cluster_of(row: ResultRow) -> str:
    """The row's cluster for intervals: its video, else the row alone."""
    return f"video:{row.video}" if row.video else f"sample:{row.id}"


def row_mean(rows: list[ResultRow]) -> Estimand:
    """The mean score of `rows` as an estimand (units: the rows; clusters: their videos)."""
    return unit_mean([r.id for r in rows], [r.score for r in rows], [cluster_of(r) for r in rows])


def label_means(rows: list[ResultRow], label: str, sep: str | None = None) -> dict[str, Estimand]:
    """`row_mean` per value of a label, as `by_label` (or with `sep`, `by_labels`) groups them."""
    return {k: row_mean(g) for k, g in groups_of(rows, label, sep).items()}


def macro_estimands(label: str) -> Callable[[list[ResultRow]], dict[str, Estimand]]:
    """`Benchmark.estimands` of a headline that is the mean over the values of `label` (as
    `macro_over`); rows without the label: none (the headline is then the plain mean)."""

    def estimands(rows: list[ResultRow]) -> dict[str, Estimand]:
        parts = label_means(rows, label)
        return {"overall": macro(parts)} if parts else {}

    return estimands


def multi_label_estimands(label: str, sep: str) -> Callable[[list[ResultRow]], dict[str, Estimand]]:
    """`Benchmark.estimands` of a `by_labels` table (a row in each of its values)."""

    def estimands(rows: list[ResultRow]) -> dict[str, Estimand]:
        return {f"{label}={k}": e for k, e in label_means(rows, label, sep).items()}

    return estimands
