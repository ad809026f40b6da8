"""Memory and step time of full fine-tuning vs LoRA, side by side, same model, data and config.

Each mode runs in its own fresh process (so each peak is its own): the same tiny model, the
synthetic tasks, the KL loss on (full fine-tuning then holds a reference copy; LoRA's
reference is the policy with its adapters off). Printed per mode: trainable / total
parameters, the bytes of parameters + gradients + AdamW states, the process's peak memory
(CPU: peak RSS, which includes the Python/torch baseline; CUDA: peak allocated), and the mean
step time and update time over --steps steps after one warm-up step; then the ratios LoRA / full.

Usage: OMP_WAIT_POLICY=PASSIVE python benchmarks/lora_memory.py [--size small] [--rank 16] [--steps 3]
       [--dtype bfloat16]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: timings swing without it

import argparse
import json
import logging
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from easyvideor1.config import load_config
from easyvideor1.data.synth import write_suite
from easyvideor1.models.lora import parameter_counts
from easyvideor1.models.tiny import SIZES, build_tiny_model
from easyvideor1.training.setup import build_run
from easyvideor1.training.trainer import train_step


def _overrides(work: Path, mode: str, rank: int, dtype: str) -> list[str]:
    out = [f"model.path={work / 'model'}", f"data.train_files=[{work / 'synth' / 'train.jsonl'}]",
           f"logging.out_dir={work / mode}", f"model.dtype={dtype}", "vision.max_frames=8",
           "vision.video_min_pixels=3136", "vision.video_max_pixels=12544", "vision.image_min_pixels=3136",
           "vision.image_max_pixels=12544", "training.rollout_batch_size=8", "training.mini_batch_size=8",
           "training.micro_batch_size=8", "training.lr=1e-4", "rollout.n=4", "rollout.max_tokens=32",
           "rollout.temperature=1.0", "hybrid.enable=true", "algorithm.use_kl_loss=true", "algorithm.kl_coef=0.01",
           "logging.progress=false", "checkpoint.resume=never", "checkpoint.every=0", "data.shuffle=false"]
    if mode == "lora":
        out.append(f"model.lora.rank={rank}")
    return out


def _state_bytes(run) -> dict[str, int]:
    """Bytes of the policy's parameters, their gradients and AdamW's states, and of a separate
    reference model (none under LoRA)."""
    params = sum(p.numel() * p.element_size() for p in run.model.parameters())
    grads = sum(p.numel() * p.element_size() for p in run.model.parameters() if p.requires_grad)
    optim = sum(t.numel() * t.element_size() for s in run.optimizer.state.values() for t in s.values()
                if torch.is_tensor(t) and t.dim() > 0)
    ref = run.reference
    ref_bytes = (sum(p.numel() * p.element_size() for p in ref.parameters())
                 if isinstance(ref, torch.nn.Module) else 0)
    return {"params": params, "grads": grads, "optimizer": optim, "reference": ref_bytes}


def worker(work: Path, mode: str, rank: int, steps: int, dtype: str) -> None:
    logging.basicConfig(level=logging.WARNING)
    cfg = load_config(None, _overrides(work, mode, rank, dtype))
    run = build_run(cfg)
    cuda = torch.cuda.is_available()
    times, updates = [], []
    for step in range(1, 2 + steps):
        metrics = train_step(run, step)
        if step > 1:
            times.append(metrics["time/step"])
            updates.append(metrics.get("time/update", 0.0))
    trainable, total = parameter_counts(run.model)
    peak = (torch.cuda.max_memory_allocated() if cuda
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)  # Linux: KiB
    print(json.dumps({"mode": mode, "trainable": trainable, "total": total, **_state_bytes(run), "peak": peak,
                      "peak_kind": "CUDA peak allocated" if cuda else "peak RSS",
                      "step_s": sum(times) / len(times), "update_s": sum(updates) / len(updates)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="small", choices=list(SIZES), help="tiny model size (largest: small)")
    ap.add_argument("--rank", type=int, default=16, help="LoRA rank")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per mode (after 1 warm-up step)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="compute dtype (bfloat16: FSDP2 mixed precision; LoRA stores the frozen base in it)")
    ap.add_argument("--work", default=None, help="folder for the model and data (default: a temp dir)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="lora_memory_"))
    if args.worker:
        worker(work, args.worker, args.rank, args.steps, args.dtype)
        return
    build_tiny_model("qwen2_5_vl", work / "model", seed=0, size=args.size)
    write_suite(work / "synth", num_train=32, num_val=0, seed=0)
    results = {}
    for mode in ("full", "lora"):
        cmd = [sys.executable, __file__, "--worker", mode, "--work", str(work), "--rank", str(args.rank),
               "--steps", str(args.steps), "--dtype", args.dtype]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        if proc.returncode:
            raise SystemExit(f"{mode} run failed:\n{proc.stderr[-4000:]}")
        results[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    full, lora = results["full"], results["lora"]
    mib = 1 / 2**20
    print(f"\nqwen2_5_vl tiny size '{args.size}', {args.dtype}, 8 prompts x 4 responses, KL loss on, "
          f"{args.steps} timed steps; LoRA rank {args.rank}")
    rows = [("trainable parameters", "trainable", 1, "{:,.0f}"), ("total parameters", "total", 1, "{:,.0f}"),
            ("policy parameters MiB", "params", mib, "{:.2f}"), ("gradients MiB", "grads", mib, "{:.2f}"),
            ("AdamW states MiB", "optimizer", mib, "{:.2f}"), ("reference copy MiB", "reference", mib, "{:.2f}"),
            (f"{full['peak_kind']} MiB", "peak", mib, "{:.1f}"), ("step time s", "step_s", 1, "{:.3f}"),
            ("update time s", "update_s", 1, "{:.3f}")]
    print(f"{'':<26}{'full FT':>14}{'LoRA':>14}{'LoRA/full':>12}")
    for label, key, scale, fmt in rows:
        a, b = full[key] * scale, lora[key] * scale
        ratio = f"{b / a:.3f}" if a else "-"
        print(f"{label:<26}{fmt.format(a):>14}{fmt.format(b):>14}{ratio:>12}")
    state_full = full["params"] + full["grads"] + full["optimizer"] + full["reference"]
    state_lora = lora["params"] + lora["grads"] + lora["optimizer"] + lora["reference"]
    print(f"\ntrainable-parameter ratio (LoRA / full): {lora['trainable'] / full['trainable']:.4f}")
    print(f"training state (params + grads + AdamW + reference): {state_full * mib:.2f} -> {state_lora * mib:.2f} MiB "
          f"({state_lora / state_full:.3f}x)")


if __name__ == "__main__":
    main()
