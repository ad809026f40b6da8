"""CPU reference implementations of flash-linear-attention's `chunk_gated_delta_rule` and
causal-conv1d's `causal_conv1d_fn`, with their signatures and contracts.

They compute the real thing by another route than `models.linear_attention`'s pure-torch path:
the delta rule token by token (transformers' `torch_recurrent_gated_delta_rule`), one sequence of
cu_seqlens at a time; the conv with `F.conv1d`, one run of seq_idx at a time. The contract points
are asserted, so a call the real kernels would reject or misread fails here:

- chunk_gated_delta_rule: q, k [B, T, H, K], v [B, T, H, V] of one dtype (equal head counts: the
  caller repeats key heads), g and beta [B, T, H]; with `cu_seqlens` (a 1-D int64 tensor from 0 to
  T, never falling) B must be 1, and `initial_state` is [N, H, K, V] float32 for N sequences.
  Returns (o [B, T, H, V] in q's dtype, final state [N, H, K, V] float32 or None).
- causal_conv1d_fn: x [B, C, L] channel-last (x.stride(1) == 1: seq_idx is only supported so),
  weight [C, W] with 2 <= W <= 4, seq_idx int32 [B, L], activation None, "silu" or "swish".

The dtype is not asserted to be half: some FLA versions refuse float32, the reference takes it,
so a comparison can be exact to 1e-5.
"""

from __future__ import annotations

import sys
import types

import torch
import torch.nn.functional as F
from transformers.models.qwen3_5.modeling_qwen3_5 import torch_recurrent_gated_delta_rule

calls: list[tuple[str, tuple]] = []
"""(kernel, its sequence bounds) of every call since the last `calls.clear()`."""


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           cu_seqlens=None, use_qk_l2norm_in_kernel=False, **kwargs):
    """FLA's `fla.ops.gated_delta_rule.chunk_gated_delta_rule` (module docstring)."""
    assert q.dim() == k.dim() == v.dim() == 4 and q.shape == k.shape, f"q {q.shape}, k {k.shape}: [B, T, H, K]"
    assert q.dtype == k.dtype == v.dtype, f"q, k, v dtypes {q.dtype}, {k.dtype}, {v.dtype}"
    bsz, total, heads, dk = q.shape
    assert v.shape[:3] == (bsz, total, heads), f"v {v.shape} for q {q.shape}"
    assert g.shape == beta.shape == (bsz, total, heads), f"g {g.shape}, beta {beta.shape}: [B, T, H]"
    assert scale is None or scale == dk ** -0.5, "the reference scales by K ** -0.5 only"
    assert not kwargs.get("head_first"), "head_first is deprecated"
    if cu_seqlens is None:
        bounds = [(b, 0, total) for b in range(bsz)]
    else:
        assert bsz == 1, f"the batch size must be 1 with cu_seqlens, got {bsz}"
        assert isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.dtype == torch.int64 and cu_seqlens.dim() == 1, \
            f"cu_seqlens must be a 1-D LongTensor, got {getattr(cu_seqlens, 'dtype', type(cu_seqlens))}"
        assert cu_seqlens.device == q.device
        cu = cu_seqlens.tolist()
        assert cu[0] == 0 and cu[-1] == total and all(a <= b for a, b in zip(cu, cu[1:])), f"cu_seqlens {cu}"
        bounds = [(0, a, b) for a, b in zip(cu, cu[1:])]
    if initial_state is not None:
        assert initial_state.shape == (len(bounds), heads, dk, v.shape[-1]), \
            f"initial_state {tuple(initial_state.shape)}: one [H, K, V] per sequence ({len(bounds)})"
        assert initial_state.dtype == torch.float32, f"initial_state {initial_state.dtype}"
    calls.append(("chunk_gated_delta_rule", tuple(cu_seqlens.tolist()) if cu_seqlens is not None else (bsz, total)))
    outs, states = [], []
    for n, (b, s, e) in enumerate(bounds):
        o, state = torch_recurrent_gated_delta_rule(
            q[b:b + 1, s:e], k[b:b + 1, s:e], v[b:b + 1, s:e], g[b:b + 1, s:e], beta[b:b + 1, s:e],
            initial_state=None if initial_state is None else initial_state[n:n + 1],
            output_final_state=True, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
        outs.append(o)
        states.append(state)
    out = torch.cat(outs, 1) if cu_seqlens is not None else torch.cat(outs, 0)
    return out.to(q.dtype), torch.cat(states).float() if output_final_state else None


def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                     final_states_out=None, activation=None):
    """causal-conv1d's `causal_conv1d_fn` (module docstring): [B, C, L] out."""
    assert activation in (None, "silu", "swish"), f"activation {activation!r}"
    assert x.dim() == 3 and weight.dim() == 2 and weight.shape[0] == x.shape[1], f"x {x.shape}, weight {weight.shape}"
    assert 2 <= weight.shape[1] <= 4, f"width {weight.shape[1]}: causal-conv1d takes 2-4"
    assert initial_states is None and not return_final_states, "not with seq_idx (and not implemented here)"
    bsz, channels, length = x.shape
    if seq_idx is not None:
        assert x.stride(1) == 1, "seq_idx is only supported for channel-last x (stride(1) == 1)"
        assert seq_idx.dtype == torch.int32 and seq_idx.shape == (bsz, length), f"seq_idx {seq_idx.dtype} {seq_idx.shape}"
    calls.append(("causal_conv1d_fn", tuple(x.shape)))
    width = weight.shape[1]
    rows = []
    for b in range(bsz):
        ids = torch.zeros(length, dtype=torch.int32) if seq_idx is None else seq_idx[b].cpu()
        _, counts = torch.unique_consecutive(ids, return_counts=True)
        runs = x[b:b + 1].to(weight.dtype).split(counts.tolist(), -1)
        rows.append(torch.cat([F.conv1d(r, weight[:, None], bias, padding=width - 1, groups=channels)[..., :r.shape[-1]]
                               for r in runs], -1))
    out = torch.cat(rows)
    out = out if activation is None else F.silu(out)
    return out.to(x.dtype)


def install(monkeypatch) -> None:
    """Make `fla.ops.gated_delta_rule` and `causal_conv1d` importable as these references."""
    fla, ops, rule = (types.ModuleType(n) for n in ("fla", "fla.ops", "fla.ops.gated_delta_rule"))
    rule.chunk_gated_delta_rule = chunk_gated_delta_rule
    fla.ops, ops.gated_delta_rule = ops, rule
    conv = types.ModuleType("causal_conv1d")
    conv.causal_conv1d_fn = causal_conv1d_fn
    for name, module in (("fla", fla), ("fla.ops", ops), ("fla.ops.gated_delta_rule", rule), ("causal_conv1d", conv)):
        monkeypatch.setitem(sys.modules, name, module)
