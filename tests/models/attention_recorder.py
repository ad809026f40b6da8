"""Records every `F.scaled_dot_product_attention` call (its arguments, not its result) while active:
what a CUDA kernel would be asked to run. CPU kernels accept what CUDA's fused ones refuse (a
tensor mask with grouped-query heads falls to the MATH kernel there), so the tests check the calls.

Used by test_attention_calls.py and, under torchrun, by ulysses_worker.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import CausalBias
from torch.overrides import TorchFunctionMode


@dataclass(frozen=True)
class Call:
    q_heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    mask: str  # "none", "causal" (is_causal), "lower_right" (a CausalBias), or "tensor"
    mask_elements: int  # of a tensor mask (0 otherwise)


class AttentionRecorder(TorchFunctionMode):
    """`with AttentionRecorder() as rec:` ... `rec.calls` (top-level calls only: a CausalBias's
    own CPU fallback inside torch is not a call of ours, and not what CUDA runs)."""

    def __init__(self):
        super().__init__()
        self.calls: list[Call] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q, k = args[0], args[1]
            mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
            causal = kwargs.get("is_causal", args[5] if len(args) > 5 else False)
            if isinstance(mask, CausalBias):
                kind, elements = "lower_right", 0
            elif isinstance(mask, torch.Tensor):
                kind, elements = "tensor", mask.numel()
            else:
                kind, elements = ("causal" if causal else "none"), 0
            self.calls.append(Call(q.shape[-3], k.shape[-3], q.shape[-2], k.shape[-2], kind, elements))
        return func(*args, **kwargs)

    def problems(self, row_length: int) -> list[str]:
        """What a fused CUDA kernel would refuse or what is O(L^2): a tensor mask with unequal
        query/key-value heads, or a tensor mask of at least `row_length`^2 elements."""
        out = []
        for c in self.calls:
            if c.mask == "tensor" and c.q_heads != c.kv_heads:
                out.append(f"tensor mask with {c.q_heads} query / {c.kv_heads} key-value heads: {c}")
            if c.mask == "tensor" and c.mask_elements >= row_length**2:
                out.append(f"mask of {c.mask_elements} elements >= L^2 = {row_length**2}: {c}")
        return out
