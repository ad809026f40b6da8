"""Makes the figures the documentation shows, from the project's own outputs (none is pasted by hand).

    .venv/bin/python scripts/docs_figures.py --demo-run runs/demo/train   # after `make demo`
    .venv/bin/python scripts/docs_figures.py --architecture               # needs Graphviz `dot`

- docs/demo_training_accuracy.png: the training-accuracy curves of a demo run, drawn by the
  demo's own end-of-run report (`easyvideor1.training.report.write_training_report`) from the
  run's `metrics.jsonl`. The page's figure is seed 0 of `make demo` (runs/demo/train).
- docs/architecture.png: Graphviz's drawing of docs/architecture.dot.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from easyvideor1.training.report import write_training_report  # noqa: E402


def demo_figure(run_dir: Path, out: Path = ROOT / "docs" / "demo_training_accuracy.png") -> Path:
    """Redraw the run's report plots and copy its training-accuracy plot to `out`."""
    if not (run_dir / "metrics.jsonl").is_file():
        raise SystemExit(f"{run_dir}/metrics.jsonl not found: give the demo's run folder, e.g. runs/demo/train")
    made = write_training_report(run_dir)
    if "accuracy" not in made:
        raise SystemExit(f"{run_dir}/metrics.jsonl holds no accuracy/* metrics to draw")
    shutil.copyfile(made["accuracy"], out)
    return out


def architecture_figure(dot: Path = ROOT / "docs" / "architecture.dot") -> Path:
    out = dot.with_suffix(".png")
    if shutil.which("dot") is None:
        raise SystemExit("Graphviz `dot` is not installed (apt-get install graphviz)")
    subprocess.run(["dot", "-Tpng", "-Gdpi=110", str(dot), "-o", str(out)], check=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo-run", type=Path, default=None, help="a demo run folder (runs/demo/train)")
    parser.add_argument("--architecture", action="store_true", help="redraw docs/architecture.png")
    args = parser.parse_args(argv)
    if not args.demo_run and not args.architecture:
        parser.error("give --demo-run DIR and/or --architecture")
    if args.demo_run:
        print(f"wrote {demo_figure(args.demo_run)}")
    if args.architecture:
        print(f"wrote {architecture_figure()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
