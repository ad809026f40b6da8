"""M-RoPE ids: hand-computed cases, transformers where it should agree, vLLM's own functions."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch
from model_media import make_image, make_sample, make_video

from easyvideor1.models.families import MODEL_FAMILIES
from easyvideor1.models.inputs import build_inputs
from easyvideor1.models.mrope import (
    MRopeSpec,
    extend_positions,
    qwen2_5_vl_positions,
    qwen2_vl_positions,
    qwen3_vl_positions,
)

IMG, VID, VS, VE = 12, 13, 9, 10
SPEC = MRopeSpec(image_token_id=IMG, video_token_id=VID, merge_size=2, tokens_per_second=2.0)
SPEC_Q2 = MRopeSpec(image_token_id=IMG, video_token_id=VID, merge_size=2, tokens_per_second=1.0)
# The oracle tests run every family: the MoE ones have their own transformers `get_rope_index` and
# vLLM classes (conftest's `tiny` holds the dense four)
ALL_FAMILIES = list(MODEL_FAMILIES)


def test_qwen2_5_vl_text_after_video_continues_after_the_largest_id():
    # 3 text, a video of LLM grid t=2, h=1, w=2 (patch grid 2x2x4), 1 s per temporal patch
    # -> temporal ids 0, 2 (x tokens_per_second 2), then 2 text tokens from max + 1 = 6.
    ids = torch.tensor([100, 101, 102, VID, VID, VID, VID, 103, 104])
    got = qwen2_5_vl_positions(ids, None, torch.tensor([[2, 2, 4]]), torch.tensor([1.0]), SPEC)
    assert got.tolist() == [
        [0, 1, 2, 3, 3, 5, 5, 6, 7],
        [0, 1, 2, 3, 3, 3, 3, 6, 7],
        [0, 1, 2, 3, 4, 3, 4, 6, 7],
    ]
    # transformers 5.19 would restart the text at 3 + max(h, w) = 5.


def test_qwen2_vl_video_longer_than_wide():
    # patch grid 3x2x2 -> LLM grid t=3, h=1, w=1: temporal ids 3, 4, 5 outrun the spatial 3 -> text at 6.
    ids = torch.tensor([100, 101, 102, VID, VID, VID, 103])
    got = qwen2_vl_positions(ids, None, torch.tensor([[3, 2, 2]]), None, SPEC_Q2)
    assert got.tolist() == [[0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 3, 3, 6], [0, 1, 2, 3, 3, 3, 6]]


def test_qwen2_vl_image():
    ids = torch.tensor([100, IMG, IMG, IMG, IMG, 101])
    got = qwen2_vl_positions(ids, torch.tensor([[1, 4, 4]]), None, None, SPEC_Q2)
    assert got.tolist() == [[0, 1, 1, 1, 1, 3], [0, 1, 1, 2, 2, 3], [0, 1, 2, 1, 2, 3]]


def test_qwen3_vl_frames_are_separate_blocks_around_timestamp_text():
    # <vs> frame 1 (h=1, w=2) <ve> "<t s>" <vs> frame 2 <ve> text
    ids = torch.tensor([100, VS, VID, VID, VE, 200, VS, VID, VID, VE, 101])
    got = qwen3_vl_positions(ids, None, torch.tensor([[2, 2, 4]]), None, SPEC)
    assert got.tolist() == [
        [0, 1, 2, 2, 4, 5, 6, 7, 7, 9, 10],
        [0, 1, 2, 2, 4, 5, 6, 7, 7, 9, 10],
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
    ]


def test_extend_positions_counts_on_from_the_largest_id():
    pos = torch.tensor([[0, 1, 5], [0, 1, 3], [0, 1, 4]])
    assert extend_positions(pos, 2).tolist() == [[0, 1, 5, 6, 7], [0, 1, 3, 6, 7], [0, 1, 4, 6, 7]]


def test_runs_must_match_the_grids():
    ids = torch.tensor([100, VID, VID, 101])
    with pytest.raises(ValueError, match=r"videos: placeholder runs of lengths \[2\] do not match .*\[4\]"):
        qwen2_vl_positions(ids, None, torch.tensor([[2, 2, 4]]), None, SPEC_Q2)


def _hf(tiny, got):
    pos, _ = tiny.model.model.get_rope_index(
        got.input_ids[None],
        mm_token_type_ids=got.mm_token_type_ids[None],
        image_grid_thw=got.image_grid_thw,
        video_grid_thw=got.video_grid_thw,
        second_per_grid_ts=got.second_per_grid_ts,
    )
    return pos[:, 0]


@pytest.mark.parametrize("tiny", ALL_FAMILIES, indirect=True)
def test_images_agree_with_transformers(tiny):
    image = make_image(tiny.family, rows=2, cols=3)
    got = build_inputs(make_sample("i", [image]), [image], "hi", tiny.processor, tiny.family, tiny.spec)
    assert torch.equal(got.position_ids, _hf(tiny, got))


# How far our text ids after the video run ahead of transformers' for an 8-frame 1 fps video
# of 2x2 LLM cells: Qwen2-VL has 4 temporal ids (0..3) vs 2 spatial -> 2; Qwen2.5-VL spaces
# them 2 s x 2 tokens/s = 4 apart (0..12) -> 13 - 2 = 11; Qwen3-VL/3.5 agree.
TEXT_SHIFT = {"qwen2_vl": 2, "qwen2_5_vl": 11, "qwen3_vl": 0, "qwen3_5": 0, "qwen3_vl_moe": 0, "qwen3_5_moe": 0}


@pytest.mark.parametrize("tiny", ALL_FAMILIES, indirect=True)
def test_video_follows_vllm_where_transformers_differs(tiny):
    video = make_video(tiny.family, frames=8, fps=1.0)
    got = build_inputs(make_sample("v", [video]), [video], "hi", tiny.processor, tiny.family, tiny.spec)
    hf = _hf(tiny, got)
    last_vision = int((got.input_ids == tiny.spec.video_token_id).nonzero().max())
    assert torch.equal(got.position_ids[:, : last_vision + 1], hf[:, : last_vision + 1])
    shift = got.position_ids[:, last_vision + 1 :] - hf[:, last_vision + 1 :]
    assert (shift == TEXT_SHIFT[tiny.family.name]).all()


def _vllm_features(tiny, got, input_ids):
    """vLLM's MultiModalFeatureSpec, duck-typed: modality, mm_position.offset, data fields."""
    ids = input_ids
    feats = []
    pad = lambda tok: [i for i in range(len(ids)) if ids[i] == tok and (i == 0 or ids[i - 1] != tok)]
    for k, start in enumerate(pad(tiny.spec.image_token_id)):
        data = {"image_grid_thw": SimpleNamespace(data=got.image_grid_thw[k])}
        feats.append(SimpleNamespace(modality="image", mm_position=SimpleNamespace(offset=start), data=data))
    runs = pad(tiny.spec.video_token_id)
    frames_per_video = [1] * len(got.video_grid_thw) if tiny.family.timestamps != "frame_text" else [
        int(t) for t in got.video_grid_thw[:, 0]
    ]
    vs = tiny.model.config.vision_start_token_id
    r = 0
    for k, n in enumerate(frames_per_video):
        start = runs[r]
        if tiny.family.timestamps == "frame_text":  # placeholder starts after the outer <|vision_start|>
            starts = [i for i in range(start) if ids[i] == vs]
            start = starts[-2] + 1
        data = {"video_grid_thw": SimpleNamespace(data=got.video_grid_thw[k])}
        if got.second_per_grid_ts is not None:
            data["second_per_grid_ts"] = SimpleNamespace(data=got.second_per_grid_ts[k])
        feats.append(SimpleNamespace(modality="video", mm_position=SimpleNamespace(offset=start), data=data))
        r += n
    return feats


@pytest.mark.parametrize("tiny", ALL_FAMILIES, indirect=True)
def test_positions_equal_vllms_own_function(tiny):
    pytest.importorskip("vllm")
    from vllm.model_executor.models.qwen2_5_vl import Qwen2_5_VLForConditionalGeneration
    from vllm.model_executor.models.qwen2_vl import Qwen2VLForConditionalGeneration
    from vllm.model_executor.models.qwen3_5 import Qwen3_5MoeForConditionalGeneration
    from vllm.model_executor.models.qwen3_vl import Qwen3VLForConditionalGeneration
    from vllm.model_executor.models.qwen3_vl_moe import Qwen3VLMoeForConditionalGeneration

    video, image = make_video(tiny.family, frames=8, fps=1.0), make_image(tiny.family, rows=2, cols=3)
    video2 = make_video(tiny.family, frames=6, rows=1, cols=3, fps=3.0, step=2, seed=5)
    frames = [video, image, video2]
    got = build_inputs(
        make_sample("m", frames), frames, "<video> a <image> b <video> c", tiny.processor, tiny.family, tiny.spec
    )
    ids = got.input_ids.tolist()
    feats = _vllm_features(tiny, got, ids)
    config = tiny.model.config
    moe = {"qwen3_vl_moe": Qwen3VLMoeForConditionalGeneration, "qwen3_5_moe": Qwen3_5MoeForConditionalGeneration}
    if tiny.family.moe:  # the methods each MoE model class resolves to (vLLM's own inheritance)
        model_cls = moe[tiny.family.name]
        fake = SimpleNamespace(config=config, _get_mrope_input_positions=model_cls._get_mrope_input_positions)
        pos, delta = model_cls.get_mrope_input_positions(fake, ids, feats)
    elif tiny.family.timestamps == "frame_text":  # Qwen3_5ForConditionalGeneration inherits this rule
        pos, delta = Qwen3VLForConditionalGeneration._get_mrope_input_positions(ids, feats, config)
    else:
        cls = {"qwen2_vl": Qwen2VLForConditionalGeneration, "qwen2_5_vl": Qwen2_5_VLForConditionalGeneration}
        model_cls = cls[tiny.family.name]
        fake = SimpleNamespace(config=config)
        fake.iter_mm_grid_thw = functools.partial(model_cls.iter_mm_grid_thw, fake)
        pos, delta = model_cls.get_mrope_input_positions(fake, ids, feats)
    assert torch.equal(got.position_ids, torch.as_tensor(pos).long())
    assert delta == int(got.position_ids.max()) + 1 - len(ids)
