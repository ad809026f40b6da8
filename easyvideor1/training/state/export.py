"""Export the trained policy as an HF-format folder (`from_pretrained` and vLLM load it), and a
LoRA policy also as a PEFT adapter folder: at the end of training (`export_hf`,
`export_adapter` on a `Run`) or from a checkpoint (`export_checkpoint`, the `export` command).
The MoE families' routed experts are written in the released checkpoints' layout
(`models.expert_layout`), the one vLLM loads; transformers loads it too.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import torch

from easyvideor1 import distributed
from easyvideor1.config import Config
from easyvideor1.models import model_settings
from easyvideor1.models.expert_layout import released_tensors
from easyvideor1.models.families import family_of
from easyvideor1.models.loading import load_policy, load_processor, resolve_dtype
from easyvideor1.models.lora import apply_lora, has_adapters, merged_state_items, save_adapter, trainable_state
from easyvideor1.training.run import Run
from easyvideor1.training.state.checkpoint import read_weights
from easyvideor1.training.state.hf_shards import SHARD_BYTES, ShardWriter
from easyvideor1.training.state.shards import shard_files


def _gathered(model) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, whole tensor) of `model`'s state dict, one at a time (under FSDP2 each is an
    all-gather: every rank must run through all of it)."""
    for name, tensor in model.state_dict().items():
        yield name, tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor.detach()


def _skeleton(model):
    """A weightless model of `model`'s architecture (same config), as `from_pretrained` builds it."""
    from transformers import AutoModelForImageTextToText

    with torch.device("meta"):  # a copy: the vision tower's attention name is the loaded model's own
        skeleton = AutoModelForImageTextToText.from_config(copy.deepcopy(model.config), attn_implementation="sdpa")
    skeleton.generation_config = model.generation_config
    return skeleton


def _names_on_disk(skeleton, names: list[str]) -> dict[str, str]:
    """Model name -> the name `save_pretrained` writes (the checkpoint format transformers knows
    for the architecture, e.g. Qwen2.5-VL's `model.layers.*`, `visual.*`). A name whose tensor the
    format changes (Qwen3.5-MoE's grouped experts, written one tensor per expert) is left out:
    `_on_disk` converts it when its tensor comes."""
    from transformers.core_model_loading import revert_weight_conversion

    shapes = skeleton.state_dict()
    marks = {name: torch.empty(shapes[name].shape, dtype=shapes[name].dtype, device="meta") for name in names}
    by_id = {id(t): name for name, t in marks.items()}
    return {by_id[id(t)]: disk for disk, t in revert_weight_conversion(skeleton, marks).items() if id(t) in by_id}


def _on_disk(skeleton, disk: dict[str, str], name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """(name on disk, tensor) pairs `save_pretrained` writes for the model's `name`: renamed, or
    converted alone (each of the grouped experts' conversions reverts one model tensor)."""
    if name in disk or name not in skeleton.state_dict():
        yield disk.get(name, name), tensor
        return
    from transformers.core_model_loading import revert_weight_conversion

    yield from revert_weight_conversion(skeleton, {name: tensor}).items()


def write_hf(model, processor, dtype: str, out_dir: str | Path, shard_bytes: int = SHARD_BYTES) -> Path | None:
    """Write config, safetensors weights (in `dtype`) and the processor to `out_dir` (rank 0);
    all ranks call. A LoRA policy is written merged (`models.lora.merged_state_items`): a plain
    model of the base's architecture, with no peft needed to load it.

    Streamed: every rank gathers one whole tensor at a time (a collective), rank 0 casts it and
    adds it to a safetensors file of at most `shard_bytes` (`hf_shards.ShardWriter`), the others
    drop it at once; no rank ever holds the merged model."""
    adapted = has_adapters(model)
    # Written in the compute dtype (`model.dtype`), as released checkpoints are, not in the
    # float32 of the master weights.
    dt = resolve_dtype(dtype)
    rank0 = distributed.rank() == 0
    skeleton = _skeleton(model)
    family = family_of(model.config)
    owners: dict[int, list[str]] = {}  # a tied pair (one process) is written once, as from_pretrained reads it
    for name, p in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), []).append(name)
    skip = {alias for names in owners.values() for alias in names[1:]}
    disk = _names_on_disk(skeleton, list(skeleton.state_dict())) if rank0 else {}
    writer = ShardWriter(out_dir, shard_bytes) if rank0 else None
    for name, tensor in merged_state_items(model) if adapted else _gathered(model):
        if writer is not None and name not in skip:
            for on_disk, part in _on_disk(skeleton, disk, name, tensor.cpu()):
                for released, piece in released_tensors(family, on_disk, part):
                    writer.add(released, piece.to(dt) if piece.is_floating_point() else piece)
        del tensor
    if writer is None:
        return None
    writer.close()
    out = Path(out_dir)
    # config and generation config as save_pretrained writes them for the skeleton
    skeleton.config.dtype = str(skeleton.dtype).split(".")[1]
    skeleton.config.architectures = [type(skeleton).__name__]
    skeleton.config.save_pretrained(out)
    if skeleton.can_generate():
        skeleton.generation_config.save_pretrained(out)
    processor.save_pretrained(out)
    return out


def export_hf(run: Run, out_dir: str | Path) -> Path | None:
    """The run's policy as a full HF folder (`write_hf`); all ranks call."""
    return write_hf(run.model, run.prompts.processor, run.cfg.model.dtype, out_dir)


def export_model(run: Run, out_dir: str | Path, written_by: str) -> Path | None:
    """`export_hf`, and beside it the settings `eval` reads (`models.model_settings`); all ranks call."""
    path = export_hf(run, out_dir)
    if path is not None:
        model_settings.write(path, model_settings.settings_of(run.cfg, written_by=written_by,
                                                              step=run.cfg.training.steps))
    return path


def eval_command(model: str | Path, data: str | Path | None = None, cache_dir: str | Path | None = None,
                 out: str | Path | None = None) -> str:
    """The `easyvideor1 eval` line that scores `model` at the settings it carries."""
    return (f"easyvideor1 eval --model {model} --benchmarks {data or 'FILE_OR_NAMES'}"
            + (f" --cache-dir {cache_dir}" if cache_dir else "") + (f" --out {out}" if out else ""))


def export_adapter(run: Run, out_dir: str | Path) -> Path | None:
    """The LoRA policy's PEFT adapter folder (rank 0 writes); all ranks call."""
    state = trainable_state(run.model)
    if run.rank != 0:
        return None
    return save_adapter(run.model, state, out_dir, run.cfg.model.path)


def export_checkpoint(cfg: Config, checkpoint: str | Path, out_dir: str | Path, merge: bool) -> Path:
    """A training checkpoint of the run configured by `cfg` as a PEFT adapter folder (LoRA runs),
    or with `merge` (always for full fine-tuning) as a full HF folder. One process."""
    m, lora = cfg.model, cfg.model.lora
    path = Path(checkpoint)
    if not (path / "model.safetensors").is_file() and not shard_files(path, "model"):
        raise FileNotFoundError(f"no model shards (model.rank*.json) in {path}: expected a checkpoint folder "
                                f"(<logging.out_dir>/checkpoints/step-NNNNNN)")
    model = load_policy(m.path, "float32", m.attn_implementation)
    if lora.rank:
        apply_lora(model, lora.rank, lora.scale_alpha, lora.dropout, lora.target_modules, lora.vision,
                   lora.modules_to_save)
    weights = read_weights(path)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected or (lora.rank and set(weights) != {n for n, p in model.named_parameters() if p.requires_grad}):
        raise ValueError(f"checkpoint {path} does not fit model.path={m.path} with model.lora.rank={lora.rank} "
                         f"(e.g. {(unexpected or sorted(weights))[:2]}): use the config it was trained with")
    if not lora.rank and missing:
        raise ValueError(f"checkpoint {path} lacks {len(missing)} weights (e.g. {missing[:2]}); it was written by "
                         "a LoRA run: set model.lora.* as in that run")
    if lora.rank and not merge:
        return save_adapter(model, trainable_state(model), out_dir, m.path)
    return write_hf(model, load_processor(m.path), m.dtype, out_dir)
