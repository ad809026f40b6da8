"""Group-shared prompts: a group's prompt (and its vision features) run once for all its responses.

GRPO scores n responses of one prompt; built as n prompt + response sequences, the vision
tower and the prompt's forward run n times. Here a group is one row,

    [prompt][response 1][response 2] ... [response k]

in which the prompt is causal, each response sees the whole prompt and its own earlier tokens,
never another response, and padding (and the masked dummy vision token) is never seen by a real
token. No mask says so: the row's `Packing` (or, for right-padded rows, `PaddedRows`) lists its
pieces and `models.packing.packed_attention` runs the prompt causally and each response over
[prompt; response] (`models.fused_attention`), so nothing of [L, L] is built. Each response
keeps the M-RoPE ids of its unshared sequence (the prompt's ids, then max + 1, max + 2, ...;
`mrope.extend_positions`), so every response token's attention scores, and so its log-prob,
are those of the unshared sequence up to float summation order. The first token of a response is scored from the prompt's last position, not the
previous response's (`Batch.predict_from`). In the update the prompt's activations receive the
summed gradient of the group's responses through the same autograd graph.

Linear-attention layers (Qwen3.5's Gated DeltaNet, `models.linear_attention`) run the prompt once
and each response from the prompt's final recurrent state and last conv inputs.

Why one row, not a key/value cache expanded over the responses: the row is one ordinary
forward, so gradient checkpointing, FSDP2 (the same collectives as the plain path), the
vision tower and Qwen3-VL's deepstack need nothing new, and it is the same packed layout that
padding-free batches use. HF drops the cache under gradient checkpointing, and its multi-token
continuation from a cache is not differentiable through Qwen3.5's linear-attention state.

Where it cannot be exact the trainer falls back to one sequence per response
(`shared_prefix_blocker`): linear-attention layers other than Qwen3.5's, sliding-window layers
(not full attention), and language-model attention that `packed_attention` does not replace
(SDPA or flash-attention; eager is refused).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from easyvideor1.models.collate import Batch, _cat, _dummy_pixels, _dummy_rows, _pack, _pad
from easyvideor1.models.families import Family
from easyvideor1.models.inputs import ModelInputs, check_placeholders
from easyvideor1.models.linear_attention import linear_attention_blocker
from easyvideor1.models.mrope import MRopeSpec, extend_positions
from easyvideor1.models.packing import PACKED_ATTENTION, Packing, PaddedRows
from easyvideor1.models.ulysses import ULYSSES_ATTENTION

SHARED_ATTENTION = ("sdpa", "flash_attention_2", PACKED_ATTENTION, ULYSSES_ATTENTION)
"""Language-model attention implementations that packed attention replaces for group rows
(`models.packing.use_packed_attention`)."""


@dataclass
class SharedGroup:
    """One prompt and some of its responses: one row of a shared-prefix batch."""

    prompt: ModelInputs
    responses: list[torch.Tensor]  # each [R_k] long


def shared_prefix_blocker(config) -> str | None:
    """Why a model with HF `config` cannot share a group's prompt exactly, or None when it can."""
    text = config.get_text_config()  # the language model's attention is what packing replaces
    attn = getattr(text, "_attn_implementation", None) or getattr(config, "_attn_implementation", None) or "eager"
    if attn not in SHARED_ATTENTION:
        return (f"attention implementation {attn!r} is not one packed attention replaces "
                f"(shared prefix needs one of {', '.join(SHARED_ATTENTION)})")
    kinds = set(getattr(text, "layer_types", None) or ())
    if (why := linear_attention_blocker(config)) is not None:
        return why
    if kinds - {"full_attention", "linear_attention"} or getattr(text, "use_sliding_window", False):
        return f"layer types {sorted(kinds)} / sliding window: group rows need full attention in every layer"
    return None


def _row(group: SharedGroup, spec: MRopeSpec) -> dict[str, torch.Tensor]:
    """Token-wise tensors of one group row (before padding); `segment` 0 prompt, k response k."""
    p = group.prompt
    n = p.prompt_len
    if n < 1:
        raise ValueError(f"sample {p.sample_id!r}: an empty prompt has no context to score a response from")
    positions = p.position_ids[:, :n]
    ids, mrope = [p.input_ids[:n]], [positions]
    seg, src = [torch.zeros(n, dtype=torch.long)], [torch.arange(n) - 1]
    start = n
    for k, response in enumerate(group.responses, 1):
        response = torch.as_tensor(response, dtype=p.input_ids.dtype).flatten()
        check_placeholders(p.sample_id, response, None, None, spec, where="response")
        r = len(response)
        ids.append(response)
        mrope.append(extend_positions(positions, r)[:, n:])  # the unshared sequence's ids
        seg.append(torch.full((r,), k, dtype=torch.long))
        src.append(torch.arange(start - 1, start + r - 1))  # token j predicted from token j - 1,
        src[-1][:1] = n - 1  # the first from the prompt's last
        start += r
    total = start
    loss = torch.zeros(total, dtype=torch.bool)
    loss[n:] = True
    return dict(
        input_ids=torch.cat(ids),
        mrope=torch.cat(mrope, dim=1),
        mm_token_type_ids=torch.cat([p.mm_token_type_ids[:n], torch.zeros(total - n, dtype=torch.int32)]),
        loss_mask=loss,
        segment=torch.cat(seg),
        predict_from=torch.cat(src),
    )


def collate_shared(groups: list[SharedGroup], family: Family, spec: MRopeSpec, pad_token_id: int,
                   padding_free: bool = False) -> Batch:
    """One right-padded row per group (module docstring), with the masked dummy image / video of
    `collate` when the batch lacks that modality; `padding_free`: the group rows are blocks of one
    packed row instead (`models.packing`). The batch's `loss_mask`, read row by row, lists the
    response tokens in the order of `groups` and their responses."""
    if not groups:
        raise ValueError("collate_shared needs at least one group")
    if padding_free and not family.padding_free:  # as `collate`: refused, never computed wrong
        raise ValueError(f"{family.name} does not support padding-free batches (see Family.padding_free)")
    prompts = [g.prompt for g in groups]
    need_image = all(p.pixel_values is None for p in prompts)
    need_video = all(p.pixel_values_videos is None for p in prompts)
    dummies = [_dummy_rows(spec, "image")] * need_image + [_dummy_rows(spec, "video")] * need_video
    rows = [_row(g, spec) for g in groups]
    for p, r in zip(prompts, rows):
        check_placeholders(p.sample_id, r["input_ids"], p.image_grid_thw, p.video_grid_thw, spec, "sequence")
    if padding_free:
        tokens = _pack(rows, dummies)
        bounds = tokens["packing"].bounds
        segment = torch.full((bounds[-1],), -1, dtype=torch.long)
        predict_from = torch.zeros(1, bounds[-1], dtype=torch.long)
        for r, (s, e) in zip(rows, zip(bounds, bounds[1:])):
            segment[s:e], predict_from[0, s:e] = r["segment"], r["predict_from"] + s
        shared = tuple(i < len(rows) for i in range(len(bounds) - 1))
        tokens["packing"] = Packing(bounds, segment, shared)
        attention = None
    else:
        tokens = _pad(rows, dummies, pad_token_id, "right")
        b, width = tokens["input_ids"].shape
        predict_from = torch.zeros(b, width, dtype=torch.long)
        blocks = []
        for i, r in enumerate(rows):
            n = len(r["input_ids"])
            predict_from[i, :n] = r["predict_from"]
            # the group block, then the row's padding (and dummies) as a block no real token sees
            bounds, shared = ((0, n, width), (True, False)) if width > n else ((0, n), (True,))
            blocks.append(Packing(bounds, F.pad(r["segment"], (0, width - n), value=-1), shared))
        # text ids 0..L-1 on every row: transformers sees unpadded rows and builds no [B, 1, L, L] mask
        tokens["position_ids"][0] = torch.arange(width)
        tokens["packing"] = PaddedRows(tuple(blocks))
        attention = None
    grid = torch.tensor([[1, spec.merge_size, spec.merge_size]])
    has_seconds = any(p.second_per_grid_ts is not None for p in prompts)
    return Batch(
        sample_ids=[p.sample_id for p in prompts],
        input_ids=tokens["input_ids"],
        attention_mask=attention,
        position_ids=tokens["position_ids"],
        mm_token_type_ids=tokens["mm_token_type_ids"],
        loss_mask=tokens["loss_mask"],
        seq_spans=tokens["spans"],
        pixel_values=_cat([p.pixel_values for p in prompts] + [_dummy_pixels(family)] * need_image),
        image_grid_thw=_cat([p.image_grid_thw for p in prompts] + [grid] * need_image),
        pixel_values_videos=_cat([p.pixel_values_videos for p in prompts] + [_dummy_pixels(family)] * need_video),
        video_grid_thw=_cat([p.video_grid_thw for p in prompts] + [grid] * need_video),
        second_per_grid_ts=_cat([p.second_per_grid_ts for p in prompts] + [torch.ones(1)] * (need_video and has_seconds)),
        has_dummy_vision=bool(dummies),
        predict_from=predict_from,
        packing=tokens.get("packing"),
    )
