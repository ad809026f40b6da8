"""`easyvideor1 eval ...` and `easyvideor1 report RESULTS_DIR [--compare OTHER_DIR] [--out DIR]`."""

from __future__ import annotations

import argparse
from pathlib import Path

from easyvideor1 import arguments
from easyvideor1.errors import UserError
from easyvideor1.evaluation.adapters import BENCHMARKS
from easyvideor1.evaluation.adapters.base import ANNOTATION_DIRS
from easyvideor1.evaluation.adapters.generic import FILE_SUFFIXES
from easyvideor1.evaluation.compare import write_comparison
from easyvideor1.evaluation.merge import merge_results
from easyvideor1.evaluation.presets import DEFAULT_DTYPE, DEFAULT_PRESET, EVAL_PRESETS, SOURCE_HELP, Overrides
from easyvideor1.evaluation.report import markdown, summarize_run, write_report
from easyvideor1.evaluation.results import SETTINGS_FILE
from easyvideor1.models.model_settings import VISION_KEYS


ENGINE_CHOICES = ("auto", "vllm", "hf")


def _report(args: argparse.Namespace) -> int:
    for folder in args.results_dir:
        _results_folder("RESULTS_DIR", folder)
    if args.compare:
        _results_folder("--compare", args.compare)
    if args.label and not args.compare:
        raise UserError(f"--label {' '.join(args.label)}: names the two runs of a comparison; "
                        "give --compare OTHER_DIR too, or drop --label")
    if args.label and (args.label[0] == args.label[1] or not all(x.strip() for x in args.label)):
        raise UserError(f"--label {' '.join(map(repr, args.label))}: give two different, non-empty names")
    if len(args.results_dir) > 1 and not args.out:
        raise UserError("several results folders (the shards of one run) need --out for the merged folder")
    if args.out:
        arguments.output_folder("--out", args.out)
    try:
        results_dir = args.results_dir[0]
        if len(args.results_dir) > 1:  # shards of one run: merge first
            counts = merge_results(args.results_dir, args.out)
            print(f"merged {len(args.results_dir)} shards into {args.out}: "
                  + ", ".join(f"{k} {v} rows" for k, v in counts.items()))
            results_dir = args.out
        if args.compare:
            paths = write_comparison(results_dir, args.compare, args.out, labels=args.label)
        else:
            from easyvideor1.vision.cache import FrameSource  # imports torch: the page's frame thumbnails

            paths = write_report(results_dir, args.out, make_source=FrameSource)
    except (FileNotFoundError, ValueError) as e:  # folders that cannot be merged or compared
        raise UserError(str(e)) from e
    print(paths[0].read_text(encoding="utf-8"))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def _results_folder(flag: str, value: str) -> None:
    """`value` is a results folder of `easyvideor1 eval` (it holds settings.json)."""
    arguments.input_folder(flag, value, "the --out folder of an `easyvideor1 eval` run")
    if not (Path(value) / SETTINGS_FILE).is_file():
        raise UserError(f"{flag} {value}: no {SETTINGS_FILE}, so it is not a results folder of "
                        "`easyvideor1 eval`; give the --out folder of an eval run")


def _check_benchmarks(text: str, data_root: str | None) -> list[str]:
    """The benchmark names and sample files of `--benchmarks`, each known or present, and the
    annotation file of each registered one found under `--data-root`."""
    names = [b.strip() for b in text.split(",") if b.strip()]
    if not names:
        raise UserError(f"--benchmarks {text!r}: empty; give comma-separated names or sample files")
    for name in names:
        if name in BENCHMARKS:
            bench = BENCHMARKS[name]
            if data_root is None:
                raise UserError(f"--benchmarks {name}: {bench.title} reads its annotation file and videos from a "
                                "folder; give --data-root DIR (the folder holding them)")
            try:
                bench.find_file(data_root)
            except FileNotFoundError:
                raise UserError(f"--benchmarks {name}: no annotation file of {bench.title} under --data-root "
                                f"{data_root} (looked for {' or '.join(bench.files)} there and in "
                                f"{', '.join(d + '/' for d in ANNOTATION_DIRS if d)}); put it there, or give "
                                "--data-root the folder that holds it") from None
        elif name.lower().endswith(FILE_SUFFIXES) or arguments.looks_local(name):
            arguments.input_file("--benchmarks", name)
        else:
            raise UserError(f"--benchmarks {name!r}: unknown benchmark; choose from {', '.join(BENCHMARKS)}, "
                            "or give the path of a .json/.jsonl/.parquet sample file")
    return names


def _eval(args: argparse.Namespace) -> int:
    arguments.model_folder("--model", args.model)
    arguments.input_folder("--data-root", args.data_root, "the folder holding the benchmark files and videos")
    benchmarks = _check_benchmarks(args.benchmarks, args.data_root)
    arguments.output_folder("--out", args.out)
    arguments.run_flags(args)
    if args.settings_from is not None and not Path(args.settings_from).exists():
        raise UserError(f"--settings-from {args.settings_from}: no such file or folder; give {SOURCE_HELP}")
    frames = {k: getattr(args, k) for k in VISION_KEYS}  # `cache`'s flags, Overrides' fields
    arguments.at_least(1, max_new_tokens=args.max_new_tokens, judge_concurrency=args.judge_concurrency,
                       data_parallel=args.data_parallel, max_model_len=args.max_model_len,
                       tensor_parallel_size=args.tensor_parallel_size,
                       **{k: v for k, v in frames.items() if k != "fps"})
    arguments.at_least(0, max_samples=args.max_samples, judge_retries=args.judge_retries)
    arguments.above(0, fps=args.fps, gpu_memory_utilization=args.gpu_memory_utilization)
    arguments.within(0, 1, gpu_memory_utilization=args.gpu_memory_utilization)
    if args.judge_endpoint and not args.judge_model:
        raise UserError(f"--judge-endpoint {args.judge_endpoint} needs --judge-model NAME (the judge's model name)")
    import logging

    from easyvideor1.evaluation.carried import start
    from easyvideor1.evaluation.evaluator import Evaluator, options_from  # imports torch
    from easyvideor1.rollout.base import pick_engine

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    begin = start(args.model, args.preset, args.settings_from,
                  Overrides(max_new_tokens=args.max_new_tokens, **frames), args.template_dir, args.dtype)
    print(begin.line())
    engine, why = pick_engine(args.engine)
    print(f"engine: {engine} ({why})")
    vllm_log = None if args.verbose or engine != "vllm" else str(Path(args.out) / "vllm.log")
    if vllm_log:
        print(f"vLLM's own log: {vllm_log} (--verbose prints it here)")
    options = options_from(data_root=args.data_root, out_dir=args.out, cache_dir=args.cache_dir,
                           cache_mode=args.cache_mode, template_dir=begin.template, max_samples=args.max_samples,
                           load_workers=args.load_workers, prefetch=args.prefetch, max_batch=args.max_batch,
                           max_concurrency=args.max_concurrency, asynchronous=not args.no_async, dtype=begin.dtype,
                           judge_endpoint=args.judge_endpoint, judge_model=args.judge_model,
                           judge_concurrency=args.judge_concurrency, judge_retries=args.judge_retries,
                           max_model_len=args.max_model_len, tensor_parallel_size=args.tensor_parallel_size,
                           enforce_eager=args.enforce_eager, gpu_memory_utilization=args.gpu_memory_utilization,
                           chunked_prefill=args.chunked_prefill, shard=args.shard,
                           data_parallel=args.data_parallel, vllm_log=vllm_log, sources=begin.sources)
    tools = tuple(t for t in (args.tools or "").split(",") if t)
    if tools and options.data_parallel > 1:
        raise UserError("--tools runs with --data-parallel 1")
    if options.data_parallel > 1:
        from easyvideor1.evaluation.parallel import run_data_parallel

        run_data_parallel(args.model, engine, begin.preset, options, benchmarks, begin.overrides)
    else:  # a SettingsMismatch (another run's settings in --out) is a UserError
        evaluator = Evaluator(args.model, engine=engine, preset=begin.preset, options=options,
                              overrides=begin.overrides, tools=tools)
        try:
            evaluator.run(benchmarks)
        finally:
            evaluator.close()
    print(markdown(summarize_run(args.out)))
    return 0


def shard_arg(text: str) -> tuple[int, int]:
    """`"i/N"` -> (i, N), with 0 <= i < N."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard {text!r}: write I/N, e.g. 0/4") from None
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"--shard {text!r}: need 0 <= I < N")
    return i, n


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `eval` and `report` subcommands."""
    p = subparsers.add_parser(
        "eval", help="evaluate a model on video benchmarks (async pipeline, resumable)",
        description="Run benchmarks (registry names, or paths of sample files) through the asynchronous "
                    "pipeline: frames load ahead of the engine, longest videos first, results stream to "
                    "<out>/<benchmark>.jsonl. Re-running resumes: finished ids are skipped; settings that "
                    "change scores must match the stored ones.")
    p.add_argument("--model", required=True, help="local HF-format model folder")
    p.add_argument("--benchmarks", required=True, help="comma-separated names (videomme,mvbench,...) or sample files")
    p.add_argument("--data-root", default=None, help="folder holding the benchmark files and videos")
    p.add_argument("--engine", choices=ENGINE_CHOICES, default="auto",
                   help="generation engine; auto: vllm where a GPU and vLLM are present, else hf")
    p.add_argument("--verbose", action="store_true",
                   help="vLLM's own logs on the console (default: <out>/vllm.log)")
    p.add_argument("--preset", default=None, choices=list(EVAL_PRESETS),
                   help=f"frame budget + sampling preset (presets.py; default {DEFAULT_PRESET}); given, it replaces "
                        "the settings the model carries. `easyvideor1 cache --preset` takes the same names")
    p.add_argument("--settings-from", default=None, metavar="SRC",
                   help=f"take the frames, prompt template, dtype and response length from SRC: {SOURCE_HELP} "
                        "(default: the model's own easyvideor1.json when it has one)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="response length limit (default: the preset's)")
    f = p.add_argument_group("frames (the flags of `easyvideor1 cache`; default: the model's settings or the "
                             "preset's)")
    f.add_argument("--fps", type=float, default=None, help="video frames sampled per second")
    f.add_argument("--min-frames", type=int, default=None, help="fewest frames per video")
    f.add_argument("--video-max-frames", "--max-frames", dest="max_frames", type=int, default=None,
                   help="most frames per video")
    f.add_argument("--video-min-pixels", type=int, default=None, help="lower bound on H*W of each video frame")
    f.add_argument("--video-max-pixels", type=int, default=None, help="upper bound on H*W of each video frame")
    f.add_argument("--video-total-pixels", type=int, default=None, help="budget over the whole video")
    f.add_argument("--image-min-pixels", type=int, default=None, help="lower bound on H*W of an image")
    f.add_argument("--image-max-pixels", type=int, default=None, help="upper bound on H*W of an image")
    p.add_argument("--out", default="runs/eval", help="results folder")
    p.add_argument("--cache-dir", default=None, help="frame cache built by `easyvideor1 cache`")
    p.add_argument("--cache-mode", choices=("prefer_cache", "cache_only", "realtime"), default="prefer_cache",
                   help="read the cache and fall back to decoding, require it, or always decode")
    p.add_argument("--template-dir", default=None,
                   help="prompt templates: a folder (a template per problem type) or one .jinja file for every sample")
    p.add_argument("--tools", default="", help="video tools the model may call, multi-turn (crop_video,zoom_frame); "
                                               "with --engine vllm, run batch by batch, not asynchronously")
    p.add_argument("--max-samples", type=int, default=0, help="per benchmark (0: all)")
    p.add_argument("--load-workers", type=int, default=4, help="loading threads")
    p.add_argument("--prefetch", type=int, default=16, help="prepared prompts waiting for the engine, at most")
    p.add_argument("--max-batch", type=int, default=8, help="HF engine batch size")
    p.add_argument("--max-concurrency", type=int, default=64,
                   help="vLLM requests in flight (with --tools: prompts per batch of the tool loop)")
    p.add_argument("--no-async", action="store_true", help="the vanilla loop: load a batch, generate, repeat")
    p.add_argument("--dtype", default=None, choices=arguments.DTYPE_NAMES,
                   help=f"model dtype (default: the model's settings, or {DEFAULT_DTYPE})")
    p.add_argument("--judge-endpoint", default=None,
                   help="OpenAI-compatible URL of an LLM judge for open-ended answers (VCR-Bench, VideoReasonBench); "
                        "key from $OPENAI_API_KEY")
    p.add_argument("--judge-model", default=None, help="the judge's model name")
    p.add_argument("--judge-concurrency", type=int, default=16,
                   help="judge requests in flight (the judge runs beside generation, in its own queue)")
    p.add_argument("--judge-retries", type=int, default=3,
                   help="retries of a failing judge request; then the sample is a failed row")
    p.add_argument("--data-parallel", type=int, default=1, metavar="N",
                   help="N engines, one worker process each (vLLM: --tensor-parallel-size GPUs each), samples "
                        "dealt longest first; one results store")
    p.add_argument("--shard", type=shard_arg, default=None, metavar="I/N",
                   help="run only shard I of N (0-based) of every benchmark, e.g. one per machine; merge the "
                        "shard folders with `easyvideor1 report DIR0 DIR1 ... --out MERGED`")
    v = p.add_argument_group("vLLM engine (--engine vllm)")
    v.add_argument("--max-model-len", type=int, default=None,
                   help="longest prompt + response in tokens (default: the preset's video budget + two images "
                        "+ 2048 + --max-new-tokens, capped at the model's max_position_embeddings)")
    v.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs per engine")
    v.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=None,
                   help="no CUDA graphs (default: eager on CPU, graphs on GPU)")
    v.add_argument("--gpu-memory-utilization", type=float, default=0.8, help="share of GPU memory for the engine")
    v.add_argument("--chunked-prefill", action=argparse.BooleanOptionalAction, default=None,
                   help="split long prefills into chunks (default: vLLM's)")
    p.set_defaults(func=_eval)

    p = subparsers.add_parser(
        "report", help="tables, JSON and charts of evaluation results",
        description="Summarize a results folder written by `easyvideor1 eval`: a Markdown table per "
                    "benchmark and category (report.md), JSON (report.json) and a bar chart "
                    "(report.png), every score with its 95% confidence interval (cluster bootstrap by "
                    "video). With --compare, per-benchmark deltas between two models with a paired test "
                    "(interval, p-value, verdict) over the samples both scored (compare.md/.json/.png); "
                    "both folders must share their settings but the model.")
    p.add_argument("results_dir", metavar="RESULTS_DIR", nargs="+",
                   help="results folder (settings.json + <benchmark>.jsonl); several: the shard folders of one "
                        "`eval --shard i/N` run, merged into --out first")
    p.add_argument("--compare", metavar="OTHER_DIR", default=None,
                   help="second results folder (B); deltas are RESULTS_DIR (A) - OTHER_DIR (B), verdicts "
                        "'A better' / 'B better' / 'no significant difference'")
    p.add_argument("--label", nargs=2, metavar=("A_NAME", "B_NAME"), default=None,
                   help="with --compare: the names of RESULTS_DIR (A) and OTHER_DIR (B) in the table, JSON, "
                        "chart and verdicts (default: the two folders' names)")
    p.add_argument("--out", default=None, help="where to write the outputs (default: RESULTS_DIR)")
    p.set_defaults(func=_report)
