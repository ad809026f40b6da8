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
memory-efficient kernel, which takes no GQA in torch up to 2.13 at least (`models.kernel_check`).
On CPU, torch itself turns the lower-right bias into an [R, P + R] mask (responses x keys) for its
kernel; never [L, L].

On CUDA every call runs under `kernel_policy`. It checks each SDPA call before it runs
(`models.kernel_check`). A call only the MATH kernel would take (the [B, H, L, L] scores) logs one
warning per distinct reason, with its shapes. Under `model.strict_kernels: true`, or with
`EASYVIDEOR1_FUSED_ATTENTION=1` (set by `scripts/gpu_check.py` and the tests), it raises instead,
and the calls run under `sdpa_kernel([FLASH, EFFICIENT, CUDNN])`, so torch refuses MATH too.

flash-attn (`flash_attn.flash_attn_varlen_func`), when installed, runs a whole row in one call on
CUDA in half precision (`varlen`): every piece's queries over its keys, [total, heads, D] with
int32 cu_seqlens. Its `causal=True` is bottom-right aligned, so a response sees its prompt, and its
grouped-query heads come from fewer key/value heads. flash-attn does not install on the machines
this project is tested on. tests/models/test_flash_varlen.py runs this path through the model
against a reference implementation of flash-attn's contract (equal to the SDPA pieces to 1e-5);
the real flash-attn has not run it.
"""

from __future__ import annotations

import functools
import importlib.util
from contextlib import ExitStack, contextmanager

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from easyvideor1.models import kernel_check

FUSED_ONLY_ENV = kernel_check.STRICT_ENV
"""Environment variable: "1" runs CUDA attention calls with the MATH kernel refused (`kernel_check.strict`)."""
FUSED_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
HALF_PRECISION = (torch.float16, torch.bfloat16)


@contextmanager
def kernel_policy(device: torch.device):
    """On CUDA: every SDPA call inside is checked (`kernel_check.watch`); under `kernel_check.strict()`
    SDPA may use fused kernels only (module docstring)."""
    if device.type != "cuda":
        yield
        return
    with ExitStack() as stack:
        if kernel_check.strict():
            stack.enter_context(sdpa_kernel(FUSED_BACKENDS))
        stack.enter_context(kernel_check.watch())
        yield


def _cuda(t: torch.Tensor) -> bool:
    """`t.is_cuda`; the tests replace it to record on a CPU the calls CUDA gets (tests/models/test_kernel_check.py)."""
    return t.is_cuda


def _heads(q, k, v):
    """(k, v, enable_gqa) for SDPA: GQA natively, except on CUDA in float32 (module docstring)."""
    if q.shape[1] == k.shape[1]:
        return k, v, False
    if _cuda(q) and q.dtype not in HALF_PRECISION:
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
    over keys ks[i] [1, H_kv, S_i, D] (S_i >= R_i). Returns each piece's [1, H, R_i, D]. Tested against
    a reference of flash-attn's contract, not flash-attn itself (module docstring)."""
    def tokens(xs):  # [total, heads, D], flash-attn's layout
        return torch.cat([x[0].transpose(0, 1) for x in xs])

    def cu(lengths):
        return torch.tensor([0, *lengths], dtype=torch.int32, device=qs[0].device).cumsum(0, dtype=torch.int32)

    r, s = [q.shape[2] for q in qs], [k.shape[2] for k in ks]
    out = _flash_varlen()(tokens(qs), tokens(ks), tokens(vs), cu(r), cu(s), max(r), max(s), softmax_scale=scale,
                          causal=True)
    return [o.transpose(0, 1)[None] for o in out.split(r)]
