"""The vision tower's patch embedding as one matmul.

Every supported family embeds patches with a `Conv3d` whose kernel equals its stride, over input
the processor has already cut into patches (`[P, C, T, p, p]`): one output per patch, a linear
map. CPU convolution kernels run it far slower than the same matmul: forward + backward of 2,048
patches took 231 ms against 9 ms on a CPU without AVX-512 (70 ms against 8 ms with it; the
demo's step: `benchmarks/demo_step.py`, variant "before"). vLLM runs these layers
as a matmul too. `PatchLinear` keeps the convolution's own parameters (same names, shapes and
objects), so checkpoints, exports, weight syncs, LoRA selection and FSDP see nothing new; only
the order of the float sums changes (outputs within ~4e-6 of the convolution's in float32).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class PatchLinear(torch.nn.Module):
    """A `Conv3d` with kernel == stride, no padding, run as a matmul on its weight."""

    def __init__(self, conv: torch.nn.Conv3d):
        super().__init__()
        self.weight = conv.weight  # [E, C, T, p, p]: the convolution's Parameter
        self.bias = conv.bias  # [E] or None
        self.stride = conv.stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, C, T, p, p] -> [N, E, 1, 1, 1]
        if tuple(x.shape[2:]) != tuple(self.weight.shape[2:]):  # more than one patch per input
            return F.conv3d(x, self.weight, self.bias, stride=self.stride)
        out = F.linear(x.reshape(x.shape[0], -1), self.weight.reshape(self.weight.shape[0], -1), self.bias)
        return out.view(*out.shape, 1, 1, 1)


def _is_patch_conv(m: torch.nn.Module) -> bool:
    return (type(m) is torch.nn.Conv3d and m.kernel_size == m.stride and m.padding == (0, 0, 0)
            and m.dilation == (1, 1, 1) and m.groups == 1)


def _swap(model: torch.nn.Module, match, make) -> int:
    """Replace each submodule for which `match` holds by `make(it)`; returns how many."""
    found = [(name, m) for name, m in model.named_modules() if match(m)]
    for name, m in found:
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, make(m))
    return len(found)


def use_linear_patch_embed(model: torch.nn.Module) -> int:
    """Replace each patch `Conv3d` of `model` by a `PatchLinear` on the same parameters; returns
    how many were replaced."""
    return _swap(model, _is_patch_conv, PatchLinear)


def _as_conv(lin: PatchLinear) -> torch.nn.Conv3d:
    e, c, *kernel = lin.weight.shape
    conv = torch.nn.Conv3d(c, e, tuple(kernel), lin.stride, bias=lin.bias is not None, device="meta")
    conv.weight, conv.bias = lin.weight, lin.bias
    return conv


def use_conv_patch_embed(model: torch.nn.Module) -> int:
    """The inverse (benchmarks and tests): each `PatchLinear` back to a `Conv3d` on the same parameters."""
    return _swap(model, lambda m: isinstance(m, PatchLinear), _as_conv)
