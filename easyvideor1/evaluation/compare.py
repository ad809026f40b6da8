"""Compare two results folders: per-benchmark deltas, in the paper's Figure 2 layout.

    easyvideor1 report RESULTS_DIR --compare OTHER_DIR

delta = score(RESULTS_DIR) - score(OTHER_DIR), in points, per benchmark present in both (and
per category in the JSON). The two folders must share their protocol (every stored setting
but the model path): otherwise the comparison is refused with the differing settings.

Outputs (in RESULTS_DIR unless --out): compare.md (table), compare.json, compare.png (paired
bars per benchmark, OTHER_DIR then RESULTS_DIR, with the delta written above each pair:
green when RESULTS_DIR is better, red when worse).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from easyvideor1.evaluation.report import RunSummary, pct, summarize_run
from easyvideor1.evaluation.results import check_comparable


@dataclass
class Delta:
    """One benchmark (or one category of it) in both runs."""

    benchmark: str
    """Benchmark key (results file stem)."""
    title: str
    """Display name (with the category when there is one)."""
    this: float
    """Score of RESULTS_DIR, in [0, 1]."""
    other: float
    """Score of OTHER_DIR, in [0, 1]."""

    @property
    def delta(self) -> float:
        """this - other, in [-1, 1]."""
        return self.this - self.other


def benchmark_deltas(this: RunSummary, other: RunSummary) -> list[Delta]:
    """Headline deltas for the benchmarks present in both runs (RESULTS_DIR's order)."""
    return [Delta(k, this.titles[k], a.overall, other.aggregates[k].overall)
            for k, a in this.aggregates.items() if k in other.aggregates]


def category_deltas(this: RunSummary, other: RunSummary) -> list[Delta]:
    """Deltas of every breakdown category present in both runs."""
    out = []
    for key, agg in this.aggregates.items():
        if key not in other.aggregates:
            continue
        for name, table in agg.categories.items():
            theirs = other.aggregates[key].categories.get(name, {})
            for label, score in table.items():
                if label in theirs:
                    out.append(Delta(key, f"{this.titles[key]} / {name}={label}", score.score, theirs[label].score))
    return out


def compare_markdown(this: RunSummary, other: RunSummary, deltas: list[Delta]) -> str:
    """Table: benchmark | OTHER | THIS | delta; then the benchmarks only one run has."""
    lines = [f"# {this.model} vs {other.model}", "",
             f"| Benchmark | {other.model} | {this.model} | Δ |", "|---|---|---|---|"]
    for d in deltas:
        lines.append(f"| {d.title} | {pct(d.other)} | {pct(d.this)} | {100 * d.delta:+.1f} |")
    if deltas:
        mean_other = sum(d.other for d in deltas) / len(deltas)
        mean_this = sum(d.this for d in deltas) / len(deltas)
        lines.append(f"| **Average** | {pct(mean_other)} | {pct(mean_this)} | {100 * (mean_this - mean_other):+.1f} |")
    only = sorted(set(this.aggregates) ^ set(other.aggregates))
    if only:
        lines += ["", "Not in both runs (not compared): " + ", ".join(only)]
    return "\n".join(lines) + "\n"


def compare_chart(this: RunSummary, other: RunSummary, deltas: list[Delta], path: str | os.PathLike) -> None:
    """Paired bars per benchmark with the delta above each pair (Figure 2 layout)."""
    from matplotlib.figure import Figure

    n = len(deltas)
    fig = Figure(figsize=(max(6.0, 0.8 * n + 2), 4.8))
    ax = fig.add_subplot()
    xs = list(range(n))
    width = 0.38
    ax.bar([x - width / 2 for x in xs], [100 * d.other for d in deltas], width, label=other.model, color="#A6A6A6")
    ax.bar([x + width / 2 for x in xs], [100 * d.this for d in deltas], width, label=this.model, color="#4C72B0")
    for x, d in zip(xs, deltas):
        top = 100 * max(d.this, d.other)
        color = "#2E7D32" if d.delta > 0 else "#C62828" if d.delta < 0 else "#555555"
        ax.annotate(f"{100 * d.delta:+.1f}", (x, top), xytext=(0, 3), textcoords="offset points",
                    ha="center", fontsize=8, color=color, fontweight="bold")
    ax.set_xticks(xs, [d.title for d in deltas], rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("score (%)")
    peak = max([100.0] + [100 * max(d.this, d.other) for d in deltas])
    ax.set_ylim(0, peak * 1.12)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def compare_json(this: RunSummary, other: RunSummary) -> dict[str, Any]:
    """Machine-readable comparison: benchmark and category deltas."""

    def rows(ds: list[Delta]) -> list[dict[str, Any]]:
        return [{**asdict(d), "delta": d.delta} for d in ds]

    return {"this": {"model": this.model, "results_dir": this.results_dir},
            "other": {"model": other.model, "results_dir": other.results_dir},
            "benchmarks": rows(benchmark_deltas(this, other)),
            "categories": rows(category_deltas(this, other))}


def write_comparison(results_dir: str | os.PathLike, other_dir: str | os.PathLike,
                     out_dir: str | os.PathLike | None = None) -> list[Path]:
    """Check the protocols match, then write compare.md, compare.json, compare.png."""
    check_comparable(results_dir, other_dir)
    this, other = summarize_run(results_dir), summarize_run(other_dir)
    deltas = benchmark_deltas(this, other)
    if not deltas:
        raise ValueError(f"{results_dir} and {other_dir} have no benchmark in common")
    out = Path(out_dir or results_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, js, png = out / "compare.md", out / "compare.json", out / "compare.png"
    md.write_text(compare_markdown(this, other, deltas), encoding="utf-8")
    js.write_text(json.dumps(compare_json(this, other), indent=2) + "\n", encoding="utf-8")
    compare_chart(this, other, deltas, png)
    return [md, js, png]
