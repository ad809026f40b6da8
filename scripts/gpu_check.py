#!/usr/bin/env python3
"""Real-scale check on one GPU: two training steps of a Qwen2.5-VL-3B-shaped and a
Qwen3-VL-8B-shaped model through the real trainer, with step time, memory, tokens/s and MFU.

    python3 scripts/gpu_check.py                        # on the GPU machine (H200), ~5 min
    python3 scripts/gpu_check.py --wheels wheels        # same, installing carried wheels first
    python3 scripts/gpu_check.py --tiny --cpu --out D   # the same logic on CPU, tiny models (~1 min)

From a session with the device tool, after downloading the wheels (below):
    run(command="python3 scripts/gpu_check.py --wheels wheels", carry=["wheels"], timeout_s=600)
The check keeps to --deadline (540 s) and writes $OUT/gpu_check.json after each model.

What runs, per model, in its own process (a crash or timeout of one leaves the other's row):
  1. a model with random weights is built from its config alone (no hub: the released
     architectures' numbers are written below in `SHAPES`, with a small tokenizer and the
     family's processor; the model keeps the real 151,936-row vocabulary so the embedding
     and lm_head cost is real), saved in bfloat16 to a scratch folder;
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
- MFU of the actor update = model FLOPs / update_s / peak, peak = 989e12 (H200 dense bf16;
  --peak-tflops to change), model FLOPs = 6 x (params x tokens each runs on), counting
    * LLM decoder layers + final norm (embedding lookups are not FLOPs) x LLM tokens in the update,
    * lm_head (vocab x hidden) x response tokens only (log-probs are made for those alone,
      `models/logprobs.py`),
    * vision blocks + patch embedding x vision patches, merger(s) x patches / 4 (they run on
      merged tokens).
  Attention's sequence-length term (QK^T, AV) is left out, as in the usual 6ND, so MFU is a
  slight underestimate (about 5-10% at these ~2k-token sequences). Gradient checkpointing
  recomputes the forward (hardware FLOPs ~ 8ND); MFU counts 6ND, as is the convention.
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
import gc
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
H200_BF16_DENSE = 989e12


@dataclass(frozen=True)
class Shape:
    """The numbers of one model to build (text = the LLM, vision = the ViT tower)."""

    family: str
    vocab_size: int
    text_hidden: int
    text_intermediate: int
    text_layers: int
    text_heads: int
    text_kv_heads: int
    head_dim: int
    rope_theta: float
    mrope_section: tuple[int, int, int]
    tie_embeddings: bool
    vision_depth: int
    vision_hidden: int
    vision_intermediate: int
    vision_heads: int
    vision_extra: dict = field(default_factory=dict)
    released_text_layers: int = 0  # depth of the released model (0: same as text_layers)


# From the released config.json files (Qwen/Qwen2.5-VL-3B-Instruct, Qwen/Qwen3-VL-8B-Instruct).
SHAPES: dict[str, Shape] = {
    "qwen2_5_vl_3b": Shape(
        family="qwen2_5_vl", vocab_size=151936, text_hidden=2048, text_intermediate=11008, text_layers=36,
        text_heads=16, text_kv_heads=2, head_dim=128, rope_theta=1e6, mrope_section=(16, 24, 24),
        tie_embeddings=True, vision_depth=32, vision_hidden=1280, vision_intermediate=3420, vision_heads=16,
        vision_extra=dict(window_size=112, fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2,
                          hidden_act="silu")),
    "qwen3_vl_8b": Shape(
        family="qwen3_vl", vocab_size=151936, text_hidden=4096, text_intermediate=12288, text_layers=18,
        text_heads=32, text_kv_heads=8, head_dim=128, rope_theta=5e6, mrope_section=(24, 20, 20),
        tie_embeddings=False, vision_depth=27, vision_hidden=1152, vision_intermediate=4304, vision_heads=16,
        vision_extra=dict(num_position_embeddings=2304, deepstack_visual_indexes=[8, 16, 24],
                          hidden_act="gelu_pytorch_tanh"),
        released_text_layers=36),
}

# The same structures, small, for --tiny (CPU logic check). The vocabulary stays larger than
# the tokenizer (818 tokens), as in the real-shape models, so sampled ids outside it occur.
TINY_SHAPES: dict[str, Shape] = {
    "qwen2_5_vl_3b": replace(SHAPES["qwen2_5_vl_3b"], vocab_size=4096, text_hidden=64, text_intermediate=128,
                             text_layers=2, text_heads=2, text_kv_heads=1, head_dim=32, mrope_section=(4, 6, 6),
                             vision_depth=2, vision_hidden=32, vision_intermediate=64, vision_heads=2,
                             vision_extra={**SHAPES["qwen2_5_vl_3b"].vision_extra, "fullatt_block_indexes": [1]}),
    "qwen3_vl_8b": replace(SHAPES["qwen3_vl_8b"], vocab_size=4096, text_hidden=64, text_intermediate=128,
                           text_layers=2, text_heads=2, text_kv_heads=1, head_dim=32, mrope_section=(6, 5, 5),
                           vision_depth=2, vision_hidden=32, vision_intermediate=64, vision_heads=2,
                           vision_extra={**SHAPES["qwen3_vl_8b"].vision_extra, "num_position_embeddings": 256,
                                         "deepstack_visual_indexes": [0]},
                           released_text_layers=0),
}


@dataclass(frozen=True)
class Workload:
    """Data and batch sizes of the check."""

    clip_side: int  # synthetic frame side, pixels (a multiple of 28 and 32)
    clip_seconds: int  # at 8 fps source, sampled at 2 fps
    prompts: int  # prompts per step: videos and images alternate
    n: int  # responses per prompt
    micro: int  # sequences per forward/backward: 2 prompts' groups, one video and one image
    max_tokens: int  # random weights never stop early: every response is this long


WORKLOADS = {"real": Workload(448, 8, 8, 4, 8, 128), "tiny": Workload(112, 4, 4, 2, 4, 12)}
TASKS = ("colour", "image_colour", "count", "image_count")  # video, image, video, image, ...


# ---------------------------------------------------------------- model building

def hf_config(shape: Shape, tokens: dict[str, int]):
    """The transformers config of `shape` (token ids from the small tokenizer)."""
    import transformers

    text = dict(vocab_size=shape.vocab_size, hidden_size=shape.text_hidden,
                intermediate_size=shape.text_intermediate, num_hidden_layers=shape.text_layers,
                num_attention_heads=shape.text_heads, num_key_value_heads=shape.text_kv_heads,
                rms_norm_eps=1e-6, max_position_embeddings=128000,
                eos_token_id=tokens["<|im_end|>"], pad_token_id=tokens["<|endoftext|>"],
                bos_token_id=tokens["<|endoftext|>"],
                rope_parameters=dict(rope_type="default", rope_theta=shape.rope_theta,
                                     mrope_section=list(shape.mrope_section)))
    vision = dict(depth=shape.vision_depth, hidden_size=shape.vision_hidden,
                  intermediate_size=shape.vision_intermediate, num_heads=shape.vision_heads,
                  out_hidden_size=shape.text_hidden, spatial_merge_size=2, temporal_patch_size=2,
                  **shape.vision_extra)
    if shape.family == "qwen3_vl":
        text["head_dim"] = shape.head_dim
        text["rope_parameters"]["mrope_interleaved"] = True
        vision["patch_size"] = 16
        cls = transformers.Qwen3VLConfig
    elif shape.family == "qwen2_5_vl":
        vision["patch_size"] = 14
        cls = transformers.Qwen2_5_VLConfig
    else:
        raise ValueError(f"no config builder for family {shape.family!r}")
    return cls(text_config=text, vision_config=vision, tie_word_embeddings=shape.tie_embeddings,
               image_token_id=tokens["<|image_pad|>"], video_token_id=tokens["<|video_pad|>"],
               vision_start_token_id=tokens["<|vision_start|>"], vision_end_token_id=tokens["<|vision_end|>"])


def build_model_dir(shape: Shape, out: Path, device) -> int:
    """Write config + bf16 random weights + tokenizer + processor to `out`; return the parameter count."""
    import torch
    from transformers import AutoModelForImageTextToText, GenerationConfig

    from easyvideor1.models.families import get_family
    from easyvideor1.models.tiny import build_processor
    from easyvideor1.models.tokenizer import SPECIAL_TOKENS, build_tokenizer, chat_template

    fam = get_family(shape.family)
    tokenizer = build_tokenizer(chat_template(fam.default_system_prompt))
    tokens = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    config = hf_config(shape, tokens)
    config.architectures = [fam.architecture]
    torch.manual_seed(0)
    with torch.device(device):  # random init on the GPU: seconds instead of minutes on CPU
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.bfloat16)
    end, im_end = tokens["<|endoftext|>"], tokens["<|im_end|>"]
    model.generation_config = GenerationConfig(bos_token_id=end, pad_token_id=end, eos_token_id=[im_end, end])
    n_params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    build_processor(fam, tokenizer).save_pretrained(out)
    del model
    return n_params


# ---------------------------------------------------------------- counting FLOPs

@dataclass
class UpdateCounter:
    """What the actor update's forward passes process, read by a pre-hook on the backbone
    (`model.model`) when gradients are on: rollout and log-prob passes run without gradients,
    and gradient checkpointing recomputes blocks inside it, never the backbone's own call."""

    llm_tokens: int = 0
    vision_patches: int = 0
    images: int = 0
    videos: int = 0
    sequences: int = 0

    def hook(self, module, args, kwargs):
        import torch

        if not torch.is_grad_enabled():
            return
        mask, ids, packing = kwargs.get("attention_mask"), kwargs.get("input_ids"), kwargs.get("packing")
        if hasattr(packing, "rows"):  # right-padded group-shared rows: each row's first block is its group
            self.llm_tokens += sum(row.blocks[0][1] for row in packing.rows)
            self.sequences += len(packing.rows)
        elif packing is not None:  # a padding-free row: its blocks of one are the masked dummy vision tokens
            real = [e - s for s, e in packing.blocks if e - s > 1]
            self.llm_tokens += sum(real)
            self.sequences += len(real)
        else:
            self.llm_tokens += int(mask.sum()) if mask is not None else int(ids.numel())
            self.sequences += int(ids.shape[0]) if mask is not None else 1
        for key, attr in (("image_grid_thw", "images"), ("video_grid_thw", "videos")):
            grid = kwargs.get(key)
            if grid is not None:
                self.vision_patches += int(grid.prod(-1).sum())
                # collate's masked 1-token dummies have a 1 x 2 x 2 grid; real items are larger
                setattr(self, attr, getattr(self, attr) + int((grid.prod(-1) > 4).sum()))


def flop_params(model) -> dict[str, int]:
    """Trainable parameter counts by what they run on (see the module docstring)."""
    from easyvideor1.models.loading import vision_tower

    def count(module, skip=lambda name: False):
        return sum(p.numel() for n, p in module.named_parameters() if p.requires_grad and not skip(n))

    lm = model.model.language_model
    visual = vision_tower(model)
    return dict(
        trainable=sum(p.numel() for p in model.parameters() if p.requires_grad),
        llm_body=count(lm, skip=lambda n: "embed_tokens" in n),
        lm_head=int(model.lm_head.weight.shape[0] * model.lm_head.weight.shape[1]),
        vision_per_patch=count(visual, skip=lambda n: "merger" in n or "pos_embed" in n),
        vision_per_merged=count(visual, skip=lambda n: "merger" not in n),
        merge=int(visual.spatial_merge_size) ** 2 if hasattr(visual, "spatial_merge_size") else 4,
    )


def update_flops(p: dict[str, int], c: UpdateCounter, response_tokens: float) -> float:
    return 6.0 * (p["llm_body"] * c.llm_tokens + p["lm_head"] * response_tokens
                  + p["vision_per_patch"] * c.vision_patches + p["vision_per_merged"] * c.vision_patches / p["merge"])


# ---------------------------------------------------------------- one model (child process)

def run_one(name: str, shape: Shape, work: Path, data: dict, args) -> dict:
    """Build, load and train one model; `result` is rewritten to disk after every phase."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    from easyvideor1.config import load_config
    from easyvideor1.training.setup import build_run
    from easyvideor1.training.trainer import train_step

    res_path = work / f"result_{name}.json"
    result: dict = {"model": name, "family": shape.family, "status": "building", "text_layers": shape.text_layers,
                    "released_text_layers": shape.released_text_layers or shape.text_layers, "steps": []}

    def save(**kv):
        result.update(kv)
        res_path.write_text(json.dumps(result, indent=1))

    save()
    cuda = not args.cpu
    # A group of one rank, made here rather than left to build_run (which makes one only for a
    # compute dtype below float32): FSDP2 then wraps the model with any --dtype.
    if cuda:
        torch.cuda.set_device(0)
    dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    wl = WORKLOADS["tiny" if args.tiny else "real"]
    model_dir = work / f"model_{name}"
    t0 = time.perf_counter()
    n_params = build_model_dir(shape, model_dir, "cuda" if cuda else "cpu")
    gc.collect()  # the built model's reference cycles: its GPU memory goes back before loading
    if cuda:
        torch.cuda.empty_cache()
    save(status="loading", params=n_params, build_s=time.perf_counter() - t0)

    cfg = load_config(None, [
        f"model.path={model_dir}", f"model.dtype={args.dtype}", "model.gradient_checkpointing=true",
        "model.attn_implementation=sdpa", f"vision.family={shape.family}", "vision.fps=2.0",
        f"data.train_files=[{data['train']}]", "data.shuffle=false", "rollout.engine=hf", f"rollout.n={wl.n}",
        f"rollout.max_tokens={wl.max_tokens}", "rollout.temperature=1.0", "algorithm.disable_kl=true",
        f"training.steps={args.steps}", f"training.rollout_batch_size={wl.prompts}",
        f"training.mini_batch_size={wl.prompts}", f"training.micro_batch_size={wl.micro}",
        f"logging.out_dir={work / f'run_{name}'}", "logging.progress=false", "checkpoint.resume=never",
        "checkpoint.export_hf=false"])
    t0 = time.perf_counter()
    run = build_run(cfg)
    shutil.rmtree(model_dir, ignore_errors=True)  # loaded: free the disk for the next model
    params = flop_params(run.model)
    save(status="training", load_s=time.perf_counter() - t0, fsdp2=isinstance(run.model, FSDPModule),
         param_dtype=str(next(run.model.parameters()).dtype).replace("torch.", ""), flop_params=params,
         shared_prefix=run.ctx.shared_prefix, padding_free=run.ctx.padding_free,
         mem_after_load_gib=torch.cuda.memory_allocated() / 2**30 if cuda else None)
    counter = UpdateCounter()
    run.model.model.register_forward_pre_hook(counter.hook, with_kwargs=True)
    peak = args.peak_tflops * 1e12
    for step in range(1, args.steps + 1):
        run.step = step
        for k in asdict(counter):
            setattr(counter, k, 0)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        m = train_step(run, step)
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        if run.sink is not None:
            run.sink.log(step, m)
        responses = (wl.prompts - m.get("data/prompt_failures", 0.0)) * wl.n
        response_tokens = m.get("response/length", 0.0) * responses
        flops = update_flops(params, counter, response_tokens)
        upd = m["time/update"]
        result["steps"].append(dict(
            step=step, wall_s=wall, step_s=m["time/step"], rollout_s=m.get("time/rollout", 0.0), update_s=upd,
            prepare_s=m.get("time/prepare", 0.0), peak_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
            reserved_gib=torch.cuda.max_memory_reserved() / 2**30 if cuda else None,
            tokens_per_s=m["perf/tokens_per_s"], step_tokens=m["perf/tokens_per_s"] * m["time/step"],
            response_tokens=response_tokens, responses=responses, update_tokens=counter.llm_tokens,
            update_tokens_per_s=counter.llm_tokens / upd, vision_patches=counter.vision_patches,
            update_images=counter.images, update_videos=counter.videos, update_sequences=counter.sequences,
            update_flops=flops, mfu=None if args.cpu else flops / upd / peak,
            grad_norm=m.get("update/grad_norm"), reward=m.get("reward/all")))
        save()
    save(status="ok")
    dist.destroy_process_group()
    return result


# ---------------------------------------------------------------- orchestration (parent)

def install_wheels(wheel_dir: Path, work: Path) -> Path:
    """pip-install the carried wheels into `work/site` (no index, no deps); return that folder."""
    site = work / "site"
    wheels = sorted(str(p) for p in wheel_dir.glob("*.whl"))
    if not wheels:
        raise SystemExit(f"gpu_check: no .whl files in {wheel_dir}")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(site),
                    *wheels], check=True)
    return site


def child_env(extra_path: list[str]) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*extra_path, str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               OMP_WAIT_POLICY="PASSIVE", PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True",
               EASYVIDEOR1_FUSED_ATTENTION="1")  # packed attention refuses SDPA's MATH kernel: a fallback raises
    return env


def run_child(name: str, args, work: Path, env: dict, timeout: float) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--work", str(work),
           "--steps", str(args.steps), "--dtype", args.dtype, "--peak-tflops", str(args.peak_tflops),
           *(["--tiny"] if args.tiny else []), *(["--cpu"] if args.cpu else []),
           *[f"--layers={x}" for x in args.layers]]
    log = work / f"log_{name}.txt"
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:  # also when this process is stopped (SIGTERM -> SystemExit): leave no orphan on the GPU
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    res_path = work / f"result_{name}.json"
    result = json.loads(res_path.read_text()) if res_path.is_file() else {"model": name, "steps": []}
    result["seconds"] = time.perf_counter() - t0
    if rc is None:
        result["status"] = f"timeout after {timeout:.0f} s (was {result.get('status', 'starting')})"
    elif rc != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-30:]
        result["status"] = f"failed (exit {rc}, was {result.get('status', 'starting')})"
        result["log_tail"] = tail
    return result


def _fmt(v, spec: str) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)


def table(results: list[dict]) -> str:
    head = ("model", "layers", "params_B", "fsdp2", "dtype", "step1_s", "step_s", "rollout_s", "update_s",
            "peak_GiB", "tok/s", "upd_tok/s", "MFU", "status")
    rows = [head]
    for r in results:
        last = r["steps"][-1] if r.get("steps") else {}
        first = r["steps"][0] if r.get("steps") else {}
        layers = f"{r.get('text_layers', '?')}/{r.get('released_text_layers', '?')}"
        rows.append((r["model"], layers, _fmt(r.get("params", 0) / 1e9, ".2f"), str(r.get("fsdp2", "-")),
                     r.get("param_dtype", "-"), _fmt(first.get("step_s"), ".2f"), _fmt(last.get("step_s"), ".2f"),
                     _fmt(last.get("rollout_s"), ".2f"), _fmt(last.get("update_s"), ".2f"),
                     _fmt(last.get("peak_gib"), ".1f"), _fmt(last.get("tokens_per_s"), ".0f"),
                     _fmt(last.get("update_tokens_per_s"), ".0f"), _fmt(last.get("mfu"), ".1%"), r.get("status", "?")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny models of the same structures (logic check)")
    p.add_argument("--cpu", action="store_true", help="run on CPU with gloo (with --tiny)")
    p.add_argument("--models", default=",".join(SHAPES), help=f"comma list of {', '.join(SHAPES)}")
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
        data = json.loads((args.work / "data.json").read_text())
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
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu_check_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        return check(args, names, work, out, write_out, started)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def check(args, names: list[str], work: Path, out: dict, write_out, started: float) -> int:
    """Data once, then each model in its own process; the table and JSON at the end."""
    extra = []
    if args.wheels is not None:
        extra.append(str(install_wheels(args.wheels, work)))
    sys.path[:0] = [*extra, str(REPO)]
    try:
        import av  # noqa: F401  (the synthetic clips are written and decoded with PyAV)
        import transformers
    except ImportError as e:
        out["error"] = (f"{e}: PyAV (av) writes and decodes the synthetic clips; carry its wheel "
                        "(scripts/gpu_wheels.txt) and pass --wheels DIR")
        print(f"gpu_check: {out['error']}")
        write_out()
        return 3
    out["versions"]["transformers"] = transformers.__version__
    from easyvideor1.data.synth import SynthConfig, write_suite

    wl = WORKLOADS["tiny" if args.tiny else "real"]
    paths = write_suite(work / "data", num_train=wl.prompts * args.steps, num_val=0, tasks=TASKS,
                        cfg=SynthConfig(size=wl.clip_side, cell=wl.clip_side // 2, fps=8, seconds=wl.clip_seconds))
    (work / "data.json").write_text(json.dumps({k: str(v) for k, v in paths.items()}))
    out["workload"] = asdict(wl)
    env = child_env(extra)
    for i, name in enumerate(names):
        left = args.deadline - (time.perf_counter() - started)
        if left < 30:
            out["models"].append({"model": name, "steps": [], "status": "skipped (deadline)"})
            continue
        print(f"gpu_check: {name} ({left:.0f} s left) ...", flush=True)
        result = run_child(name, args, work, env, timeout=left / (len(names) - i))
        out["models"].append(result)
        write_out()
        print(f"gpu_check: {name}: {result['status']} in {result['seconds']:.0f} s", flush=True)
        for line in result.get("log_tail", []):
            print(f"    {line}")
    out["seconds"] = time.perf_counter() - started
    write_out()
    print(table(out["models"]))
    if args.out is not None:
        print(f"gpu_check: wrote {args.out / 'gpu_check.json'}")
    return 0 if all(r.get("status") == "ok" for r in out["models"]) else 1


if __name__ == "__main__":
    sys.exit(main())
