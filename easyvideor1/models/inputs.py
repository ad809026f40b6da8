"""Prompt -> model inputs for one sample: chat template, processor, strict check, M-RoPE ids.

The frames arrive already sampled and resized (from the frame cache or a decoder), so the
processor is called with `do_sample_frames=False, do_resize=False` (inside `videos_kwargs`
/ `images_kwargs`, which keeps a mixed call from disabling the other modality's options) and
with the video metadata, so grids and timestamps are exactly those of the cache.

Departures from the HF defaults, on purpose:
- M-RoPE position ids are ours (`models/mrope.py`, vLLM's numbering), stored per sequence;
  the model never computes its own.
- Placeholders that disagree with the vision features are an error naming the sample, both
  counts and the likely cause, never a silent truncation or padding.
- Prompts are never truncated: an over-long prompt is an error (truncating would cut
  placeholder tokens).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import torch

from easyvideor1.models.families import Family
from easyvideor1.models.mrope import MROPE, MRopeSpec, extend_positions
from easyvideor1.records import Frames, Sample

PLACEHOLDER_RE = re.compile(r"<video>|<image>")


class PlaceholderMismatch(ValueError):
    """Vision placeholder tokens and vision features of one sample disagree."""


@dataclass
class ModelInputs:
    """Model inputs of one sequence (a prompt, optionally followed by a response), unbatched."""

    sample_id: str
    """`Sample.problem_id`, named in every error about this sequence."""
    input_ids: torch.Tensor
    """[L] long: prompt tokens (placeholders expanded), then response tokens."""
    position_ids: torch.Tensor
    """[3, L] long: M-RoPE (t, h, w) ids, vLLM numbering."""
    mm_token_type_ids: torch.Tensor
    """[L] int: 0 text, 1 image, 2 video."""
    prompt_len: int
    """Number of prompt tokens; tokens after them are the response."""
    prompt_text: str = ""
    """Chat-templated prompt with one placeholder per media item (what vLLM is given)."""
    pixel_values: torch.Tensor | None = None
    """[P_img, patch_dim] float: image patches, all images of the sample."""
    image_grid_thw: torch.Tensor | None = None
    """[N_img, 3] long: patch grid of each image."""
    pixel_values_videos: torch.Tensor | None = None
    """[P_vid, patch_dim] float: video patches, all videos of the sample."""
    video_grid_thw: torch.Tensor | None = None
    """[N_vid, 3] long: patch grid of each video."""
    second_per_grid_ts: torch.Tensor | None = None
    """[N_vid] float: seconds per temporal patch (Qwen2.5-VL only)."""
    response_mask: torch.Tensor | None = None
    """[L - prompt_len] bool: the response tokens that are scored (None: all; tool turns are not)."""

    @property
    def response_len(self) -> int:
        """Number of response tokens."""
        return len(self.input_ids) - self.prompt_len


def chat_messages(sample_id: str, user_text: str, n_videos: int, n_images: int) -> list[dict]:
    """One user turn: `<video>`/`<image>` placeholders in the text are honoured in place;
    without any, the videos come first, then the images, then the text."""
    found = PLACEHOLDER_RE.findall(user_text)
    if not found:
        content = [{"type": "video"}] * n_videos + [{"type": "image"}] * n_images
        return [{"role": "user", "content": content + [{"type": "text", "text": user_text}]}]
    if found.count("<video>") != n_videos or found.count("<image>") != n_images:
        raise ValueError(
            f"sample {sample_id!r}: the prompt has {found.count('<video>')} <video> and "
            f"{found.count('<image>')} <image> placeholders but the sample has {n_videos} videos and "
            f"{n_images} images; put one placeholder per media item, or none (media then go first)"
        )
    content = []
    for i, piece in enumerate(PLACEHOLDER_RE.split(user_text)):
        if i > 0:
            content.append({"type": found[i - 1][1:-1]})
        if piece:
            content.append({"type": "text", "text": piece})
    return [{"role": "user", "content": content}]


def _check_frames(sample_id: str, frames: list[Frames], family: Family) -> None:
    f = family.grid_factor
    for fr in frames:
        px = fr.pixels
        if px.dtype != torch.uint8 or px.ndim != 4 or px.shape[1] != 3:
            raise ValueError(
                f"sample {sample_id!r}: frames of {fr.source or 'a media item'} must be uint8 [T, 3, H, W], "
                f"got {px.dtype} {tuple(px.shape)}"
            )
        if px.shape[2] % f or px.shape[3] % f:
            raise ValueError(
                f"sample {sample_id!r}: frames of {fr.source or 'a media item'} are {px.shape[2]}x{px.shape[3]}, "
                f"not multiples of {f} ({family.name}); resize them with the family's grid factor"
            )
        if fr.metadata is None and px.shape[0] != 1:
            raise ValueError(f"sample {sample_id!r}: image {fr.source!r} has {px.shape[0]} frames, expected 1")
        if fr.metadata is not None and len(fr.metadata.frames_indices) != px.shape[0]:
            raise ValueError(
                f"sample {sample_id!r}: video {fr.source!r} has {px.shape[0]} frames but its metadata lists "
                f"{len(fr.metadata.frames_indices)} frame indices; re-sample or rebuild the cache entry"
            )


def _check_prompt_placeholders(sample_id: str, prompt_text: str, processor, n_videos: int, n_images: int):
    """Before expansion: one pad token per media item (the processor itself would crash)."""
    for name, token, n in (("video", processor.video_token, n_videos), ("image", processor.image_token, n_images)):
        found = prompt_text.count(token)
        if found != n:
            cause = (
                "the text contains literal vision pad tokens" if found > n else "the chat template dropped media items"
            )
            raise PlaceholderMismatch(
                f"sample {sample_id!r}: the chat prompt has {found} {token} placeholders for {n} {name}s; "
                f"likely cause: {cause}"
            )


def check_placeholders(
    sample_id: str,
    input_ids: torch.Tensor,
    image_grid_thw: torch.Tensor | None,
    video_grid_thw: torch.Tensor | None,
    spec: MRopeSpec,
    where: str = "prompt",
) -> None:
    """Raise `PlaceholderMismatch` unless each modality has one pad token per vision feature."""
    for name, token_id, grid in (
        ("image", spec.image_token_id, image_grid_thw),
        ("video", spec.video_token_id, video_grid_thw),
    ):
        tokens = int((input_ids == token_id).sum())
        features = 0 if grid is None else int(grid.prod(-1).sum()) // spec.merge_size**2
        if tokens == features:
            continue
        if where == "response":
            cause = "the response contains vision pad tokens; ban them in the rollout sampling params"
        elif tokens < features:
            cause = "placeholder tokens were cut (prompt truncation?) or a media item has no placeholder"
        else:
            cause = (
                "more placeholders than features: the text contains literal vision pad tokens, or the "
                "frames were resized after the prompt was expanded (pixel budget changed)"
            )
        raise PlaceholderMismatch(
            f"sample {sample_id!r}: {tokens} {name} placeholder tokens in the {where} but "
            f"{features} {name} features from the vision grids; likely cause: {cause}"
        )


def build_inputs(
    sample: Sample,
    frames: list[Frames],
    user_text: str,
    processor,
    family: Family,
    spec: MRopeSpec,
    max_prompt_tokens: int | None = None,
    tools: list[dict] | None = None,
) -> ModelInputs:
    """Model inputs of `sample` from its frames (videos: metadata set; images: T=1, no metadata).

    `frames` lists the sample's videos and images in the order of `sample.videos` and
    `sample.images` (videos and images may be interleaved; only the order within each
    modality matters). `user_text` is the rendered prompt (`data.templates.render_prompt`).
    `tools`: function schemas the chat template lists (multi-turn tool rollouts), or None.
    """
    sid = sample.problem_id
    _check_frames(sid, frames, family)
    videos = [fr for fr in frames if fr.metadata is not None]
    images = [fr for fr in frames if fr.metadata is None]
    if len(videos) != len(sample.videos) or len(images) != len(sample.images):
        raise ValueError(
            f"sample {sid!r}: got frames for {len(videos)} videos and {len(images)} images, but the sample "
            f"lists {len(sample.videos)} videos and {len(sample.images)} images"
        )
    messages = chat_messages(sid, user_text, len(videos), len(images))
    prompt_text = processor.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    _check_prompt_placeholders(sid, prompt_text, processor, len(videos), len(images))

    kwargs: dict = {}
    if videos:
        kwargs["videos"] = [fr.pixels for fr in videos]
        kwargs["videos_kwargs"] = dict(
            do_sample_frames=False,
            do_resize=False,
            video_metadata=[fr.metadata.to_hf() for fr in videos],
        )
    if images:
        kwargs["images"] = [fr.pixels[0] for fr in images]
        kwargs["images_kwargs"] = dict(do_resize=False)
    out = processor(text=[prompt_text], return_tensors="pt", **kwargs)

    input_ids = out["input_ids"][0]
    image_grid = out.get("image_grid_thw")
    video_grid = out.get("video_grid_thw")
    check_placeholders(sid, input_ids, image_grid, video_grid, spec)
    if max_prompt_tokens is not None and len(input_ids) > max_prompt_tokens:
        raise ValueError(
            f"sample {sid!r}: prompt has {len(input_ids)} tokens > max_prompt_tokens={max_prompt_tokens}; "
            f"lower the frame count or pixel budget, or raise the limit (prompts are never truncated)"
        )
    seconds = out.get("second_per_grid_ts")
    if seconds is not None:
        seconds = torch.as_tensor(seconds, dtype=torch.float32)
    positions = MROPE[family.name](input_ids, image_grid, video_grid, seconds, spec)
    type_ids = torch.zeros_like(input_ids, dtype=torch.int32)
    type_ids[input_ids == spec.image_token_id] = 1
    type_ids[input_ids == spec.video_token_id] = 2
    return ModelInputs(
        sample_id=sid,
        input_ids=input_ids,
        position_ids=positions,
        mm_token_type_ids=type_ids,
        prompt_len=len(input_ids),
        prompt_text=prompt_text,
        pixel_values=out.get("pixel_values"),
        image_grid_thw=image_grid,
        pixel_values_videos=out.get("pixel_values_videos"),
        video_grid_thw=video_grid,
        second_per_grid_ts=seconds,
    )


def append_response(inputs: ModelInputs, response_ids, spec: MRopeSpec) -> ModelInputs:
    """`inputs` (a prompt) followed by `response_ids`; the response may not hold vision pad tokens."""
    response = torch.as_tensor(response_ids, dtype=inputs.input_ids.dtype).flatten()
    check_placeholders(inputs.sample_id, response, None, None, spec, where="response")
    return replace(
        inputs,
        input_ids=torch.cat([inputs.input_ids[: inputs.prompt_len], response]),
        position_ids=extend_positions(inputs.position_ids[:, : inputs.prompt_len], len(response)),
        mm_token_type_ids=torch.cat(
            [inputs.mm_token_type_ids[: inputs.prompt_len], torch.zeros(len(response), dtype=torch.int32)]
        ),
    )
