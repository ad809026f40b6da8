"""Ulysses sequence parallelism: one packed row split over the k ranks of a sequence-parallel group.

The k ranks of a group hold the same micro-batch (one packed row, `models.packing`). The row is
padded to a multiple of k (the pad tokens a block of their own, never seen by a real token) and
each rank runs the language model on its contiguous 1/k of the tokens: its slice of the input
embeddings and of the M-RoPE position ids. Attention is the only place where tokens meet: there
`ulysses_attention` exchanges [1, H, L/k, D] for [1, H/k, L, D] (all-to-all over heads), runs the
per-block packed attention over the whole row for its H/k heads, and exchanges back. Key/value
heads are repeated up to a multiple of k when there are fewer than k (or k does not divide them).
Qwen3.5's linear-attention (Gated DeltaNet) layers exchange the same way around their token
mixing (`ulysses_linear_attention`): each rank runs the conv and recurrence over the whole row for
Hk/k key heads and their Hv/k value heads; those head counts must divide by k (never repeated).

The vision tower: each rank encodes its share of the frames (every image and every temporal
patch of every video is one unit; contiguous runs of units of balanced patch counts go to the k
ranks) in one tower call, and the features are all-gathered (with gradients) so each rank takes
those of the placeholders in its slice. The Qwen-VL towers attend within one temporal patch, so
a video cut along t gives the same features as whole. The slice's features go into the model as
`mm_encoder_outputs` (transformers' own precomputed-features argument), so HF's forward scatters
them into the slice's placeholders and, for Qwen3-VL, builds the deepstack masks from the slice.

Log-probs: token t is scored from the hidden state at t - 1 (or `Batch.predict_from`), on the rank
that holds that position; `models.logprobs` sums the k ranks' parts with an all-reduce that
carries gradients. Every collective here is an exact adjoint (all-to-all <-> all-to-all,
all-gather <-> reduce-scatter, all-reduce <-> all-reduce), so the k ranks' gradients together are
k times the gradient of the micro-batch's loss; FSDP averaging over dp * k ranks then gives the
data-parallel-alone gradient exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from easyvideor1 import distributed
from easyvideor1.models.collate import Batch
from easyvideor1.models.linear_attention import (gated_output, head_channels, mix_tokens, packed_linear_forward,
                                                 project, use_packed_linear_attention)
from easyvideor1.models.packing import Packing, packed_attention

ULYSSES_ATTENTION = "easyvideor1_ulysses"
"""The language model's attention implementation under sequence parallelism (packed rows, and
transformers' SDPA when called without `packing`, as `packed_attention`)."""


@dataclass(frozen=True)
class SequenceParallel:
    """This rank's place in its sequence-parallel group."""

    group: Any
    """Process group of the k ranks that share a row (None in one process)."""
    rank: int
    """Rank within the group."""
    size: int
    """k."""
    pad_token_id: int = 0
    """Token of the padding that makes the row a multiple of k (its own block, never attended)."""


@dataclass(frozen=True)
class ShardedPacking:
    """The `packing` keyword of the language model under sequence parallelism."""

    packing: Packing
    """Blocks of the whole padded row (its length a multiple of `sp.size`)."""
    sp: SequenceParallel


def padded_length(length: int, k: int) -> int:
    return -(-length // k) * k


def pad_packing(packing: Packing, length: int) -> Packing:
    """`packing` with the tokens up to `length` as one more block (the pad block)."""
    extra = length - packing.length
    if extra <= 0:
        return packing
    segment = None if packing.segment is None else F.pad(packing.segment, (0, extra))
    shared = packing.shared + (False,) if packing.shared else ()
    return Packing(packing.bounds + (length,), segment, shared, packing.parts + ((extra,),))


def local_span(length: int, sp: SequenceParallel) -> tuple[int, int]:
    """[start, end) of this rank's tokens in a row of `length` (a multiple of k)."""
    per = length // sp.size
    return sp.rank * per, (sp.rank + 1) * per


def seq_to_heads(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """[1, H, L/k, D] (all heads, this rank's tokens) -> [1, H/k, L, D] (its heads, every token)."""
    k = sp.size
    _, h, lk, d = x.shape
    blocks = x.reshape(k, h // k, lk, d)  # block j: the heads rank j will hold
    got = distributed.all_to_all(blocks, sp.group)  # block j: rank j's tokens of my heads
    return got.transpose(0, 1).reshape(1, h // k, k * lk, d)


def heads_to_seq(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """[1, H/k, L, D] -> [1, H, L/k, D]: the inverse of `seq_to_heads`."""
    k = sp.size
    _, hk, length, d = x.shape
    blocks = x.reshape(hk, k, length // k, d).transpose(0, 1)  # block j: rank j's tokens
    got = distributed.all_to_all(blocks.contiguous(), sp.group)  # block j: my tokens of rank j's heads
    return got.reshape(1, k * hk, length // k, d)


def kv_repeats(kv_heads: int, k: int) -> int:
    """How many times each key/value head is repeated so that k divides them (1 when it does)."""
    return 1 if kv_heads % k == 0 else k // math.gcd(kv_heads, k)


def ulysses_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                      packing: ShardedPacking | Packing | None = None, **kwargs):
    """Attention over this rank's slice of a packed row (module docstring); `packed_attention` when
    `packing` is not a `ShardedPacking`. query [1, H, L/k, D], key/value [1, H_kv, L/k, D]; returns
    ([1, L/k, H, D], None)."""
    if not isinstance(packing, ShardedPacking):
        return packed_attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                packing=packing, **kwargs)
    sp = packing.sp
    if query.shape[1] % sp.size:
        raise ValueError(f"{query.shape[1]} attention heads cannot be split over {sp.size} sequence-parallel ranks")
    rep = kv_repeats(key.shape[1], sp.size)
    if rep > 1:  # head j of the repeated keys is head j // rep of the model's: grouping is kept
        key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    q, k, v = (seq_to_heads(t.contiguous(), sp) for t in (query, key, value))
    out, _ = packed_attention(module, q, k, v, None, dropout=dropout, scaling=scaling, packing=packing.packing)
    out = heads_to_seq(out.transpose(1, 2).contiguous(), sp)  # [1, H, L/k, D]
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(ULYSSES_ATTENTION, ulysses_attention)
AttentionMaskInterface.register(ULYSSES_ATTENTION, sdpa_mask)  # padded calls get SDPA's mask


def use_ulysses_attention(model) -> None:
    """Give `model`'s language model `ulysses_attention` (its vision tower keeps its own), and its
    linear-attention layers, if any, `ulysses_linear_forward`."""
    if getattr(model.config.get_text_config(), "_attn_implementation", None) != ULYSSES_ATTENTION:
        model.set_attn_implementation({"text_config": ULYSSES_ATTENTION})
    use_packed_linear_attention(model, ulysses_linear_forward)


# ---- linear attention (Gated DeltaNet): the same exchange around stage (b) ----

def linear_head_shares(num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int, k: int) -> torch.Tensor:
    """[k, C/k] long: row j the conv channels (`head_channels`) of rank j's key heads [j*Hk/k, (j+1)*Hk/k)
    and so of its value heads [j*Hv/k, (j+1)*Hv/k) (repeat_interleave order keeps them contiguous)."""
    per = num_k_heads // k
    return torch.stack([head_channels(range(j * per, (j + 1) * per), num_k_heads, num_v_heads, head_k_dim, head_v_dim)
                        for j in range(k)])


def ulysses_linear_attention(module, hidden: torch.Tensor, packing: ShardedPacking,
                             attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """A Gated DeltaNet `module` on this rank's slice hidden [1, L/k, D] of a packed row: project the
    local tokens (stage a), one all-to-all to [its heads' conv channels | a | b] of every token, conv and
    recurrence over the whole padded row's blocks (`ShardedPacking.packing`, shared rows included) with
    its share of the conv weights, A_log and dt_bias (stage b), all-to-all back, gated norm and out_proj
    (stage c). Heads are never repeated: a value head owns a recurrent state and an output (a copy would
    count twice), and a key head's q/k channels feed a conv of its own; so k must divide both head counts
    (`training.sequence_parallel.sequence_parallel_blocker` says so at start-up)."""
    sp = packing.sp
    hk, hv, dk, dv = module.num_k_heads, module.num_v_heads, module.head_k_dim, module.head_v_dim
    if hk % sp.size or hv % sp.size:
        raise ValueError(f"{hk} linear-attention key heads / {hv} value heads cannot be split over {sp.size} "
                         "sequence-parallel ranks")
    mixed, z, a, b = project(module, hidden, attention_mask)  # [1, L/k, C], [1, L/k, Hv, dv], [1, L/k, Hv] x 2
    _, local, _ = mixed.shape
    shares = linear_head_shares(hk, hv, dk, dv, sp.size).to(mixed.device)  # [k, C/k]
    per_v = hv // sp.size
    sent = torch.cat([mixed[..., shares.flatten()].reshape(1, local, sp.size, -1),
                      a.reshape(1, local, sp.size, per_v), b.reshape(1, local, sp.size, per_v)], -1)
    got = seq_to_heads(sent.transpose(1, 2).contiguous(), sp)[0]  # [1, L, C/k + 2 Hv/k]: my heads, every token
    x, a_mine, b_mine = got.split([shares.shape[1], per_v, per_v], -1)
    mine = shares[sp.rank]
    heads = slice(sp.rank * per_v, (sp.rank + 1) * per_v)
    bias = None if module.conv1d.bias is None else module.conv1d.bias[mine]
    core, _ = mix_tokens(x, a_mine, b_mine, module.conv1d.weight.squeeze(1)[mine], bias, module.A_log[heads],
                         module.dt_bias[heads], dk, dv, packing.packing, module.activation)  # [1, L, Hv/k, dv]
    back = heads_to_seq(core.reshape(1, 1, core.shape[1], per_v * dv), sp)  # [1, k, L/k, Hv/k * dv]
    return gated_output(module, back.transpose(1, 2).reshape(1, local, hv, dv), z)


def ulysses_linear_forward(self, hidden_states, cache_params=None, attention_mask=None, packing=None, **kwargs):
    """A GDN instance's forward under `use_ulysses_attention`: `ulysses_linear_attention` for a
    `ShardedPacking`, else `models.linear_attention.packed_linear_forward`."""
    if not isinstance(packing, ShardedPacking):
        return packed_linear_forward(self, hidden_states, cache_params=cache_params, attention_mask=attention_mask,
                                     packing=packing, **kwargs)
    if cache_params is not None:
        raise ValueError("sequence-parallel rows run without a cache (use_cache=False)")
    return ulysses_linear_attention(self, hidden_states, packing, attention_mask)


# ---- the vision tower: each rank encodes its share of the frames ----

@dataclass(frozen=True)
class VisionRun:
    """Temporal patches [t0, t1) of one image or video (`kind`), encoded together by one rank."""

    kind: str  # "image" or "video"
    item: int
    t0: int
    t1: int
    grid: tuple[int, int, int]  # the item's (t, h, w)
    first_patch: int  # the item's first row in its modality's pixel tensor

    @property
    def patch_rows(self) -> slice:
        hw = self.grid[1] * self.grid[2]
        return slice(self.first_patch + self.t0 * hw, self.first_patch + self.t1 * hw)


def vision_shares(image_grid: torch.Tensor | None, video_grid: torch.Tensor | None, k: int) -> list[list[VisionRun]]:
    """The runs each of the k ranks encodes: units (a temporal patch of an item) in order, images
    first, cut into k contiguous shares of balanced patch counts (a share may be empty)."""
    units = []  # (kind, item, t, (t, h, w), first_patch, patches)
    for kind, grid in (("image", image_grid), ("video", video_grid)):
        first = 0
        for item, (t, h, w) in enumerate([] if grid is None else grid.tolist()):
            units += [(kind, item, s, (t, h, w), first, h * w) for s in range(t)]
            first += t * h * w
    total = sum(u[5] for u in units)
    shares: list[list[VisionRun]] = [[] for _ in range(k)]
    before = 0
    for kind, item, s, grid, first, n in units:
        owner = min(k - 1, (2 * before + n) * k // (2 * total))  # by the unit's midpoint
        before += n
        runs = shares[owner]
        if runs and runs[-1].kind == kind and runs[-1].item == item and runs[-1].t1 == s:
            runs[-1] = VisionRun(kind, item, runs[-1].t0, s + 1, grid, first)
        else:
            runs.append(VisionRun(kind, item, s, s + 1, grid, first))
    return shares


def _features(run: VisionRun, merge: int) -> int:
    return (run.t1 - run.t0) * run.grid[1] * run.grid[2] // merge**2


def encode_vision(inner, batch: Batch, sp: SequenceParallel) -> tuple[dict[str, list[torch.Tensor]], type]:
    """Every image's and video's features, per modality: [pooled [F, D], deepstack level 1, ...]
    (deepstack only for Qwen3-VL), each rank encoding its share (`vision_shares`), all-gathered
    with gradients. Also the tower's output class (for `mm_encoder_outputs`)."""
    if batch.image_grid_thw is None and batch.video_grid_thw is None:  # every rank must call the tower
        raise ValueError("a sequence-parallel row needs vision input (collate with dummy_vision=True)")
    visual = inner.visual
    merge = visual.spatial_merge_size
    shares = vision_shares(batch.image_grid_thw, batch.video_grid_thw, sp.size)
    pixels = {"image": batch.pixel_values, "video": batch.pixel_values_videos}
    mine = shares[sp.rank]
    dtype = visual.dtype
    if mine:
        px = torch.cat([pixels[r.kind][r.patch_rows] for r in mine]).type(dtype)
        grid = torch.tensor([[r.t1 - r.t0, r.grid[1], r.grid[2]] for r in mine], device=px.device)
    else:  # an empty share still calls the tower (FSDP's collectives), on a zero frame, weight 0
        ref = batch.pixel_values if batch.pixel_values is not None else batch.pixel_values_videos
        px = ref.new_zeros(merge**2, ref.shape[1]).type(dtype)
        grid = torch.tensor([[1, merge, merge]], device=px.device)
    out = visual(px, grid_thw=grid)
    levels = [out.pooler_output] + list(getattr(out, "deepstack_features", None) or [])
    local = torch.cat(levels, dim=-1)  # [F_r, D * levels]
    counts = [sum(_features(r, merge) for r in share) for share in shares]
    if not mine:
        local = local[:0] + 0.0 * local.sum()
    width = max(counts)
    padded = F.pad(local, (0, 0, 0, width - local.shape[0]))
    gathered = distributed.all_gather_grad(padded, sp.group)  # [k, width, D * levels]
    every = torch.cat([gathered[j, :counts[j]] for j in range(sp.size)])  # units in order
    d = out.pooler_output.shape[-1]
    result, row = {}, 0
    for kind, grid in (("image", batch.image_grid_thw), ("video", batch.video_grid_thw)):
        if grid is None:
            continue
        n = int((grid.prod(-1) // merge**2).sum())
        feats = every[row:row + n]
        row += n
        result[kind] = [feats[:, i * d:(i + 1) * d] for i in range(len(levels))]
    return result, type(out)


def sharded_hidden(model, batch: Batch, sp: SequenceParallel) -> tuple[torch.Tensor, int]:
    """Last hidden states of this rank's slice of the padded packed row, [1, L/k, H], and the
    slice's first position. `batch` is the whole (unpadded) packed row, the same on the k ranks."""
    if not isinstance(batch.packing, Packing) or batch.input_ids.shape[0] != 1:
        raise ValueError("sequence parallelism runs on packed rows (padding-free batches)")
    inner = model.model
    length = padded_length(batch.input_ids.shape[1], sp.size)
    extra = length - batch.input_ids.shape[1]
    ids = F.pad(batch.input_ids, (0, extra), value=sp.pad_token_id)  # [1, Lp]
    start, end = local_span(length, sp)
    positions = F.pad(batch.position_ids, (0, extra))[:, :, start:end].clone()  # [4, 1, L/k]
    positions[0] = torch.arange(end - start, device=positions.device)  # one unpadded row: no mask built
    encoded, output_class = encode_vision(inner, batch, sp)
    config = model.config
    outputs = {}
    for kind, token in (("image", config.image_token_id), ("video", config.video_token_id)):
        if kind not in encoded:
            continue
        is_token = ids[0] == token
        a, b = int(is_token[:start].sum()), int(is_token[:end].sum())
        levels = [f[a:b] for f in encoded[kind]]
        extra_kw = {"deepstack_features": [(f,) for f in levels[1:]]} if len(levels) > 1 else {}
        outputs[kind] = output_class(pooler_output=(levels[0],), **extra_kw)
    types = F.pad(batch.mm_token_type_ids, (0, extra))[:, start:end]
    out = inner(input_ids=ids[:, start:end], position_ids=positions, mm_token_type_ids=types,
                mm_encoder_outputs=outputs, packing=ShardedPacking(pad_packing(batch.packing, length), sp),
                use_cache=False)
    return out.last_hidden_state, start
