"""The vision tower's attention as one SDPA call per distinct window size (review C10).

transformers' Qwen2-VL, Qwen2.5-VL and Qwen3-VL vision attention with `sdpa` splits the patches
into their windows (Qwen2.5-VL) or frames and calls SDPA once per piece: a 16k-token video is
~64k patches, ~1000 windows x 28 window layers, so ~28k small launches per forward (and again
in recompute and backward). Here the pieces of equal length go into one call over
`[pieces, heads, length, dim]`; pieces of another length (the edge windows, a second video of
another size) get one call per length. No mask tensor: within a piece every patch sees every
other (`is_causal=False`), so nothing of [L, L] exists.

It is registered in transformers' `AttentionInterface` as `VISION_ATTENTION` and selected for the
vision config only (`model.set_attn_implementation({"vision_config": ...})`), not patched in.
transformers hands the piece boundaries (`cu_seq_lens_q`) only to implementations whose name
contains "flash" (`utils.generic.is_flash_attention_requested`, checked by each family's vision
attention), hence the name; nothing of flash-attn is loaded for it (a registered custom name
is taken as is). A transformers that routes only its own flash names so gets here once per piece,
with no `cu_seq_lens_q`: each call is then one piece, as `sdpa` would run it. On CUDA the calls
run under `fused_attention.kernel_policy`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from easyvideor1.models.fused_attention import kernel_policy

VISION_ATTENTION = "easyvideor1_flash_windows"
"""The `AttentionInterface` name of `window_attention` ("flash": see the module docstring)."""


@dataclass(frozen=True)
class _Plan:
    """How the pieces of one `cu_seqlens` are batched."""

    pieces: tuple[tuple[int, int, int], ...]  # (length, count, first token in the gathered order)
    perm: torch.Tensor | None  # token order that puts each length's pieces side by side (None: already)
    inverse: torch.Tensor | None  # back to the tower's order


_last: tuple = (None, -1, None)  # (weakref to the cu_seqlens tensor, its version, its plan)


def _plan(cu: torch.Tensor) -> _Plan:
    """The plan of `cu` (one host sync); the tower passes the same tensor to every layer of a kind,
    so the plan is kept for the last tensor seen (and its in-place version)."""
    global _last
    ref, version, plan = _last
    if ref is not None and ref() is cu and cu._version == version:
        return plan
    starts = cu[:-1].tolist()
    lengths = (cu[1:] - cu[:-1]).tolist()
    groups: dict[int, list[int]] = {}  # length -> the starts of its pieces, in order
    for s, n in zip(starts, lengths):
        if n > 0:
            groups.setdefault(n, []).append(s)
    order = sorted(groups.items(), key=lambda g: g[1][0])  # by first piece
    runs = all(st[-1] - st[0] == n * (len(st) - 1) for n, st in order)
    if runs and all(a[1][-1] + a[0] == b[1][0] for a, b in zip(order, order[1:])):
        # each length's pieces are one contiguous run, the runs in order: views, no gathers
        plan = _Plan(tuple((n, len(st), st[0]) for n, st in order), None, None)
    else:
        perm = torch.cat([torch.arange(s, s + n) for n, st in order for s in st]).to(cu.device)
        pieces, at = [], 0
        for n, st in order:
            pieces.append((n, len(st), at))
            at += n * len(st)
        plan = _Plan(tuple(pieces), perm, torch.argsort(perm))
    _last = (weakref.ref(cu), cu._version, plan)
    return plan


def window_attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0,
                     cu_seq_lens_q=None, **kwargs):
    """query/key/value [1, H, N, D], pieces given by `cu_seq_lens_q` [P + 1] -> ([1, N, H, D], None),
    the layout transformers' attention functions return."""
    if attention_mask is not None:
        raise ValueError(f"{VISION_ATTENTION} is for the vision tower (pieces by cu_seqlens, no mask)")
    if cu_seq_lens_q is None:  # a transformers that splits the pieces itself (`sdpa`-like path): one piece
        n = query.shape[2]
        cu_seq_lens_q = torch.tensor([0, n], device=query.device)
    plan = _plan(cu_seq_lens_q)
    if plan.perm is not None:
        query, key, value = (x.index_select(2, plan.perm) for x in (query, key, value))
    h, d = query.shape[1], query.shape[3]
    outs = []
    with kernel_policy(query.device):
        for n, m, at in plan.pieces:
            def block(x):  # [1, H, m * n, D] -> [m, H, n, D]
                return x[0, :, at:at + m * n].reshape(h, m, n, d).transpose(0, 1)

            o = F.scaled_dot_product_attention(block(query), block(key), block(value), scale=scaling,
                                               dropout_p=dropout if module.training else 0.0)
            outs.append(o.transpose(1, 2).reshape(m * n, h, d))  # [m * n, H, D]
    out = torch.cat(outs)
    if plan.inverse is not None:
        out = out.index_select(0, plan.inverse)
    return out[None], None


def use_window_attention(model) -> None:
    """Register `window_attention` and select it for `model`'s vision tower (text attention unchanged)."""
    from transformers import AttentionInterface

    AttentionInterface.register(VISION_ATTENTION, window_attention)
    model.set_attn_implementation({"vision_config": VISION_ATTENTION})
