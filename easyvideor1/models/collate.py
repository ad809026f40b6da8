"""Batch any mix of video, image and text sequences for one forward pass.

Padded (right padding for training, left for generation) or padding-free (all sequences
packed in one row, attention separated by text position ids restarting at 0).

Every parameter must take part in every forward, or FSDP hangs/aborts on a rank whose
micro-batch has no vision input (ENVIRONMENT.md). So a batch without any image or video gets
a masked dummy image: one `<|image_pad|>` token in a padding slot (attention_mask 0, outside
the loss mask) fed by a 1 x merge x merge patch grid of zeros. Real tokens never see it (it is
masked, and in right padding it comes after them), so the loss is bit-identical (gradients
equal up to float summation order) and every vision parameter gets a gradient, exactly zero.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from easyvideor1.models.families import Family
from easyvideor1.models.inputs import ModelInputs, check_placeholders
from easyvideor1.models.mrope import MRopeSpec

MODEL_KEYS = (
    "input_ids",
    "attention_mask",
    "position_ids",
    "mm_token_type_ids",
    "pixel_values",
    "image_grid_thw",
    "pixel_values_videos",
    "video_grid_thw",
    "second_per_grid_ts",
)


@dataclass
class Batch:
    """A collated micro-batch; `model_kwargs()` feeds HF forward/generate."""

    sample_ids: list[str]
    """Sample id of each sequence, in order."""
    input_ids: torch.Tensor
    """[B, L] long (B = 1 when padding-free)."""
    attention_mask: torch.Tensor | None
    """[B, L] long, 0 on padding and the dummy token; None when padding-free."""
    position_ids: torch.Tensor
    """[4, B, L] long: row 0 text ids (restart at 0 per packed sequence), rows 1-3 M-RoPE t/h/w."""
    mm_token_type_ids: torch.Tensor
    """[B, L] int: 0 text, 1 image, 2 video."""
    loss_mask: torch.Tensor
    """[B, L] bool: response tokens (whose log-probs count)."""
    seq_spans: list[tuple[int, int, int]]
    """(row, start, end) of each sequence in the batch, in `sample_ids` order."""
    pixel_values: torch.Tensor | None = None
    """[P_img, patch_dim]: image patches of all sequences (and the dummy), in order."""
    image_grid_thw: torch.Tensor | None = None
    """[N_img, 3]."""
    pixel_values_videos: torch.Tensor | None = None
    """[P_vid, patch_dim]."""
    video_grid_thw: torch.Tensor | None = None
    """[N_vid, 3]."""
    second_per_grid_ts: torch.Tensor | None = None
    """[N_vid] (Qwen2.5-VL)."""
    has_dummy_vision: bool = False
    """A masked dummy image was added (the batch had no vision input)."""

    def model_kwargs(self) -> dict:
        """Keyword arguments for the HF model's forward / generate (None entries dropped)."""
        return {k: getattr(self, k) for k in MODEL_KEYS if getattr(self, k) is not None}

    def to(self, device, dtype: torch.dtype | None = None) -> Batch:
        """The batch on `device`; pixel tensors also cast to `dtype` when given."""
        moved = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                cast = dtype if (dtype is not None and f.name.startswith("pixel_values")) else None
                v = v.to(device=device, dtype=cast) if cast else v.to(device)
            moved[f.name] = v
        return Batch(**moved)


def _cat(tensors: list[torch.Tensor | None]) -> torch.Tensor | None:
    present = [t for t in tensors if t is not None]
    return torch.cat(present) if present else None


def _rows(it: ModelInputs) -> dict[str, torch.Tensor]:
    n = len(it.input_ids)
    loss = torch.zeros(n, dtype=torch.bool)
    loss[it.prompt_len :] = True
    return dict(
        input_ids=it.input_ids,
        mrope=it.position_ids,
        mm_token_type_ids=it.mm_token_type_ids,
        loss_mask=loss,
        attention_mask=torch.ones(n, dtype=torch.long),
    )


def _dummy_rows(spec: MRopeSpec) -> dict[str, torch.Tensor]:
    """One masked `<|image_pad|>` token (the dummy image's single merged feature)."""
    return dict(
        input_ids=torch.tensor([spec.image_token_id]),
        mrope=torch.zeros(3, 1, dtype=torch.long),
        mm_token_type_ids=torch.ones(1, dtype=torch.int32),
        loss_mask=torch.zeros(1, dtype=torch.bool),
        attention_mask=torch.zeros(1, dtype=torch.long),
    )


def _dummy_pixels(family: Family) -> torch.Tensor:
    """Patches of a 1 x merge x merge grid of zeros: [merge**2, 3 * temporal * patch**2]."""
    patch_dim = 3 * family.temporal_patch_size * family.patch_size**2
    return torch.zeros(family.merge_size**2, patch_dim)


def _pad(seqs, dummy, pad_token_id: int, side: str) -> dict:
    """Stack `seqs` into [B, L] rows; `dummy` (or None) goes into the outermost padding slot
    of the shortest row, or into a new column when no row has padding."""
    lengths = [len(s["input_ids"]) for s in seqs]
    width = max(lengths)
    dummy_row = min(range(len(seqs)), key=lambda r: lengths[r])
    if dummy is not None and lengths[dummy_row] == width:
        width += 1
    b = len(seqs)
    input_ids = torch.full((b, width), pad_token_id, dtype=torch.long)
    attention = torch.zeros(b, width, dtype=torch.long)
    mrope = torch.zeros(3, b, width, dtype=torch.long)
    types = torch.zeros(b, width, dtype=torch.int32)
    loss = torch.zeros(b, width, dtype=torch.bool)
    spans = []
    for r, s in enumerate(seqs):
        n = lengths[r]
        cols = slice(0, n) if side == "right" else slice(width - n, width)
        input_ids[r, cols] = s["input_ids"]
        attention[r, cols] = 1
        mrope[:, r, cols] = s["mrope"]
        types[r, cols] = s["mm_token_type_ids"]
        loss[r, cols] = s["loss_mask"]
        spans.append((r, cols.start, cols.stop))
    if dummy is not None:
        c = width - 1 if side == "right" else 0
        input_ids[dummy_row, c] = dummy["input_ids"][0]
        types[dummy_row, c] = 1
    text = (attention.cumsum(-1) - 1).clamp(min=0) * attention
    return dict(
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=torch.cat([text[None], mrope]),
        mm_token_type_ids=types,
        loss_mask=loss,
        spans=spans,
    )


def _pack(seqs, dummy) -> dict:
    """Concatenate `seqs` (then `dummy`) into one row; text ids restart at 0 per sequence."""
    parts = seqs + ([dummy] if dummy is not None else [])
    spans, start = [], 0
    for s in seqs:
        spans.append((0, start, start + len(s["input_ids"])))
        start += len(s["input_ids"])
    text = torch.cat([torch.arange(len(s["input_ids"])) for s in parts])
    return dict(
        input_ids=torch.cat([s["input_ids"] for s in parts])[None],
        attention_mask=None,
        position_ids=torch.cat([text[None], torch.cat([s["mrope"] for s in parts], dim=1)])[:, None],
        mm_token_type_ids=torch.cat([s["mm_token_type_ids"] for s in parts])[None],
        loss_mask=torch.cat([s["loss_mask"] for s in parts])[None],
        spans=spans,
    )


def collate(
    items: list[ModelInputs],
    family: Family,
    spec: MRopeSpec,
    pad_token_id: int,
    padding_side: str = "right",
    padding_free: bool = False,
    dummy_vision: bool = True,
) -> Batch:
    """Batch `items` (any mix of modalities).

    `padding_side` "right" for training, "left" for generation. `padding_free` packs all
    sequences in one row (families with `padding_free`). `dummy_vision` adds the masked dummy
    image when no item has vision input, so all vision parameters join the forward.
    """
    if not items:
        raise ValueError("collate needs at least one sequence")
    if padding_side not in ("right", "left"):
        raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
    if padding_free and not family.padding_free:
        raise ValueError(f"{family.name} does not support padding-free batches (see Family.padding_free)")
    for it in items:  # strict check again: a response may have brought vision pad tokens
        check_placeholders(it.sample_id, it.input_ids, it.image_grid_thw, it.video_grid_thw, spec, "sequence")

    no_vision = all(it.pixel_values is None and it.pixel_values_videos is None for it in items)
    dummy = _dummy_rows(spec) if (dummy_vision and no_vision) else None
    seqs = [_rows(it) for it in items]
    rows = _pack(seqs, dummy) if padding_free else _pad(seqs, dummy, pad_token_id, padding_side)
    extra_pixels = [_dummy_pixels(family)] if dummy is not None else []
    extra_grid = [torch.tensor([[1, spec.merge_size, spec.merge_size]])] if dummy is not None else []
    return Batch(
        sample_ids=[it.sample_id for it in items],
        input_ids=rows["input_ids"],
        attention_mask=rows["attention_mask"],
        position_ids=rows["position_ids"],
        mm_token_type_ids=rows["mm_token_type_ids"],
        loss_mask=rows["loss_mask"],
        seq_spans=rows["spans"],
        pixel_values=_cat([it.pixel_values for it in items] + extra_pixels),
        image_grid_thw=_cat([it.image_grid_thw for it in items] + extra_grid),
        pixel_values_videos=_cat([it.pixel_values_videos for it in items]),
        video_grid_thw=_cat([it.video_grid_thw for it in items]),
        second_per_grid_ts=_cat([it.second_per_grid_ts for it in items]),
        has_dummy_vision=dummy is not None,
    )
