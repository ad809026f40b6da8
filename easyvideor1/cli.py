"""The `easyvideor1` command: parse arguments, then call into the package.

Each subcommand lives next to the code it drives, in a module exposing
`register(subparsers)`, which adds its parser and sets `func`. Modules are listed here and
imported only when the command line is parsed, so `--help` stays fast. Before a command runs,
`threads.apply` sets the threading policy (no module imports torch before that); after it
returns, `leave_process_groups` ends any torch.distributed group it joined.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from easyvideor1 import threads
from easyvideor1.errors import UserError

COMMAND_MODULES = [
    "easyvideor1.data.commands",  # synth, check-data
    "easyvideor1.vision.commands",  # cache
    "easyvideor1.models.commands",  # tiny-model
    "easyvideor1.rewards.commands",  # score
    "easyvideor1.training.commands",  # train, demo
    "easyvideor1.evaluation.commands",  # report
    "easyvideor1.curation.commands",  # pass-rate, trajectories
]

# Worker processes or loading threads a command keeps busy beside its own torch threads
# (`threads.apply` gives torch the cores left). None: that command's default (one per CPU).
WORKERS = {
    "cache": lambda a: a.workers if a.workers is not None else threads.usable_cores(),
    "score": lambda a: a.workers if a.workers is not None else min(8, os.cpu_count() or 1),
    "eval": lambda a: a.load_workers,
    "pass-rate": lambda a: a.load_workers + a.score_workers,
    "trajectories": lambda a: a.load_workers + a.score_workers,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="easyvideor1",
        description="RL post-training and fast evaluation of video-understanding VLMs.",
        epilog=threads.HELP,
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if "torch" not in sys.modules:  # else a caller (a test, a script) already owns this process's threads
        workers = WORKERS.get(args.command)
        threads.apply(workers(args) if workers else 0)
    try:
        code = int(args.func(args) or 0)
    except UserError as e:  # bad input or settings: the message says what to do, no traceback
        print(f"easyvideor1 {args.command}: {e}", file=sys.stderr)
        return 2
    leave_process_groups()
    return code


def leave_process_groups() -> None:
    """Every rank leaves its process groups after a command's last collective (`distributed.close`;
    without it a finished run under torchrun may abort at exit). Only a command that imported
    `easyvideor1.distributed` can have joined one; the others stay free of torch."""
    if "easyvideor1.distributed" in sys.modules:
        from easyvideor1 import distributed
        distributed.close()


if __name__ == "__main__":
    sys.exit(main())
