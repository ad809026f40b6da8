"""Compare two results folders: per-benchmark deltas with paired tests, in the paper's Figure 2 layout.

    easyvideor1 report RESULTS_DIR --compare OTHER_DIR [--label A_NAME B_NAME]
                                                            (A = RESULTS_DIR, B = OTHER_DIR)

delta = score(A) - score(B), in points, per benchmark present in both (and per category in the
JSON). Per benchmark, a paired cluster bootstrap over the sample ids both runs scored
(bootstrap.paired) gives the difference's 95% interval, a two-sided p-value and a verdict:
"A better" / "B better" when p < 0.05 (shown as "<A_NAME> better"), else "no significant
difference" ("not tested" with fewer than 10 shared video clusters, or a score that is not a
mean of per-sample scores). The two folders must share their protocol (every stored setting but
the model path): otherwise the comparison is refused with the differing settings. The runs are
named by --label, else by their folders' names (`default_labels`).

Outputs (in RESULTS_DIR unless --out): compare.md (table: A, B, delta), compare.json,
compare.png (paired bars per benchmark, A then B, on a 0-100 axis with 95% error bars; a bar at 0
is marked on the axis; the delta is written above each pair: green when A is significantly
better, red when B is, grey otherwise).
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


def default_labels(results_dir: str | os.PathLike, other_dir: str | os.PathLike) -> tuple[str, str]:
    """The two folders' names (`eval-trained`, `eval-base`); where they are equal, with as many
    parent folders as it takes to tell them apart (`a/eval`, `b/eval`)."""
    a, b = Path(results_dir).resolve().parts, Path(other_dir).resolve().parts
    for k in range(1, max(len(a), len(b)) + 1):
        la, lb = "/".join(a[-k:]).lstrip("/") or "/", "/".join(b[-k:]).lstrip("/") or "/"
        if la != lb:
            return la, lb
    return f"{a[-1] if a else '/'} (A)", f"{b[-1] if b else '/'} (B)"  # one folder compared with itself


def verdict_text(test: PairedTest | None, labels: tuple[str, str]) -> str:
    """The test's verdict with the runs' names: "A better" -> "<A_NAME> better"."""
    if test is None:
        return "-"
    return {"A better": f"{labels[0]} better", "B better": f"{labels[1]} better"}.get(test.verdict, test.verdict)


def compare_markdown(this: RunSummary, other: RunSummary, deltas: list[Delta], labels: tuple[str, str]) -> str:
    """Table: benchmark | A | B | delta | paired CI | p | verdict; then notes."""
    la, lb = labels
    lines = [f"# {la} vs {lb}", "",
             f"A = {la} (model {this.model}, `{this.results_dir}`), B = {lb} (model {other.model}, "
             f"`{other.results_dir}`); Δ = A - B in points.",
             "", f"| Benchmark | {la} | {lb} | Δ | 95% CI of Δ | p | Verdict |",
             "|---|---|---|---|---|---|---|"]
    partial = []
    for d in deltas:
        t = d.test
        ci = f"{100 * t.low:+.1f} to {100 * t.high:+.1f}" if t and t.low is not None else "-"
        p = f"{t.p_value:.3f}" if t and t.p_value is not None else "-"
        lines.append(f"| {d.title} | {pct(d.this)} | {pct(d.other)} | {100 * d.delta:+.1f} | {ci} | {p} | "
                     f"{verdict_text(t, labels)} |")
        if t and t.delta is not None and abs(t.delta - d.delta) > 1e-9:
            partial.append(f"{d.title} ({t.shared} shared, Δ {100 * t.delta:+.1f})")
    if deltas:
        mean_other = sum(d.other for d in deltas) / len(deltas)
        mean_this = sum(d.this for d in deltas) / len(deltas)
        lines.append(f"| **Average** | {pct(mean_this)} | {pct(mean_other)} | {100 * (mean_this - mean_other):+.1f} "
                     "| | | |")
    lines += ["", f"Paired test: {METHOD}, over the sample ids both runs scored, the same resampled videos for "
              f"A and B. Verdict: {la} or {lb} better when p < {1 - LEVEL:.2f} (the CI of Δ then excludes 0); "
              f"not tested with fewer than {MIN_CLUSTERS} shared clusters. Testing k benchmarks at "
              f"{1 - LEVEL:.2f}, about k/20 verdicts of \"better\" are expected by chance when nothing changed."]
    if partial:
        lines += ["", "The runs do not share every sample; their test (and its Δ) covers the shared ones: "
                  + "; ".join(partial)]
    only = sorted(set(this.aggregates) ^ set(other.aggregates))
    if only:
        lines += ["", "Not in both runs (not compared): " + ", ".join(only)]
    return "\n".join(lines) + "\n"


ZERO_MARK = 1.0  # points: a bar lower than this gets a mark on the axis, so a score of 0 is seen


def compare_chart(this: RunSummary, other: RunSummary, deltas: list[Delta], path: str | os.PathLike,
                  labels: tuple[str, str]):
    """Paired bars per benchmark, A then B, each with its value, and the delta above each pair
    (Figure 2 layout); returns the matplotlib Figure (also saved to `path`)."""
    from matplotlib.figure import Figure

    n = len(deltas)
    fig = Figure(figsize=(max(6.0, 0.9 * n + 2), 4.8))
    ax = fig.add_subplot()
    xs = list(range(n))
    width = 0.38
    runs = ((this, [d.this for d in deltas], -width / 2, "#4C72B0", f"A: {labels[0]}"),
            (other, [d.other for d in deltas], width / 2, "#A6A6A6", f"B: {labels[1]}"))
    tops = [0.0] * n  # points: the highest bar, error bar or value label of each pair
    for run, values, shift, colour, label in runs:
        heights = [100 * v for v in values]
        yerr = error_bars(run.aggregates[d.benchmark] for d in deltas)
        bars = ax.bar([x + shift for x in xs], heights, width, label=label, color=colour, edgecolor="#333333",
                      linewidth=0.6, yerr=yerr, ecolor="#222222", capsize=2)
        ax.bar_label(bars, labels=[f"{h:.1f}" for h in heights], fontsize=7, padding=2)
        for x, h, above in zip(xs, heights, yerr[1]):
            if h < ZERO_MARK:  # a thick stub on the axis in the run's colour: the bar is there, at 0
                ax.hlines(0, x + shift - width / 2, x + shift + width / 2, colors=colour, linewidth=4,
                          zorder=5, clip_on=False, gid="zero-mark")
            tops[x] = max(tops[x], h + above + 6)  # the value label (7 pt) is about 6 points high
    for x, d, top in zip(xs, deltas, tops):
        verdict = d.test.verdict if d.test else ""
        color = "#2E7D32" if verdict == "A better" else "#C62828" if verdict == "B better" else "#555555"
        # a bracket over both bars of the pair, the delta above its middle
        ax.plot([x - width / 2, x - width / 2, x + width / 2, x + width / 2], [top, top + 2, top + 2, top],
                color=color, linewidth=0.8, gid="delta-bracket")
        ax.text(x, top + 3, f"{100 * d.delta:+.1f}", ha="center", va="bottom", fontsize=8, color=color,
                fontweight="bold", gid="delta")
    ax.set_xticks(xs, [d.title for d in deltas], rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("score (%)")
    ax.set_title("error bars: 95% CI; Δ = A - B, green/red: significant (paired test)", fontsize=9)
    ax.set_ylim(0, max([100.0, *tops]) + 12)  # room for the brackets and deltas above a score of 100
    ax.set_yticks(range(0, 101, 20))
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return fig


def compare_json(this: RunSummary, other: RunSummary, deltas: list[Delta], labels: tuple[str, str]) -> dict[str, Any]:
    """Machine-readable comparison: benchmark deltas with their paired tests (verdict "A better" /
    "B better" / ..., A and B named in "this" / "other"), category deltas."""

    def rows(ds: list[Delta]) -> list[dict[str, Any]]:
        return [{**asdict(d), "delta": d.delta, "verdict": verdict_text(d.test, labels) if d.test else None}
                for d in ds]

    return {"this": {"label": labels[0], "model": this.model, "results_dir": this.results_dir},
            "other": {"label": labels[1], "model": other.model, "results_dir": other.results_dir},
            "test": {"method": "paired " + METHOD, "level": LEVEL, "min_clusters": MIN_CLUSTERS,
                     "delta": f"A - B, A = this ({labels[0]}), B = other ({labels[1]})"},
            "benchmarks": rows(deltas),
            "categories": rows(category_deltas(this, other))}


def write_comparison(results_dir: str | os.PathLike, other_dir: str | os.PathLike,
                     out_dir: str | os.PathLike | None = None, labels: tuple[str, str] | None = None) -> list[Path]:
    """Check the protocols match, then write compare.md, compare.json, compare.png. `labels`: the
    names of A (`results_dir`) and B (`other_dir`) in every output; default `default_labels`."""
    labels = tuple(labels) if labels else default_labels(results_dir, other_dir)
    if labels[0] == labels[1]:
        raise ValueError(f"--label {labels[0]} {labels[1]}: give the two runs different names")
    check_comparable(results_dir, other_dir)
    this, other = summarize_run(results_dir), summarize_run(other_dir)
    deltas = benchmark_deltas(this, other)
    if not deltas:
        raise ValueError(f"{results_dir} and {other_dir} have no benchmark in common")
    out = Path(out_dir or results_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, js, png = out / "compare.md", out / "compare.json", out / "compare.png"
    md.write_text(compare_markdown(this, other, deltas, labels), encoding="utf-8")
    js.write_text(json.dumps(compare_json(this, other, deltas, labels), indent=2) + "\n", encoding="utf-8")
    compare_chart(this, other, deltas, png, labels)
    return [md, js, png]
