"""The end-of-run report: reward / accuracy curves as PNG and a Markdown summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from easyvideor1.training.metrics import read_metrics


def _plot(rows: list[dict[str, Any]], keys: list[str], title: str, path: Path, ylabel: str) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {k: [(r["step"], r[k]) for r in rows if isinstance(r.get(k), (int, float))] for k in keys}
    series = {k: v for k, v in series.items() if v}
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for k, pts in sorted(series.items()):
        xs, ys = zip(*pts)
        ax.plot(xs, ys, label=k.split("/", 1)[-1], marker="." if len(xs) < 30 else None)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
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
