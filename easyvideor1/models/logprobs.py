"""Per-token log-probs and entropy of response tokens, chunked to bound memory.

The backbone runs once; logits are then made only for the response positions, a chunk of
tokens at a time, in float32. With gradients on, each chunk is checkpointed, so at most one
chunk's [chunk, vocab] logits are alive in forward and in backward. Works on padded and
padding-free (packed) batches alike, since the response positions come from `loss_mask`.

Under FSDP2, shard `model.model` and `model.lm_head` as their own units: we call them
directly rather than the root module's forward (which would make full [B, L, V] logits).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from easyvideor1.models.collate import Batch


@dataclass
class TokenLogProbs:
    """Log-probs (and entropies) of the response tokens of a batch."""

    logprobs: torch.Tensor
    """[B, L] float32: log p(input_ids[b, t] | tokens before t); 0 outside `mask`."""
    entropy: torch.Tensor | None
    """[B, L] float32: entropy of the next-token distribution that produced token t; 0 outside."""
    mask: torch.Tensor
    """[B, L] bool: the batch's `loss_mask`."""


def _chunk_stats(hidden, lm_head, targets, temperature: float, with_entropy: bool):
    logits = lm_head(hidden).float()  # [n, V]
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)  # [n]
    if not with_entropy:
        return logp, torch.zeros_like(logp)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def token_logprobs(
    hidden: torch.Tensor,
    lm_head: torch.nn.Module,
    targets: torch.Tensor,
    chunk_size: int = 1024,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of `targets` [N] under `lm_head(hidden)` ([N, H] -> [N, V]), `chunk_size` rows at a time.

    Returns (logprobs [N], entropy [N] or None), float32.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    logps, ents = [], []
    for start in range(0, hidden.shape[0], chunk_size):
        h = hidden[start : start + chunk_size]
        t = targets[start : start + chunk_size]
        if torch.is_grad_enabled() and h.requires_grad:
            lp, en = checkpoint(
                _chunk_stats, h, lm_head, t, temperature, with_entropy, use_reentrant=False
            )
        else:
            lp, en = _chunk_stats(h, lm_head, t, temperature, with_entropy)
        logps.append(lp)
        ents.append(en)
    logp = torch.cat(logps) if logps else hidden.new_zeros(0, dtype=torch.float32)
    if not with_entropy:
        return logp, None
    return logp, (torch.cat(ents) if ents else torch.zeros_like(logp))


def sequence_logprobs(
    model,
    batch: Batch,
    chunk_size: int = 1024,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> TokenLogProbs:
    """Run `model`'s backbone on `batch` and score its response tokens (`batch.loss_mask`)."""
    out = model.model(**batch.model_kwargs(), use_cache=False)
    hidden = out.last_hidden_state  # [B, L, H]
    mask = batch.loss_mask.to(hidden.device)
    if mask[:, 0].any():
        raise ValueError("a response token at position 0 has no context to be scored from")
    b_idx, t_idx = mask.nonzero(as_tuple=True)
    targets = batch.input_ids.to(hidden.device)[b_idx, t_idx]
    logp, ent = token_logprobs(
        hidden[b_idx, t_idx - 1], model.lm_head, targets, chunk_size, temperature, with_entropy
    )
    full = torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device)
    logprobs = full.index_put((b_idx, t_idx), logp)
    if not targets.numel() and torch.is_grad_enabled():
        # No response token (a rank's padding groups): keep the backbone and the head in the graph with
        # zero gradients, so this rank's backward runs FSDP's gradient collectives like the others'.
        logprobs = logprobs + 0.0 * model.lm_head(hidden[:, -1]).float().sum()
    entropy = full.index_put((b_idx, t_idx), ent) if ent is not None else None
    return TokenLogProbs(logprobs=logprobs, entropy=entropy, mask=mask)
