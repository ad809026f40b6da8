"""Padding-free rows: many sequences (or group-shared rows) in one row, attention per block.

A packed row is `[block 1][block 2] ... [block m]`: each block is one prompt + response
sequence, or one group-shared row (`models.shared_prefix`: a prompt and its responses, each
response seeing the prompt and itself), or a masked dummy vision token (a block of one). No pad
token is computed. `Packing` carries the block bounds (cu_seqlens, as flash-attention's varlen
API calls them) and, for group-shared blocks, each token's segment; the language model's
attention layers receive it as the `packing` keyword and `packed_attention` runs one
scaled-dot-product attention per block (causal, or the group mask), so attention costs the sum
of the blocks' squared lengths, not the row's.

`packed_attention` is registered with transformers' attention-function interface under
`PACKED_ATTENTION` (no model class is patched); `use_packed_attention` selects it for a model's
language model only (the vision tower keeps its own). Called without `packing` (generation,
padded batches) it is transformers' SDPA, with the SDPA mask, so one model serves both paths.

M-RoPE positions stay per sequence (rows 1-3 of `position_ids`, each sequence's own ids).
Row 0, the text positions transformers reads only to build a mask, counts 0..L-1 over the whole
row, so transformers sees one unpadded sequence and builds no [L, L] mask (attention is
separated by `packing`, not by a mask).

Which families: those whose language model is attention only (`Family.padding_free`). Qwen3.5's
linear-attention layers carry a recurrent state along the row from one sequence into the next;
transformers' CPU kernel for them takes no sequence bounds, so Qwen3.5 stays padded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

PACKED_ATTENTION = "easyvideor1_packed"
"""The language model's attention implementation while packed rows are used."""


@dataclass(frozen=True)
class Packing:
    """How one packed row splits into independent blocks."""

    bounds: tuple[int, ...]
    """Block boundaries (cu_seqlens): 0, end of block 1, ..., row length."""
    segment: torch.Tensor | None = None
    """[L] long, for group-shared blocks: 0 prompt, k > 0 response k (the block's tokens attend
    causally within the prompt and their own response); None: every block is plain causal."""
    shared: tuple[bool, ...] = ()
    """Per block: it is a group-shared row (has responses after a prompt); () means none is."""

    def __post_init__(self):
        if len(self.bounds) < 2 or self.bounds[0] != 0 or any(b >= e for b, e in zip(self.bounds, self.bounds[1:])):
            raise ValueError(f"packing bounds must rise strictly from 0, got {self.bounds[:8]}...")

    @property
    def length(self) -> int:
        return self.bounds[-1]

    @property
    def blocks(self) -> list[tuple[int, int]]:
        return list(zip(self.bounds[:-1], self.bounds[1:]))

    def to(self, device) -> Packing:
        seg = None if self.segment is None else self.segment.to(device)
        return Packing(self.bounds, seg, self.shared)


def block_mask(segment: torch.Tensor) -> torch.Tensor:
    """[n, n] bool (True: attend) of one group-shared block: causal; a response sees the prompt
    (segment 0) and itself."""
    n = segment.shape[0]
    q, k = segment[:, None], segment[None, :]
    causal = torch.ones(n, n, dtype=torch.bool, device=segment.device).tril()
    return causal & ((k == 0) | (k == q))


def packed_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                     packing: Packing | None = None, **kwargs):
    """Attention over a packed row, block by block or short blocks in one batched call
    (`BATCHED_WASTE`) (module docstring); transformers' SDPA
    when called without `packing`. query [1, H, L, D], key/value [1, H_kv, L, D]; returns
    ([1, L, H, D], None) as transformers' attention functions do."""
    if packing is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if query.shape[0] != 1 or query.shape[2] != packing.length:
        raise ValueError(f"a packed row is one row of {packing.length} tokens; attention got {tuple(query.shape)}")
    sizes = [e - s for s, e in packing.blocks]
    if 1 < len(sizes) and max(sizes) <= BATCHED_MAX_LEN and \
            len(sizes) * max(sizes) ** 2 <= BATCHED_WASTE * sum(n * n for n in sizes):
        out = _batched_blocks(query, key, value, packing, sizes, scaling)
    else:
        out = _block_by_block(query, key, value, packing, sizes, scaling)
    return out.transpose(1, 2).contiguous(), None


BATCHED_WASTE = 2.0
"""Blocks of similar length run as one batched SDPA call (each block a row, padded to the
longest) when that computes at most this many times the attention scores of one call per block:
many short blocks (CPU and GPU alike pay a fixed cost per call) gain more from one call than
they lose to the padding, which exists inside attention only. Long blocks of unequal length run
one call each."""
BATCHED_MAX_LEN = 2048
"""Longest block of a batched call: beyond it a call is long enough to pay its fixed cost, and the
batched call's [m, W, W] mask would grow large."""


def _block_by_block(query, key, value, packing: Packing, sizes: list[int], scaling) -> torch.Tensor:
    """[1, H, L, D]: one SDPA call per block."""
    gqa = query.shape[1] != key.shape[1]
    shared = packing.shared or (False,) * len(sizes)
    # split, not one slice per block: a slice's backward writes its gradient into a zero tensor of
    # the whole row (m blocks: m row-sized tensors); split's backward concatenates the m parts once
    out = []
    for (s, e), is_shared, q, k, v in zip(packing.blocks, shared, query.split(sizes, 2), key.split(sizes, 2),
                                          value.split(sizes, 2)):
        if is_shared:
            mask = block_mask(packing.segment[s:e])
            out.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling, enable_gqa=gqa))
        else:
            out.append(F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, enable_gqa=gqa))
    return torch.cat(out, dim=2)


def _batched_blocks(query, key, value, packing: Packing, sizes: list[int], scaling) -> torch.Tensor:
    """[1, H, L, D]: the blocks as the rows of one SDPA call, each padded to the longest; a padding
    query attends only to itself (never a fully masked row) and no real query sees padding."""
    m, width, device = len(sizes), max(sizes), query.device
    starts = torch.tensor(packing.bounds[:-1], device=device)
    cols = torch.arange(width, device=device)
    valid = cols[None] < torch.tensor(sizes, device=device)[:, None]  # [m, W]
    index = torch.where(valid, starts[:, None] + cols[None], 0)  # [m, W] -> row position
    segment = torch.zeros(m, width, dtype=torch.long, device=device)
    if packing.segment is not None and packing.shared:
        shared = torch.tensor(packing.shared, device=device)[:, None]
        segment = torch.where(shared, packing.segment[index], 0)
    segment = torch.where(valid, segment, -1)
    q_seg, k_seg = segment[:, :, None], segment[:, None, :]
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    mask = causal & ((k_seg == 0) | (k_seg == q_seg))  # padding sits after a block: causal keeps it unseen
    mask |= torch.eye(width, dtype=torch.bool, device=device) & ~valid[:, :, None]  # padding: itself only
    flat = index.flatten()

    def rows(x):  # [1, H, L, D] -> [m, H, W, D]
        return x[0].index_select(1, flat).unflatten(1, (m, width)).transpose(0, 1)

    out = F.scaled_dot_product_attention(rows(query), rows(key), rows(value), attn_mask=mask[:, None], scale=scaling,
                                         enable_gqa=query.shape[1] != key.shape[1])  # [m, H, W, D]
    return out.transpose(0, 1).flatten(1, 2)[:, valid.flatten()][None]  # [1, H, L, D], row order


AttentionInterface.register(PACKED_ATTENTION, packed_attention)
AttentionMaskInterface.register(PACKED_ATTENTION, sdpa_mask)  # padded calls get SDPA's mask


def language_attention(model) -> str | None:
    """The attention implementation of `model`'s language model."""
    return getattr(model.config.get_text_config(), "_attn_implementation", None)


def use_packed_attention(model) -> None:
    """Give `model`'s language model `packed_attention` (its vision tower keeps its own)."""
    if language_attention(model) != PACKED_ATTENTION:
        model.set_attn_implementation({"text_config": PACKED_ATTENTION})


def packing_blocker(config) -> str | None:
    """Why a model with HF `config` cannot train on packed rows, or None when it can."""
    text = config.get_text_config()
    attn = getattr(text, "_attn_implementation", None) or "eager"
    if attn not in ("sdpa", PACKED_ATTENTION):
        return f"attention implementation {attn!r}: packed rows replace SDPA only (set model.attn_implementation: sdpa)"
    kinds = set(getattr(text, "layer_types", None) or ())
    if "linear_attention" in kinds:
        return "linear-attention (recurrent) layers would carry one sequence's state into the next"
    if kinds - {"full_attention"} or getattr(text, "use_sliding_window", False):
        return f"layer types {sorted(kinds)} / sliding window: packed attention is full attention per block"
    return None
