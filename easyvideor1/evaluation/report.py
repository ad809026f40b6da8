"""Reports of one results folder: a Markdown table per benchmark and category, JSON, a bar chart.

    RESULTS_DIR/report.md     headline table, then per benchmark its metrics and breakdowns
    RESULTS_DIR/report.json   {"model", "settings_hash", "benchmarks": {name: Aggregate}}
    RESULTS_DIR/report.png    headline score per benchmark
    RESULTS_DIR/report.html   all of it on one page, with sample responses beside their frames
                              (html_report.py; thumbnails in report_files/)

Scores are shown as percentages with one decimal. Failed samples are counted in every
denominator and their number is shown next to each score. Every score and breakdown cell has
its 95% confidence interval (intervals.py: cluster bootstrap by video), or says "n too small"
(fewer than 10 videos) or "n/a" (not a mean of per-sample scores); the chart draws them as
error bars.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from easyvideor1.evaluation.adapters import BENCHMARKS, CROSS_METRICS, get_benchmark
from easyvideor1.evaluation.aggregate import Aggregate
from easyvideor1.evaluation.bootstrap import (
    LEVEL,
    METHOD,
    MIN_CLUSTERS,
    RESAMPLES,
    SEED,
    Estimand,
    ScoreInterval,
    interval_text,
)
from easyvideor1.evaluation.html_report import render
from easyvideor1.evaluation.intervals import add_intervals
from easyvideor1.evaluation.results import SETTINGS_FILE, read_results

log = logging.getLogger(__name__)


@dataclass
class RunSummary:
    """The aggregates of every benchmark in one results folder."""

    results_dir: str
    """The folder read."""
    model: str
    """Model name shown in tables (last part of the stored model path, else the folder name)."""
    settings_hash: str | None
    """Hash stored in settings.json (None when the folder has none)."""
    aggregates: dict[str, Aggregate] = field(default_factory=dict)
    """Benchmark (results file stem) -> its aggregate, in registry order (then file benchmarks)."""
    titles: dict[str, str] = field(default_factory=dict)
    """Benchmark -> display name."""
    estimands: dict[str, Estimand | None] = field(default_factory=dict)
    """Benchmark -> its headline score as an estimand (None: no interval), for paired tests."""
    tool_calls: dict[str, dict[str, float]] = field(default_factory=dict)
    """Benchmark -> its tool calls (`eval --tools`): calls, calls_per_response, errors; absent without."""


def summarize_run(results_dir: str | os.PathLike) -> RunSummary:
    """Aggregate every `<benchmark>.jsonl` of a results folder with its benchmark's rules."""
    root = Path(results_dir)
    settings_path = root / SETTINGS_FILE
    model, digest = root.name, None
    if settings_path.exists():
        stored = json.loads(settings_path.read_text(encoding="utf-8"))
        digest = stored.get("hash")
        model = Path(stored.get("settings", {}).get("model_path", "") or root.name).name or root.name
    run = RunSummary(results_dir=str(root), model=model, settings_hash=digest)
    results = read_results(root)
    if not results:
        raise FileNotFoundError(f"{root} holds no <benchmark>.jsonl results files")
    order = {name: i for i, name in enumerate(BENCHMARKS)}  # registry (paper) order, then files
    for stem, rows in sorted(results.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])):
        try:
            bench = get_benchmark(stem)
        except ValueError:
            log.warning("%s: %s.jsonl is not a benchmark's results file; skipped", root, stem)
            continue
        run.aggregates[stem] = bench.aggregate(rows)
        run.estimands[stem] = add_intervals(bench, rows, run.aggregates[stem])
        run.titles[stem] = bench.title
        if any(r.turns for r in rows):  # a multi-turn run (`eval --tools`)
            calls = [c for r in rows for c in r.tool_calls]
            run.tool_calls[stem] = {"calls": len(calls), "calls_per_response": len(calls) / len(rows),
                                    "errors": sum(c.get("error") is not None for c in calls)}
    for add in CROSS_METRICS:
        add(run.aggregates)
    return run


METHOD_TEXT = (f"95% CI: {METHOD}; a cluster is one video (a sample without a video is its own), so "
               f"questions on one video count together. Fewer than {MIN_CLUSTERS} clusters: n too small. "
               "n/a: the score is not a mean of per-sample scores.")


def pct(x: float) -> str:
    """0.6234 -> '62.3'."""
    return f"{100 * x:.1f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def markdown(run: RunSummary) -> str:
    """The whole report as Markdown."""
    out = [f"# Evaluation: {run.model}", "", f"Results: `{run.results_dir}`"
           + (f" (settings hash `{run.settings_hash}`)" if run.settings_hash else ""), ""]
    out += _table(["Benchmark", "Score", "Metric", "Samples", "Failed", "95% CI", "Clusters"],
                  [[run.titles[k], pct(a.overall), a.metric, str(a.count), str(a.failed), interval_text(a.ci),
                    str(a.ci.clusters) if a.ci and a.ci.clusters else "-"] for k, a in run.aggregates.items()])
    out += ["", METHOD_TEXT]
    if run.tool_calls:
        out += ["", "Tool calls (`eval --tools`):", ""]
        out += _table(["Benchmark", "Calls", "Per response", "Errors"],
                      [[run.titles[k], str(t["calls"]), f"{t['calls_per_response']:.2f}", str(t["errors"])]
                       for k, t in run.tool_calls.items()])
    for key, agg in run.aggregates.items():
        out += ["", f"## {run.titles[key]}", "",
                f"{agg.metric}: **{pct(agg.overall)}** (95% CI: {ci_text(agg.ci)}) over {agg.count} samples "
                f"({agg.failed} failed)"]
        out += [f"\n> **Note:** {note}" for note in agg.notes]
        if agg.metrics:
            out += [""] + _table(["Metric", "Score"], [[k, pct(v)] for k, v in agg.metrics.items()])
        for name, table in agg.categories.items():
            if not table:
                continue
            out += ["", f"### by {name}", ""]
            out += _table([name, "Score", "Samples", "Failed", "95% CI"],
                          [[label, pct(c.score), str(c.count), str(c.failed), interval_text(c.ci)]
                           for label, c in table.items()])
    return "\n".join(out) + "\n"


def ci_text(ci: ScoreInterval | None) -> str:
    """'41.2–58.8 over 38 clusters' / 'n too small: 6 clusters' / 'n/a: why'."""
    if ci is None:
        return "n/a"
    if ci.low is None and not ci.note.startswith("n too small"):
        return ci.note.replace("not available", "n/a")
    return f"{ci.text()} over {ci.clusters} clusters" if ci.low is not None else f"n too small: {ci.clusters} clusters"


def to_json(run: RunSummary) -> dict[str, Any]:
    """Machine-readable report."""
    return {"model": run.model, "results_dir": run.results_dir, "settings_hash": run.settings_hash,
            "intervals": {"method": METHOD, "level": LEVEL, "resamples": RESAMPLES, "seed": SEED,
                          "min_clusters": MIN_CLUSTERS},
            "benchmarks": {k: {"title": run.titles[k], **a.to_dict(),
                               **({"tool_calls": run.tool_calls[k]} if k in run.tool_calls else {})}
                           for k, a in run.aggregates.items()}}


def bar_chart(run: RunSummary, path: str | os.PathLike) -> None:
    """PNG bar chart of the headline score per benchmark (matplotlib, no display needed)."""
    from matplotlib.figure import Figure

    names = [run.titles[k] for k in run.aggregates]
    values = [100 * a.overall for a in run.aggregates.values()]
    fig = Figure(figsize=(max(6.0, 0.6 * len(names) + 2), 4.5))
    ax = fig.add_subplot()
    bars = ax.bar(range(len(names)), values, color="#4C72B0", yerr=error_bars(run.aggregates.values()),
                  ecolor="#222222", capsize=3)
    ax.bar_label(bars, labels=[f"{v:.1f}" for v in values], fontsize=7, padding=2)
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("score (%)")
    ax.set_ylim(0, max([100.0, *values]) * 1.08)
    ax.set_title(f"{run.model} (error bars: 95% CI)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def error_bars(aggs) -> list[list[float]]:
    """[[below], [above]] in points per aggregate for matplotlib's `yerr` (0 where no interval)."""
    spans = [(a.overall - a.ci.low, a.ci.high - a.overall) if a.ci and a.ci.low is not None else (0.0, 0.0)
             for a in aggs]
    return [[100 * max(0.0, lo) for lo, _ in spans], [100 * max(0.0, hi) for _, hi in spans]]


def write_report(results_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None,
                 make_source: Callable[..., Any] | None = None) -> list[Path]:
    """Write report.md, report.json, report.png and report.html; returns their paths.
    `make_source`: the frame reader for the HTML page's thumbnails (`html_report.render`)."""
    run = summarize_run(results_dir)
    out = Path(out_dir or results_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, js, png, page = out / "report.md", out / "report.json", out / "report.png", out / "report.html"
    md.write_text(markdown(run), encoding="utf-8")
    js.write_text(json.dumps(to_json(run), indent=2) + "\n", encoding="utf-8")
    bar_chart(run, png)
    page.write_text(render(results_dir, out, run.model, run.settings_hash, run.aggregates, run.titles, make_source),
                    encoding="utf-8")
    return [md, js, png, page]
