"""The end-of-run training charts: one colour per task across reward, accuracy and validation
(a series in one chart only, like reward/errors, shifts none), integer step ticks."""

from __future__ import annotations

from matplotlib.colors import to_hex

from easyvideor1.training.metrics import MetricsSink, read_metrics
from easyvideor1.training.report import training_charts, write_training_report


def test_training_charts_keep_one_colour_per_task_and_integer_steps(tmp_path):
    sink = MetricsSink(tmp_path)
    for step in range(1, 6):
        sink.log(step, {"reward/all": step / 10, "reward/boolean": 0.5, "reward/multiple_choice": step / 20,
                        "reward/errors": float(step % 3 == 0),  # only the reward chart has this series
                        "accuracy/all": step / 10, "accuracy/boolean": 0.4, "accuracy/multiple_choice": step / 20,
                        **({"val/accuracy/multiple_choice": step / 10, "val/reward/multiple_choice": step / 12,
                            "val/accuracy/boolean": 0.3, "val/failed": 0.0} if step % 2 == 0 else {})})
    charts = training_charts(read_metrics(tmp_path / "metrics.jsonl"))
    assert set(charts) == {"reward", "accuracy", "val"}
    colours: dict[str, set[str]] = {}
    for name, fig in charts.items():
        (ax,) = fig.axes
        for line in ax.get_lines():
            if not line.get_label().startswith("_"):
                task = line.get_label().rsplit("/", 1)[-1]
                colours.setdefault(task, set()).add(to_hex(line.get_color()))
        ticks = ax.get_xticks()
        lo, hi = ax.get_xlim()
        shown = [t for t in ticks if lo <= t <= hi]
        assert len(shown) >= 3 and all(float(t).is_integer() for t in shown), (name, shown)
    assert {"all", "boolean", "multiple_choice", "errors"} <= set(colours)
    assert all(len(c) == 1 for c in colours.values()), colours  # one colour per task over all charts
    assert len({next(iter(c)) for c in colours.values()}) == len(colours)  # and tasks told apart
    val_styles = {line.get_label(): line.get_linestyle() for line in charts["val"].axes[0].get_lines()}
    assert val_styles["accuracy/multiple_choice"] != val_styles["reward/multiple_choice"]
    made = write_training_report(tmp_path)
    assert all(made[k].read_bytes().startswith(b"\x89PNG") for k in ("reward", "accuracy", "val"))
