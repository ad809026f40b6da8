"""Distributed set-up and FSDP2 (`fully_shard`) wrapping of the policy and reference.

The same command runs in 1 process or under torchrun on N GPUs / N nodes:

    torchrun --nproc-per-node 8 -m easyvideor1.cli train configs/qwen2_5_vl_7b_8gpu.yaml
    torchrun --nnodes 2 --node-rank $RANK --nproc-per-node 8 \
             --rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:29500 -m easyvideor1.cli train CONFIG

Units: each decoder layer, each vision block, then the backbone (`model.model`) and the
`lm_head` as their own units (log-probs call them directly, `models.logprobs`), then the root.
Tied input/output embeddings are untied first (a tied pair cannot sit in two units). The head
unit gets one more forward method (`models.logprobs.HEAD_PASS`, FSDP2's
`register_fsdp_forward_method`): a whole chunked log-prob pass runs as one forward of it, so the
head is gathered once per pass, not once per chunk. Call `run_root_once` after sharding: the
root module must be the FSDP root of every unit below it (module docstring of `run_root_once`).

MoE families: a decoder layer stays one unit with its experts, router and attention. The grouped
expert parameters ([experts, 2 x intermediate, hidden], [experts, hidden, intermediate]) are
sharded on dim 0, whole experts per rank; an experts unit of its own would add a gather per layer
and lower no peak (in 30B-A3B the experts are ~97% of a layer's parameters). Two processes train
as one (tests/training/test_moe_families.py).

Mixed precision: parameters stay float32 (the master weights, and so AdamW's states); FSDP2
gathers them in the compute dtype for each forward and reduces gradients in float32.
"""

from __future__ import annotations

import datetime
import os
import types

import torch
import torch.distributed as dist

from easyvideor1 import distributed
from easyvideor1.models.logprobs import HEAD_PASS, run_head_pass

TRAINERS_PREFIX = "trainers/"  # the trainer ranks' world under separate rollout placement (torchrun's store)


def init_distributed(need_group: bool = False, rollout_ranks: int = 0,
                     timeout_minutes: float = 120.0) -> tuple[int, int, torch.device]:
    """Join the process group when launched by torchrun (any world size), or, with `need_group`,
    make a group of one rank in this process (FSDP2 needs one for its mixed-precision policy).
    With `rollout_ranks` R (separate rollout placement under torchrun) the group is the trainer
    ranks' alone: the first WORLD_SIZE - R ranks, on a prefix of torchrun's store; the last R
    ranks never join it (`training.asynchronous`), so every collective below sees trainers only.

    Returns (rank, world, device): the rank's GPU (LOCAL_RANK) when CUDA is there, else the CPU.
    Every collective of the group may wait `timeout_minutes` (`training.collective_timeout_minutes`).
    """
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    on_gpu = torch.cuda.is_available()
    if on_gpu:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized() and (launched or need_group):
        backend = "nccl" if on_gpu else distributed.CPU_BACKEND
        timeout = datetime.timedelta(minutes=timeout_minutes)
        if launched and rollout_ranks:
            store = dist.PrefixStore(TRAINERS_PREFIX, distributed.launch_store())
            distributed.init_process_group(backend, store=store, rank=int(os.environ["RANK"]),
                                           world_size=int(os.environ["WORLD_SIZE"]) - rollout_ranks, timeout=timeout)
        elif launched:
            distributed.init_process_group(backend, timeout=timeout)
        else:  # one process, no launcher: an in-memory store, nothing listens on a port
            distributed.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    return rank, world, device


def untie_head(model) -> None:
    """Give a tied LM head its own copy of the input embedding (the pair then trains apart): a tied
    pair cannot sit in two FSDP units, and every policy is untied alike, in one process too, and
    the rollout side's copy under separate placement (`training.asynchronous`), so all hold and
    sync the same parameters."""
    head, emb = model.lm_head, model.get_input_embeddings()
    if head.weight is emb.weight:
        head.weight = torch.nn.Parameter(emb.weight.detach().clone(), requires_grad=emb.weight.requires_grad)
        model.config.tie_word_embeddings = False


def _blocks(model) -> list[torch.nn.Module]:
    inner = model.model
    layers = list(getattr(inner, "language_model", inner).layers)
    visual = getattr(inner, "visual", None)
    if visual is not None:
        layers += list(visual.blocks)
    return layers


def shard(model, param_dtype: torch.dtype | None = None, cpu_offload: bool = False, vision_unit: bool = False):
    """Wrap `model` with FSDP2 in place (no-op without an initialised process group).

    `param_dtype` (e.g. bf16) is the compute dtype: FSDP2 keeps the sharded float32 parameters
    (and so float32 AdamW states) and all-gathers them cast to `param_dtype` for each forward;
    gradients are reduced in float32 (`MixedPrecisionPolicy`, as EasyR1 and veRL do).
    `vision_unit`: the vision tower is a unit of its own too (sequence parallelism calls it
    directly, outside the backbone's forward; `models.ulysses`; then see `run_root_once`).
    """
    if not dist.is_initialized():
        return model
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    kwargs = {}
    if param_dtype is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    if cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    untie_head(model)
    for block in _blocks(model):
        fully_shard(block, **kwargs)
    if vision_unit and getattr(model.model, "visual", None) is not None:
        fully_shard(model.model.visual, **kwargs)
    fully_shard(model.model, **kwargs)
    fully_shard(model.lm_head, **kwargs)
    setattr(model.lm_head, HEAD_PASS, types.MethodType(run_head_pass, model.lm_head))
    register_fsdp_forward_method(model.lm_head, HEAD_PASS)
    fully_shard(model, **kwargs)
    return model


def run_root_once(model, device) -> None:
    """One token through the root module, without gradients. FSDP2 takes the first unit to run
    forward as the root of the units below it; a unit called directly before its parent (the
    vision tower under sequence parallelism, before the backbone; the backbone and the head in
    log-prob passes when no full forward ran first, as with the vLLM engine) would otherwise
    become a root of its own: the parent's first forward fails, or a root head stays gathered
    after its passes and its gradient misses the end-of-backward callback of the backbone's root.
    Every rank calls it (its all-gathers are collectives)."""
    if not dist.is_initialized():
        return
    with torch.no_grad():
        model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=device), use_cache=False)


def full_state_dict(model) -> dict[str, torch.Tensor]:
    """Unsharded parameters on CPU (every rank gets them; the whole model: export streams instead,
    `training.state.export.write_hf`)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
