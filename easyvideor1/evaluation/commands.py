"""`easyvideor1 report RESULTS_DIR [--compare OTHER_DIR] [--out DIR]`."""

from __future__ import annotations

import argparse


def _report(args: argparse.Namespace) -> int:
    from easyvideor1.evaluation.results import SettingsMismatch

    try:
        if args.compare:
            from easyvideor1.evaluation.compare import write_comparison

            paths = write_comparison(args.results_dir, args.compare, args.out)
        else:
            from easyvideor1.evaluation.report import write_report

            paths = write_report(args.results_dir, args.out)
    except (SettingsMismatch, FileNotFoundError, ValueError) as e:
        print(f"error: {e}")
        return 1
    print(paths[0].read_text(encoding="utf-8"))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `report` subcommand."""
    p = subparsers.add_parser(
        "report", help="tables, JSON and charts of evaluation results",
        description="Summarize a results folder written by `easyvideor1 eval`: a Markdown table per "
                    "benchmark and category (report.md), JSON (report.json) and a bar chart "
                    "(report.png). With --compare, per-benchmark deltas between two models "
                    "(compare.md/.json/.png); both folders must share their settings but the model.")
    p.add_argument("results_dir", metavar="RESULTS_DIR", help="results folder (settings.json + <benchmark>.jsonl)")
    p.add_argument("--compare", metavar="OTHER_DIR", default=None,
                   help="second results folder; deltas are RESULTS_DIR - OTHER_DIR")
    p.add_argument("--out", default=None, help="where to write the outputs (default: RESULTS_DIR)")
    p.set_defaults(func=_report)
