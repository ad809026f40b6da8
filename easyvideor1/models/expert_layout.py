"""The routed experts of the MoE families in the layout of the released checkpoints, which is what
vLLM's `load_weights` reads, from transformers' grouped tensors (`mlp.experts.gate_up_proj`
[E, 2I, H], `mlp.experts.down_proj` [E, H, I]):

- Qwen3-VL-MoE (Qwen3-VL-30B-A3B): grouped but transposed, [E, H, 2I] and [E, I, H]; vLLM always
  transposes this family's experts back (`is_fused_checkpoint_transposed`), so the grouped tensors
  as transformers holds them do not load.
- Qwen3.5-MoE (Qwen3.5-35B-A3B): one tensor per expert, `mlp.experts.{e}.gate_proj.weight` [I, H],
  `up_proj` [I, H], `down_proj` [H, I] (what `save_pretrained` writes, too).

Every other tensor passes as it is. Views, one model tensor at a time: nothing is copied here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from easyvideor1.models.families import Family

if TYPE_CHECKING:  # no torch import at run time: `models.tiny`, which the CLI imports, uses this module
    import torch

_GROUPED = (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")


def released_tensors(family: Family, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs a released checkpoint of `family` stores for the model's `name`."""
    if not (family.moe and name.endswith(_GROUPED)):
        yield name, tensor
    elif family.name == "qwen3_vl_moe":
        yield name, tensor.transpose(1, 2)
    elif family.name == "qwen3_5_moe":
        prefix = name[: -len("gate_up_proj" if name.endswith("gate_up_proj") else "down_proj")]
        if name.endswith("gate_up_proj"):
            gate, up = tensor.chunk(2, dim=1)  # [E, I, H] each: transformers concatenates gate, then up
            for e in range(tensor.shape[0]):
                yield f"{prefix}{e}.gate_proj.weight", gate[e]
                yield f"{prefix}{e}.up_proj.weight", up[e]
        else:
            for e in range(tensor.shape[0]):
                yield f"{prefix}{e}.down_proj.weight", tensor[e]
    else:
        raise ValueError(f"no released expert layout known for MoE family {family.name!r}")


def released_items(family: Family, items: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """`released_tensors` of each (model name, tensor) of `items`, as they stream."""
    for name, tensor in items:
        yield from released_tensors(family, name, tensor)
