"""Pixel similarity of two renderings (SVG or HTML screenshots), blank-normalised.

Plain 1 - mean|a - b| / 255 gives a blank white image ~0.95 against a drawing that covers a
tenth of the canvas, which rewards drawing nothing. We normalise by how far the reference is
from blank white instead:

    similarity = clip(1 - mean|pred - ref| / mean|white - ref|, 0, 1)

so an exact copy scores 1, a blank canvas (or anything as far from the reference as blank is)
scores 0. For a blank reference, similarity = 1 - mean|pred - ref| / 255. Both images are RGB
uint8 arrays of the same shape.
"""

from __future__ import annotations

from easyvideor1.rewards.verdict import Verdict


def similarity(pred, ref) -> float:
    """Blank-normalised pixel similarity in [0, 1] (see module docstring).

    >>> import numpy as np
    >>> ref = np.full((2, 2, 3), 255, np.uint8); ref[0, 0] = 0  # one black pixel of four
    >>> similarity(ref, ref), similarity(np.full_like(ref, 255), ref)
    (1.0, 0.0)
    """
    import numpy as np

    if pred.shape != ref.shape:
        raise ValueError(f"images differ in shape: {pred.shape} vs {ref.shape}")
    ref16 = ref.astype(np.int16)
    error = float(np.abs(pred.astype(np.int16) - ref16).mean())
    blank = float((255 - ref16).mean())
    if blank < 1e-9:
        return max(0.0, 1.0 - error / 255.0)
    return min(1.0, max(0.0, 1.0 - error / blank))


def raw_similarity(pred, ref) -> float:
    """Plain 1 - mean absolute difference / 255 (reported as a part, not the reward)."""
    import numpy as np

    return 1.0 - float(np.abs(pred.astype(np.int16) - ref.astype(np.int16)).mean()) / 255.0


def png_to_rgb(png: bytes, size: tuple[int, int] | None = None):
    """PNG bytes -> RGB uint8 array, transparent areas composited on white, resized if asked."""
    import io

    import numpy as np
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        rgba = image.convert("RGBA")
    canvas = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    rgb = Image.alpha_composite(canvas, rgba).convert("RGB")
    if size is not None and rgb.size != size:
        rgb = rgb.resize(size, Image.BILINEAR)
    return np.asarray(rgb, dtype=np.uint8)


def pixel_verdict(image, ref_image, valid: bool) -> Verdict:
    """The verdict of a rendering against the reference; no rendering (None) scores 0, invalid."""
    if image is None:
        return Verdict(accuracy=0.0, valid=False, parts={"pixel": 0.0, "raw_pixel": 0.0})
    accuracy = similarity(image, ref_image)
    return Verdict(accuracy=accuracy, valid=valid,
                   parts={"pixel": accuracy, "raw_pixel": raw_similarity(image, ref_image)})
