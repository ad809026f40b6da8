"""uint8 resizing equals torchvision's (and so the HF processors') uint8 resize exactly."""

from __future__ import annotations

import pytest
import torch

from easyvideor1.vision.resize import CHUNK, resize_uint8


@pytest.mark.parametrize("size", [(28, 56), (224, 392), (448, 784), (364, 644)])
def test_equals_torchvision_v2_uint8(size):
    tvf = pytest.importorskip("torchvision.transforms.v2.functional")
    from torchvision.transforms import InterpolationMode

    frames = torch.randint(0, 256, (3, 3, 360, 640), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    ours = resize_uint8(frames, size)
    theirs = tvf.resize(frames, list(size), interpolation=InterpolationMode.BICUBIC, antialias=True)
    assert ours.dtype == torch.uint8 and ours.shape == (3, 3, *size)
    assert torch.equal(ours, theirs)


def test_chunking_does_not_change_pixels():
    frames = torch.randint(0, 256, (CHUNK + 5, 3, 40, 60), dtype=torch.uint8)
    whole = torch.nn.functional.interpolate(frames, size=(56, 84), mode="bicubic", antialias=True)
    assert torch.equal(resize_uint8(frames, (56, 84)), whole)


def test_same_size_is_a_no_op_and_floats_are_refused():
    frames = torch.zeros(2, 3, 28, 28, dtype=torch.uint8)
    assert resize_uint8(frames, (28, 28)) is frames
    with pytest.raises(ValueError, match="uint8"):
        resize_uint8(frames.float(), (56, 56))
