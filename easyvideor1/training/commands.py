"""`easyvideor1 train`, `easyvideor1 demo` and `easyvideor1 export`."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from easyvideor1 import arguments, config_tree
from easyvideor1.data.synth import DEMO_TRAIN, DEMO_VAL
from easyvideor1.errors import UserError


def _split_config(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """(YAML file or None, overrides): a first argument with `=` that is no file is an override.
    Checked before torch loads: the config is a YAML file, each override is section.key=value."""
    config, overrides = args.config, list(args.overrides)
    if config and "=" in config and not Path(config).is_file():
        config, overrides = None, [config, *overrides]
    if config:
        arguments.input_file("config", config, "a YAML config (see configs/), or only section.key=value overrides",
                             arguments.CONFIG_SUFFIXES)
    for item in overrides:
        if "=" not in item:
            raise UserError(f"override {item!r}: write section.key=value (--help-config lists every field)")
    return config, overrides


def _check_paths(cfg, command: str) -> None:
    """The run's folders and files exist (and are of the right kind) before any model loads."""
    family = arguments.model_folder("model.path", cfg.model.path)
    if command == "train" and family != cfg.vision.family:
        raise UserError(f"model.path {cfg.model.path} is a {family} model but vision.family={cfg.vision.family}: "
                        f"the frame sizes would not fit its grid; set vision.family={family}")
    for key in ("train_files", "val_files") if command == "train" else ():
        for path in getattr(cfg.data, key):
            arguments.input_file(f"data.{key}", path)
    arguments.input_folder("data.data_root", cfg.data.data_root)
    arguments.template("data.template_dir", cfg.data.template_dir)
    if cfg.data.cache_mode == "cache_only":
        arguments.input_folder("data.cache_dir", cfg.data.cache_dir or "",
                               "the frame cache `easyvideor1 cache` built (data.cache_mode=cache_only needs it)")
    if command == "train":
        arguments.output_folder("logging.out_dir", cfg.logging.out_dir)
        if cfg.checkpoint.resume not in ("auto", "never"):
            arguments.input_folder("checkpoint.resume", cfg.checkpoint.resume, "a checkpoint folder, auto or never")


def _missing(cfg) -> list[str]:
    """What the defaults cannot supply: a model and training data."""
    missing = []
    if not cfg.model.path:
        missing.append("model.path=DIR (a local HF-format model folder)")
    if not cfg.data.train_files:
        missing.append("data.train_files=FILE[,FILE...] (JSON, JSONL or Parquet samples)")
    return missing


def _train(args: argparse.Namespace) -> int:
    path, overrides = _split_config(args)
    from easyvideor1.config import Config, load_config  # this and the imports below import torch

    if args.help_config:
        print("\n".join(config_tree.describe(Config)))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    cfg = load_config(path, overrides)  # a ConfigError names the field
    missing = _missing(cfg)
    if missing:
        raise UserError("set " + " and ".join(missing) + (f" in {path} or" if path else "") +
                        " on the command line (--help-config lists every field)")
    _check_paths(cfg, "train")
    from easyvideor1.training.asynchronous.placement import is_rollout_rank
    from easyvideor1.training.state.export import eval_command, export_adapter, export_model
    from easyvideor1.training.report import write_training_report
    from easyvideor1.training.asynchronous.rollout_side import serve_rank
    from easyvideor1.training.setup import build_run
    from easyvideor1.training.trainer import train

    if is_rollout_rank(cfg):  # under torchrun with rollout.placement=separate: the last ranks only generate
        serve_rank(cfg)
        return 0
    run = build_run(cfg)
    train(run)
    if run.rank == 0:
        made = write_training_report(cfg.logging.out_dir)
        print(f"report: {made['markdown']}")
    if cfg.checkpoint.export_hf:
        path = export_model(run, f"{cfg.logging.out_dir}/hf_model", "easyvideor1 train")
        if path:
            print(f"HF model: {path}")
            print(f"evaluate it: {eval_command(path)}")
        if cfg.model.lora.rank:
            path = export_adapter(run, f"{cfg.logging.out_dir}/adapter")
            if path:
                print(f"PEFT adapter: {path}")
    return 0  # cli.main then leaves the process groups (distributed.close)


def _export(args: argparse.Namespace) -> int:
    arguments.output_folder("--out", args.out)
    if args.checkpoint is not None:
        arguments.input_folder("--checkpoint", args.checkpoint, "a checkpoint folder of the run")
    folder = args.config if args.config and Path(args.config).is_dir() else None
    path, overrides = _split_config(args) if folder is None else (None, list(args.overrides))
    from easyvideor1.config import load_config  # imports torch
    from easyvideor1.training.state.checkpoint import list_checkpoints, named_by, read_meta, recorded_config

    checkpoint = args.checkpoint
    if folder is not None:  # a checkpoint or a run: the config its checkpoint recorded
        checkpoint = checkpoint or named_by(folder)
        if checkpoint is None:
            raise UserError(f"{folder}: neither a checkpoint (step-NNNNNN with state.json) nor a run folder with "
                            "checkpoints/ (a train run's logging.out_dir, or a demo's --out); give one of them")
        try:
            cfg = recorded_config(checkpoint, overrides)
        except FileNotFoundError as e:
            raise UserError(f"{e}: give the run's config, `easyvideor1 export CONFIG [overrides] --checkpoint "
                            f"{checkpoint} --out DIR`") from None
    else:
        cfg = load_config(path, overrides)
    if not cfg.model.path:
        raise UserError("set model.path (the base model the run trained from)")
    _check_paths(cfg, "export")
    if checkpoint is None:
        found = list_checkpoints(f"{cfg.logging.out_dir}/checkpoints")
        if not found:
            raise UserError(f"no checkpoint under {cfg.logging.out_dir}/checkpoints; give --checkpoint DIR "
                            "(or the run's logging.out_dir)")
        checkpoint = found[-1]
    from easyvideor1.models import model_settings
    from easyvideor1.training.state.export import eval_command, export_checkpoint  # imports transformers

    try:
        out = export_checkpoint(cfg, checkpoint, args.out, merge=args.merge)
    except (FileNotFoundError, ValueError) as e:  # a checkpoint that does not fit the config
        raise UserError(str(e)) from e
    full = args.merge or not cfg.model.lora.rank
    if full:
        model_settings.write(out, model_settings.settings_of(
            cfg, written_by="easyvideor1 export", checkpoint=str(checkpoint), step=read_meta(checkpoint).get("step")))
    print(f"{'HF model' if full else 'PEFT adapter'}: {out}")
    if full:
        print(f"evaluate it: {eval_command(out)}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    arguments.output_folder("--out", args.out)
    arguments.at_least(1, steps=args.steps, train_samples=args.train_samples, val_samples=args.val_samples)
    arguments.at_least(0, seed=args.seed)
    for item in args.overrides:
        if "=" not in item:
            raise UserError(f"override {item!r}: write section.key=value, e.g. training.lr=1e-3")
    from easyvideor1.config import demo_config_path, load_config  # imports torch

    load_config(demo_config_path(), args.overrides)  # a wrong override fails here, before the model is built
    from easyvideor1.training.demo import run_demo
    run_demo(args.out, steps=args.steps, hybrid=not args.no_hybrid, seed=args.seed, asynchronous=args.asynchronous,
             overrides=args.overrides, num_train=args.train_samples, num_val=args.val_samples, tools=args.tools)
    return 0


def _plan(args: argparse.Namespace) -> int:
    path, overrides = _split_config(args)
    arguments.at_least(1, gpus=args.gpus, gpus_per_node=args.gpus_per_node)
    arguments.at_least(0, vision_tokens=args.vision_tokens)
    arguments.above(0, gpu_memory_gib=args.gpu_memory_gib)
    from easyvideor1.config import load_config  # imports torch
    from easyvideor1.training.plan.memory import advice, from_config, plan_memory, render_disk, render_plan
    from easyvideor1.training.plan.shapes import TINY_PREFIX, read_shape
    from easyvideor1.vision.budget import clip_tokens, largest_video

    cfg = load_config(path, overrides)
    model = args.model_config or cfg.model.path or f"{TINY_PREFIX}{cfg.vision.family}"
    try:
        shape = read_shape(model)
    except ValueError as e:
        flag = "--model-config" if args.model_config else "model.path"
        raise UserError(f"{flag} {e}") from None
    workload = from_config(cfg, shape, args.gpus, args.gpu_memory_gib, args.vision_tokens, args.gpus_per_node)
    sp = workload.sequence_parallel
    if args.gpus % sp or shape.heads % sp:
        raise UserError(f"training.sequence_parallel_size={sp} must divide --gpus {args.gpus} and the model's "
                        f"{shape.heads} attention heads")
    plan = plan_memory(shape, workload)
    print(render_plan(shape, workload, plan, advice(shape, workload)))
    largest = largest_video(cfg.vision)
    print(f"videos, as the sampler sizes them: the largest this vision section admits takes {largest.tokens} prompt "
          f"tokens ({largest.vision_tokens} vision, {largest.frames} frames of at most {largest.frame_pixels} px; the "
          f"rows above plan for it unless --vision-tokens); a 64-s 1080p clip at 30 fps takes "
          f"{clip_tokens(cfg.vision, 64, 1080, 1920)}")
    print(render_disk(plan, workload, cfg.logging.out_dir))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="RL post-training from a config",
                              description="Train with a YAML config plus section.key=value overrides, or with "
                                          "overrides alone on top of the defaults (model.path and "
                                          "data.train_files are then required). Under torchrun the same "
                                          "command runs on N processes / nodes.")
    p.add_argument("config", nargs="?", help="YAML config (see configs/); optional")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. training.steps=10 rollout.n=4")
    p.add_argument("--help-config", action="store_true", help="list every config field with its default and doc")
    p.set_defaults(func=_train)

    p = subparsers.add_parser("export", help="a training checkpoint as a PEFT adapter or a full HF model folder",
                              description="Export a checkpoint of a run: a LoRA run's adapter as a PEFT folder, "
                                          "or with --merge (always for full fine-tuning) a full HF model folder "
                                          "that AutoModelForImageTextToText and vLLM load, with the settings "
                                          "`eval` reads (easyvideor1.json). Give the checkpoint folder or the "
                                          "run's folder (its newest checkpoint and the config it recorded), or "
                                          "the run's config and overrides.")
    p.add_argument("config", nargs="?", metavar="CHECKPOINT_OR_CONFIG",
                   help="a checkpoint folder, a run folder (logging.out_dir, or a demo's --out), or the run's "
                        "YAML config; optional")
    p.add_argument("overrides", nargs="*", help="dotted overrides, as given to train")
    p.add_argument("--checkpoint", default=None, help="checkpoint folder (default: the newest of the run)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--merge", action="store_true", help="merge the adapters into a full HF model folder")
    p.set_defaults(func=_export)

    p = subparsers.add_parser("demo", help="the embedded default: tiny model + synthetic video tasks, on CPU",
                              description="Build a tiny Qwen-VL model and the synthetic task suite, cache the "
                                          "frames, measure validation accuracy, train with GRPO + hybrid "
                                          "groups, measure again, write a report with plots and the trained model (OUT/hf_model, "
                                          "with the settings `eval` reads), and print the `eval` command for it. "
                                          "Threads as for every command (easyvideor1 --help).")
    p.add_argument("--out", default="runs/demo", help="output folder")
    p.add_argument("--steps", type=int, default=None,
                   help="training steps (default: the demo config's training.steps). A fixed count, not a time "
                        "budget: one seed gives one table on any machine; an ETA is printed from the step rate")
    p.add_argument("--no-hybrid", action="store_true", help="on-policy only (no offline trajectories)")
    p.add_argument("--async", dest="asynchronous", action="store_true",
                   help="asynchronous training: a rollout process generates batch s+1 while the trainer updates "
                        "step s (rollout.placement=separate, training.max_staleness=1; one thread each)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model, data and training")
    p.add_argument("--tools", action="store_true",
                   help="add the flash task and let the model call crop_video (multi-turn rollouts; "
                        "val/tool_call_rate/flash in demo_results.json)")
    p.add_argument("--train-samples", type=int, default=DEMO_TRAIN, help="synthetic training samples")
    p.add_argument("--val-samples", type=int, default=DEMO_VAL, help="held-out samples (an equal share per task)")
    p.add_argument("overrides", nargs="*", help="extra config overrides, e.g. training.lr=1e-3")
    p.set_defaults(func=_demo)

    p = subparsers.add_parser("plan", help="per-GPU memory of a training config, and whether it fits",
                              description="Print the per-GPU memory of a training config (parameters, gradients, "
                                          "optimizer states, reference, activations with and without gradient "
                                          "checkpointing, logits chunk, vLLM's share), whether it fits, and which "
                                          "setting to change first. Reads the model's config.json (no weights): "
                                          "model.path, or --model-config; a hub id or folder name of the built-in "
                                          "table (Qwen2.5-VL-7B-Instruct, Qwen3-VL-8B-Instruct) needs no download, "
                                          "and with no model.path the demo's tiny model is planned.")
    p.add_argument("config", nargs="?", help="YAML config (see configs/); optional")
    p.add_argument("overrides", nargs="*", help="dotted overrides, as given to train")
    p.add_argument("--gpus", type=int, default=8, help="processes (GPUs) the run uses")
    p.add_argument("--gpu-memory-gib", type=float, default=80.0, help="memory of one GPU, GiB")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs of one node (the host RAM rows)")
    p.add_argument("--model-config", default=None,
                   help="the model's shape instead of model.path's: a folder or config.json, a name of the built-in "
                        "table, or tiny:FAMILY[:SIZE]")
    p.add_argument("--vision-tokens", type=int, default=None,
                   help="LLM tokens of a prompt's video or images, 0 for text (default: the longest video the vision "
                        "section admits, at most data.max_prompt_tokens)")
    p.set_defaults(func=_plan)
