"""`easyvideor1 tiny-model`: write a tiny random-weight Qwen-VL model usable offline."""

from __future__ import annotations

import argparse

from easyvideor1 import arguments
from easyvideor1.models.families import MODEL_FAMILIES
from easyvideor1.models.tiny import SIZES, build_tiny_model


def register(subparsers) -> None:
    """Add the `tiny-model` subcommand."""
    p = subparsers.add_parser(
        "tiny-model",
        help="build a tiny random-weight model + tokenizer + processor (offline)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--family", required=True, choices=list(MODEL_FAMILIES), help="model family")
    p.add_argument("--out", required=True, help="output directory (HF format)")
    p.add_argument("--seed", type=int, default=0, help="weight initialisation seed")
    p.add_argument("--size", default="tiny", choices=list(SIZES), help="model size")
    p.set_defaults(func=_run)


def _run(args) -> int:
    """Build the model and print where it went."""
    arguments.output_folder("--out", args.out)
    arguments.at_least(0, seed=args.seed)
    out = build_tiny_model(args.family, args.out, seed=args.seed, size=args.size)
    print(f"wrote {args.family} ({args.size}, seed {args.seed}) to {out}")
    return 0
