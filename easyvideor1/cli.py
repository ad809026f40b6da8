"""The `easyvideor1` command: parse arguments, then call into the package.

Each subcommand lives next to the code it drives, in a module exposing
`register(subparsers)`, which adds its parser and sets `func`. Modules are listed here and
imported only when the command line is parsed, so `--help` stays fast. Before a command runs,
`threads.apply` sets the threading policy (no module imports torch before that); after a
command returns, `leave_process_groups` ends any torch.distributed group it joined.

A user error (`UserError`, raised anywhere, or a wrong argument argparse finds) is one line on
stderr, `easyvideor1 COMMAND: ...`, and exit status 2; any other exception is a bug and keeps its
traceback. `--debug` (or EASYVIDEOR1_DEBUG=1) shows the traceback of a user error too.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

from easyvideor1 import threads
from easyvideor1.errors import UserError

COMMAND_MODULES = [
    "easyvideor1.data.commands",  # synth, check-data
    "easyvideor1.vision.commands",  # cache
    "easyvideor1.models.commands",  # tiny-model
    "easyvideor1.rewards.commands",  # score
    "easyvideor1.training.commands",  # train, export, demo, plan
    "easyvideor1.evaluation.commands",  # report
    "easyvideor1.curation.commands",  # pass-rate, trajectories
]

DEBUG_ENV = "EASYVIDEOR1_DEBUG"  # set (not 0): a user error also prints its traceback, as --debug does

# Worker processes or loading threads a command keeps busy beside its own torch threads
# (`threads.apply` gives torch the cores left). None: that command's default (one per CPU).
WORKERS = {
    "cache": lambda a: a.workers if a.workers is not None else threads.usable_cores(),
    "score": lambda a: a.workers if a.workers is not None else min(8, os.cpu_count() or 1),
    "eval": lambda a: a.load_workers,
    "pass-rate": lambda a: a.load_workers + a.score_workers,
    "trajectories": lambda a: a.load_workers + a.score_workers,
}

# Intra-op threads at most. The demo's tiny model (hidden 64) runs ops of microseconds: waking a
# second OpenMP thread for each cost more than it saved, 0.50 s a step with 2 threads against
# 0.27 s with 1 on 2 cores, alone or beside a busy core (`benchmarks/demo_step.py`). One thread
# on every machine also gives one float-summation order, so one seed gives one table.
MOST_THREADS = {"demo": 1}


class Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (the usage is one `--help` away); an unknown flag is
    named with its command, and for a command that takes config overrides, as the override to write."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see `{self.prog} --help`)\n")

    def parse_args(self, args=None, namespace=None):
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            command = getattr(namespace, "command", None)
            message = f"unrecognized arguments: {' '.join(extras)}"
            if hasattr(namespace, "overrides"):  # train, export, plan, demo: settings are `section.key=value`
                message += override_hint(extras)
            if command:
                self.prog = f"{self.prog} {command}"
            self.error(message)
        return namespace


def override_hint(extras: list[str]) -> str:
    """`; write training.steps=5: ...` for `--steps 5`: each flag that names a config field (its last
    part, `-` read as `_`) as the dotted override to write instead, and where every field is listed."""
    from easyvideor1 import config_tree
    from easyvideor1.config import Config  # imports torch: only on this error path

    keys = [key for key, _, _ in config_tree.leaves(Config)]
    overrides, i = [], 0
    while i < len(extras):
        name, eq, value = extras[i].partition("=")
        if name.startswith("--") and not eq and i + 1 < len(extras) and not extras[i + 1].startswith("-"):
            value, i = extras[i + 1], i + 1
        i += 1
        field = name[2:].replace("-", "_") if name.startswith("--") else ""
        matches = [k for k in keys if k.rsplit(".", 1)[-1] == field]
        if matches:
            overrides.append(" or ".join(f"{k}={value or 'VALUE'}" for k in matches))
    write = f"; write {', '.join(overrides)}" if overrides else ""
    return f"{write}: config fields are section.key=value overrides, listed by `easyvideor1 train --help-config`"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="easyvideor1",
        description="RL post-training and fast evaluation of video-understanding VLMs.",
        epilog=threads.HELP,
    )
    parser.add_argument("--debug", action="store_true",
                        help=f"show the traceback of a user error too (or set {DEBUG_ENV}=1)")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    for sub in subparsers.choices.values():  # also after the command; SUPPRESS keeps a global --debug
        sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if "torch" not in sys.modules:  # else a caller (a test, a script) already owns this process's threads
        workers = WORKERS.get(args.command)
        threads.apply(workers(args) if workers else 0, most=MOST_THREADS.get(args.command))
    try:
        code = int(args.func(args) or 0)
    except UserError as e:  # bad input or settings: the message says what to do, no traceback
        if args.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            traceback.print_exc()
        print(f"easyvideor1 {args.command}: {one_line(str(e))}", file=sys.stderr)
        return 2
    leave_process_groups()
    return code


def leave_process_groups() -> None:
    """Every rank leaves its process groups after a command's last collective (`distributed.close`;
    without it a finished run under torchrun may abort at exit). Only a command that imported
    `easyvideor1.distributed` can have joined one; the others stay free of torch."""
    distributed = sys.modules.get("easyvideor1.distributed")  # not imported: no torch for the others
    if distributed is not None:
        distributed.close()


def one_line(message: str) -> str:
    """A message that lists things over several lines, joined into one."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return " ".join(line if line.endswith(":") or i == len(lines) - 1 else line.rstrip(".;") + ";"
                    for i, line in enumerate(lines))


if __name__ == "__main__":
    sys.exit(main())
