"""One model's run of the GPU check, in its own process (a crash or timeout of one leaves the
other rows): build the model, `training.setup.build_run` on it (HF rollout engine, a process group
of world size 1, FSDP2, bf16 compute, gradient checkpointing), then `train_step` per step with
peak memory, stage times, token rates, MFU and which attention kernels ran (the first step,
profiled). `result` is rewritten to `work/result_NAME.json` after every phase."""

from __future__ import annotations

import gc
import json
import shutil
import time
from pathlib import Path

from gpucheck.flops import UpdateCounter, flop_params, update_attention_flops, update_flops, vision_window
from gpucheck.kernels import KernelLog, fused_ran
from gpucheck.shapes import Shape, build_model_dir, workload


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
    wl = workload(name, args.tiny)
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
        # the workload's clips whole (every frame; 448 px ones at their size, tiny ones raised to the default
        # minimum as before), one medium a prompt: within data.max_prompt_tokens, checked at load
        f"vision.max_frames={2 * wl.clip_seconds}", "rollout.limit_images=1",
        *([f"vision.video_max_pixels={wl.clip_side ** 2}"] if wl.clip_side ** 2 >= 128 * 28 * 28 else []),
        f"data.train_files=[{data['train']}]", "data.shuffle=false", f"data.max_prompt_tokens={wl.max_prompt_tokens}",
        "rollout.engine=hf", f"rollout.n={wl.n}",
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
    counter = UpdateCounter(window=vision_window(run.model.config), merge=int(params["merge"] ** 0.5))
    run.model.model.register_forward_pre_hook(counter.hook, with_kwargs=True)
    peak = args.peak_tflops * 1e12
    for step in range(1, args.steps + 1):
        run.step = step
        counter.reset()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        if step == 1:  # the warm-up step, profiled for the attention kernels (operator names only)
            with KernelLog() as log:
                m = train_step(run, step)
            why = fused_ran(log.counts) if cuda else None
            save(attention_kernels=log.counts, fused_attention=why is None if cuda else None)
            if why is not None:
                raise SystemExit(f"gpu_check {name}: {why}")
        else:
            m = train_step(run, step)
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        if run.sink is not None:
            run.sink.log(step, m)
        responses = (wl.prompts - m.get("data/prompt_failures", 0.0)) * wl.n
        response_tokens = m.get("response/length", 0.0) * responses
        flops = update_flops(params, counter, response_tokens)
        attn = update_attention_flops(params, counter)
        upd = m["time/update"]
        result["steps"].append(dict(
            step=step, wall_s=wall, step_s=m["time/step"], rollout_s=m.get("time/rollout", 0.0), update_s=upd,
            prepare_s=m.get("time/prepare", 0.0), peak_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
            reserved_gib=torch.cuda.max_memory_reserved() / 2**30 if cuda else None,
            tokens_per_s=m["perf/tokens_per_s"], step_tokens=m["perf/tokens_per_s"] * m["time/step"],
            response_tokens=response_tokens, responses=responses, update_tokens=counter.llm_tokens,
            update_tokens_per_s=counter.llm_tokens / upd, vision_patches=counter.vision_patches,
            update_images=counter.images, update_videos=counter.videos, update_sequences=counter.sequences,
            update_flops=flops, attention_flops=attn, llm_pairs=counter.llm_pairs,
            vision_full_pairs=counter.vision_full_pairs, vision_window_pairs=counter.vision_window_pairs,
            mfu=None if args.cpu else (flops + attn) / upd / peak, mfu_dense=None if args.cpu else flops / upd / peak,
            grad_norm=m.get("update/grad_norm"), reward=m.get("reward/all")))
        save()
    save(status="ok")
    dist.destroy_process_group()
    return result


