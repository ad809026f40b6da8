"""The vision tower's attention (`models/vision_attention.py`): one SDPA call per distinct window
size and layer instead of one per window, with the features and gradients of transformers' own
`sdpa` path, on real video and image inputs of each family with a windowed or framed tower."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from model_media import make_image, make_sample, make_video
from torch.overrides import TorchFunctionMode

from easyvideor1.models.families import get_family
from easyvideor1.models.inputs import build_inputs
from easyvideor1.models.loading import load_policy, load_processor
from easyvideor1.models.mrope import mrope_spec
from easyvideor1.models.vision_attention import VISION_ATTENTION, window_attention

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


class Calls(TorchFunctionMode):
    """Per vision layer, the (pieces, piece length, has a mask) of each SDPA call."""

    def __init__(self, blocks):
        super().__init__()
        self.layers: list[list[tuple[int, int, bool]]] = []
        self.blocks = blocks

    def __enter__(self):
        self.hooks = [b.attn.register_forward_pre_hook(lambda *_: self.layers.append([])) for b in self.blocks]
        return super().__enter__()

    def __exit__(self, *exc):
        for h in self.hooks:
            h.remove()
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q = args[0]
            masked = kwargs.get("attn_mask", args[3] if len(args) > 3 else None) is not None
            self.layers[-1].append((q.shape[0], q.shape[2], masked))
        return func(*args, **kwargs)


def _features(visual, pixels, grid):
    out = visual(pixels, grid_thw=grid)
    return [out.pooler_output, out.last_hidden_state, *(getattr(out, "deepstack_features", None) or [])]


@pytest.mark.parametrize("name", FAMILIES)
def test_windows_batched_equal_sdpa(tiny_dirs, name):
    family = get_family(name)
    model = load_policy(tiny_dirs[name], dtype="float32")  # sdpa text attention -> the window attention
    assert model.config.vision_config._attn_implementation == VISION_ATTENTION
    assert model.config.text_config._attn_implementation == "sdpa"
    processor = load_processor(tiny_dirs[name])
    # 5 x 6 merged tokens per frame: Qwen2.5-VL's 4 x 4 windows come in four sizes (16, 8, 4, 2),
    # interleaved (not one run per size); the image's are one run.
    frames = [make_video(family, frames=6, rows=5, cols=6), make_image(family, rows=2, cols=2)]
    inputs = build_inputs(make_sample("v", frames), frames, "What?", processor, family, mrope_spec(model.config))
    visual = model.model.visual
    for pixels, grid in ((inputs.pixel_values_videos, inputs.video_grid_thw),
                         (inputs.pixel_values, inputs.image_grid_thw)):
        runs = {}
        for impl in (VISION_ATTENTION, "sdpa"):
            model.set_attn_implementation({"vision_config": impl})
            model.zero_grad(set_to_none=True)
            with Calls(visual.blocks) as calls:
                feats = _features(visual, pixels, grid)
                sum((f * torch.linspace(-1, 1, f.numel()).view_as(f)).sum() for f in feats).backward()
            grads = [p.grad.clone() for p in visual.parameters()]
            runs[impl] = (feats, grads, calls.layers)
        (ours, ours_g, ours_calls), (ref, ref_g, ref_calls) = runs[VISION_ATTENTION], runs["sdpa"]
        for a, b in zip(ours + ours_g, ref + ref_g, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        assert len(ours_calls) == len(ref_calls) == len(visual.blocks)
        for layer, theirs in zip(ours_calls, ref_calls):
            sizes = {n for _, n, _ in theirs}  # transformers: one call per window / frame
            assert all(b == 1 for b, _, _ in theirs)
            assert len(layer) == len(sizes)  # ours: one per distinct size
            assert sorted(n for _, n, _ in layer) == sorted(sizes)
            assert sum(b for b, _, _ in layer) == len(theirs)  # every window, batched
            assert not any(masked for _, _, masked in layer)  # no mask tensor at all
        if name == "qwen2_5_vl" and pixels is inputs.pixel_values_videos:
            assert max(len(layer) for layer in ref_calls) > 2 * max(len(layer) for layer in ours_calls) >= 8


def test_window_attention_refuses_a_mask_and_takes_one_piece():
    q, k, v = torch.randn(3, 1, 2, 5, 8).unbind(0)
    with pytest.raises(ValueError, match="vision tower"):
        window_attention(torch.nn.Module(), q, k, v, attention_mask=torch.ones(5, 5), cu_seq_lens_q=None)
    out, _ = window_attention(torch.nn.Module(), q, k, v, scaling=0.5)  # no cu_seqlens: the whole input
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=0.5).transpose(1, 2))
