"""Distributed set-up and FSDP2 (`fully_shard`) wrapping of the policy and reference.

The same command runs in 1 process or under torchrun on N GPUs / N nodes:

    torchrun --nproc-per-node 8 -m easyvideor1.cli train configs/qwen2_5_vl_7b_8gpu.yaml
    torchrun --nnodes 2 --node-rank $RANK --nproc-per-node 8 \
             --rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:29500 -m easyvideor1.cli train CONFIG

Units: each decoder layer, each vision block, then the backbone (`model.model`) and the
`lm_head` as their own units (log-probs call them directly, `models.logprobs`), then the root.
Tied input/output embeddings are untied first (a tied pair cannot sit in two units).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def init_distributed() -> tuple[int, int, torch.device]:
    """Join the process group when launched by torchrun; return (rank, world, device)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
    rank = dist.get_rank() if dist.is_initialized() else 0
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return rank, world, torch.device("cuda", local)
    return rank, world, torch.device("cpu")


def _untie(model) -> None:
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


def shard(model, mixed_precision: bool = False, cpu_offload: bool = False):
    """Wrap `model` with FSDP2 in place (no-op without an initialised process group)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return model
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    kwargs = {}
    if mixed_precision:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    _untie(model)
    for block in _blocks(model):
        fully_shard(block, **kwargs)
    fully_shard(model.model, **kwargs)
    fully_shard(model.lm_head, **kwargs)
    fully_shard(model, **kwargs)
    return model


def full_state_dict(model) -> dict[str, torch.Tensor]:
    """Unsharded parameters on CPU (every rank gets them), for engine sync and export."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
