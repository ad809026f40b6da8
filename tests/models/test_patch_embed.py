"""models/patch_embed.py: every family's loaded model runs its patch embedding as a matmul on the
convolution's own parameters; the vision tower's output and the patch weights' gradients equal
those of the transformers Conv3d (float32, within float-summation noise)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForImageTextToText

from easyvideor1.models.loading import load_reference, vision_tower
from easyvideor1.models.patch_embed import PatchLinear, use_conv_patch_embed, use_linear_patch_embed


def _patch_modules(model, kind):
    return [name for name, m in model.named_modules() if isinstance(m, kind)]


def test_loaded_models_embed_patches_by_matmul_with_the_same_parameters(tiny, tiny_dirs):
    """No Conv3d is left in a loaded model (the slow CPU kernel); names, shapes and values of the
    parameters are those `from_pretrained` gives, so checkpoints and weight syncs see nothing new."""
    assert _patch_modules(tiny.model, PatchLinear) == ["model.visual.patch_embed.proj"]
    assert _patch_modules(tiny.model, torch.nn.Conv3d) == []
    plain = AutoModelForImageTextToText.from_pretrained(tiny_dirs[tiny.family.name], dtype=torch.float32)
    assert _patch_modules(plain, torch.nn.Conv3d) == ["model.visual.patch_embed.proj"]
    ours, theirs = tiny.model.state_dict(), plain.state_dict()
    assert list(ours) == list(theirs)
    for name in ("model.visual.patch_embed.proj.weight", "model.visual.patch_embed.proj.bias"):
        if name in theirs:  # Qwen3-VL and Qwen3.5 have a bias, Qwen2-VL and Qwen2.5-VL do not
            assert torch.equal(ours[name], theirs[name])
    assert _patch_modules(load_reference(tiny_dirs[tiny.family.name], "float32"), PatchLinear)


def test_vision_tower_equals_the_convolution_forward_and_backward(tiny):
    """The tower over 2 frames of 4 x 6 patches: outputs within 1e-5, the patch weight's gradient
    within 1e-4 of the Conv3d's (relative to their size)."""
    model = copy.deepcopy(tiny.model)
    conv = copy.deepcopy(model)
    assert use_conv_patch_embed(conv) == 1
    cfg = model.config.vision_config
    patch_dim = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size ** 2
    grid = torch.tensor([[1, 4, 6]])
    pixels = torch.randn(int(grid.prod()), patch_dim, generator=torch.Generator().manual_seed(0))
    outs, grads = [], []
    for m in (model, conv):
        out = vision_tower(m)(pixels, grid_thw=grid)
        out = out.pooler_output if hasattr(out, "pooler_output") else out
        out = out[0] if isinstance(out, (tuple, list)) else out
        out.float().square().sum().backward()
        outs.append(out.detach())
        grads.append(vision_tower(m).patch_embed.proj.weight.grad.clone())
    assert outs[0].shape == outs[1].shape
    assert torch.allclose(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    assert (grads[0] - grads[1]).abs().max() <= 1e-4 * grads[1].abs().max()


def test_several_patches_per_input_fall_back_to_the_convolution():
    conv = torch.nn.Conv3d(3, 8, (2, 4, 4), (2, 4, 4), bias=True)
    holder = torch.nn.Sequential(conv)
    assert use_linear_patch_embed(holder) == 1 and isinstance(holder[0], PatchLinear)
    assert holder[0].weight is conv.weight and holder[0].bias is conv.bias
    one = torch.randn(5, 3, 2, 4, 4)
    assert torch.allclose(holder(one), conv(one), atol=1e-6)
    many = torch.randn(2, 3, 4, 8, 8)  # 2 x 2 x 2 patches each
    assert torch.equal(holder(many), conv(many))


@pytest.mark.parametrize("kwargs", [dict(padding=1), dict(stride=1), dict(dilation=2), dict(groups=3)])
def test_other_convolutions_are_left_alone(kwargs):
    holder = torch.nn.Sequential(torch.nn.Conv3d(3, 6, (2, 4, 4), **{"stride": (2, 4, 4), **kwargs}))
    assert use_linear_patch_embed(holder) == 0 and isinstance(holder[0], torch.nn.Conv3d)
