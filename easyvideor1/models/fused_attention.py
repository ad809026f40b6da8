"""The attention calls of packed rows: only calls that a fused CUDA kernel takes, no mask tensor.

Two kinds of call cover every piece of a packed row (`models.packing`):

- `causal(q, k, v)`: queries and keys are the same tokens, causal (`is_causal=True`). Pieces of
  different lengths may share one call, each right-padded to the longest: causality keeps the
  padding unseen by real queries (`causal_batch`).
- `after_prompt(q, k, v)`: a response's queries over the keys `[prompt; response]`, causal from
  the bottom-right corner (`torch.nn.attention.bias.causal_lower_right`): query i sees the whole
  prompt and the response's tokens 0..i. The keys are the concatenation of the prompt's and the
  response's, so the prompt's keys and values receive every response's gradient through it.

Neither passes a tensor `attn_mask`, so on CUDA flash-attention takes them with grouped-query
heads natively (`enable_gqa`), O(n) memory; nothing of [L, L] (or [n, n] per block) exists. On
CUDA in float32 (flash takes half precision only) the key/value heads are repeated instead, for the
memory-efficient kernel, which takes no GQA before torch 2.12. On CPU, torch itself turns the
lower-right bias into an [R, P + R] mask (responses x keys) for its kernel; never [L, L].

With `EASYVIDEOR1_FUSED_ATTENTION=1` (set by `scripts/gpu_check.py` and the tests), CUDA calls run
under `sdpa_kernel([FLASH, EFFICIENT, CUDNN])`: a call only the MATH kernel could run (the
[B, H, L, L] float32 scores) raises instead of silently taking tens of GiB.

flash-attn (`flash_attn.flash_attn_varlen_func`), when installed, runs a whole row in two calls on
CUDA in half precision (`varlen`): the causal pieces, then the responses over their prompts (its
`causal=True` is bottom-right aligned when queries are fewer than keys). Not installable on the
machines this project is tested on: that path is untested here.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

FUSED_ONLY_ENV = "EASYVIDEOR1_FUSED_ATTENTION"
"""Environment variable: "1" runs CUDA attention calls with the MATH kernel refused."""
FUSED_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
HALF_PRECISION = (torch.float16, torch.bfloat16)


@contextmanager
def kernel_policy(device: torch.device):
    """On CUDA with `EASYVIDEOR1_FUSED_ATTENTION=1`: SDPA may use fused kernels only (module docstring)."""
    if device.type == "cuda" and os.environ.get(FUSED_ONLY_ENV, "") not in ("", "0"):
        with sdpa_kernel(FUSED_BACKENDS):
            yield
    else:
        yield


def _heads(q, k, v):
    """(k, v, enable_gqa) for SDPA: GQA natively, except on CUDA in float32 (module docstring)."""
    if q.shape[1] == k.shape[1]:
        return k, v, False
    if q.is_cuda and q.dtype not in HALF_PRECISION:
        rep = q.shape[1] // k.shape[1]
        return k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), False
    return k, v, True


def causal(q, k, v, scale):
    """[b, H, n, D]: causal attention within each of the b rows."""
    k, v, gqa = _heads(q, k, v)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)


def after_prompt(q, k, v, scale):
    """[b, H, R, D]: response queries [b, H, R, D] over keys [b, H_kv, P + R, D] = [prompt; response]."""
    k, v, gqa = _heads(q, k, v)
    bias = causal_lower_right(q.shape[2], k.shape[2])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale, enable_gqa=gqa)


def causal_batch(qs, ks, vs, scale) -> list[torch.Tensor]:
    """`causal` for pieces ([1, H, n_i, D] each) of different lengths in one call: each is
    right-padded to the longest; a real query never sees padding (it comes after it)."""
    sizes = [q.shape[2] for q in qs]
    width = max(sizes)

    def stack(xs):
        return torch.cat([F.pad(x, (0, 0, 0, width - x.shape[2])) for x in xs])

    out = causal(stack(qs), stack(ks), stack(vs), scale)  # [m, H, W, D]
    return [out[i:i + 1, :, :n] for i, n in enumerate(sizes)]


@functools.cache
def _flash_varlen():
    if importlib.util.find_spec("flash_attn") is None:
        return None
    from flash_attn import flash_attn_varlen_func  # noqa: PLC0415 (optional dependency)

    return flash_attn_varlen_func


def varlen_available(query: torch.Tensor) -> bool:
    """flash-attn is installed and takes `query` (CUDA, half precision)."""
    return query.is_cuda and query.dtype in HALF_PRECISION and _flash_varlen() is not None


def varlen(qs, ks, vs, scale) -> list[torch.Tensor]:
    """flash-attn's varlen call over many pieces, bottom-right causal: queries qs[i] [1, H, R_i, D]
    over keys ks[i] [1, H_kv, S_i, D] (S_i >= R_i). Returns each piece's [1, H, R_i, D]. Untested here
    (module docstring)."""
    def tokens(xs):  # [total, heads, D], flash-attn's layout
        return torch.cat([x[0].transpose(0, 1) for x in xs])

    def cu(lengths):
        return torch.tensor([0, *lengths], dtype=torch.int32, device=qs[0].device).cumsum(0, dtype=torch.int32)

    r, s = [q.shape[2] for q in qs], [k.shape[2] for k in ks]
    out = _flash_varlen()(tokens(qs), tokens(ks), tokens(vs), cu(r), cu(s), max(r), max(s), softmax_scale=scale,
                          causal=True)
    return [o.transpose(0, 1)[None] for o in out.split(r)]
