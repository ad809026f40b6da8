"""Batch any mix of video, image and text sequences for one forward pass.

Padded (right padding for training, left for generation) or padding-free (all sequences
packed in one row, attention separated per sequence by `models.packing`).

Every rank must make the same sequence of calls into the model, or FSDP's collectives
mismatch and abort (ENVIRONMENT.md). A Qwen-VL forward runs the vision tower once for the
images and once more for the videos of a batch, so a batch lacking images gets a masked dummy
image and a batch lacking videos a masked dummy video: one `<|image_pad|>` / `<|video_pad|>`
token in a padding slot (attention_mask 0, outside the loss mask) fed by a 1 x merge x merge
patch grid of zeros. Every batch then calls the tower exactly twice, on every rank. Real
tokens never see a dummy (it is masked, and in right padding it comes after them), so the
loss is bit-identical (gradients equal up to float summation order) and every vision
parameter gets a gradient, exactly zero from the dummies.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from easyvideor1.models.families import Family
from easyvideor1.models.inputs import ModelInputs, check_placeholders
from easyvideor1.models.mrope import MRopeSpec
from easyvideor1.models.packing import Packing, PaddedRows

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
    "packing",
)


@dataclass
class Batch:
    """A collated micro-batch; `model_kwargs()` feeds HF forward/generate."""

    sample_ids: list[str]
    """Sample id of each sequence, in order."""
    input_ids: torch.Tensor
    """[B, L] long (B = 1 when padding-free)."""
    attention_mask: torch.Tensor | None
    """[B, L] long, 0 on padding and the dummy token; None when padding-free and for group-shared
    rows (`models.shared_prefix`: their `packing` separates them)."""
    position_ids: torch.Tensor
    """[4, B, L] long: row 0 text ids (0..L-1 over a packed row), rows 1-3 M-RoPE t/h/w."""
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
    """Masked dummy vision input was added (the batch lacked images and/or videos)."""
    predict_from: torch.Tensor | None = None
    """[B, L] long: column whose hidden state predicts token t (None: t - 1; group-shared rows
    score a response's first token from the prompt's last)."""
    packing: Packing | PaddedRows | None = None
    """Block bounds of a padding-free row (B = 1; `models.packing`), or of each right-padded
    group-shared row (`PaddedRows`); None for other padded rows."""
    routes: torch.Tensor | None = None
    """[B, L, layers, k] long: MoE experts to route each token to (`models.routing`); None: dense model."""

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
            elif isinstance(v, (Packing, PaddedRows)):
                v = v.to(device)
            moved[f.name] = v
        return Batch(**moved)


def _cat(tensors: list[torch.Tensor | None]) -> torch.Tensor | None:
    present = [t for t in tensors if t is not None]
    return torch.cat(present) if present else None


def _rows(it: ModelInputs) -> dict[str, torch.Tensor]:
    n = len(it.input_ids)
    loss = torch.zeros(n, dtype=torch.bool)
    loss[it.prompt_len :] = True if it.response_mask is None else it.response_mask
    return dict(
        input_ids=it.input_ids,
        mrope=it.position_ids,
        mm_token_type_ids=it.mm_token_type_ids,
        loss_mask=loss,
        attention_mask=torch.ones(n, dtype=torch.long),
    )


def _dummy_rows(spec: MRopeSpec, kind: str = "image") -> dict[str, torch.Tensor]:
    """One masked `<|image_pad|>` (or `<|video_pad|>`) token: the dummy's single merged feature."""
    token, type_id = (spec.image_token_id, 1) if kind == "image" else (spec.video_token_id, 2)
    return dict(
        input_ids=torch.tensor([token]),
        mrope=torch.zeros(3, 1, dtype=torch.long),
        mm_token_type_ids=torch.full((1,), type_id, dtype=torch.int32),
        loss_mask=torch.zeros(1, dtype=torch.bool),
        attention_mask=torch.zeros(1, dtype=torch.long),
    )


def _dummy_pixels(family: Family) -> torch.Tensor:
    """Patches of a 1 x merge x merge grid of zeros: [merge**2, 3 * temporal * patch**2]."""
    patch_dim = 3 * family.temporal_patch_size * family.patch_size**2
    return torch.zeros(family.merge_size**2, patch_dim)


def _dummy_slots(lengths: list[int], n: int) -> list[tuple[int, int]]:
    """(row, depth) of `n` dummy tokens: existing padding first (shortest rows first), so the
    batch width grows only when there is not enough padding (same shapes, same floats)."""
    width = max(lengths)
    while True:
        free = [(row, depth) for row in sorted(range(len(lengths)), key=lambda r: lengths[r])
                for depth in range(width - lengths[row])]
        if len(free) >= n:
            return free[:n]
        width += 1


def _pad(seqs, dummies, pad_token_id: int, side: str) -> dict:
    """Stack `seqs` into [B, L] rows; `dummies` go into padding slots (`_dummy_slots`)."""
    lengths = [len(s["input_ids"]) for s in seqs]
    width = max(lengths)
    slots = _dummy_slots(lengths, len(dummies))  # (row, depth from the outer edge)
    width = max([width] + [lengths[row] + 1 + depth for row, depth in slots])
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
    for dummy, (row, depth) in zip(dummies, slots):
        c = width - 1 - depth if side == "right" else depth
        input_ids[row, c] = dummy["input_ids"][0]
        types[row, c] = dummy["mm_token_type_ids"][0]
    text = (attention.cumsum(-1) - 1).clamp(min=0) * attention
    return dict(
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=torch.cat([text[None], mrope]),
        mm_token_type_ids=types,
        loss_mask=loss,
        spans=spans,
    )


def _pack(seqs, dummies) -> dict:
    """Concatenate `seqs`, then the dummies, into one row: each sequence and each dummy is a block
    of its own (`models.packing`); text ids count 0..L-1 over the row."""
    parts = seqs + list(dummies)
    spans, bounds = [], [0]
    for s in parts:
        bounds.append(bounds[-1] + len(s["input_ids"]))
    spans = [(0, bounds[i], bounds[i + 1]) for i in range(len(seqs))]
    mrope = torch.cat([s["mrope"] for s in parts], dim=1)
    return dict(
        input_ids=torch.cat([s["input_ids"] for s in parts])[None],
        attention_mask=None,
        position_ids=torch.cat([torch.arange(bounds[-1])[None], mrope])[:, None],
        mm_token_type_ids=torch.cat([s["mm_token_type_ids"] for s in parts])[None],
        loss_mask=torch.cat([s["loss_mask"] for s in parts])[None],
        spans=spans,
        packing=Packing(tuple(bounds)),
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
    sequences in one row (families with `padding_free`; the model's language model needs
    `models.packing.use_packed_attention`). `dummy_vision` adds a masked dummy
    image when no item has an image and a masked dummy video when none has a video (module
    docstring), so every batch makes the same vision-tower calls.
    """
    if not items:
        raise ValueError("collate needs at least one sequence")
    if padding_side not in ("right", "left"):
        raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
    if padding_free and not family.padding_free:
        raise ValueError(f"{family.name} does not support padding-free batches (see Family.padding_free)")
    for it in items:  # strict check again: a response may have brought vision pad tokens
        check_placeholders(it.sample_id, it.input_ids, it.image_grid_thw, it.video_grid_thw, spec, "sequence")

    need_image = dummy_vision and all(it.pixel_values is None for it in items)
    need_video = dummy_vision and all(it.pixel_values_videos is None for it in items)
    dummies = [_dummy_rows(spec, "image")] * need_image + [_dummy_rows(spec, "video")] * need_video
    seqs = [_rows(it) for it in items]
    rows = _pack(seqs, dummies) if padding_free else _pad(seqs, dummies, pad_token_id, padding_side)
    grid = torch.tensor([[1, spec.merge_size, spec.merge_size]])
    image_pixels = [_dummy_pixels(family)] if need_image else []
    video_pixels = [_dummy_pixels(family)] if need_video else []
    has_seconds = any(it.second_per_grid_ts is not None for it in items)
    video_seconds = [torch.ones(1)] if (need_video and has_seconds) else []
    return Batch(
        sample_ids=[it.sample_id for it in items],
        input_ids=rows["input_ids"],
        attention_mask=rows["attention_mask"],
        position_ids=rows["position_ids"],
        mm_token_type_ids=rows["mm_token_type_ids"],
        loss_mask=rows["loss_mask"],
        seq_spans=rows["spans"],
        pixel_values=_cat([it.pixel_values for it in items] + image_pixels),
        image_grid_thw=_cat([it.image_grid_thw for it in items] + [grid] * need_image),
        pixel_values_videos=_cat([it.pixel_values_videos for it in items] + video_pixels),
        video_grid_thw=_cat([it.video_grid_thw for it in items] + [grid] * need_video),
        second_per_grid_ts=_cat([it.second_per_grid_ts for it in items] + video_seconds),
        has_dummy_vision=bool(dummies),
        packing=rows.get("packing"),
    )
