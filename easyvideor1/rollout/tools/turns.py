"""Tool turns as tokens and media, and a prompt + turns as one sequence of model inputs.

A tool turn is the text Qwen's chat templates write for `tool` messages after an assistant turn
(`<|im_start|>user` + one `<tool_response>` block per call + `<|im_end|>`, then the next
assistant header), with each result's media first in its block. It is tokenised alone by the
processor (placeholders expanded, Qwen3-VL's frame timestamps inserted), and its ids appended
after the engine's sampled tokens: earlier turns are never tokenised again.

`sequence_with_turns` builds the `ModelInputs` of prompt + response (model and tool tokens) with
the media of the prompt and of every tool turn in sequence order, and numbers its M-RoPE ids over
the whole sequence (`models.mrope`, the same numbering for a prompt alone, so the prompt's ids
do not change). The engine continues from it (as a prompt) and the trainer scores it (with the
loss mask on the model's own tokens): the same function, so both see the same positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from easyvideor1.models.families import Family
from easyvideor1.models.inputs import ModelInputs, check_placeholders
from easyvideor1.models.mrope import MROPE, MRopeSpec
from easyvideor1.rollout.tools.protocol import ToolOutput

MEDIA_FIELDS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")


def _cat(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    if a is None or b is None:
        return b if a is None else a
    return torch.cat([a, b])


@dataclass
class TurnMedia:
    """Processor outputs of a response's tool turns, every turn's concatenated in order."""

    pixel_values: torch.Tensor | None = None
    """[P_img, patch_dim] image patches."""
    image_grid_thw: torch.Tensor | None = None
    """[N_img, 3]."""
    pixel_values_videos: torch.Tensor | None = None
    """[P_vid, patch_dim] video patches."""
    video_grid_thw: torch.Tensor | None = None
    """[N_vid, 3]."""
    second_per_grid_ts: torch.Tensor | None = None
    """[N_vid] (Qwen2.5-VL)."""

    def then(self, other: TurnMedia) -> TurnMedia:
        """This media followed by `other`'s."""
        return TurnMedia(**{k: _cat(getattr(self, k), getattr(other, k)) for k in MEDIA_FIELDS})


def tool_turn_text(outputs: list[ToolOutput], closed: bool) -> str:
    """The text after an assistant turn that called tools (`closed`: it ended with `<|im_end|>`)."""
    blocks = []
    for out in outputs:
        media = "".join("<|vision_start|><|video_pad|><|vision_end|>" if m.metadata is not None
                        else "<|vision_start|><|image_pad|><|vision_end|>" for m in out.media)
        blocks.append(f"\n<tool_response>\n{media}{out.text}\n</tool_response>")
    head = "" if closed else "<|im_end|>"
    return f"{head}\n<|im_start|>user{''.join(blocks)}<|im_end|>\n<|im_start|>assistant\n"


def encode_tool_turn(text: str, outputs: list[ToolOutput], processor, sample_id: str,
                     spec: MRopeSpec) -> tuple[torch.Tensor, TurnMedia]:
    """Token ids [n] of the tool turn `text` (placeholders expanded) and its media's processor outputs."""
    media = [m for out in outputs for m in out.media]
    videos = [m for m in media if m.metadata is not None]
    images = [m for m in media if m.metadata is None]
    kwargs: dict = {}
    if videos:
        kwargs["videos"] = [m.pixels for m in videos]
        kwargs["videos_kwargs"] = dict(do_sample_frames=False, do_resize=False,
                                       video_metadata=[m.metadata.to_hf() for m in videos])
    if images:
        kwargs["images"] = [m.pixels[0] for m in images]
        kwargs["images_kwargs"] = dict(do_resize=False)
    out = processor(text=[text], return_tensors="pt", **kwargs)
    ids = out["input_ids"][0]
    check_placeholders(sample_id, ids, out.get("image_grid_thw"), out.get("video_grid_thw"), spec, "tool turn")
    seconds = out.get("second_per_grid_ts")
    return ids, TurnMedia(out.get("pixel_values"), out.get("image_grid_thw"), out.get("pixel_values_videos"),
                          out.get("video_grid_thw"),
                          None if seconds is None else torch.as_tensor(seconds, dtype=torch.float32))


def sequence_with_turns(inputs: ModelInputs, token_ids: list[int], model_mask: list[bool] | None,
                        media: TurnMedia | None, family: Family, spec: MRopeSpec,
                        as_prompt: bool = False) -> ModelInputs:
    """Prompt `inputs` followed by a multi-turn response: its token ids (model and tool turns),
    which of them the model sampled, and the tool turns' media (module docstring). `as_prompt`:
    the whole sequence is the prompt of the next turn (the engine); else the response's tokens
    are the response, scored where `model_mask` is true (the trainer)."""
    media = media or TurnMedia()
    ids = torch.cat([inputs.input_ids[: inputs.prompt_len], torch.as_tensor(token_ids, dtype=inputs.input_ids.dtype)])
    grids = {k: _cat(getattr(inputs, k), getattr(media, k)) for k in MEDIA_FIELDS}
    check_placeholders(inputs.sample_id, ids, grids["image_grid_thw"], grids["video_grid_thw"], spec, "sequence")
    positions = MROPE[family.name](ids, grids["image_grid_thw"], grids["video_grid_thw"],
                                   grids["second_per_grid_ts"], spec)
    types = torch.zeros_like(ids, dtype=torch.int32)
    types[ids == spec.image_token_id] = 1
    types[ids == spec.video_token_id] = 2
    scored = None
    if not as_prompt and model_mask is not None:
        scored = torch.tensor(model_mask, dtype=torch.bool)
    return ModelInputs(sample_id=inputs.sample_id, input_ids=ids, position_ids=positions, mm_token_type_ids=types,
                       prompt_len=len(ids) if as_prompt else inputs.prompt_len, prompt_text=inputs.prompt_text,
                       response_mask=scored, **grids)
