"""Compare two results folders: per-benchmark deltas with paired tests, in the paper's Figure 2 layout.

    easyvideor1 report RESULTS_DIR --compare OTHER_DIR      (A = RESULTS_DIR, B = OTHER_DIR)

delta = score(A) - score(B), in points, per benchmark present in both (and per category in the
JSON). Per benchmark, a paired cluster bootstrap over the sample ids both runs scored
(bootstrap.paired) gives the difference's 95% interval, a two-sided p-value and a verdict:
"A better" / "B better" when p < 0.05, else "no significant difference" ("not tested" with
fewer than 10 shared video clusters, or a score that is not a mean of per-sample scores). The
two folders must share their protocol (every stored setting but the model path): otherwise
the comparison is refused with the differing settings.

Outputs (in RESULTS_DIR unless --out): compare.md (table), compare.json, compare.png (paired
bars per benchmark, OTHER_DIR then RESULTS_DIR, with 95% error bars and the delta written above
each pair: green when A is significantly better, red when B is, grey otherwise).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from easyvideor1.evaluation.bootstrap import LEVEL, METHOD, MIN_CLUSTERS, PairedTest, paired
from easyvideor1.evaluation.report import RunSummary, error_bars, pct, summarize_run
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
    test: PairedTest | None = None
    """The paired test over the shared sample ids (benchmark rows only)."""

    @property
    def delta(self) -> float:
        """this - other, in [-1, 1]."""
        return self.this - self.other


def benchmark_deltas(this: RunSummary, other: RunSummary) -> list[Delta]:
    """Headline deltas for the benchmarks present in both runs (RESULTS_DIR's order)."""
    return [Delta(k, this.titles[k], a.overall, other.aggregates[k].overall, paired_test(this, other, k))
            for k, a in this.aggregates.items() if k in other.aggregates]


def paired_test(this: RunSummary, other: RunSummary, key: str) -> PairedTest:
    """A (this) minus B (other) on benchmark `key`, paired over the shared sample ids."""
    a, b = this.estimands.get(key), other.estimands.get(key)
    if a is None or b is None:
        return PairedTest(None, None, None, None, 0, 0, "not tested: the score is not a mean of per-sample scores")
    return paired(a, b)


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
    """Table: benchmark | B | A | delta | paired CI | p | verdict; then notes."""
    lines = [f"# {this.model} vs {other.model}", "",
             f"A = {this.model} (`{this.results_dir}`), B = {other.model} (`{other.results_dir}`); "
             "Δ = A - B in points.",
             "", f"| Benchmark | {other.model} | {this.model} | Δ | 95% CI of Δ | p | Verdict |",
             "|---|---|---|---|---|---|---|"]
    partial = []
    for d in deltas:
        t = d.test
        ci = f"{100 * t.low:+.1f} to {100 * t.high:+.1f}" if t and t.low is not None else "-"
        p = f"{t.p_value:.3f}" if t and t.p_value is not None else "-"
        lines.append(f"| {d.title} | {pct(d.other)} | {pct(d.this)} | {100 * d.delta:+.1f} | {ci} | {p} | "
                     f"{t.verdict if t else '-'} |")
        if t and t.delta is not None and abs(t.delta - d.delta) > 1e-9:
            partial.append(f"{d.title} ({t.shared} shared, Δ {100 * t.delta:+.1f})")
    if deltas:
        mean_other = sum(d.other for d in deltas) / len(deltas)
        mean_this = sum(d.this for d in deltas) / len(deltas)
        lines.append(f"| **Average** | {pct(mean_other)} | {pct(mean_this)} | {100 * (mean_this - mean_other):+.1f} "
                     "| | | |")
    lines += ["", f"Paired test: {METHOD}, over the sample ids both runs scored, the same resampled videos for "
              f"A and B. Verdict: A or B better when p < {1 - LEVEL:.2f} (the CI of Δ then excludes 0); "
              f"not tested with fewer than {MIN_CLUSTERS} shared clusters. Testing k benchmarks at "
              f"{1 - LEVEL:.2f}, about k/20 verdicts of \"better\" are expected by chance when nothing changed."]
    if partial:
        lines += ["", "The runs do not share every sample; their test (and its Δ) covers the shared ones: "
                  + "; ".join(partial)]
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
    bars = {"ecolor": "#222222", "capsize": 2}
    ax.bar([x - width / 2 for x in xs], [100 * d.other for d in deltas], width, label=f"B: {other.model}",
           color="#A6A6A6", yerr=error_bars(other.aggregates[d.benchmark] for d in deltas), **bars)
    ax.bar([x + width / 2 for x in xs], [100 * d.this for d in deltas], width, label=f"A: {this.model}",
           color="#4C72B0", yerr=error_bars(this.aggregates[d.benchmark] for d in deltas), **bars)
    for x, d in zip(xs, deltas):
        cis = (this.aggregates[d.benchmark].ci, other.aggregates[d.benchmark].ci)
        top = 100 * max([d.this, d.other, *(c.high for c in cis if c is not None and c.high is not None)])
        verdict = d.test.verdict if d.test else ""
        color = "#2E7D32" if verdict == "A better" else "#C62828" if verdict == "B better" else "#555555"
        ax.annotate(f"{100 * d.delta:+.1f}", (x, top), xytext=(0, 3), textcoords="offset points",
                    ha="center", fontsize=8, color=color, fontweight="bold")
    ax.set_xticks(xs, [d.title for d in deltas], rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("score (%)")
    ax.set_title("error bars: 95% CI; Δ green/red: significant (paired test)", fontsize=9)
    peak = max([100.0] + [100 * max(d.this, d.other) for d in deltas])
    ax.set_ylim(0, peak * 1.12)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def compare_json(this: RunSummary, other: RunSummary, deltas: list[Delta]) -> dict[str, Any]:
    """Machine-readable comparison: benchmark deltas with their paired tests, category deltas."""

    def rows(ds: list[Delta]) -> list[dict[str, Any]]:
        return [{**asdict(d), "delta": d.delta} for d in ds]

    return {"this": {"model": this.model, "results_dir": this.results_dir},
            "other": {"model": other.model, "results_dir": other.results_dir},
            "test": {"method": "paired " + METHOD, "level": LEVEL, "min_clusters": MIN_CLUSTERS,
                     "delta": "A - B, A = this, B = other"},
            "benchmarks": rows(deltas),
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
    js.write_text(json.dumps(compare_json(this, other, deltas), indent=2) + "\n", encoding="utf-8")
    compare_chart(this, other, deltas, png)
    return [md, js, png]
