"""Padding-free rows: many sequences (or group-shared rows) in one row, attention per block.

A packed row is `[block 1][block 2] ... [block m]`: each block is one prompt + response
sequence, or one group-shared row (`models.shared_prefix`: a prompt and its responses, each
response seeing the prompt and itself), or a masked dummy vision token (a block of one). No pad
token is computed. `Packing` carries the block bounds (cu_seqlens, as flash-attention's varlen
API calls them) and, for group-shared blocks, each token's segment; the language model's
attention layers receive it as the `packing` keyword and `packed_attention` runs the row as
pieces: each plain block and each shared block's prompt causal within itself, each response over
[its prompt; itself] (`models.fused_attention`: no mask tensor, calls a fused CUDA kernel takes;
flash-attn's varlen when installed). Attention costs the sum of the pieces' scores, not the
row's. Right-padded group-shared rows (`PaddedRows`) run the same way, one row at a time.

`packed_attention` is registered with transformers' attention-function interface under
`PACKED_ATTENTION` (no model class is patched); `use_packed_attention` selects it for a model's
language model only (the vision tower keeps its own). Called without `packing` (generation,
padded batches) it is transformers' SDPA, with the SDPA mask, so one model serves both paths.

M-RoPE positions stay per sequence (rows 1-3 of `position_ids`, each sequence's own ids).
Row 0, the text positions transformers reads only to build a mask, counts 0..L-1 over the whole
row, so transformers sees one unpadded sequence and builds no [L, L] mask (attention is
separated by `packing`, not by a mask).

Which families: `Family.padding_free`. Qwen3.5's linear-attention (Gated DeltaNet) layers would
carry a recurrent state from one sequence into the next; `use_packed_attention` also gives them a
forward that restarts at each block (`models.linear_attention`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from easyvideor1.models import fused_attention as fused
from easyvideor1.models.linear_attention import linear_attention_blocker, use_packed_linear_attention

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
    parts: tuple[tuple[int, ...], ...] = ()
    """Per block, the lengths of its pieces: (n,) for a plain block, (prompt, response 1, ...) for a
    group-shared one (an empty response has none); derived from `segment` when not given."""

    def __post_init__(self):
        if len(self.bounds) < 2 or self.bounds[0] != 0 or any(b >= e for b, e in zip(self.bounds, self.bounds[1:])):
            raise ValueError(f"packing bounds must rise strictly from 0, got {self.bounds[:8]}...")
        if not self.parts:
            object.__setattr__(self, "parts", tuple(self._parts(i, s, e) for i, (s, e) in enumerate(self.blocks)))
        if [sum(p) for p in self.parts] != [e - s for s, e in self.blocks]:
            raise ValueError("packing parts must add up to their blocks' lengths")

    def _parts(self, i: int, s: int, e: int) -> tuple[int, ...]:
        if not (self.shared and self.shared[i]):
            return (e - s,)
        runs = torch.unique_consecutive(self.segment[s:e], return_counts=True)
        ids, counts = (t.tolist() for t in runs)
        if ids[0] != 0 or 0 in ids[1:]:
            raise ValueError(f"group-shared block {i} must start with its prompt (segment 0), then responses")
        return tuple(counts)

    @property
    def length(self) -> int:
        return self.bounds[-1]

    @property
    def blocks(self) -> list[tuple[int, int]]:
        return list(zip(self.bounds[:-1], self.bounds[1:]))

    @functools.cached_property
    def pieces(self) -> list[tuple[int, int | None]]:
        """The row in order as (length, prompt): a causal piece (a plain block or a shared block's
        prompt) has prompt None; a response has the index of its block's prompt piece."""
        out = []
        for parts in self.parts:
            first = len(out)
            out += [(parts[0], None)] + [(n, first) for n in parts[1:]]
        return out

    def to(self, device) -> Packing:
        seg = None if self.segment is None else self.segment.to(device)
        return Packing(self.bounds, seg, self.shared, self.parts)


@dataclass(frozen=True)
class PaddedRows:
    """Padded rows, each a packed row of its own: right-padded group-shared rows
    (`models.shared_prefix` without padding-free rows: the group block, then a block of padding),
    or the HF engine's left-padded prompts at prefill (padding, then the prompt)."""

    rows: tuple[Packing, ...]

    @staticmethod
    def left_padded(attention_mask: torch.Tensor) -> PaddedRows:
        """Rows of a left-padded batch ([B, L] long, 0 on padding and dummies, all of it before the
        row's tokens): the padding, then the sequence, as two plain blocks."""
        width = attention_mask.shape[1]
        pads = (width - attention_mask.sum(-1)).tolist()
        return PaddedRows(tuple(Packing((0, p, width) if p else (0, width)) for p in pads))

    def to(self, device) -> PaddedRows:
        return PaddedRows(tuple(r.to(device) for r in self.rows))


def packed_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                     packing: Packing | PaddedRows | None = None, **kwargs):
    """Attention over packed rows (module docstring; the calls: `models.fused_attention`);
    transformers' SDPA when called without `packing`. query [B, H, L, D], key/value [B, H_kv, L, D]
    (B = 1 for a `Packing`, one per row of `PaddedRows`); returns ([B, L, H, D], None) as
    transformers' attention functions do."""
    with fused.kernel_policy(query.device):
        if packing is None:
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                          scaling=scaling, **kwargs)
        rows = packing.rows if isinstance(packing, PaddedRows) else (packing,)
        if query.shape[0] != len(rows) or any(query.shape[2] != r.length for r in rows):
            raise ValueError(f"packed rows of {[r.length for r in rows]} tokens; attention got {tuple(query.shape)}")
        out = torch.cat([_row(query[b:b + 1], key[b:b + 1], value[b:b + 1], r, scaling) for b, r in enumerate(rows)])
    return out.transpose(1, 2).contiguous(), None


BATCHED_WASTE = 2.0
"""The causal pieces of a row run as one call (each padded to the longest) when that computes at
most this many times the attention scores of one call per piece: many short blocks pay a fixed
cost per call, which one call saves. Long pieces of unequal length run one call each."""
BATCHED_MAX_LEN = 2048
"""Longest piece of a batched call: beyond it a call is long enough to pay its fixed cost."""


def _row(query, key, value, packing: Packing, scaling) -> torch.Tensor:
    """[1, H, L, D]: one packed row, piece by piece (`Packing.pieces`), no mask tensor."""
    pieces = packing.pieces
    sizes = [n for n, _ in pieces]
    qs, ks, vs = query.split(sizes, 2), key.split(sizes, 2), value.split(sizes, 2)

    def keys(xs, i):  # a response's keys and values: its prompt's, then its own
        prompt = pieces[i][1]
        return xs[i] if prompt is None else torch.cat([xs[prompt], xs[i]], 2)

    if fused.varlen_available(query):
        every = range(len(pieces))
        return torch.cat(fused.varlen(qs, [keys(ks, i) for i in every], [keys(vs, i) for i in every], scaling), 2)
    out: list[torch.Tensor | None] = [None] * len(pieces)
    causal = [i for i, (_, prompt) in enumerate(pieces) if prompt is None]
    n = [sizes[i] for i in causal]
    if 1 < len(n) and max(n) <= BATCHED_MAX_LEN and len(n) * max(n) ** 2 <= BATCHED_WASTE * sum(x * x for x in n):
        got = fused.causal_batch([qs[i] for i in causal], [ks[i] for i in causal], [vs[i] for i in causal], scaling)
        for i, o in zip(causal, got):
            out[i] = o
    else:
        for i in causal:
            out[i] = fused.causal(qs[i], ks[i], vs[i], scaling)
    alike: dict[tuple[int, int], list[int]] = {}  # responses of one prompt and one length: one call
    for i, (size, prompt) in enumerate(pieces):
        if prompt is not None:
            alike.setdefault((prompt, size), []).append(i)
    for same in alike.values():
        got = fused.after_prompt(torch.cat([qs[i] for i in same]), torch.cat([keys(ks, i) for i in same]),
                                 torch.cat([keys(vs, i) for i in same]), scaling)
        for j, i in enumerate(same):
            out[i] = got[j:j + 1]
    return torch.cat(out, 2)


AttentionInterface.register(PACKED_ATTENTION, packed_attention)
AttentionMaskInterface.register(PACKED_ATTENTION, sdpa_mask)  # padded calls get SDPA's mask


def language_attention(model) -> str | None:
    """The attention implementation of `model`'s language model."""
    return getattr(model.config.get_text_config(), "_attn_implementation", None)


def use_packed_attention(model) -> None:
    """Give `model`'s language model `packed_attention` (its vision tower keeps its own), and its
    linear-attention layers, if any, their packing-aware forward (`models.linear_attention`)."""
    if language_attention(model) != PACKED_ATTENTION:
        model.set_attn_implementation({"text_config": PACKED_ATTENTION})
    use_packed_linear_attention(model)


def packing_blocker(config) -> str | None:
    """Why a model with HF `config` cannot train on packed rows, or None when it can."""
    text = config.get_text_config()
    attn = getattr(text, "_attn_implementation", None) or "eager"
    if attn not in ("sdpa", "flash_attention_2", PACKED_ATTENTION):
        return (f"attention implementation {attn!r}: packed rows replace SDPA or flash-attention only "
                "(set model.attn_implementation: sdpa)")
    kinds = set(getattr(text, "layer_types", None) or ())
    if (why := linear_attention_blocker(config)) is not None:
        return why
    if kinds - {"full_attention", "linear_attention"} or getattr(text, "use_sliding_window", False):
        return f"layer types {sorted(kinds)} / sliding window: packed attention is full attention per block"
    return None
