"""`easyvideor1 synth` and `easyvideor1 check-data`."""

from __future__ import annotations

import argparse

from easyvideor1 import arguments
from easyvideor1.data.synth import OPT_IN_TASKS, TASKS, write_suite
from easyvideor1.errors import UserError


def _synth(args: argparse.Namespace) -> int:
    arguments.output_folder("--out", args.out)
    arguments.at_least(0, num_train=args.num_train, num_val=args.num_val, seed=args.seed)
    tasks = tuple(t for t in args.tasks.split(",") if t) if args.tasks else TASKS
    unknown = [t for t in tasks if t not in TASKS + OPT_IN_TASKS]
    if unknown:
        raise UserError(f"--tasks: unknown task(s) {', '.join(unknown)}; valid: {', '.join(TASKS + OPT_IN_TASKS)}")
    paths = write_suite(args.out, num_train=args.num_train, num_val=args.num_val, seed=args.seed, tasks=tasks)
    print(f"wrote {args.num_train} train and {args.num_val} val samples:")
    for split, path in paths.items():
        print(f"  {split}: {path}")
    return 0


def _check(args: argparse.Namespace) -> int:
    arguments.input_file("FILE", args.file)
    arguments.input_folder("--data-root", args.data_root, "the folder relative media paths resolve against")
    from easyvideor1.data.checks import check_file, print_report  # imports torch (decoders)

    report = check_file(args.file, data_root=args.data_root, open_media=not args.no_media)
    print_report(report)
    return 1 if report.problems else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("synth", help="write the built-in synthetic video task suite",
                              description="Write small mp4 clips, images and train/val JSONL files "
                                          "of verifiable video tasks (deterministic by seed).")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--num-train", type=int, default=256, help="training samples")
    p.add_argument("--num-val", type=int, default=64, help="validation samples")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--tasks", default="", help="comma-separated tasks to write (default: the standard suite; "
                                               "`flash` is opt-in, for video tools)")
    p.set_defaults(func=_synth)

    p = subparsers.add_parser("check-data", help="validate every record of a sample file",
                              description="Check required fields and types, known problem types, "
                                          "that media files exist and open, and that each answer "
                                          "parses for its task type. Exit status 1 if any record is bad.")
    p.add_argument("file", help="JSON, JSONL or Parquet sample file")
    p.add_argument("--data-root", default=None, help="folder relative media paths resolve against "
                                                     "(default: the file's folder)")
    p.add_argument("--no-media", action="store_true", help="skip opening media files")
    p.set_defaults(func=_check)
