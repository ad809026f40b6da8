"""M-RoPE position ids, one function per family, numbered the way vLLM numbers them.

Each vision item (image, video, or Qwen3-VL video frame) gets 3-D ids (t, h, w) offset by
where it starts; text gets the same id on all three axes, counting up by one. Where
transformers 5.19 and vLLM 0.32 disagree we follow vLLM (the rollout engine), because PPO
ratios compare the trainer's log-probs with the engine's (ENVIRONMENT.md: a 3e-3 gap):

- text after a vision item starts at `max(all ids so far) + 1` (vLLM, and the original Qwen
  code); transformers starts it at `start + max(h, w)`, ignoring the temporal axis. They differ
  for Qwen2.5-VL videos whose scaled temporal ids outrun the spatial ones, and for Qwen2-VL
  videos with more temporal patches than spatial rows/columns. Qwen3-VL/3.5 give every frame
  t = 0 (time is in the `<t seconds>` text), so both libraries agree there.
- Qwen2.5-VL temporal ids are `int(i * second_per_grid_ts * tokens_per_second)` in float64
  (vLLM), not float32 (transformers).

Functions take one sequence (`input_ids` [L]) plus the processor's grids and return [3, L].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MRopeSpec:
    """The config numbers M-RoPE numbering needs (read from the HF model config)."""

    image_token_id: int
    """Id of `<|image_pad|>`."""
    video_token_id: int
    """Id of `<|video_pad|>`."""
    merge_size: int
    """Vision spatial merge size (grid h, w are divided by it for the LLM)."""
    tokens_per_second: float
    """Qwen2.5-VL temporal id scale (1.0 for the other families)."""


def mrope_spec(config) -> MRopeSpec:
    """The `MRopeSpec` of a loaded HF config (any of the four families)."""
    vision = config.vision_config
    return MRopeSpec(
        image_token_id=config.image_token_id,
        video_token_id=config.video_token_id,
        merge_size=vision.spatial_merge_size,
        tokens_per_second=float(getattr(vision, "tokens_per_second", 1.0)),
    )


def _pad_runs(input_ids: torch.Tensor, token_id: int) -> list[tuple[int, int]]:
    """(start, length) of each maximal run of `token_id` in `input_ids` [L]."""
    is_tok = (input_ids == token_id).to(torch.int8)
    edges = torch.diff(is_tok, prepend=is_tok.new_zeros(1), append=is_tok.new_zeros(1))
    starts = (edges == 1).nonzero().flatten().tolist()
    ends = (edges == -1).nonzero().flatten().tolist()
    return [(s, e - s) for s, e in zip(starts, ends)]


def _match(runs: list[tuple[int, int]], sizes: list[int], what: str) -> list[int]:
    """Offsets of the runs, after checking they match the expected per-item token counts."""
    if [n for _, n in runs] != sizes:
        raise ValueError(
            f"{what}: placeholder runs of lengths {[n for _, n in runs]} do not match the "
            f"feature counts {sizes} from the grids (see inputs.check_placeholders)"
        )
    return [s for s, _ in runs]


def _number(length: int, blocks: list[tuple[int, int, int, int, float]]) -> torch.Tensor:
    """vLLM's rule: blocks are (offset, t, h, w, t_factor) in LLM units, sorted by offset."""
    chunks: list[torch.Tensor] = []
    st = 0  # next unnumbered token
    next_id = 0  # id the next text token gets
    for offset, t, h, w, t_factor in blocks:
        text_len = offset - st
        chunks.append(torch.arange(text_len).expand(3, -1) + next_id)
        grid = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"))
        grid = grid.reshape(3, -1)
        if t_factor != 1.0:
            grid[0] = (grid[0].double() * t_factor).long()
        vision = grid + next_id + text_len
        chunks.append(vision)
        next_id = int(vision.max()) + 1
        st = offset + t * h * w
    chunks.append(torch.arange(length - st).expand(3, -1) + next_id)
    return torch.cat(chunks, dim=1)


def _grids(grid_thw: torch.Tensor | None) -> list[list[int]]:
    return [] if grid_thw is None else grid_thw.tolist()


def qwen2_vl_positions(input_ids, image_grid_thw, video_grid_thw, second_per_grid_ts, spec):
    """Qwen2-VL: one block per image/video; temporal ids are the temporal patch index."""
    return _qwen2_family(input_ids, image_grid_thw, video_grid_thw, second_per_grid_ts, spec)


def qwen2_5_vl_positions(input_ids, image_grid_thw, video_grid_thw, second_per_grid_ts, spec):
    """Qwen2.5-VL: like Qwen2-VL, temporal ids scaled by `second_per_grid_ts * tokens_per_second`."""
    return _qwen2_family(input_ids, image_grid_thw, video_grid_thw, second_per_grid_ts, spec)


def _qwen2_family(input_ids, image_grid_thw, video_grid_thw, second_per_grid_ts, spec):
    m = spec.merge_size
    blocks = []
    images = _grids(image_grid_thw)
    offsets = _match(
        _pad_runs(input_ids, spec.image_token_id), [t * h * w // m**2 for t, h, w in images], "images"
    )
    blocks += [(o, 1, h // m, w // m, 1.0) for o, (_, h, w) in zip(offsets, images)]
    videos = _grids(video_grid_thw)
    offsets = _match(
        _pad_runs(input_ids, spec.video_token_id), [t * h * w // m**2 for t, h, w in videos], "videos"
    )
    for i, (o, (t, h, w)) in enumerate(zip(offsets, videos)):
        # vLLM: a missing second_per_grid_ts counts as 1.0 s; Qwen2-VL has tokens_per_second 1.
        seconds = 1.0 if second_per_grid_ts is None else float(second_per_grid_ts[i])
        blocks.append((o, t, h // m, w // m, seconds * spec.tokens_per_second))
    return _number(len(input_ids), sorted(blocks))


def qwen3_vl_positions(input_ids, image_grid_thw, video_grid_thw, second_per_grid_ts, spec):
    """Qwen3-VL and Qwen3.5: each temporal patch of a video is its own t=0 block (frames are
    separated by `<t seconds>` text); images as in Qwen2-VL."""
    m = spec.merge_size
    blocks = []
    images = _grids(image_grid_thw)
    offsets = _match(
        _pad_runs(input_ids, spec.image_token_id), [h * w // m**2 for _, h, w in images], "images"
    )
    blocks += [(o, 1, h // m, w // m, 1.0) for o, (_, h, w) in zip(offsets, images)]
    frames = [(h, w) for t, h, w in _grids(video_grid_thw) for _ in range(t)]
    offsets = _match(
        _pad_runs(input_ids, spec.video_token_id), [h * w // m**2 for h, w in frames], "video frames"
    )
    blocks += [(o, 1, h // m, w // m, 1.0) for o, (h, w) in zip(offsets, frames)]
    return _number(len(input_ids), sorted(blocks))


def extend_positions(positions: torch.Tensor, n: int) -> torch.Tensor:
    """Append `n` text tokens (a response) after `positions` [3, L]: ids max+1, max+2, ..."""
    start = int(positions.max()) + 1 if positions.numel() else 0
    return torch.cat([positions, torch.arange(start, start + n).expand(3, -1)], dim=1)


MROPE = {
    "qwen2_vl": qwen2_vl_positions,
    "qwen2_5_vl": qwen2_5_vl_positions,
    "qwen3_vl": qwen3_vl_positions,
    "qwen3_5": qwen3_vl_positions,  # vLLM's Qwen3_5ForConditionalGeneration inherits Qwen3-VL's rule
    "qwen3_vl_moe": qwen3_vl_positions,
    "qwen3_5_moe": qwen3_vl_positions,
}
