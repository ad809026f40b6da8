"""`models.packing.packed_attention`: its two ways of running a packed row (one call per block,
short blocks batched in one call) give each block's own attention, values and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from easyvideor1.models import packing as pk
from easyvideor1.models.packing import Packing, block_mask, packed_attention


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
    ((9, 7, 8, 1), (0, 2), True),  # group-shared blocks among plain ones
    ((40, 3, 5), (0,), False),  # unequal: one call per block
    ((12,), (0,), False),  # one block
])
def test_packed_attention_equals_each_block_alone(sizes, shared, batched):
    q, k, v, packing = _row(sizes, shared)
    n = [e - s for s, e in packing.blocks]
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


def test_batched_and_block_by_block_agree_on_the_same_row():
    """The same row both ways gives the same values."""
    q, k, v, packing = _row((9, 7, 8, 1), (0, 2))
    sizes = [e - s for s, e in packing.blocks]
    batched = pk._batched_blocks(q, k, v, packing, sizes, None)
    blocks = pk._block_by_block(q, k, v, packing, sizes, None)
    torch.testing.assert_close(batched, blocks, rtol=0, atol=1e-5)


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
