"""Start-up where no process holds more than its shard: build on the meta device, shard, then fill.

`empty_model` builds the policy or the reference as `from_pretrained` does (same class, config,
attention implementation, dtype, generation config) with every tensor on the meta device: no
memory, nothing read. FSDP2 shards it as it is (`training.fsdp.shard`). `fill_weights` then gives
each tensor storage on the rank's device (`to_empty`) and copies in the rank's own rows only, read
with `safe_open(...).get_slice` (pread, not mmap: no page of the file stays mapped) one tensor at a
time: a rank's host memory holds its shard plus one slice, never a whole tensor it does not own.

Why each rank reads its slices rather than rank 0 reading and broadcasting: no collective at all
(nothing to keep in step, no full-tensor receive buffer on every GPU), each rank reads 1/N of the
bytes in parallel, and the model folder is on every node already (today every rank reads it).

Exactly `from_pretrained`'s result (tests/models/test_meta_init.py compares bitwise): checkpoint
names go through transformers' own key renamings (old Qwen-VL layouts load too); each tensor is
cast as `from_pretrained` casts it (to the build dtype, then to the parameter's dtype, e.g. a LoRA
base in bf16); tied weights (an untied FSDP head) read their checkpoint twin; the non-persistent
buffers (rotary `inv_freq`) are recomputed by the model's own `initialize_weights`, as
`from_pretrained` does, with every loaded tensor marked initialised so nothing else is touched.
One departure: that pass runs under a forked RNG. transformers' Qwen3.5 init draws (and discards)
one uniform per linear-attention layer from the global RNG while loading; here it does not, so a
Qwen3.5 LoRA run starts from other (equally distributed) random A matrices than before.
Tensors that are real before `to_empty` (LoRA adapters, drawn by peft at injection) keep their values.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from easyvideor1.errors import UserError
from easyvideor1.models.lora import base_name

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def empty_model(path: str | Path, dtype: torch.dtype, attn_implementation: str):
    """The model `from_pretrained(path, dtype=dtype)` would give, every tensor on the meta device."""
    from transformers import AutoConfig, AutoModelForImageTextToText, GenerationConfig

    path = Path(path)
    config = AutoConfig.from_pretrained(path)
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    model.config.name_or_path = str(path)
    if getattr(model.config, "tie_word_embeddings", False) or getattr(model.config.get_text_config(),
                                                                        "tie_word_embeddings", False):
        model.tie_weights()
    if (path / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(path)
    model.eval()
    return model


class WeightsError(UserError, ValueError):
    """model.path's weights cannot be read slice by slice for this model."""


def _files(path: Path) -> list[Path]:
    if (path / INDEX).is_file():
        weight_map = json.loads((path / INDEX).read_text())["weight_map"]
        return [path / f for f in sorted(set(weight_map.values()))]
    if (path / SINGLE).is_file():
        return [path / SINGLE]
    raise WeightsError(f"model.path {path}: no {SINGLE} or {INDEX}; training reads safetensors weights (convert "
                       "the folder once: from_pretrained, then save_pretrained)")


class WeightSource:
    """Where each weight of a model lives in the safetensors files of `path`, and the dtype
    `from_pretrained` would load it in. Made from the model as built (`empty_model`), before
    LoRA and sharding change names and untie the head."""

    def __init__(self, path: str | Path, model):
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
        from safetensors import safe_open

        self.path = Path(path)
        expected = model.state_dict()
        self.dtypes = {name: t.dtype for name, t in expected.items()}
        mapping = get_model_conversion_mapping(model)
        renamings = [t for t in mapping if isinstance(t, WeightRenaming)]
        converters = [t for t in mapping if isinstance(t, WeightConverter)]
        by_pattern = {pattern: c for c in converters for pattern in c.source_patterns}
        self.where: dict[str, tuple[Path, str]] = {}
        self.transposed: dict[str, tuple[int, int]] = {}  # name -> the two dims the file has swapped
        self.experts: dict[str, list[dict[int, tuple[Path, str]]]] = {}  # name -> per source pattern, expert -> (file, key)
        converted: dict[str, list] = {}
        for file in _files(self.path):
            with safe_open(str(file), framework="pt", backend="pread") as f:
                keys = list(f.keys())
            for key in keys:
                name, converter = rename_source_key(key, renamings, converters, model.base_model_prefix, expected)
                if name not in expected and key in expected:
                    name, converter = key, None
                if converter is not None and name in expected:
                    converted.setdefault(name, []).append((file, key, by_pattern[converter], converter))
                elif converter is not None:
                    raise WeightsError(f"model.path {file}: weight {key} needs transformers' conversion "
                                       f"({converter}); convert the folder once: from_pretrained, then save_pretrained")
                elif name in expected:
                    self.where[name] = (file, key)
        for name, parts in converted.items():
            self._converted(name, tuple(expected[name].shape), parts)
        # tied names (lm_head.weight and the input embedding): one tensor, stored once
        owners: dict[int, list[str]] = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            owners.setdefault(id(p), []).append(name)
        for names in owners.values():
            stored = [n for n in names if n in self.where]
            for n in names:
                if n not in self.where and stored:
                    self.where[n] = self.where[stored[0]]
        missing = sorted(set(expected) - set(self.where) - set(self.experts))
        if missing:
            raise WeightsError(f"model.path {self.path} has no weight for {len(missing)} tensors of the model "
                             f"(e.g. {missing[:3]}): not a checkpoint of this architecture")

    def _converted(self, name: str, shape: tuple[int, ...], parts: list) -> None:
        """Where the model's `name` comes from when transformers converts it on load: the MoE families'
        grouped experts, stored transposed (Qwen3-VL-MoE's `Transpose`) or one tensor per expert
        (Qwen3.5-MoE's `MergeModulelist` over experts, then `Concatenate` of gate and up). Others refuse."""
        import re

        from safetensors import safe_open
        from transformers.core_model_loading import Concatenate, MergeModulelist, Transpose

        converter = parts[0][2]
        ops = [type(op) for op in converter.operations]
        if ops == [Transpose] and len(parts) == 1:
            file, key = parts[0][:2]
            with safe_open(str(file), framework="pt", backend="pread") as f:
                stored = tuple(f.get_slice(key).get_shape())
            op = converter.operations[0]
            swapped = list(shape)
            swapped[op.dim0], swapped[op.dim1] = shape[op.dim1], shape[op.dim0]
            if stored in (shape, tuple(swapped)):
                self.where[name] = (file, key)
                if stored != shape:
                    self.transposed[name] = (op.dim0, op.dim1)
                return
        elif ops in ([MergeModulelist], [MergeModulelist, Concatenate]) and converter.operations[0].dim == 0:
            per_pattern: list[dict[int, tuple[Path, str]]] = [{} for _ in converter.source_patterns]
            for file, key, _, pattern in parts:
                expert = int(re.search(r"\.(\d+)\.", key[key.index(pattern.split("*")[0]):]).group(1))
                per_pattern[converter.source_patterns.index(pattern)][expert] = (file, key)
            if all(set(p) == set(range(shape[0])) for p in per_pattern):
                self.experts[name] = per_pattern
                return
        raise WeightsError(f"model.path {parts[0][0]}: weight {parts[0][1]} needs a transformers conversion "
                           f"({converter.operations}) this start-up cannot read by slices; convert the folder once: "
                           "from_pretrained, then save_pretrained")

    def read(self, name: str, region: tuple[slice, ...]) -> torch.Tensor:
        """Rows `region` of weight `name` (an HF name of the built model), in its load dtype."""
        from safetensors import safe_open

        if name in self.experts:  # one expert at a time: the rank's experts, gate and up concatenated
            rows = []
            for expert in range(region[0].start, region[0].stop):
                whole = []
                for experts in self.experts[name]:
                    file, key = experts[expert]
                    with safe_open(str(file), framework="pt", backend="pread") as f:
                        whole.append(f.get_tensor(key))
                rows.append(torch.cat(whole, dim=0)[region[1:]])
            return torch.stack(rows).to(self.dtypes[name])
        if name in self.transposed:
            d0, d1 = self.transposed[name]
            stored = list(region)
            stored[d0], stored[d1] = region[d1], region[d0]
            file, key = self.where[name]
            with safe_open(str(file), framework="pt", backend="pread") as f:
                return f.get_slice(key)[tuple(stored)].transpose(d0, d1).contiguous().to(self.dtypes[name])
        file, key = self.where[name]
        with safe_open(str(file), framework="pt", backend="pread") as f:
            return f.get_slice(key)[region].to(self.dtypes[name])


def _region(tensor: torch.Tensor) -> tuple[torch.Tensor, tuple[slice, ...]]:
    """(the local tensor to write, the region of the full tensor it holds)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if not isinstance(tensor, DTensor):
        return tensor, tuple(slice(0, n) for n in tensor.shape)
    shape, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
    return tensor.to_local(), tuple(slice(o, o + n) for o, n in zip(offset, shape))


def _named_tensors(model):
    """Parameters and persistent buffers, each once (a tied pair under its first name)."""
    names = set(model.state_dict())
    yield from model.named_parameters()
    yield from ((n, b) for n, b in model.named_buffers() if n in names)


@torch.no_grad()
def fill_weights(model, source: WeightSource, device: str | torch.device) -> None:
    """Give `model`'s meta tensors storage on `device` (only each rank's shard under FSDP2) and fill
    them from `source`, slice by slice; LoRA adapters keep their values; non-persistent buffers are
    recomputed. No collective: ranks need not call it together."""
    kept = {}
    for name, t in _named_tensors(model):
        if not t.is_meta:  # peft's freshly drawn adapters (local rows under FSDP2)
            kept[name] = _region(t)[0].detach().to("cpu", copy=True)
    owners: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), []).append(name)
    model.to_empty(device=device)
    for first, *aliases in owners.values():  # to_empty gives each module its own tensor: re-tie
        for alias in aliases:
            module, _, attr = alias.rpartition(".")
            setattr(model.get_submodule(module), attr, model.get_parameter(first))
    for name, t in _named_tensors(model):
        local, region = _region(t)
        if name in kept:
            local.copy_(kept.pop(name))
        elif local.numel():
            local.copy_(source.read(base_name(name), region).to(t.dtype))
        t._is_hf_initialized = True  # transformers' init pass below leaves it alone
    device = torch.device(device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model.initialize_weights()  # non-persistent buffers (rotary inv_freq), as from_pretrained does
