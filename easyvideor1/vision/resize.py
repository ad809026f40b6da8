"""Resizing uint8 frames without leaving uint8.

`F.interpolate(mode="bicubic", antialias=True)` on a uint8 tensor runs PyTorch's uint8 kernel
and gives exactly what torchvision's `resize(..., BICUBIC, antialias=True)` gives on uint8
(the path qwen-vl-utils takes before it casts to float), about 7x faster than via float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 32  # frames per interpolate call: bounds the kernel's temporary buffers


def resize_uint8(frames: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Resize [T, 3, H, W] uint8 frames to `size` = (H', W'); returns [T, 3, H', W'] uint8.

    Returns the input unchanged when it already has that size.
    """
    if frames.dtype != torch.uint8 or frames.ndim != 4:
        raise ValueError(f"resize_uint8 needs [T, C, H, W] uint8 frames, got {frames.dtype} "
                         f"{tuple(frames.shape)}")
    height, width = size
    if tuple(frames.shape[-2:]) == (height, width):
        return frames
    frames = frames.contiguous()
    out = torch.empty((frames.shape[0], frames.shape[1], height, width), dtype=torch.uint8)
    for i in range(0, frames.shape[0], CHUNK):
        out[i:i + CHUNK] = F.interpolate(frames[i:i + CHUNK], size=(height, width), mode="bicubic",
                                         antialias=True, align_corners=False)
    return out
