"""The end-of-run report: reward / accuracy / validation curves as PNG and a Markdown summary.

A task keeps one colour in every chart of a report (`task_colours`), whatever other series a
chart holds; the validation chart tells its metrics apart by line style."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from easyvideor1.training.metrics import read_metrics


def _moving_mean(ys: list[float], window: int) -> list[float]:
    """Mean of each value and the `window - 1` before it (fewer at the start)."""
    sums, out = [0.0], []
    for i, y in enumerate(ys):
        sums.append(sums[-1] + y)
        lo = max(0, i + 1 - window)
        out.append((sums[i + 1] - sums[lo]) / (i + 1 - lo))
    return out


# Matplotlib's tab10 colours; a task keeps one of them in every chart of a report.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")
ALL_COLOUR = "#222222"  # the `all` series (the mean over tasks), drawn wide
STYLES = {"accuracy": "-", "reward": "--", "format": ":", "tool_call_rate": "-."}  # val chart: one per metric


def _task_of(key: str) -> str:
    """The task a metric key is about: its last part (`val/accuracy/boolean` -> `boolean`)."""
    return key.rsplit("/", 1)[-1]


def task_colours(keys: list[str]) -> dict[str, str]:
    """Task -> colour for every chart of one report: the palette over the sorted task names of
    all the charts' keys, so a series present in one chart only (`reward/errors`) shifts none."""
    tasks = sorted({_task_of(k) for k in keys} - {"all"})
    return {"all": ALL_COLOUR, **{t: PALETTE[i % len(PALETTE)] for i, t in enumerate(tasks)}}


def _figure(rows: list[dict[str, Any]], keys: list[str], title: str, ylabel: str, colours: dict[str, str]):
    """One line per key, coloured by its task (`colours`), styled by its metric where a chart
    holds several (validation). Long noisy series (a per-step metric over a few samples each)
    are drawn faintly and overlaid with their moving mean over 1/40 of the points, so trends stay
    readable. Steps are integers, so are the x ticks. None when no key has a value."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    series = {k: [(r["step"], r[k]) for r in rows if isinstance(r.get(k), (int, float))] for k in keys}
    series = {k: v for k, v in series.items() if v}
    if not series:
        return None
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    window = max(1, max(len(v) for v in series.values()) // 40)
    for k, pts in sorted(series.items()):
        xs, ys = zip(*pts)
        label, colour = k.split("/", 1)[-1], colours[_task_of(k)]
        style = STYLES.get(label.split("/")[0], "-") if "/" in label else "-"
        wide = _task_of(k) == "all"
        if window > 1:
            ax.plot(xs, ys, color=colour, alpha=0.12, linewidth=0.5, linestyle=style)
            ys = _moving_mean(list(ys), window)
        ax.plot(xs, ys, color=colour, label=label, linewidth=2.2 if wide else 1.2, linestyle=style,
                marker="." if len(xs) < 30 else None, zorder=3 if wide else 2)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title + (f" (moving mean over {window} points; raw values faint)" if window > 1 else ""),
                 fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


CHARTS = {  # name -> (key prefix, title, y label)
    "reward": ("reward/", "training reward", "mean reward"),
    "accuracy": ("accuracy/", "training accuracy", "accuracy"),
    "val": ("val/", "validation", "score"),
}


def training_charts(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The report's matplotlib Figures by name (reward, accuracy, val; those with data), one
    colour per task across all of them."""
    keys = sorted({k for r in rows for k in r})
    picked = {name: [k for k in keys if k.startswith(prefix)] for name, (prefix, _, _) in CHARTS.items()}
    colours = task_colours([k for ks in picked.values() for k in ks])
    figures = {name: _figure(rows, picked[name], title, ylabel, colours)
               for name, (_, title, ylabel) in CHARTS.items()}
    return {k: f for k, f in figures.items() if f is not None}


def write_training_report(out_dir: str | Path, extra_markdown: str = "") -> dict[str, Path]:
    """Plots of reward and per-problem_type accuracy (train and validation) under `out_dir/report`."""
    out_dir = Path(out_dir)
    rows = read_metrics(out_dir / "metrics.jsonl")
    report = out_dir / "report"
    report.mkdir(parents=True, exist_ok=True)
    made = {}
    for name, fig in training_charts(rows).items():
        made[name] = report / f"{name}.png"
        fig.savefig(made[name], dpi=110)
    lines = ["# Training report", "", f"Steps logged: {len(rows)}", ""]
    lines += [f"![{k}]({p.name})" for k, p in made.items()]
    if extra_markdown:
        lines += ["", extra_markdown]
    (report / "README.md").write_text("\n".join(lines) + "\n")
    made["markdown"] = report / "README.md"
    return made
