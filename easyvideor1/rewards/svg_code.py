"""SVG code: render the response's SVG and the reference with cairosvg, compare pixels.

Both are rendered to the same `svg_render_px` square (transparent areas on white) and compared
with `pixels.similarity` (blank-normalised, so drawing nothing scores 0). An invalid SVG (no
`<svg>...</svg>`, over `svg_max_chars`, or failing to render) scores 0. cairosvg runs with
`unsafe=False`: no external files or URLs are fetched, no XML entities resolved.
"""

from __future__ import annotations

import re
from functools import lru_cache

from easyvideor1.records import Sample
from easyvideor1.rewards.config import RewardConfig
from easyvideor1.rewards.format import answer_content, answer_text
from easyvideor1.rewards.pixels import pixel_verdict, png_to_rgb
from easyvideor1.rewards.verdict import Verdict


def last_element(text: str, tag: str) -> str | None:
    """The last complete `<tag ...>...</tag>` in `text` (nested ones balanced), or None.

    Found with rfind and running tag counts rather than a lazy regex, which is quadratic on
    many unclosed tags.
    """
    lower = text.lower()
    close = lower.rfind(f"</{tag}")
    end = lower.find(">", close) + 1 if close >= 0 else 0
    if end <= 0:
        return None
    opener = re.compile(rf"<{tag}\b")
    opens, closes, start = 0, 1, close
    while True:
        previous, start = start, lower.rfind(f"<{tag}", 0, start)
        if start < 0:
            return None
        segment = lower[start:previous]
        opens += len(opener.findall(segment))
        closes += segment.count(f"</{tag}")
        if opener.match(lower, start) and opens == closes:
            return text[start:end]


def extract_svg(text: str) -> str | None:
    """The last `<svg ...>...</svg>` of the answer text, else of the whole text, or None."""
    for part in (answer_text(text), text):
        found = last_element(part, "svg")
        if found:
            return found
    return None


@lru_cache(maxsize=256)
def render_svg(svg: str, px: int):
    """RGB uint8 array [px, px, 3] of an SVG, or None when it does not render."""
    import cairosvg

    try:
        png = cairosvg.svg2png(
            bytestring=svg.encode("utf-8"), output_width=px, output_height=px, unsafe=False
        )
    except Exception:  # cairosvg raises many types on malformed input
        return None
    try:
        return png_to_rgb(png, (px, px))
    except Exception:
        return None


def score(response: str, sample: Sample, cfg: RewardConfig) -> Verdict:
    """Accuracy = blank-normalised pixel similarity of the two renderings; 0 for invalid SVG."""
    reference = extract_svg(sample.answer)
    ref_image = render_svg(reference, cfg.svg_render_px) if reference else None
    if ref_image is None:
        raise ValueError(
            f"svg-code sample {sample.problem_id!r}: the answer is not a renderable <svg>"
        )
    svg = extract_svg(response)
    image = render_svg(svg, cfg.svg_render_px) if svg and len(svg) <= cfg.svg_max_chars else None
    content = answer_content(response)
    valid = image is not None and content is not None and extract_svg(content) == svg
    return pixel_verdict(image, ref_image, valid)
