"""The `easyvideor1 cache` subcommand: build the offline frame cache for a data file."""

from __future__ import annotations

import argparse
import dataclasses
import logging

from easyvideor1 import arguments
from easyvideor1.data.loading import load_records
from easyvideor1.errors import UserError
from easyvideor1.evaluation.presets import EVAL_PRESETS, get_preset
from easyvideor1.models.families import MODEL_FAMILIES
from easyvideor1.vision.config import BACKENDS, CACHE_FLAGS, VisionConfig


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `cache` subcommand."""
    defaults = VisionConfig()
    p = subparsers.add_parser(
        "cache", help="decode, sample and resize every video/image of a data file into a frame cache",
        description="Build the offline frame cache: one safetensors entry per (media file, parameters), "
                    "written atomically; re-runs skip finished entries. Writes DIR/manifest.jsonl (each "
                    "sample + its cache keys) and DIR/failures.jsonl (sample, file, reason). Exit status "
                    "1 when any sample failed.")
    p.add_argument("--data", required=True, metavar="FILE", help="samples (.json, .jsonl or .parquet)")
    p.add_argument("--out", required=True, metavar="DIR", help="cache directory (created if missing)")
    p.add_argument("--data-root", metavar="DIR", help="root for relative media paths (default: the data file's folder)")
    p.add_argument("--workers", type=int, default=None, metavar="N", help="decoding processes (default: one per CPU)")
    p.add_argument("--preset", default=None, choices=list(EVAL_PRESETS),
                   help="start from an `eval` preset's frame budget (the flags below override it), so "
                        "`eval --preset NAME --cache-dir DIR` reads this cache; default: the training "
                        "defaults shown below")
    p.add_argument("--family", default=None, help=f"model family (default {defaults.family})")
    p.add_argument("--fps", type=float, default=None, help=f"frames sampled per second (default {defaults.fps})")
    p.add_argument("--min-frames", type=int, default=None, help=f"default {defaults.min_frames}")
    p.add_argument("--video-max-frames", type=int, default=None, help=f"default {defaults.max_frames}")
    p.add_argument("--video-min-pixels", type=int, default=None,
                   help=f"per frame (default {defaults.video_min_pixels})")
    p.add_argument("--video-max-pixels", type=int, default=None,
                   help=f"per frame (default {defaults.video_max_pixels})")
    p.add_argument("--video-total-pixels", type=int, default=None,
                   help=f"whole video (default {defaults.video_total_pixels})")
    p.add_argument("--image-min-pixels", type=int, default=None,
                   help=f"default {defaults.image_min_pixels}")
    p.add_argument("--image-max-pixels", type=int, default=None,
                   help=f"default {defaults.image_max_pixels}")
    p.add_argument("--backend", choices=BACKENDS, default=defaults.backend, help="video decoder (default auto)")
    p.add_argument("--content-hash", action="store_true", help="also hash file contents into the keys (slower)")
    p.add_argument("--verify", action="store_true", help="load every existing entry in full; rebuild damaged ones")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)


def config_from_args(args: argparse.Namespace) -> VisionConfig:
    """The VisionConfig the command line asks for: the preset's (or the default) budget, then
    every flag given."""
    base = get_preset(args.preset).vision if args.preset else VisionConfig()
    given = {name: getattr(args, flag[2:].replace("-", "_")) for name, flag in CACHE_FLAGS.items()}
    return dataclasses.replace(base, backend=args.backend, **{k: v for k, v in given.items() if v is not None})


def _run(args: argparse.Namespace) -> int:
    """Check the arguments, load the samples, build the cache, print the summary."""
    arguments.input_file("--data", args.data)
    arguments.output_folder("--out", args.out)
    arguments.input_folder("--data-root", args.data_root, "the folder relative media paths resolve against")
    arguments.at_least(0, workers=args.workers)
    arguments.above(0, fps=args.fps)
    arguments.at_least(1, min_frames=args.min_frames, video_max_frames=args.video_max_frames,
                       video_min_pixels=args.video_min_pixels, video_max_pixels=args.video_max_pixels,
                       video_total_pixels=args.video_total_pixels, image_min_pixels=args.image_min_pixels,
                       image_max_pixels=args.image_max_pixels)
    if args.family is not None:
        arguments.known("--family", args.family, MODEL_FAMILIES)
    try:
        cfg = config_from_args(args)
    except ValueError as e:
        raise UserError(f"{e}; change the flags that set it (easyvideor1 cache --help)") from None
    loaded = load_records(args.data, args.data_root)  # a DataError is a UserError
    from easyvideor1.vision.cache import CacheError  # these two import torch
    from easyvideor1.vision.cache_build import build_cache

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    bad_records = [{"problem_id": p.problem_id, "index": p.index, "file": str(args.data), "reason": "bad_record",
                    "detail": str(p)} for p in loaded.problems]
    try:
        report = build_cache(loaded.samples, cfg, args.out, workers=args.workers, verify=args.verify,
                             content_hash=args.content_hash, progress=not args.no_progress,
                             extra_failures=bad_records)
    except CacheError as e:  # a cache built with other settings: the message says what to do
        raise UserError(str(e)) from e
    print(report.summary())
    return 1 if report.failed_samples else 0
