"""`models.packing.packed_attention`: its ways of running a packed row (one call per piece, short
causal pieces batched in one call, responses of one length in one call) give each block's own
attention, values and gradients, with no mask tensor."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from easyvideor1.models import fused_attention as fused
from easyvideor1.models import packing as pk
from easyvideor1.models.packing import Packing, PaddedRows, packed_attention


def _row(sizes, shared_blocks=(), seed=0, heads=4, kv_heads=2, dim=8):
    """A packed row of blocks `sizes`; the blocks in `shared_blocks` are group-shared (a prompt of
    half the block, then two responses)."""
    g = torch.Generator().manual_seed(seed)
    length = sum(sizes)
    q = torch.randn(1, heads, length, dim, generator=g, requires_grad=True)
    k = torch.randn(1, kv_heads, length, dim, generator=g, requires_grad=True)
    v = torch.randn(1, kv_heads, length, dim, generator=g, requires_grad=True)
    bounds = [0]
    for n in sizes:
        bounds.append(bounds[-1] + n)
    segment = torch.full((length,), -1, dtype=torch.long)
    for i in shared_blocks:
        s, n = bounds[i], sizes[i]
        p = n // 2
        segment[s:s + n] = torch.tensor([0] * p + [1] * ((n - p) // 2) + [2] * (n - p - (n - p) // 2))
    shared = tuple(i in shared_blocks for i in range(len(sizes)))
    packing = Packing(tuple(bounds), segment if shared_blocks else None, shared if shared_blocks else ())
    return q, k, v, packing


def block_mask(segment: torch.Tensor) -> torch.Tensor:
    """[n, n] bool (True: attend) of one group-shared block: causal; a response sees the prompt
    (segment 0) and itself. The reference only: the code under test builds no mask."""
    n = segment.shape[0]
    q, k = segment[:, None], segment[None, :]
    return torch.ones(n, n, dtype=torch.bool).tril() & ((k == 0) | (k == q))


def _reference(q, k, v, packing):
    """Each block alone, with its explicit [n, n] mask, GQA by repeating key/value heads."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    out = []
    for i, (s, e) in enumerate(packing.blocks):
        shared = bool(packing.shared) and packing.shared[i]
        mask = block_mask(packing.segment[s:e]) if shared else torch.ones(e - s, e - s, dtype=torch.bool).tril()
        out.append(F.scaled_dot_product_attention(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], attn_mask=mask))
    return torch.cat(out, 2).transpose(1, 2)


@pytest.mark.parametrize("sizes, shared, batched", [
    ((9, 7, 8, 1), (), True),  # similar short blocks and a dummy: one batched call
    ((12, 5, 14, 5), (0, 2), True),  # group-shared blocks among plain ones: prompts batched
    ((40, 3, 5), (0,), False),  # unequal: one call per piece
    ((12,), (0,), False),  # one block
    ((15, 5), (0,), True),  # two responses of one length: one call
])
def test_packed_attention_equals_each_block_alone(sizes, shared, batched):
    q, k, v, packing = _row(sizes, shared)
    n = [size for size, prompt in packing.pieces if prompt is None]
    assert (len(n) > 1 and len(n) * max(n) ** 2 <= pk.BATCHED_WASTE * sum(x * x for x in n)) == batched
    out, _ = packed_attention(None, q, k, v, None, packing=packing)
    ref = _reference(q, k, v, packing)
    # Same scores, other kernel shapes: float32 rounding only (~1e-7 here); a block that sees its
    # neighbour, or a response that sees another, moves outputs by O(0.1).
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    grads = torch.autograd.grad((out * w).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((ref * w).sum(), (q, k, v))
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_pieces_of_a_row():
    """A shared block is its prompt then its responses (an empty one has none); plain blocks are one piece."""
    _, _, _, packing = _row((9, 7, 8, 1), (0, 2))
    assert packing.parts == ((4, 2, 3), (7,), (4, 2, 2), (1,))
    assert packing.pieces == [(4, None), (2, 0), (3, 0), (7, None), (4, None), (2, 4), (2, 4), (1, None)]
    with pytest.raises(ValueError, match="must start with its prompt"):
        Packing((0, 3), torch.tensor([1, 1, 0]), (True,))


def test_padded_rows_equal_their_packed_row():
    """Right-padded group rows (`PaddedRows`): each row's tokens get what the same blocks get in one
    packed row; padding, after the group, changes no real token."""
    q, k, v, packing = _row((9, 6), (0, 1))
    width = 11
    rows, pads = [], []
    for s, e in packing.blocks:
        n = e - s
        pads.append(lambda x, s=s, e=e: F.pad(x[:, :, s:e], (0, 0, 0, width - e + s), value=0.5))
        rows.append(Packing((0, n, width), F.pad(packing.segment[s:e], (0, width - n), value=-1), (True, False)))
    out, _ = packed_attention(None, *(torch.cat([p(x) for p in pads]) for x in (q, k, v)), None,
                              packing=PaddedRows(tuple(rows)))
    ref, _ = packed_attention(None, q, k, v, None, packing=packing)
    torch.testing.assert_close(out[0, :9], ref[0, :9], rtol=0, atol=1e-6)
    torch.testing.assert_close(out[1, :6], ref[0, 9:], rtol=0, atol=1e-6)


def test_a_block_never_sees_its_neighbour():
    """Changing one block's keys and values changes no other block's output."""
    q, k, v, packing = _row((9, 7, 8, 1), (0, 2))
    out, _ = packed_attention(None, q, k, v, None, packing=packing)
    s, e = packing.blocks[1]
    k2, v2 = k.detach().clone(), v.detach().clone()
    k2[:, :, s:e] += 3.0
    v2[:, :, s:e] -= 2.0
    out2, _ = packed_attention(None, q, k2, v2, None, packing=packing)
    assert torch.allclose(out[:, :s], out2[:, :s], atol=1e-6)
    assert torch.allclose(out[:, e:], out2[:, e:], atol=1e-6)
    assert (out[:, s:e] - out2[:, s:e]).abs().max() > 0.1


def test_kernel_policy_refuses_math_on_cuda_only(monkeypatch):
    """`EASYVIDEOR1_FUSED_ATTENTION=1`: CUDA calls run with SDPA's MATH kernel off (a fallback then
    raises); CPU calls, and any call without the setting, keep every kernel."""
    monkeypatch.setenv(fused.FUSED_ONLY_ENV, "1")
    with fused.kernel_policy(torch.device("cuda")):
        assert not torch.backends.cuda.math_sdp_enabled() and torch.backends.cuda.flash_sdp_enabled()
    assert torch.backends.cuda.math_sdp_enabled()
    with fused.kernel_policy(torch.device("cpu")):
        assert torch.backends.cuda.math_sdp_enabled()
    monkeypatch.setenv(fused.FUSED_ONLY_ENV, "0")
    with fused.kernel_policy(torch.device("cuda")):
        assert torch.backends.cuda.math_sdp_enabled()


def _varlen_reference(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=None, causal=False):
    """flash-attn's `flash_attn_varlen_func` contract ([tokens, heads, D], bottom-right causal per
    sequence), written with SDPA: flash-attn does not install here, so this checks our side of the
    call (layout, cu_seqlens, each piece's keys, the output order), not flash-attn."""
    assert causal and cu_q.dtype == cu_k.dtype == torch.int32 and max_q == int((cu_q[1:] - cu_q[:-1]).max())
    out = []
    for a, b, c, d in zip(cu_q.tolist(), cu_q[1:].tolist(), cu_k.tolist(), cu_k[1:].tolist()):
        qs, ks, vs = (x.transpose(0, 1)[None] for x in (q[a:b], k[c:d], v[c:d]))
        rep = qs.shape[1] // ks.shape[1]
        mask = torch.ones(b - a, d - c, dtype=torch.bool).tril(d - c - (b - a))
        out.append(F.scaled_dot_product_attention(qs, ks.repeat_interleave(rep, 1), vs.repeat_interleave(rep, 1),
                                                  attn_mask=mask, scale=softmax_scale)[0].transpose(0, 1))
    return torch.cat(out)


def test_flash_varlen_path_gets_each_piece_and_its_keys(monkeypatch):
    """With flash-attn installed (CUDA, half precision) a row is one varlen call: the same values
    as the SDPA pieces, given flash-attn's documented contract (`_varlen_reference`)."""
    q, k, v, packing = _row((12, 5, 14, 5), (0, 2))
    ref, _ = packed_attention(None, q, k, v, None, packing=packing)
    monkeypatch.setattr(fused, "_flash_varlen", lambda: _varlen_reference)
    monkeypatch.setattr(fused, "varlen_available", lambda query: True)
    out, _ = packed_attention(None, q, k, v, None, packing=packing)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)
