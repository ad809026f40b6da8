"""`easyvideor1 pass-rate ...` and `easyvideor1 trajectories ...` (data curation before training)."""

from __future__ import annotations

import argparse
from pathlib import Path

from easyvideor1 import arguments
from easyvideor1.curation.frame_budget import vision_config
from easyvideor1.errors import UserError


def _check(args: argparse.Namespace) -> None:
    """Every argument of `pass-rate` / `trajectories`, before any model loads or engine starts."""
    family = None
    if args.command == "pass-rate":
        family = arguments.model_folder("--model", args.model)
        arguments.output_folder("--out", args.out)
        if not 0.0 <= args.min < args.max <= 1.0:
            raise UserError(f"--min {args.min} --max {args.max}: need 0 <= --min < --max <= 1")
    else:
        if args.teacher and args.endpoint:
            raise UserError(f"--teacher {args.teacher} and --endpoint {args.endpoint}: give only one of them")
        if not args.teacher and not args.endpoint:
            raise UserError("no teacher: give --teacher DIR (a local model) or --endpoint URL (an OpenAI-compatible "
                            "server)")
        if args.teacher:
            family = arguments.model_folder("--teacher", args.teacher)
        elif not args.endpoint.startswith(("http://", "https://")):
            raise UserError(f"--endpoint {args.endpoint}: not an http(s) URL; give e.g. http://host:8000/v1")
        elif not args.endpoint_model:
            raise UserError(f"--endpoint {args.endpoint} needs --endpoint-model NAME (the model the server serves)")
        arguments.output_file("--out", args.out)
        arguments.within(0, 1, min_accuracy=args.min_accuracy)
        arguments.at_least(0, retries=args.retries, backoff=args.backoff)
        arguments.above(0, timeout=args.timeout)
    arguments.input_file("--data", args.data)
    arguments.input_folder("--data-root", args.data_root, "the folder relative media paths resolve against")
    arguments.run_flags(args)
    arguments.at_least(1, k=args.k)
    arguments.at_least(0, temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed,
                       score_workers=args.score_workers)
    arguments.above(0, top_p=args.top_p, score_timeout=args.score_timeout)
    arguments.within(0, 1, top_p=args.top_p)
    vision_config(args.preset, family, tuple(args.vision))


def _sampling(args: argparse.Namespace):
    """Sampling parameters (the response limit defaults to the preset's)."""
    from easyvideor1.evaluation.presets import get_preset
    from easyvideor1.rollout.base import SamplingParams

    max_tokens = args.max_tokens or get_preset(args.preset).sampling.max_new_tokens
    return SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=max_tokens, seed=args.seed)


def _engine(args: argparse.Namespace) -> str:
    """The engine `--engine` means here, printed with why (`rollout.base.pick_engine`)."""
    from easyvideor1.rollout.base import pick_engine

    engine, why = pick_engine(args.engine)
    print(f"engine: {engine} ({why})")
    return engine


def _options(args: argparse.Namespace):
    from easyvideor1.curation.runner import RunOptions
    from easyvideor1.curation.sources import SourceOptions

    out = Path(args.out)  # pass-rate: a folder; trajectories: a file, its log beside it
    log = None if args.verbose else str(out / "vllm.log" if args.command == "pass-rate" else
                                        out.with_name(out.name.removesuffix(".jsonl") + ".vllm.log"))
    source = SourceOptions(preset=args.preset, vision=tuple(args.vision), template_dir=args.template_dir,
                           cache_dir=args.cache_dir, cache_mode=args.cache_mode, dtype=args.dtype,
                           max_batch=args.max_batch, max_concurrency=args.max_concurrency, vllm_log=log)
    run = RunOptions(load_workers=args.load_workers, prefetch=args.prefetch, score_workers=args.score_workers,
                     score_timeout_s=args.score_timeout)
    return source, run


def _media_note(data: str, data_root: str | None, out_dir) -> str | None:
    """Records are written unchanged: relative media paths still resolve against the input's root."""
    root = Path(data_root) if data_root else Path(data).parent
    if Path(out_dir).resolve() == root.resolve():
        return None
    return (f"note: media paths are written as in {data}; train on these records with "
            f"data.data_root={root}")


def _pass_rate(args: argparse.Namespace) -> int:
    _check(args)
    import logging

    from easyvideor1.curation.pass_rate import pass_rate, pass_rate_table  # imports torch
    from easyvideor1.curation.sources import local_source

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    source_options, run_options = _options(args)
    params = _sampling(args)
    source = local_source(args.model, _engine(args), source_options)
    summary = pass_rate(args.data, args.out, source, params, args.k, args.data_root, args.min, args.max, run_options)
    print(pass_rate_table(summary))
    print(f"wrote {args.out}/pass_rates.jsonl, filtered.jsonl, summary.md, summary.json and "
          f"{len(summary['histograms'])} histogram(s)")
    note = _media_note(args.data, args.data_root, args.out)
    if note:
        print(note)
    return 0


def _trajectories(args: argparse.Namespace) -> int:
    _check(args)
    import logging
    from easyvideor1.curation.endpoint import EndpointConfig
    from easyvideor1.curation.sources import endpoint_source, local_source
    from easyvideor1.curation.trajectories import rejected_path, trajectories, trajectories_table  # imports torch

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    source_options, run_options = _options(args)
    params = _sampling(args)
    if args.endpoint:
        cfg = EndpointConfig(url=args.endpoint, model=args.endpoint_model, timeout_s=args.timeout,
                             retries=args.retries, backoff_s=args.backoff, concurrency=args.max_concurrency)
        source = endpoint_source(cfg, source_options)
    else:
        source = local_source(args.teacher, _engine(args), source_options)
    counts = trajectories(args.data, args.out, source, params, args.k, args.data_root, args.min_accuracy,
                          args.pick, run_options)
    print(trajectories_table(counts, args.out))
    retried = getattr(source.backend, "retried", None)
    if retried:
        print(f"endpoint: {source.backend.attempts} requests, {retried} of them retries")
    print(f"wrote {args.out} and {rejected_path(args.out)}")
    note = _media_note(args.data, args.data_root, Path(args.out).parent)
    if note:
        print(note)
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, help="sample file (JSON, JSONL or Parquet)")
    p.add_argument("--data-root", default=None, help="folder media paths are relative to (default: the file's)")
    p.add_argument("--engine", choices=("auto", "vllm", "hf"), default="auto",
                   help="local generation engine; auto: vllm where a GPU and vLLM are present, else hf")
    p.add_argument("--verbose", action="store_true",
                   help="vLLM's own logs on the console (default: a file beside the output, *vllm.log)")
    p.add_argument("--preset", default="qwen2_5_vl",
                   help="frame budget (and default --max-tokens) from an evaluation preset (presets.py)")
    p.add_argument("--vision", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a frame-budget field of the preset, e.g. max_frames=32 (repeatable)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling")
    p.add_argument("--max-tokens", type=int, default=0, help="response limit (0: the preset's)")
    p.add_argument("--seed", type=int, default=0, help="base sampling seed (each response has its own)")
    p.add_argument("--template-dir", default=None, help="prompt template overrides (as data.template_dir)")
    p.add_argument("--cache-dir", default=None, help="frame cache built by `easyvideor1 cache`")
    p.add_argument("--cache-mode", choices=("prefer_cache", "cache_only", "realtime"), default="prefer_cache")
    p.add_argument("--load-workers", type=int, default=4, help="loading threads")
    p.add_argument("--prefetch", type=int, default=16, help="samples loading ahead of the engine, at most")
    p.add_argument("--max-batch", type=int, default=32, help="HF engine: responses decoded together")
    p.add_argument("--max-concurrency", type=int, default=64, help="vLLM / endpoint requests in flight")
    p.add_argument("--dtype", default="bfloat16", help="local model dtype")
    p.add_argument("--score-workers", type=int, default=2, help="reward processes (0: in this process)")
    p.add_argument("--score-timeout", type=float, default=60.0, help="seconds per response (workers only)")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `pass-rate` and `trajectories` subcommands."""
    p = subparsers.add_parser(
        "pass-rate", help="k responses per sample; keep those neither always nor never solved",
        description="Sample k responses per record from the starting model, score them with the rewards, "
                    "write <out>/pass_rates.jsonl (one row per record, resumable by id), "
                    "<out>/filtered.jsonl (the records with --min < pass rate < --max, unchanged), "
                    "a summary table per problem_type and a histogram PNG per problem_type.")
    p.add_argument("--model", required=True, help="local HF-format model folder")
    p.add_argument("--k", type=int, default=8, help="responses per sample")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--min", type=float, default=0.0, help="keep pass rates strictly above this")
    p.add_argument("--max", type=float, default=1.0, help="keep pass rates strictly below this")
    _common(p)
    p.set_defaults(func=_pass_rate)

    p = subparsers.add_parser(
        "trajectories", help="offline trajectories for hybrid training from a teacher model or endpoint",
        description="Generate k responses per record from a teacher (local engine, or any OpenAI-compatible "
                    "endpoint: frames sent as images with their timestamps), score them, and write the records "
                    "with offline_output set to a response with accuracy >= --min-accuracy to --out; the others "
                    "go to <out>.rejected.jsonl with the reason. Resumable by problem_id.")
    p.add_argument("--out", required=True, help="output JSONL file")
    p.add_argument("--teacher", default=None, help="local HF-format teacher model folder")
    p.add_argument("--endpoint", default=None, help="OpenAI-compatible base URL, e.g. http://host:8000/v1 "
                                                    "(key from $OPENAI_API_KEY)")
    p.add_argument("--endpoint-model", default=None, help="model name the endpoint serves")
    p.add_argument("--k", type=int, default=4, help="responses per sample")
    p.add_argument("--min-accuracy", type=float, default=1.0, help="accuracy a kept response needs")
    p.add_argument("--pick", choices=("shortest", "first"), default="shortest", help="which good response to keep")
    p.add_argument("--retries", type=int, default=3, help="endpoint retries (timeouts, 429, 5xx)")
    p.add_argument("--backoff", type=float, default=1.0, help="first retry delay, doubled each retry (s)")
    p.add_argument("--timeout", type=float, default=300.0, help="endpoint request timeout (s)")
    _common(p)
    p.set_defaults(func=_trajectories)
