"""The end-of-run report: reward / accuracy curves as PNG and a Markdown summary."""

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


def _plot(rows: list[dict[str, Any]], keys: list[str], title: str, path: Path, ylabel: str) -> Path | None:
    """One line per key. Long noisy series (a per-step metric over a few samples each) are drawn
    faintly and overlaid with their moving mean over 1/40 of the points, so trends stay readable."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {k: [(r["step"], r[k]) for r in rows if isinstance(r.get(k), (int, float))] for k in keys}
    series = {k: v for k, v in series.items() if v}
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    window = max(1, max(len(v) for v in series.values()) // 40)
    for i, (k, pts) in enumerate(sorted(series.items())):
        xs, ys = zip(*pts)
        label, colour = k.split("/", 1)[-1], f"C{i % 10}"
        wide = label == "all"
        if window > 1:
            ax.plot(xs, ys, color=colour, alpha=0.12, linewidth=0.5)
            ys = _moving_mean(list(ys), window)
        ax.plot(xs, ys, color=colour, label=label, linewidth=2.2 if wide else 1.2,
                marker="." if len(xs) < 30 else None, zorder=3 if wide else 2)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title + (f" (moving mean over {window} points; raw values faint)" if window > 1 else ""),
                 fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_training_report(out_dir: str | Path, extra_markdown: str = "") -> dict[str, Path]:
    """Plots of reward and per-problem_type accuracy (train and validation) under `out_dir/report`."""
    out_dir = Path(out_dir)
    rows = read_metrics(out_dir / "metrics.jsonl")
    report = out_dir / "report"
    report.mkdir(parents=True, exist_ok=True)
    keys = sorted({k for r in rows for k in r})
    made = {
        "reward": _plot(rows, [k for k in keys if k.startswith("reward/")], "training reward",
                        report / "reward.png", "mean reward"),
        "accuracy": _plot(rows, [k for k in keys if k.startswith("accuracy/")], "training accuracy",
                          report / "accuracy.png", "accuracy"),
        "val": _plot(rows, [k for k in keys if k.startswith("val/")], "validation", report / "val.png",
                     "score"),
    }
    made = {k: v for k, v in made.items() if v is not None}
    lines = ["# Training report", "", f"Steps logged: {len(rows)}", ""]
    lines += [f"![{k}]({p.name})" for k, p in made.items()]
    if extra_markdown:
        lines += ["", extra_markdown]
    (report / "README.md").write_text("\n".join(lines) + "\n")
    made["markdown"] = report / "README.md"
    return made
