"""A CPU reference implementation of flash-attn 2's `flash_attn_varlen_func`, computed with SDPA one
sequence at a time.

It computes real attention, with the same signature and contract as flash-attn. Most contract
points are asserted, so a call real flash-attn would reject or misread fails here:

- q is [total_q, H, D]; k and v are [total_k, H_kv, D] (equal head dims, D <= 256).
- Grouped-query attention comes from fewer key/value heads. Query head h reads key/value head
  h // (H / H_kv), which is `repeat_interleave` order.
- `cu_seqlens_q` / `cu_seqlens_k` are int32, 1-D, on q's device. Each starts at 0, never falls and
  ends at its total, and both describe the same number of sequences.
- `max_seqlen_q` / `max_seqlen_k` are Python ints, at least the longest sequence (flash-attn sizes
  its grid by them; a smaller one silently drops tokens).
- `causal=True` is aligned to the bottom-right corner (flash-attn >= 2.1): query i of a sequence
  of n queries over s keys sees keys 0 .. i + s - n. A query row that sees no key (n > s) outputs
  zeros.

The dtype is not asserted: flash-attn takes float16/bfloat16 only. The reference also runs in
float32, so a comparison can be exact to 1e-5. Dropout, windows, softcap, ALiBi and paged KV are
not implemented; each is asserted off.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class VarlenCall:
    """What one call received (for the tests' checks of cu_seqlens)."""

    q_shape: tuple[int, ...]
    k_shape: tuple[int, ...]
    cu_seqlens_q: tuple[int, ...]
    cu_seqlens_k: tuple[int, ...]
    max_seqlen_q: int
    max_seqlen_k: int
    causal: bool


calls: list[VarlenCall] = []
"""Every call since the last `calls.clear()`."""


def _check_cu(cu: torch.Tensor, total: int, device: torch.device, name: str) -> list[int]:
    assert isinstance(cu, torch.Tensor) and cu.dtype == torch.int32 and cu.dim() == 1, \
        f"{name} must be a 1-D int32 tensor, got {getattr(cu, 'dtype', type(cu))}"
    assert cu.device == device, f"{name} on {cu.device}, q on {device}"
    values = cu.tolist()
    assert values[0] == 0 and values[-1] == total, f"{name} must run from 0 to {total}, got {values[0]}..{values[-1]}"
    assert all(a <= b for a, b in zip(values, values[1:])), f"{name} falls: {values}"
    return values


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """flash-attn 2's `flash_attn_varlen_func` (module docstring): [total_q, H, D] out."""
    assert q.dim() == k.dim() == v.dim() == 3, "q, k, v must be [total_tokens, heads, head_dim]"
    total_q, heads, dim = q.shape
    total_k, kv_heads, _ = k.shape
    assert v.shape == k.shape and k.shape[-1] == dim <= 256, f"head dims q {dim}, k {k.shape[-1]}, v {v.shape[-1]}"
    assert heads % kv_heads == 0, f"{kv_heads} key/value heads must divide {heads} query heads"
    assert dropout_p == 0.0 and tuple(window_size) == (-1, -1) and not softcap and alibi_slopes is None \
        and block_table is None and not return_attn_probs, "not implemented by the reference"
    cu_q = _check_cu(cu_seqlens_q, total_q, q.device, "cu_seqlens_q")
    cu_k = _check_cu(cu_seqlens_k, total_k, q.device, "cu_seqlens_k")
    assert len(cu_q) == len(cu_k), "cu_seqlens_q and cu_seqlens_k must describe the same sequences"
    for name, given, cu in (("max_seqlen_q", max_seqlen_q, cu_q), ("max_seqlen_k", max_seqlen_k, cu_k)):
        longest = max(b - a for a, b in zip(cu, cu[1:]))
        assert isinstance(given, int) and given >= longest, f"{name}={given!r}, the longest sequence is {longest}"
    calls.append(VarlenCall(tuple(q.shape), tuple(k.shape), tuple(cu_q), tuple(cu_k), max_seqlen_q, max_seqlen_k,
                            causal))
    scale = dim ** -0.5 if softmax_scale is None else softmax_scale
    rep = heads // kv_heads
    out = []
    for a, b, c, d in zip(cu_q, cu_q[1:], cu_k, cu_k[1:]):
        n, s = b - a, d - c
        qs = q[a:b].transpose(0, 1)  # [H, n, D]
        ks, vs = (x[c:d].transpose(0, 1).repeat_interleave(rep, 0) for x in (k, v))  # [H, s, D]
        mask = None
        seen = torch.ones(n, dtype=torch.bool, device=q.device)
        if causal:
            mask = torch.arange(s, device=q.device)[None, :] <= torch.arange(n, device=q.device)[:, None] + (s - n)
            seen = mask.any(-1)
            mask = mask | ~seen[:, None]  # a row that sees nothing: any keys, zeroed below
        if n == 0 or s == 0:
            out.append(q.new_zeros(n, heads, dim))
            continue
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale)  # [H, n, D]
        out.append((o * seen[None, :, None]).transpose(0, 1))
    return torch.cat(out)
