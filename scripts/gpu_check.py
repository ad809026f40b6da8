#!/usr/bin/env python3
"""Real-scale check on one GPU: two training steps of a Qwen2.5-VL-3B-shaped and a
Qwen3-VL-8B-shaped model through the real trainer, with step time, memory, tokens/s and MFU; the
realistic row (a Qwen2.5-VL-7B shape on a 16k-token video); the 60-second A1 attention check.

    python3 scripts/gpu_check.py                        # on the GPU machine (H200), ~5 min
    python3 scripts/gpu_check.py --wheels wheels        # same, installing carried wheels first
    python3 scripts/gpu_check.py --models qwen2_5_vl_7b --wheels wheels   # the realistic row
    python3 scripts/gpu_check.py --a1                   # review section F: one GQA shared block, 60 s
    python3 scripts/gpu_check.py --a1 --cpu --a1-tokens 1280   # its code path, small, on CPU
    python3 scripts/gpu_check.py --tiny --cpu --out D   # the same logic on CPU, tiny models (~1 min)

The realistic row (`qwen2_5_vl_7b`, issue 26): hidden 3584, 28 query / 4 key-value heads, MLP
18944, vocabulary 152064, 18 of the released 28 decoder layers (the released vision tower), random
bf16 weights built here; one 64 s clip at 2 fps (128 frames of 448 px = 16,384 video tokens), 8
responses of 1,024 tokens, the group in one micro-batch: shared prefix + padding-free (one
~24.6k-token block), gradient checkpointing. Target: peak < 70 GiB on one H200, update MFU >= 35%.
Its first step is profiled: the table's `fused` says a fused attention kernel (flash, efficient,
cudnn or flex) ran, and the check fails if none did; the packed-row and vision-tower attention
calls run with MATH refused (`EASYVIDEOR1_FUSED_ATTENTION=1`), so a fallback raises.

The pieces are in `scripts/gpucheck/` (shapes, flops, kernels, child, parent).

From a session with the device tool, after downloading the wheels (below):
    run(command="python3 scripts/gpu_check.py --wheels wheels", carry=["wheels"], timeout_s=600)
The check keeps to --deadline (540 s) and writes $OUT/gpu_check.json after each model.

What runs, per model, in its own process (a crash or timeout of one leaves the other's row):
  1. a model with random weights is built from its config alone (no hub: the released
     architectures' numbers are written in `gpucheck/shapes.py`, with a small tokenizer and the
     family's processor; the model keeps the real 151,936-row (7B: 152,064) vocabulary so the
     embedding and lm_head cost is real), saved in bfloat16 to a scratch folder;
  2. `training.setup.build_run` on it, with the HF rollout engine, a process group of world
     size 1 (NCCL; gloo with --cpu), FSDP2 as `training/fsdp.py` applies it,
     `model.dtype: bfloat16` (fp32 master weights and AdamW states, bf16 compute through
     FSDP2's MixedPrecisionPolicy; the table's dtype column shows the parameters' dtype) and
     gradient checkpointing;
  3. `training.trainer.train_step` twice on synthetic data (`data.synth`: 448x448 clips of 8 s,
     sampled at 2 fps -> 16 frames, and 448x448 images), every step and every micro-batch
     holding both videos and images.
  `trainer.train` is not called because it always ends with a full checkpoint (fp32 weights
  + AdamW state: 12 bytes/param, 45-64 GB here, on a 64 GiB disk) and its progress bar.

The Qwen3-VL-8B shape keeps every width of the released model but, by default, 18 of its 36
decoder layers: with fp32 master weights, fp32 gradients and AdamW's two fp32 moments the
full 8.8B model holds 16 bytes/param = 131 GiB on one GPU, and AdamW's multi-tensor step
briefly needs about one more fp32 copy, against the H200's 140 GiB (with activations, the bf16
compute copies and the rollout's KV cache on top). At 18 layers it is 5.3B params (79 GiB of
states). Per-layer cost is the same, so time and memory scale about linearly in depth;
`--layers qwen3_vl_8b=36` tries the full depth.

How the numbers are counted (printed as a table, also written to $OUT/gpu_check.json):
- step_s: the trainer's `time/step` (sum of its stage timers); rollout_s / update_s: its
  `time/rollout` and `time/update` stages. The last step is the steady one (the first pays
  CUDA and allocator warm-up). Stage timers do not synchronise CUDA, so a few ms of queued
  work can move between neighbouring stages.
- peak_gib: torch.cuda.max_memory_allocated() over the step (reset before each step).
- tok/s: the trainer's `perf/tokens_per_s` (prompt tokens once per prompt + response tokens,
  over the whole step). upd_tok/s: LLM tokens of the actor update (every prompt+response
  sequence, or with the group-shared prefix, `shared_prefix` in the JSON, each prompt once plus
  its responses; counted by a forward pre-hook on the backbone when gradients are on) / update_s.
- MFU of the actor update = update FLOPs / update_s / peak, peak = 989e12 (H200 dense bf16;
  --peak-tflops to change). Update FLOPs = 6 x (params x tokens each runs on) + attention's
  QK^T and AV (12 x layers x heads x head_dim x attended pairs, LLM and vision tower): the
  formulas are in `gpucheck/flops.py`. MFU_6ND leaves attention out (the usual 6ND).
  The update includes its optimizer step, gradient clipping and per-micro-batch metric reads.

Packages: the GPU machine's image has torch 2.11, transformers 5.17 and the rest, but no PyAV
(`av`), which the synthetic data writer and the PyAV decoder need (torchcodec is absent there
too; decoding falls back to PyAV). Carry its wheel: `scripts/gpu_wheels.txt` lists it (first
line, the only one this check needs) and the pure-Python wheels other rewards import lazily.
On the CPU machine: `pip download --no-deps --only-binary=:all: --python-version 3.12
--platform manylinux_2_28_x86_64 -r scripts/gpu_wheels.txt -d wheels` (wheels/ is git-ignored;
carry it), then on the GPU machine `python3 scripts/gpu_check.py --wheels wheels`, which
installs them with pip --no-index into a scratch folder put on the path (nothing system-wide).

Without CUDA (and without --cpu) it prints why it measured nothing and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the gpucheck package beside this script

from gpucheck.child import run_one  # noqa: E402
from gpucheck.kernels import a1_check  # noqa: E402
from gpucheck.parent import REPO, check  # noqa: E402
from gpucheck.shapes import SHAPES, TINY_SHAPES  # noqa: E402

H200_BF16_DENSE = 989e12
DEFAULT_MODELS = ("qwen2_5_vl_3b", "qwen3_vl_8b")  # the realistic row is asked for by name


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny models of the same structures (logic check)")
    p.add_argument("--cpu", action="store_true", help="run on CPU with gloo (with --tiny)")
    p.add_argument("--models", default=",".join(DEFAULT_MODELS), help=f"comma list of {', '.join(SHAPES)}")
    p.add_argument("--layers", action="append", default=[], metavar="MODEL=N", help="override a model's LLM depth")
    p.add_argument("--steps", type=int, default=2, help="training steps per model")
    p.add_argument("--dtype", default="bfloat16", help="model.dtype: the compute dtype (bfloat16 on CPU too)")
    p.add_argument("--deadline", type=float, default=540.0, help="seconds for everything (models share what is left)")
    p.add_argument("--peak-tflops", type=float, default=H200_BF16_DENSE / 1e12, help="peak bf16 TFLOP/s for MFU")
    p.add_argument("--wheels", type=Path, default=None, help="folder of carried wheels to install first")
    p.add_argument("--work", type=Path, default=None, help="scratch folder (default: a new temp folder)")
    p.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None,
                   help="folder for gpu_check.json (default: $OUT)")
    p.add_argument("--keep", action="store_true", help="keep the scratch folder")
    p.add_argument("--a1", action="store_true", help="only the review's section F check (60 s on a GPU)")
    p.add_argument("--a1-tokens", default="4096,8192", help="block lengths of --a1 (comma list, >= 1280)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    shapes = TINY_SHAPES if args.tiny else SHAPES
    for item in args.layers:
        key, _, n = item.partition("=")
        if key not in shapes or not n.isdigit():
            p.error(f"--layers {item!r}: expected MODEL=N with MODEL one of {', '.join(shapes)}")
        shapes = {**shapes, key: replace(shapes[key], text_layers=int(n))}

    if args.child:
        sys.path.insert(0, str(REPO))
        data = json.loads((args.work / "data.json").read_text())[args.child]
        run_one(args.child, shapes[args.child], args.work, data, args)
        return 0

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the clean-ups below when stopped
    started = time.perf_counter()
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in shapes]
    if unknown:
        p.error(f"unknown model(s) {unknown}; known: {', '.join(shapes)}")
    out = {"tiny": args.tiny, "cpu": args.cpu, "dtype": args.dtype, "peak_tflops": args.peak_tflops, "models": []}

    def write_out() -> None:
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "gpu_check.json").write_text(json.dumps(out, indent=1))

    import torch

    if not args.cpu and not torch.cuda.is_available():
        out["error"] = "no CUDA device: nothing measured (use --tiny --cpu to check the logic on CPU)"
        print(f"gpu_check: {out['error']}")
        write_out()
        return 2
    out["device"] = torch.cuda.get_device_name(0) if not args.cpu else "cpu"
    out["versions"] = {"torch": torch.__version__, "python": sys.version.split()[0]}
    if args.a1:
        sys.path.insert(0, str(REPO))
        out["a1"] = a1_check("cpu" if args.cpu else "cuda", [int(n) for n in args.a1_tokens.split(",")])
        write_out()
        return 0 if args.cpu or all(r.get("fused") for r in out["a1"]) else 1
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu_check_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        return check(args, names, work, out, write_out, started)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)



if __name__ == "__main__":
    sys.exit(main())
