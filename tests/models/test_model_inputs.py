"""Prompt -> model inputs: placeholders, cached frames vs processor-side sampling, strict checks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from model_media import make_image, make_sample, make_video
from transformers.video_utils import VideoMetadata as HFVideoMetadata

from easyvideor1.models.inputs import (
    PlaceholderMismatch,
    append_response,
    build_inputs,
    chat_messages,
    check_placeholders,
)
from easyvideor1.records import Frames, VideoMetadata


def test_placeholders_honoured_in_place():
    msgs = chat_messages("s1", "Look: <image> then <video>. Which?", n_videos=1, n_images=1)
    assert msgs == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look: "},
                {"type": "image"},
                {"type": "text", "text": " then "},
                {"type": "video"},
                {"type": "text", "text": ". Which?"},
            ],
        }
    ]


def test_without_placeholders_media_come_first():
    msgs = chat_messages("s1", "Which?", n_videos=2, n_images=1)
    types = [c["type"] for c in msgs[0]["content"]]
    assert types == ["video", "video", "image", "text"]


def test_placeholder_count_mismatch_names_sample():
    with pytest.raises(ValueError, match=r"sample 's9'.*2 <video>.*1 videos"):
        chat_messages("s9", "<video> and <video>", n_videos=1, n_images=0)


def _processor_side(tiny, raw: torch.Tensor, fps: float):
    """Let the processor sample and resize the full video itself."""
    n, _, h0, w0 = raw.shape
    meta = dict(
        fps=fps, total_num_frames=n, frames_indices=list(range(n)), width=w0, height=h0,
        duration=n / fps, video_backend="torchcodec",
    )
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "hi"}]}]
    text = tiny.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    out = tiny.processor(
        text=[text], videos=[raw], videos_kwargs=dict(do_sample_frames=True, video_metadata=[meta]),
        return_tensors="pt",
    )
    return out, meta


def test_cached_frames_give_the_processor_side_inputs(tiny):
    """Sampling + resizing ourselves (bicubic, antialias, uint8) and passing the frames with
    their metadata gives exactly what the processor produces from the full video."""
    g = torch.Generator().manual_seed(1)
    raw = torch.randint(0, 256, (20, 3, 90, 130), dtype=torch.uint8, generator=g)
    ref, meta = _processor_side(tiny, raw, fps=4.0)
    vp = tiny.processor.video_processor
    indices = [int(i) for i in vp.sample_frames(HFVideoMetadata(**meta), fps=vp.fps)]
    _, gh, gw = ref["video_grid_thw"][0].tolist()
    size = (gh * tiny.family.patch_size, gw * tiny.family.patch_size)
    frames = F.interpolate(raw[indices], size=size, mode="bicubic", antialias=True)
    cached = Frames(frames, VideoMetadata(4.0, 20, indices, 130, 90, 5.0), source="v.mp4")

    got = build_inputs(make_sample("s", [cached]), [cached], "hi", tiny.processor, tiny.family, tiny.spec)
    assert torch.equal(got.input_ids, ref["input_ids"][0])
    assert torch.equal(got.video_grid_thw, ref["video_grid_thw"])
    assert torch.equal(got.pixel_values_videos, ref["pixel_values_videos"])
    assert torch.equal(got.mm_token_type_ids, ref["mm_token_type_ids"][0].to(torch.int32))
    if "second_per_grid_ts" in ref:
        assert torch.equal(got.second_per_grid_ts, torch.as_tensor(ref["second_per_grid_ts"]).float())
    if tiny.family.timestamps == "frame_text":  # timestamps from the metadata, not a 24 fps guess
        text = tiny.processor.tokenizer.decode(got.input_ids)
        first = (indices[0] / 4.0 + indices[1] / 4.0) / 2
        assert f"<{first:.1f} seconds>" in text


def test_mixed_sample_and_prompt_text(tiny):
    video, image = make_video(tiny.family), make_image(tiny.family)
    sample = make_sample("mix", [video, image])
    got = build_inputs(sample, [video, image], "<image> vs <video>?", tiny.processor, tiny.family, tiny.spec)
    # The prompt for vLLM keeps one placeholder per item, in the order the text gives.
    assert got.prompt_text.count("<|image_pad|>") == 1 and got.prompt_text.count("<|video_pad|>") == 1
    assert got.prompt_text.index("<|image_pad|>") < got.prompt_text.index("<|video_pad|>")
    assert got.image_grid_thw.tolist() == [[1, 2, 4]]
    assert got.video_grid_thw.tolist() == [[2, 4, 4]]
    assert got.prompt_len == len(got.input_ids) and got.response_len == 0
    assert got.position_ids.shape == (3, len(got.input_ids))


def test_literal_pad_token_in_text_is_a_named_error(tiny):
    video = make_video(tiny.family)
    sample = make_sample("bad-1", [video])
    with pytest.raises(PlaceholderMismatch) as err:
        build_inputs(sample, [video], "why <|video_pad|>?", tiny.processor, tiny.family, tiny.spec)
    msg = str(err.value)
    assert "'bad-1'" in msg and "literal vision pad tokens" in msg
    assert "2 <|video_pad|> placeholders for 1 videos" in msg


def test_more_placeholders_than_features_is_a_named_error(tiny):
    video = make_video(tiny.family)
    got = build_inputs(make_sample("x-2", [video]), [video], "hi", tiny.processor, tiny.family, tiny.spec)
    extra = torch.cat([got.input_ids, torch.tensor([tiny.spec.video_token_id])])
    n = 2 * 4 * 4 // 4  # grid t*h*w / merge**2
    with pytest.raises(PlaceholderMismatch, match=rf"'x-2': {n + 1} video placeholder .* {n} video features.*pixel budget"):
        check_placeholders("x-2", extra, None, got.video_grid_thw, tiny.spec)


def test_truncated_placeholders_are_a_named_error(tiny):
    video = make_video(tiny.family)
    got = build_inputs(make_sample("cut-7", [video]), [video], "hi", tiny.processor, tiny.family, tiny.spec)
    cut = got.input_ids[: int((got.input_ids == tiny.spec.video_token_id).nonzero()[2])]
    with pytest.raises(PlaceholderMismatch, match=r"'cut-7': 2 video placeholder tokens .* 8 video features.*truncation"):
        check_placeholders("cut-7", cut, None, got.video_grid_thw, tiny.spec)


def test_response_with_vision_pad_tokens_is_refused(tiny):
    image = make_image(tiny.family)
    got = build_inputs(make_sample("r-3", [image]), [image], "hi", tiny.processor, tiny.family, tiny.spec)
    with pytest.raises(PlaceholderMismatch, match=r"'r-3'.*ban them"):
        append_response(got, [5, tiny.spec.image_token_id, 6], tiny.spec)


def test_bad_frames_are_named_errors(tiny):
    f = tiny.family.grid_factor
    odd = Frames(torch.zeros(2, 3, f + 2, f, dtype=torch.uint8), VideoMetadata(1.0, 2, [0, 1], f, f + 2, 2.0), "odd.mp4")
    with pytest.raises(ValueError, match=rf"'o1'.*odd.mp4.*multiples of {f}"):
        build_inputs(make_sample("o1", [odd]), [odd], "hi", tiny.processor, tiny.family, tiny.spec)
    short = Frames(torch.zeros(2, 3, f, f, dtype=torch.uint8), VideoMetadata(1.0, 3, [0, 1, 2], f, f, 3.0), "s.mp4")
    with pytest.raises(ValueError, match=r"'o2'.*2 frames but its metadata lists 3"):
        build_inputs(make_sample("o2", [short]), [short], "hi", tiny.processor, tiny.family, tiny.spec)
    floats = Frames(torch.zeros(1, 3, f, f), None, "f.png")
    with pytest.raises(ValueError, match=r"'o3'.*uint8"):
        build_inputs(make_sample("o3", [floats]), [floats], "hi", tiny.processor, tiny.family, tiny.spec)
    video = make_video(tiny.family)
    with pytest.raises(ValueError, match=r"'o4'.*frames for 1 videos.*lists 0 videos"):
        build_inputs(make_sample("o4", []), [video], "hi", tiny.processor, tiny.family, tiny.spec)


def test_long_prompt_is_an_error_not_a_truncation(tiny):
    video = make_video(tiny.family)
    with pytest.raises(ValueError, match=r"'long'.*> max_prompt_tokens=10.*never truncated"):
        build_inputs(
            make_sample("long", [video]), [video], "hi", tiny.processor, tiny.family, tiny.spec, max_prompt_tokens=10
        )
