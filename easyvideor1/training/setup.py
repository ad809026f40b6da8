"""Build a `Run` from a `Config`: data, frames, models, engine, optimizer, metrics sink."""

from __future__ import annotations

import logging
import math
import random
from functools import partial
from pathlib import Path

import numpy as np
import torch

from easyvideor1 import distributed
from easyvideor1.config import Config
from easyvideor1.config_tree import ConfigError, to_dict
from easyvideor1.data.templates import render_prompt
from easyvideor1.data.loading import load_samples
from easyvideor1.algorithms import make_kl_controller
from easyvideor1.algorithms.rollout_correction import resolve_rollout_correction
from easyvideor1.models.families import Family, family_of
from easyvideor1.models.loading import load_policy, load_processor, load_reference, resolve_dtype
from easyvideor1.models.lora import ReferenceView, apply_lora, parameter_counts
from easyvideor1.models.meta_init import WeightSource, fill_weights
from easyvideor1.models.mrope import mrope_spec
from easyvideor1.models.kernel_check import set_strict as strict_kernels
from easyvideor1.models.packing import packing_blocker, use_packed_attention
from easyvideor1.models.routing import router_settings
from easyvideor1.models.shared_prefix import shared_prefix_blocker
from easyvideor1.records import Sample
from easyvideor1.rewards.batch import ScoringPool, score_batch
from easyvideor1.prompts import PromptBuilder
from easyvideor1.rollout.base import banned_token_ids
from easyvideor1.rollout.hf_engine import HFEngine
from easyvideor1.rollout.tools.multiturn import ToolEngine, ToolLimits
from easyvideor1.rollout.tools.registry import get_tools, tools_not_on
from easyvideor1.rollout.tools.video_tools import ClipSource
from easyvideor1.rollout.vllm_engine import VLLMEngine  # imports vllm only when one is built
from easyvideor1.rollout.vllm_inputs import check_media_limits
from easyvideor1.training.asynchronous.placement import check_placement, rollout_ranks
from easyvideor1.training.asynchronous.trainer_side import remote_rollouts
from easyvideor1.training.fsdp import init_distributed, run_root_once, shard, untie_head
from easyvideor1.training.groups import RolloutStage, stop_token_ids
from easyvideor1.training.loader import PromptLoader
from easyvideor1.training.metrics import MetricsSink
from easyvideor1.training.sequence_parallel import data_parallel, setup_sequence_parallel, split_rollouts
from easyvideor1.training.sequences import ForwardContext
from easyvideor1.training.recompute import gradient_checkpointing
from easyvideor1.training.run import Run
from easyvideor1.training.state.checkpoint import checkpoint_room
from easyvideor1.vision.cache import FrameSource

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def load_split(files: list[str], cfg: Config) -> list[Sample]:
    samples: list[Sample] = []
    for f in files:
        samples += load_samples(f, data_root=cfg.data.data_root, on_error=cfg.data.on_error)
    return samples


def make_score_fn(cfg: Config):
    """Rewards in this process (`scoring.workers=0`), or in a pool of worker processes kept for
    the whole run (started once, not per step)."""
    if cfg.scoring.workers <= 0:
        return lambda responses, samples: score_batch(responses, samples, cfg.reward, workers=0)
    pool = ScoringPool(cfg.reward, workers=cfg.scoring.workers, timeout_s=cfg.scoring.timeout_s)
    return pool.score


def make_optimizer(params, cfg: Config) -> torch.optim.Optimizer:
    """`training.optimizer`: AdamW (lr, weight decay), or plain SGD (lr only; it keeps no state)."""
    t = cfg.training
    if t.optimizer == "sgd":
        return torch.optim.SGD(params, lr=t.lr)
    return torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay)


def make_scheduler(optimizer, cfg: Config):
    t = cfg.training

    def factor(step: int) -> float:
        if t.warmup_steps and step < t.warmup_steps:
            return (step + 1) / t.warmup_steps
        if t.lr_schedule == "cosine":
            flat = t.lr_decay_start * (t.steps - t.warmup_steps)
            progress = (step - t.warmup_steps - flat) / max(1, t.steps - t.warmup_steps - flat)
            return 0.5 * (1 + math.cos(math.pi * min(1.0, max(0.0, progress))))
        return 1.0
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def make_engine(cfg: Config, model, processor, family, spec, samples: list[Sample] = ()):
    """The rollout engine named by `rollout.engine` (vLLM imported only when chosen).

    vLLM: with more than one process in the default group (torchrun's ranks, or a pool of rollout
    processes, `rollout_side.join_pool`) one engine per process (`external_launcher`; the
    processes of a tensor-parallel group share one), in one process an in-process engine core
    (weight syncs stay in memory),
    context = `data.max_prompt_tokens + rollout.max_tokens`, LM head tied as in the policy
    (FSDP unties it). `samples` are checked against the per-prompt media limits.
    """
    if cfg.rollout.engine == "vllm":
        r, world = cfg.rollout, distributed.world_size()
        if world % r.tensor_parallel_size:
            raise ConfigError(f"rollout.tensor_parallel_size={r.tensor_parallel_size} must divide the number of "
                             f"processes ({world})")
        limits = {"video": r.limit_videos, "image": r.limit_images}
        check_media_limits(list(samples), limits)
        untied = model.lm_head.weight is not model.get_input_embeddings().weight  # FSDP unties
        if r.tools:
            limits = ToolLimits(max_turns=r.max_turns).media_limits(limits)
        return VLLMEngine(cfg.model.path, dtype=r.dtype, tensor_parallel_size=r.tensor_parallel_size,
                          max_model_len=cfg.data.max_prompt_tokens + r.max_tokens,
                          gpu_memory_utilization=r.gpu_memory_utilization,
                          limit_mm_per_prompt=limits,
                          enable_sleep_mode=None if r.sleep else False, seed=cfg.training.seed,
                          enforce_eager=r.enforce_eager, external_launcher=world > 1, untie_embeddings=untied,
                          in_process_engine=True,  # syncs in memory, no weights file (`rollout.vllm_engine`)
                          return_routes=family.moe and cfg.algorithm.routing_replay == "rollout")
    return HFEngine(model, processor, family, spec, max_batch_tokens=cfg.rollout.max_batch_tokens)


def make_rollouts(cfg: Config, model, processor, family, spec, frames: FrameSource, samples: list[Sample],
                  token_engine=None, split=None, count_group=None) -> tuple[PromptBuilder, RolloutStage]:
    """The prompt builder and the rollout stage, alike for colocated training and the rollout side
    of separate placement: over `token_engine` (default: `make_engine`'s), which `rollout.tools`
    wraps in the multi-turn tool loop (`ToolEngine`: the prompts offer the tools' schemas, tool
    turns are masked, offline trajectories replayed). `split`, `count_group`: `RolloutStage`'s."""
    engine = token_engine or make_engine(cfg, model, processor, family, spec, samples)
    tools = get_tools(cfg.rollout.tools)
    if tools:
        r = cfg.rollout
        engine = ToolEngine(engine, processor, family, spec, tools, ClipSource(cfg.vision),
                            ToolLimits(r.max_turns, r.tool_call_visual_tokens, r.tool_response_visual_tokens))
    prompts = PromptBuilder(frames, processor, family, spec,
                            render=partial(render_prompt, template_dir=cfg.data.template_dir),
                            max_prompt_tokens=cfg.data.max_prompt_tokens,
                            tools=[t.schema() for t in tools.values()] or None)
    rollouts = RolloutStage(engine, make_score_fn(cfg), processor.tokenizer, _end_token(processor), cfg.rollout,
                            cfg.hybrid, cfg.algorithm, cfg.training.seed,
                            stop_token_ids(cfg.rollout.stop_tokens, processor.tokenizer), split=split,
                            count_group=count_group, replay=engine.replay if tools else None)
    return prompts, rollouts


def shared_prefix_state(cfg: Config, model, reference, rank: int) -> bool:
    """`training.shared_prefix` where the policy and the reference can share a group's prompt
    exactly (`models.shared_prefix`); the state, and why not when it falls back, is logged once.
    The same on every rank: it depends only on the config and the model's config."""
    if not cfg.training.shared_prefix:
        state, why = False, "off (training.shared_prefix=false)"
    else:
        reasons = {shared_prefix_blocker(m.config) for m in (model, reference) if m is not None} - {None}
        state = not reasons
        why = "on" if state else "off, plain path instead: " + "; ".join(sorted(reasons))
        n, micro = cfg.rollout.n, cfg.training.micro_batch_size
        if state and cfg.training.micro_batch_tokens:
            why += " (whole groups per micro-batch: training.micro_batch_tokens)"
        elif state and micro % n and n % micro == 0:
            why += f" (micro_batch_size {micro} < rollout.n {n}: each prompt runs {n // micro} times per pass)"
        elif state and micro % n:
            why += (f" (micro_batch_size {micro} is no multiple of rollout.n {n}: groups cut by a micro-batch "
                    "run their prompt once per part)")
    if rank == 0:
        log.info("shared prefix (a group's prompt runs once per micro-batch): %s", why)
    return state


def padding_free_state(cfg: Config, family: Family, model, reference, rank: int) -> bool:
    """`training.padding_free` where the policy and the reference can run packed rows exactly
    (`models.packing`); the state, and why not when it falls back to padded rows, is logged once.
    The same on every rank: it depends only on the config and the model's config."""
    if not cfg.training.padding_free:
        state, why = False, "off (training.padding_free=false)"
    else:
        reasons = {packing_blocker(m.config) for m in (model, reference) if m is not None} - {None}
        if not reasons and not family.padding_free:
            reasons.add(f"family {family.name} does not pack (Family.padding_free)")
        state = not reasons
        why = "on" if state else "off, padded instead: " + "; ".join(sorted(reasons))
    if rank == 0:
        log.info("padding-free rows (micro-batch sequences packed in one row, attention per sequence): %s", why)
    return state


def build_run(cfg: Config) -> Run:
    """Everything the loop needs, built in dependency order."""
    compute_dtype = resolve_dtype(cfg.model.dtype)
    # A process group also in one process when computing below float32: FSDP2's mixed-precision
    # policy is what keeps float32 master weights beside bf16 compute.
    check_placement(cfg, distributed.launched()[1])
    # under torchrun with separate placement the last ranks are rollout ranks: not in this world
    rank, world, device = init_distributed(need_group=compute_dtype != torch.float32, rollout_ranks=rollout_ranks(cfg),
                                           timeout_minutes=cfg.training.collective_timeout_minutes)
    seed_everything(cfg.training.seed)
    t = cfg.training
    dp_world = data_parallel(cfg, rank, world).world  # processes / sequence_parallel_size
    if t.rollout_batch_size % dp_world or t.mini_batch_size % dp_world:
        raise ConfigError(f"training.rollout_batch_size={t.rollout_batch_size} and training.mini_batch_size="
                          f"{t.mini_batch_size} must be multiples of the number of data-parallel ranks ({dp_world}), "
                          "so every rank holds the same share of every mini-batch")
    train_samples = load_split(cfg.data.train_files, cfg)
    if rank == 0 and len(train_samples) < t.rollout_batch_size:  # not an error: a small set is fine to try things
        log.warning("data.train_files has %d samples, fewer than training.rollout_batch_size %d: each step reuses "
                    "samples", len(train_samples), t.rollout_batch_size)
    val_samples = load_split(cfg.data.val_files, cfg)
    frames = FrameSource(cfg.vision, cfg.data.cache_dir, cfg.data.cache_mode)

    m = cfg.model
    strict_kernels(m.strict_kernels)  # CUDA attention that would run SDPA's MATH kernel: an error, not a warning
    # Built on the meta device, sharded, then each rank reads only its own rows (`models.meta_init`).
    # The policy's parameters and AdamW states are float32 (master weights); `model.dtype` is the
    # compute dtype, applied by FSDP2 (`shard(param_dtype=...)`). At lr 1e-6, bf16 parameters
    # would round most updates away.
    recompute, why = gradient_checkpointing(cfg)
    if rank == 0:
        log.info("gradient checkpointing: %s (%s)", "on" if recompute else "off", why)
    model = load_policy(m.path, "float32", m.attn_implementation, m.freeze_vision, recompute, "meta")
    weights = WeightSource(m.path, model)  # names and tied pairs as built, before LoRA and FSDP2
    family, spec = family_of(model.config), mrope_spec(model.config)
    if family.name != cfg.vision.family:
        raise ConfigError(f"model {m.path} is {family.name} but vision.family={cfg.vision.family}: the frame sizes "
                         f"would not fit its grid; set vision.family={family.name}")
    processor = load_processor(m.path)
    # separate placement in one process: the rollout processes start here, after the config's
    # checks, and import and load while this process fills its weights
    remote = remote_rollouts(cfg, device, rank)
    lora = m.lora
    if lora.rank:
        apply_lora(model, lora.rank, lora.scale_alpha, lora.dropout, lora.target_modules, lora.vision,
                   lora.modules_to_save, base_dtype=compute_dtype)  # the frozen base: no float32 masters
    # LoRA's reference is the policy with its adapters off: no second copy of the weights.
    reference = (None if not cfg.algorithm.needs_reference
                 else ReferenceView(model) if lora.rank
                 else load_reference(m.path, m.dtype, m.attn_implementation, "meta"))
    reference_weights = WeightSource(m.path, reference) if reference is not None and not lora.rank else None
    padding_free = padding_free_state(cfg, family, model, reference, rank)
    shared_prefix = shared_prefix_state(cfg, model, reference, rank)
    if padding_free or shared_prefix:  # before sharding; LoRA's ReferenceView shares the policy's config
        for net in (model, reference):  # packed rows and group rows (padded too) run as pieces, no mask
            if net is not None:
                use_packed_attention(net)  # language model only; SDPA when called unpacked (generate)
    # after packing: sequence parallelism puts the language model on Ulysses attention (packed rows too)
    processor_pad = processor.tokenizer.pad_token_id
    sp, dp = setup_sequence_parallel(cfg, [m for m in (model, reference) if m is not None], rank, processor_pad)
    untie_head(model)  # also with no group to shard over: a tied model trains alike in any launch
    checkpoint_room(cfg, *parameter_counts(model))  # before any weight is read
    shard(model, param_dtype=None if compute_dtype == torch.float32 else compute_dtype, vision_unit=sp is not None)
    if reference is not None and not lora.rank:
        shard(reference, vision_unit=sp is not None)
    fill_weights(model, weights, device)
    if reference_weights is not None:
        fill_weights(reference, reference_weights, device)
    # FSDP2 must know its roots first: the passes call the backbone and the head directly (and, under
    # sequence parallelism, the vision tower before the backbone)
    for m in (model, reference):
        if m is not None:
            run_root_once(m, device)
    if sp is not None:
        log.info("sequence parallelism: %d ranks per row, %d data-parallel groups", sp.size, dp.world)
    trainable, total = parameter_counts(model)
    log.info("parameters: %s trainable / %s total (%.2f%%)%s", f"{trainable:,}", f"{total:,}",
             100 * trainable / total, f", LoRA rank {lora.rank}" if lora.rank else "")
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(params, cfg)
    ctx = ForwardContext(family=family, spec=spec, pad_token_id=processor.tokenizer.pad_token_id,
                         micro_batch_size=cfg.training.micro_batch_size,
                         micro_batch_tokens=cfg.training.micro_batch_tokens,
                         shared_prefix=shared_prefix, padding_free=padding_free,
                         chunk_size=cfg.training.logprob_chunk_size,
                         # log-probs of the distribution the engine sampled from (greedy: the raw one)
                         temperature=cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0, device=device,
                         pixel_dtype=compute_dtype, banned_ids=tuple(banned_token_ids(processor.tokenizer)))
    if sp is not None:  # rows are split over the group's ranks: they must be packed rows
        ctx.padding_free, ctx.sequence_parallel = True, sp
    ctx.router_shape, ctx.routing_replay = router_settings(cfg.algorithm.routing_replay, model, sp is not None)
    separate = cfg.rollout.placement == "separate"  # the rollout side generates; this HF engine only validates
    count, names = tools_not_on(train_samples + val_samples, cfg.rollout.tools)
    if count:
        log.info("%d sample(s) list tools that rollout.tools does not turn on (%s): they are not offered",
                 count, ", ".join(names))
    validator = HFEngine(model, processor, family, spec, max_batch_tokens=cfg.rollout.max_batch_tokens) \
        if separate else None
    prompts, rollouts = make_rollouts(cfg, model, processor, family, spec, frames, train_samples + val_samples,
                                      token_engine=validator,
                                      split=None if sp is None else partial(split_rollouts, sp), count_group=dp.group)
    correction, why = resolve_rollout_correction(cfg.algorithm.rollout_correction, cfg.rollout.engine,
                                                 asynchronous=separate and cfg.training.max_staleness > 0)
    log.info("rollout correction: %s (%s)%s", correction, why,
             "" if correction == "none" else f", threshold C={cfg.algorithm.rollout_correction_threshold:g}")
    Path(cfg.logging.out_dir).mkdir(parents=True, exist_ok=True)
    sink = MetricsSink(cfg.logging.out_dir, cfg.logging.tensorboard, cfg.logging.wandb, cfg.logging.wandb_project,
                       config=to_dict(cfg) | {"shared_prefix_active": ctx.shared_prefix,
                                              "padding_free_active": ctx.padding_free}, enabled=rank == 0)
    return Run(cfg=cfg, model=model, reference=reference, optimizer=optimizer,
               scheduler=make_scheduler(optimizer, cfg), kl=make_kl_controller(cfg.algorithm),
               loader=PromptLoader(train_samples, cfg.training.rollout_batch_size, cfg.training.seed, cfg.data.shuffle),
               prompts=prompts, rollouts=rollouts, ctx=ctx, padding=prompts.empty(), val_samples=val_samples,
               sink=sink, rank=rank, world=world, data=dp, rollout_correction=correction,
               remote=remote)


def _end_token(processor) -> str:
    tok = processor.tokenizer
    return "<|im_end|>" if "<|im_end|>" in tok.get_vocab() else (tok.eos_token or "")
