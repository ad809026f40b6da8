"""`training.rank_balance`: samples assigned to data-parallel ranks by estimated prompt tokens.

The estimate is checked against the frames the prompt stage really decodes (real video files
and images of several sizes and lengths), and the assignment against contiguous slices on a
batch sorted longest first (the worst case for contiguous slices)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from easyvideor1.models.families import get_family
from easyvideor1.records import Sample
from easyvideor1.training.rank_balance import balanced_slots, estimate_tokens, rank_slots
from easyvideor1.vision.cache import FrameSource
from easyvideor1.vision.config import VisionConfig
from easyvideor1.vision.encode import write_video

CFG = VisionConfig(family="qwen2_5_vl", fps=2.0, min_frames=4, max_frames=32, video_min_pixels=3136,
                   video_max_pixels=50176, video_total_pixels=401408, image_min_pixels=3136,
                   image_max_pixels=50176)


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("balance_media")
    rng = np.random.default_rng(0)
    videos = {}
    for name, (frames, h, w, fps) in {"short": (8, 64, 96, 8), "long": (120, 180, 240, 10),
                                      "tall": (40, 200, 112, 5), "tiny": (4, 32, 32, 2)}.items():
        px = rng.integers(0, 255, (frames, h, w, 3), dtype=np.uint8)
        videos[name] = str(write_video(root / f"{name}.mp4", px, fps=fps, gop=1))
    image = root / "image.png"
    Image.fromarray(rng.integers(0, 255, (300, 200, 3), dtype=np.uint8)).save(image)
    return videos, str(image)


def _sample(i, videos=(), images=(), text="What happens?", **kw):
    return Sample(problem=text, answer="A", problem_type="multiple choice", videos=list(videos), images=list(images),
                  options=["A. yes", "B. no"], problem_id=f"s{i}", **kw)


def _vision_tokens(sample) -> int:
    """Vision tokens of the frames the prompt stage decodes for `sample`."""
    family = get_family(CFG.family)
    grid = family.grid_factor
    total = 0
    for frames in FrameSource(CFG, mode="realtime").frames_for_sample(sample):
        t, _, h, w = frames.pixels.shape
        per = max(t // family.temporal_patch_size, 1) if sample.videos and frames.source in sample.videos else 1
        total += per * (h // grid) * (w // grid)
    return total


def test_estimate_counts_the_vision_tokens_the_prompt_will_have(media):
    videos, image = media
    cases = [_sample(0, [videos["short"]]), _sample(1, [videos["long"]]), _sample(2, [videos["tall"]], [image]),
             _sample(3, [videos["tiny"]]), _sample(4, [], [image]),
             _sample(5, [videos["long"]], video_start=2.0, video_end=6.0)]
    for s in cases:
        text = estimate_tokens(_sample(99, text=s.problem), CFG)
        assert estimate_tokens(s, CFG) - text == _vision_tokens(s), s.problem_id
    assert estimate_tokens(cases[1], CFG) > 10 * estimate_tokens(cases[3], CFG)


def test_unreadable_media_counts_its_text_only(tmp_path):
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"not a video")
    s = _sample(0, [str(broken), str(tmp_path / "missing.mp4")], [str(tmp_path / "missing.png")])
    assert estimate_tokens(s, CFG) == estimate_tokens(_sample(1), CFG)


def test_balanced_slots_equal_counts_and_tokens():
    costs = [4000, 3000, 2500, 1500, 1000, 800, 400, 200]  # sorted: contiguous halves get 11,000 vs 2,400
    slots = balanced_slots(costs, 2)
    assert sorted(slots[0] + slots[1]) == list(range(8))
    assert [len(s) for s in slots] == [4, 4]
    totals = [sum(costs[i] for i in s) for s in slots]
    assert max(totals) / (sum(costs) / 2) < 1.05, totals
    assert balanced_slots(costs, 2) == slots  # deterministic: every rank computes the same
    four = balanced_slots(costs, 4)
    assert [len(s) for s in four] == [2] * 4 and sorted(sum(four, [])) == list(range(8))
    with pytest.raises(ValueError, match="multiple of the number of data-parallel ranks"):
        balanced_slots(costs, 3)


def test_rank_slots_balance_real_media_and_keep_contiguous_when_off(media):
    videos, image = media
    batch = [_sample(0, [videos["long"]]), _sample(1, [videos["tall"]]), _sample(2, [videos["short"]]),
             _sample(3, [videos["tiny"]])]
    contiguous = [rank_slots(batch, r, 2, None) for r in range(2)]
    assert contiguous == [[0, 1], [2, 3]]
    balanced = [rank_slots(batch, r, 2, CFG) for r in range(2)]
    assert sorted(balanced[0] + balanced[1]) == [0, 1, 2, 3]
    cost = [estimate_tokens(s, CFG) for s in batch]

    def spread(slots):
        totals = [sum(cost[i] for i in s) for s in slots]
        return max(totals) / (sum(totals) / 2)

    assert spread(balanced) < spread(contiguous)
    assert rank_slots(batch, 0, 1, CFG) == [0, 1, 2, 3]
