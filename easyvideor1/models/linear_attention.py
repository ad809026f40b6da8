"""Qwen3.5's Gated DeltaNet layers on packed rows and group-shared rows: restart at each block.

A GDN layer runs a short causal conv (kernel K) and a gated-delta recurrence along the row;
transformers' forward does so straight across a packed row. `use_packed_linear_attention` sets,
on each GDN *instance* (no class patched), a forward that, given the `packing` keyword
(`models.packing`), restarts both at every block, and runs each response of a group-shared
block (`models.shared_prefix`) from its prompt's final recurrent state with the prompt's last
K-1 conv inputs as left context (so autograd sums the responses' gradients into the prompt).
Without `packing` it is transformers' forward (generation, padded batches, caches).

Three stages, so that sequence parallelism can exchange heads between them: `project` (the
local tokens' projections), `mix_tokens` (conv and recurrence over whole blocks for any subset
of heads: tensors and the packing, no module) and `gated_output` (gated norm, out_proj). The
conv channels (mixed_qkv = [q (Hk*dk) | k (Hk*dk) | v (Hv*dv)]): key head h owns q channels
[h*dk, (h+1)*dk), k channels Hk*dk + the same, and value heads h*r ... h*r + r - 1 (r = Hv/Hk,
repeat_interleave order), value head j owning 2*Hk*dk + [j*dv, (j+1)*dv) (`head_channels`).
On CUDA with flash-linear-attention and causal-conv1d installed, `mix_tokens` calls their
kernels (varlen cu_seqlens, seq_idx); elsewhere a pure-torch path computes the same.
"""

from __future__ import annotations

import functools
import math
import types
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from transformers.activations import ACT2FN
from transformers.models.qwen3_5.modeling_qwen3_5 import (Qwen3_5GatedDeltaNet, apply_mask_to_padding_states,
                                                          torch_chunk_gated_delta_rule)
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeGatedDeltaNet

GATED_DELTA_NETS = {"qwen3_5_text": Qwen3_5GatedDeltaNet, "qwen3_5_moe_text": Qwen3_5MoeGatedDeltaNet}
"""Text model types whose linear-attention modules `use_packed_linear_attention` replaces."""
GDN_CHUNK = 64
"""The chunk of transformers' chunked delta rule: a sequence costs whole chunks."""
GDN_BATCHED_WASTE = 2.0
"""Sequences of unequal length run as one right-padded batch (pure-torch path) while the batch
computes at most this many times the chunks they need alone."""


def linear_attention_blocker(config) -> str | None:
    """Why packed rows cannot restart the linear-attention layers of a model with HF `config`, or None."""
    text = config.get_text_config()
    if "linear_attention" not in (getattr(text, "layer_types", None) or ()):
        return None
    if getattr(text, "model_type", None) not in GATED_DELTA_NETS:
        return (f"linear-attention (recurrent) layers of model type {getattr(text, 'model_type', None)!r}: only "
                f"{', '.join(c.__name__ for c in GATED_DELTA_NETS.values())} restart at sequence bounds")
    return None


def use_packed_linear_attention(model, forward=None) -> int:
    """Give every Gated DeltaNet module of `model` the packing-aware forward (module docstring), or
    `forward` (`models.ulysses` passes one that also takes a `ShardedPacking`); returns how many.
    Idempotent; a module's class forward is untouched."""
    forward = forward or packed_linear_forward
    n = 0
    for module in model.modules():
        if isinstance(module, tuple(GATED_DELTA_NETS.values())):
            if getattr(module.forward, "__func__", None) is not forward:
                module.forward = types.MethodType(forward, module)
            n += 1
    return n


def head_channels(key_heads, num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int) -> torch.Tensor:
    """[C'] long: the mixed_qkv / conv channels of `key_heads` and their value heads (module docstring)."""
    r = num_v_heads // num_k_heads
    key = torch.cat([torch.arange(h * head_k_dim, (h + 1) * head_k_dim) for h in key_heads])
    value = torch.cat([torch.arange(j * head_v_dim, (j + 1) * head_v_dim) for h in key_heads
                       for j in range(h * r, h * r + r)])
    return torch.cat([key, num_k_heads * head_k_dim + key, 2 * num_k_heads * head_k_dim + value])


# ---- stage (a): projections of the local tokens ----

def project(module, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None):
    """(mixed_qkv [B, L, C], z [B, L, Hv, dv], a [B, L, Hv], b [B, L, Hv]) of a GDN `module`."""
    hidden = apply_mask_to_padding_states(hidden, attention_mask)
    bsz, length, _ = hidden.shape
    z = module.in_proj_z(hidden).reshape(bsz, length, -1, module.head_v_dim)
    return module.in_proj_qkv(hidden), z, module.in_proj_a(hidden), module.in_proj_b(hidden)


# ---- stage (b): token mixing over whole blocks ----

@dataclass(frozen=True)
class _Layout:
    """Index plan of a (flattened) packed row; see `_layout`."""

    lengths: tuple[int, ...]  # every piece, in row order
    prompt: tuple[int | None, ...]  # per piece: None (causal) or the index of its prompt piece
    conv_src: torch.Tensor | None  # [Lc] the conv row's tokens (responses after their prompt's tail); None: the row
    seq_idx: torch.Tensor  # [Lc] int32, the conv row's segment
    keep: torch.Tensor | None  # [L] positions of the row's tokens in the conv row; None: all of it


@functools.lru_cache(maxsize=64)
def _layout(parts: tuple[tuple[int, ...], ...], kernel: int, device: torch.device) -> _Layout:
    lengths, prompt, starts = [], [], []
    src, seq, keep = [], [], []
    at = pos = 0
    for block in parts:
        first = len(lengths)
        for j, n in enumerate(block):
            i = len(lengths)
            if j:  # a response: the conv sees its prompt's last K-1 inputs first, in its own segment
                p_start, p_len = starts[first], lengths[first]
                tail = min(kernel - 1, p_len)
                src.append(torch.arange(p_start + p_len - tail, p_start + p_len))
                seq.append(torch.full((tail,), i))
                pos += tail
            src.append(torch.arange(at, at + n))
            seq.append(torch.full((n,), i))
            keep.append(torch.arange(pos, pos + n))
            lengths.append(n)
            prompt.append(first if j else None)
            starts.append(at)
            at += n
            pos += n
    shared = pos != at
    return _Layout(tuple(lengths), tuple(prompt), torch.cat(src).to(device) if shared else None,
                   torch.cat(seq).to(device=device, dtype=torch.int32), torch.cat(keep).to(device) if shared else None)


@functools.cache
def _installed_kernels():
    """(fla's chunk_gated_delta_rule, causal_conv1d_fn) when both import, else None."""
    try:
        from causal_conv1d import causal_conv1d_fn
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError:
        return None
    return chunk_gated_delta_rule, causal_conv1d_fn


def linear_kernels(x: torch.Tensor):
    """The GPU kernels `mix_tokens` calls for `x`: installed ones on CUDA, else None (pure torch)."""
    return _installed_kernels() if x.is_cuda else None


def _conv_torch(x: torch.Tensor, weight: torch.Tensor, bias, seq_idx: torch.Tensor, activation) -> torch.Tensor:
    """Depthwise causal conv of x [1, L, C] with weight [C, K], zero left context at each change of
    seq_idx [L]: K shifted copies, each masked where it would cross into another segment."""
    k = weight.shape[-1]
    x = x.to(weight.dtype)
    out = x * weight[:, k - 1]
    for j in range(1, min(k, x.shape[1])):
        same = (seq_idx[j:] == seq_idx[:-j]).to(x.dtype)[None, :, None]  # [1, L - j, 1]
        out = out + F.pad(x[:, :-j] * same, (0, 0, j, 0)) * weight[:, k - 1 - j]
    if bias is not None:
        out = out + bias
    return out if activation is None else ACT2FN[activation](out)


def _delta_rule(seqs: list[tuple[torch.Tensor, ...]], initial: torch.Tensor | None, want_state: bool, kernels):
    """Chunked gated delta rule of each sequence (q, k, v, g, beta: [1, n, H, *]) from `initial`
    ([N, H, dk, dv] float32 or None): (outputs [1, n, H, dv] each, final states [N, ...] or None)."""
    lengths = [s[0].shape[1] for s in seqs]
    if kernels is not None:
        out, state = _varlen(kernels[0], [torch.cat(t, 1) for t in zip(*seqs)], lengths, initial, want_state)
        return list(out.split(lengths, 1)), state
    outs: list[torch.Tensor | None] = [None] * len(seqs)
    states: list[torch.Tensor | None] = [None] * len(seqs)
    for group in _batches(lengths):  # right padding: g = beta = 0 there, so the state stands still
        q, k, v, g, beta = (pad_sequence([seqs[i][n][0] for i in group], batch_first=True) for n in range(5))
        out, state = torch_chunk_gated_delta_rule(
            q, k, v, g=g, beta=beta, initial_state=None if initial is None else initial[group],
            output_final_state=want_state, use_qk_l2norm_in_kernel=True)
        for j, i in enumerate(group):
            outs[i] = out[j:j + 1, :lengths[i]]
            states[i] = None if state is None else state[j]
    return outs, torch.stack(states) if want_state else None


def _varlen(rule, tensors: list[torch.Tensor], lengths, initial, want_state: bool):
    """One varlen call of FLA's chunk_gated_delta_rule (B = 1, int64 cu_seqlens [N + 1])."""
    q, k, v, g, beta = tensors
    cu = torch.tensor([0, *lengths], device=q.device).cumsum(0)
    return rule(q, k, v, g, beta, initial_state=initial, output_final_state=want_state, cu_seqlens=cu,
                use_qk_l2norm_in_kernel=True)


def _batches(lengths: list[int]) -> list[list[int]]:
    """Indices grouped, longest first, into right-padded batches of bounded waste (`GDN_BATCHED_WASTE`)."""
    chunks = [math.ceil(n / GDN_CHUNK) for n in lengths]
    out: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        group = out[-1] if out else []
        if group and chunks[group[0]] * (len(group) + 1) <= GDN_BATCHED_WASTE * (sum(chunks[j] for j in group) + chunks[i]):
            group.append(i)
        else:
            out.append([i])
    return out


def _rows(packing) -> tuple:
    """The packed rows of a `Packing` (one) or `PaddedRows` (each row its own)."""
    rows = getattr(packing, "rows", None)
    rows = (packing,) if rows is None else tuple(rows)
    if not all(hasattr(r, "parts") for r in rows):
        raise ValueError(f"linear-attention layers take a Packing or PaddedRows, not {type(packing).__name__} "
                         "(a ShardedPacking: `models.ulysses.use_ulysses_attention` installs its forward)")
    return rows


def mix_tokens(mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, conv_weight: torch.Tensor, conv_bias,
               A_log: torch.Tensor, dt_bias: torch.Tensor, head_k_dim: int, head_v_dim: int, packing,
               activation: str | None = "silu", with_states: bool = False):
    """Conv + gated delta rule of whole blocks. mixed_qkv [B, L, C] (C = 2*Hk*dk + Hv*dv, channels of
    the heads it holds, `head_channels`), a/b [B, L, Hv], conv_weight [C, K], A_log/dt_bias [Hv];
    `packing` a `Packing` (B = 1) or `PaddedRows` (one per row). Returns core [B, L, Hv, dv] and, with
    `with_states`, the final recurrent state of each row's last piece [B, Hv, dk, dv] float32, else None."""
    bsz, width, channels = mixed_qkv.shape
    rows = _rows(packing)
    if len(rows) != bsz or any(r.length != width for r in rows):
        raise ValueError(f"packed rows of {[r.length for r in rows]} tokens; "
                         f"linear attention got {tuple(mixed_qkv.shape)}")
    kernel = conv_weight.shape[-1]
    plan = _layout(tuple(p for r in rows for p in r.parts), kernel, mixed_qkv.device)
    kernels = linear_kernels(mixed_qkv)
    x = mixed_qkv.reshape(1, bsz * width, channels)  # the rows one after another: their pieces are blocks
    if plan.conv_src is not None:
        x = x[:, plan.conv_src]
    if kernels is not None:  # channel-last [1, C, Lc], as causal_conv1d takes seq_idx
        y = kernels[1](x.transpose(1, 2), conv_weight, conv_bias, seq_idx=plan.seq_idx[None], activation=activation)
        y = y.transpose(1, 2)
    else:
        y = _conv_torch(x, conv_weight, conv_bias, plan.seq_idx, activation).to(mixed_qkv.dtype)
    if plan.keep is not None:
        y = y[:, plan.keep]
    hv = a.shape[-1]
    hk = (channels - hv * head_v_dim) // (2 * head_k_dim)
    q, k, v = y.split([hk * head_k_dim, hk * head_k_dim, hv * head_v_dim], -1)
    q, k = (t.reshape(1, -1, hk, head_k_dim).repeat_interleave(hv // hk, 2) for t in (q, k))
    v = v.reshape(1, -1, hv, head_v_dim)
    beta = b.reshape(1, -1, hv).sigmoid()
    g = -A_log.float().exp() * F.softplus(a.reshape(1, -1, hv).float() + dt_bias)  # [1, L, Hv]
    causal = [i for i, p in enumerate(plan.prompt) if p is None]
    responses = [i for i, p in enumerate(plan.prompt) if p is not None]
    if not responses and kernels is not None:  # plain blocks: the row as it is, one call
        core, states = _varlen(kernels[0], [q, k, v, g, beta], plan.lengths, None, with_states)
    else:
        pieces = list(zip(*(t.split(plan.lengths, 1) for t in (q, k, v, g, beta))))
        out: list[torch.Tensor | None] = [None] * len(pieces)
        got, states = _delta_rule([pieces[i] for i in causal], None, bool(responses) or with_states, kernels)
        for i, o in zip(causal, got):
            out[i] = o
        if responses:  # each from its prompt's final state
            slot = {i: n for n, i in enumerate(causal)}
            got, _ = _delta_rule([pieces[i] for i in responses], states[[slot[plan.prompt[i]] for i in responses]],
                                 False, kernels)
            for i, o in zip(responses, got):
                out[i] = o
        core = torch.cat(out, 1)
    core = core.reshape(bsz, width, hv, head_v_dim)
    if not with_states:
        return core, None
    ends = _row_ends(rows)
    if any(plan.prompt[i] is not None for i in ends):
        raise ValueError("a row ending in a response has no single final state to cache")
    return core, states[[causal.index(i) for i in ends]]


def _row_ends(rows) -> list[int]:
    """Index of each row's last piece among the flattened pieces."""
    ends, n = [], 0
    for r in rows:
        n += sum(len(p) for p in r.parts)
        ends.append(n - 1)
    return ends


# ---- stage (c): gated norm and output projection ----

def gated_output(module, core: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """[B, L, hidden]: the GDN `module`'s gated RMS norm of core [B, L, Hv, dv] by z, then out_proj."""
    bsz, length = core.shape[:2]
    out = module.norm(core.reshape(-1, module.head_v_dim), z.reshape(-1, module.head_v_dim))
    return module.out_proj(out.reshape(bsz, length, -1))


def packed_linear_forward(self, hidden_states, cache_params=None, attention_mask=None, packing=None, **kwargs):
    """A GDN instance's forward (module docstring); transformers' own without `packing`."""
    if packing is None:
        return type(self).forward(self, hidden_states, cache_params=cache_params, attention_mask=attention_mask,
                                  **kwargs)
    if cache_params is not None and cache_params.has_previous_state(self.layer_idx, state_idx=0):
        raise ValueError("packed rows start from no cache: continue a cached sequence without `packing`")
    mixed, z, a, b = project(self, hidden_states, attention_mask)
    core, states = mix_tokens(mixed, a, b, self.conv1d.weight.squeeze(1), self.conv1d.bias, self.A_log, self.dt_bias,
                              self.head_k_dim, self.head_v_dim, packing, self.activation,
                              with_states=cache_params is not None)
    if cache_params is not None:  # a prefill: each row's last block, from its own start, is what decoding continues
        cache_params.update_conv_state(_conv_tail(mixed, _rows(packing), self.conv_kernel_size), self.layer_idx,
                                       conv_kernel_size=self.conv_kernel_size)
        cache_params.update_recurrent_state(states, self.layer_idx)
    return gated_output(self, core, z)


def _conv_tail(mixed: torch.Tensor, rows, kernel: int) -> torch.Tensor:
    """[B, C, K]: each row's last K conv inputs, zero before its last block (a decode's left context)."""
    width = mixed.shape[1]
    start = torch.tensor([r.bounds[-2] for r in rows], device=mixed.device)
    pos = torch.arange(width - kernel, width, device=mixed.device)  # may start below 0: padded by zeros
    keep = (pos[None] >= start[:, None]) & (pos[None] >= 0)  # [B, K]
    tail = F.pad(mixed, (0, 0, max(kernel - width, 0), 0))[:, -kernel:]
    return (tail * keep[..., None].to(tail.dtype)).transpose(1, 2)
