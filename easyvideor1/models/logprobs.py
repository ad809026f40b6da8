"""Per-token log-probs and entropy of response tokens, chunked to bound memory.

The backbone runs once; logits are then made only for the response positions, a chunk of
tokens at a time, in float32. With gradients on, each chunk is checkpointed, so at most one
chunk's [chunk, vocab] logits are alive in forward and in backward. Works on padded and
padding-free (packed) batches alike, since the response positions come from `loss_mask`; in
group-shared rows (`models.shared_prefix`) `Batch.predict_from` says which position predicts
each token.

Under FSDP2, shard `model.model` and `model.lm_head` as their own units: we call them
directly rather than the root module's forward (which would make full [B, L, V] logits). The
chunk loop runs as ONE forward of the head unit (`head_pass`, registered by `training.fsdp.shard`
with FSDP2's `register_fsdp_forward_method`), and each chunk calls the head's `forward` without
FSDP's hooks: the head is all-gathered once per pass (and once more in backward, for the
checkpointed chunks' recompute) and its gradient reduce-scattered once, whatever the number of
chunks. Called per chunk, each chunk would gather the whole head again (1.1 GB in bf16 for a
152k x 3584 head) in forward, again in recompute, and reduce-scatter its gradient.

With a `reference` model (`kl_estimator: full`) the same pass also returns the exact
KL(pi || pi_ref) over the vocabulary at each response token: the reference backbone runs
once without gradients (only its hidden states at the response positions are kept), and
each chunk makes the reference's [chunk, vocab] log-softmax beside the policy's, so only one
chunk's [chunk, vocab] tensors are alive at a time; [tokens, vocab] never exists. In
backward the checkpointed chunk recomputes the reference's logits too (one more `lm_head`
matmul per chunk) rather than keeping them from the forward.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from easyvideor1 import distributed
from easyvideor1.algorithms.kl import full as vocabulary_kl
from easyvideor1.models.collate import Batch
from easyvideor1.models.lora import viewed_module
from easyvideor1.models.packing import PACKED_ATTENTION, language_attention
from easyvideor1.models.routing import routes_applied
from easyvideor1.models.ulysses import ULYSSES_ATTENTION, SequenceParallel, sharded_hidden


@dataclass
class TokenLogProbs:
    """Log-probs (and entropies) of the response tokens of a batch."""

    logprobs: torch.Tensor
    """[B, L] float32: log p(input_ids[b, t] | tokens before t); 0 outside `mask`."""
    entropy: torch.Tensor | None
    """[B, L] float32: entropy of the next-token distribution that produced token t; 0 outside."""
    mask: torch.Tensor
    """[B, L] bool: the batch's `loss_mask`."""
    full_kl: torch.Tensor | None = None
    """[B, L] float32: exact KL(pi || pi_ref) over the vocabulary at token t (with a reference); 0 outside."""


BANNED_LOGIT = -1e30  # a banned token's logit: probability 0, yet p * log p = 0 (no NaN in entropy or KL)


HEAD_PASS = "head_pass"  # the head unit's method FSDP2 runs as one forward (`training.fsdp.shard` registers it)


def run_head_pass(self, fn, *tensors):
    """`fn(*tensors)`: the body of `HEAD_PASS`, bound to a head unit by `training.fsdp.shard`.
    FSDP2 runs its pre-forward hook on `tensors` (all-gather, input cast, post-backward hook)
    before, and its post-forward hook on the result after."""
    return fn(*tensors)


def head_unit(head):
    """The module that holds `head`'s parameters (the policy's own head for a LoRA reference view)."""
    return viewed_module(head)


def head_pass(head, fn, *tensors):
    """`fn(*tensors)` as one forward of `head`'s FSDP unit (module docstring); inside, call the head's
    `forward` (no hooks). An unsharded head has no `HEAD_PASS`: then just `fn(*tensors)`."""
    method = getattr(head_unit(head), HEAD_PASS, None)
    return fn(*tensors) if method is None else method(fn, *tensors)


def _log_softmax(hidden, lm_head, temperature: float, banned: tuple[int, ...] = ()) -> torch.Tensor:
    logits = lm_head(hidden).float()  # [n, V]; lm_head: the head's hook-free forward (`head_pass`)
    if temperature != 1.0:
        logits = logits / temperature
    if banned:  # the tokens the engines never sample (`rollout.base.VISION_PAD_TOKENS`)
        logits = logits.index_fill(-1, torch.tensor(banned, device=logits.device), BANNED_LOGIT)
    return torch.log_softmax(logits, dim=-1)


def _chunk_stats(hidden, lm_head, targets, temperature: float, with_entropy: bool, ref_hidden, ref_lm_head,
                 banned: tuple[int, ...] = ()):
    logp_all = _log_softmax(hidden, lm_head, temperature, banned)  # [n, V]
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)  # [n]
    entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else torch.zeros_like(logp)
    if ref_hidden is None:
        return logp, entropy, torch.zeros_like(logp)
    with torch.no_grad():
        ref_all = _log_softmax(ref_hidden, ref_lm_head, temperature, banned)  # [n, V]
    return logp, entropy, vocabulary_kl(logp_all[None], ref_all[None])[0]  # [n]


def _chunked(hidden, lm_head, targets, chunk_size, temperature, with_entropy, ref_hidden=None, ref_lm_head=None,
             num_chunks: int | None = None, filler: torch.Tensor | None = None, banned: tuple[int, ...] = ()):
    """(logp, entropy, kl, anchor) over chunks of `chunk_size` rows (see `token_logprobs`).

    `num_chunks` > the chunks `hidden` needs: the head runs that many times all the same, on the
    one-row `filler`, and `anchor` (0, with a graph when gradients are on) ties those runs into the
    loss: a pass without rows still gives the head a (zero) gradient, so that under FSDP every rank
    takes part in its reduce-scatter.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    parts: tuple[list, list, list] = ([], [], [])
    anchor = hidden.new_zeros((), dtype=torch.float32)
    starts = list(range(0, hidden.shape[0], chunk_size))
    for k in range(max(len(starts), num_chunks or 0)):
        if k < len(starts):
            rows = slice(starts[k], starts[k] + chunk_size)
            args = (hidden[rows], lm_head, targets[rows], temperature, with_entropy,
                    None if ref_hidden is None else ref_hidden[rows], ref_lm_head, banned)
        else:
            args = (filler, lm_head, targets.new_zeros(1), temperature, with_entropy,
                    None if ref_hidden is None else filler.detach(), ref_lm_head, banned)
        if torch.is_grad_enabled() and args[0].requires_grad:
            out = checkpoint(_chunk_stats, *args, use_reentrant=False)
        else:
            out = _chunk_stats(*args)
        if k < len(starts):
            for part, value in zip(parts, out):
                part.append(value)
        else:
            anchor = anchor + 0.0 * out[0].sum()
    empty = hidden.new_zeros(0, dtype=torch.float32)
    return (*(torch.cat(p) if p else empty for p in parts), anchor)


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
    logp, ent, _, _ = _chunked(hidden, lm_head, targets, chunk_size, temperature, with_entropy)
    return logp, (ent if with_entropy else None)


def token_logprobs_and_kl(
    hidden: torch.Tensor,
    lm_head: torch.nn.Module,
    targets: torch.Tensor,
    ref_hidden: torch.Tensor,
    ref_lm_head: torch.nn.Module,
    chunk_size: int = 1024,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """`token_logprobs` plus the exact KL(pi || pi_ref) [N] of each row's next-token
    distribution, pi from `lm_head(hidden)`, pi_ref from `ref_lm_head(ref_hidden)` (no
    gradient), both at `temperature`. Gradients flow through pi only.
    """
    if ref_hidden.shape[0] != hidden.shape[0]:
        raise ValueError(f"ref_hidden has {ref_hidden.shape[0]} rows for {hidden.shape[0]} policy rows")
    logp, ent, kl, _ = _chunked(hidden, lm_head, targets, chunk_size, temperature, with_entropy,
                                ref_hidden.detach(), ref_lm_head)
    return logp, (ent if with_entropy else None), kl


def _scored_in_one_head_pass(head, ref_head, rows, filler, ref_rows, targets, chunk_size, temperature, with_entropy,
                             banned):
    """`_chunked` over `rows` inside one `head_pass` of the policy's head and, for a reference with
    a head unit of its own, one of the reference's (outside the policy's: the policy's input cast and
    post-backward hook apply to `rows` and `filler` only). At least one chunk: a rank without rows
    still runs the head once on `filler`, so its gradient exists (zeros) for the reduce-scatter."""
    def body(rows, filler):
        return _chunked(rows, head.forward, targets, chunk_size, temperature, with_entropy, ref_rows,
                        None if ref_head is None else ref_head.forward, num_chunks=1, filler=filler, banned=banned)

    def policy_pass():
        return head_pass(head, body, rows, filler)

    if ref_head is None or head_unit(ref_head) is head_unit(head):
        return policy_pass()
    return head_pass(ref_head, policy_pass)


def sequence_logprobs(
    model,
    batch: Batch,
    chunk_size: int = 1024,
    temperature: float = 1.0,
    with_entropy: bool = False,
    reference=None,
    sp: SequenceParallel | None = None,
    banned: tuple[int, ...] = (),
) -> TokenLogProbs:
    """Run `model`'s backbone on `batch` and score its response tokens (`batch.loss_mask`);
    with a `reference` model, also the exact per-token KL to it (`TokenLogProbs.full_kl`).

    With `sp` (sequence parallelism, `models.ulysses`) each rank of the group runs its slice of the
    packed row and scores the tokens whose predicting position it holds; the parts are summed over
    the group (with gradients), so every rank returns the whole batch's values.

    `banned` token ids get probability 0 in every distribution (policy and reference): the
    vision pad tokens the rollout engines ban, so that the trainer's log-probs are those of the
    distribution the engines sample from (`rollout.base`)."""
    if batch.packing is not None:
        wanted = (ULYSSES_ATTENTION,) if sp is not None else (PACKED_ATTENTION, ULYSSES_ATTENTION)
        for m in (model, reference):
            if m is not None and language_attention(m) not in wanted:
                raise ValueError("a packed (padding-free or group-shared) batch needs the model's language model on "
                                 "packed attention "
                                 "(models.packing.use_packed_attention, or models.ulysses.use_ulysses_attention "
                                 "under sequence parallelism); with its SDPA, sequences would see each other")
    # MoE: route with `batch.routes` (`models.routing`); the update reads the router outputs it collects
    with nullcontext() if batch.routes is None else routes_applied(model, batch.routes, torch.is_grad_enabled()):
        if sp is None:
            hidden, offset = model.model(**batch.model_kwargs(), use_cache=False).last_hidden_state, 0  # [B, L, H]
        else:
            hidden, offset = sharded_hidden(model, batch, sp)  # [1, L/k, H]: this rank's slice
    mask = batch.loss_mask.to(hidden.device)
    if mask[:, 0].any():
        raise ValueError("a response token at position 0 has no context to be scored from")
    b_idx, t_idx = mask.nonzero(as_tuple=True)
    targets = batch.input_ids.to(hidden.device)[b_idx, t_idx]
    src = t_idx - 1 if batch.predict_from is None else batch.predict_from.to(hidden.device)[b_idx, t_idx]
    every_b, every_t, every_n = b_idx, t_idx, len(targets)
    if sp is not None:  # the tokens predicted from this rank's positions
        here = (src >= offset) & (src < offset + hidden.shape[1])
        b_idx, t_idx, targets, src = b_idx[here], t_idx[here], targets[here], src[here] - offset
    rows = hidden[b_idx, src]  # [n, H]: the position that predicts each response token
    ref_rows = ref_head = None
    if reference is not None:
        # a LoRA reference view shares the policy's routers: their routes stay for the policy's backward
        with torch.no_grad(), \
                nullcontext() if batch.routes is None else routes_applied(reference, batch.routes, keep=True):
            ref_hidden = (reference.model(**batch.model_kwargs(), use_cache=False).last_hidden_state if sp is None
                          else sharded_hidden(reference, batch, sp)[0])
            ref_rows, ref_head = ref_hidden[b_idx, src], reference.lm_head  # [n, H]
            del ref_hidden
    logp, ent, kl, anchor = _scored_in_one_head_pass(model.lm_head, ref_head, rows, hidden[0, -1:], ref_rows, targets,
                                                     chunk_size, temperature, with_entropy, banned)
    if sp is not None:  # each token's values from the rank that scored it, summed over the group
        here_idx = here.nonzero(as_tuple=True)[0]
        parts = torch.zeros(3, every_n, dtype=torch.float32, device=hidden.device)
        parts = parts.index_put((torch.arange(3, device=hidden.device)[:, None], here_idx[None]),
                                torch.stack([logp, ent, kl]))
        # The anchor goes through the all-reduce too: then in backward every head call (an FSDP
        # all-gather of the world) comes after the group's all-reduce on every rank. Beside it, a
        # rank could recompute a filler head call first while another waits in the all-reduce: deadlock.
        logp, ent, kl = distributed.all_reduce_grad(parts + anchor, sp.group)
        anchor = 0.0
        b_idx, t_idx = every_b, every_t
    full = torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device)
    logprobs = full.index_put((b_idx, t_idx), logp) + anchor
    ent = ent if with_entropy else None
    kl = kl if reference is not None else None
    entropy = full.index_put((b_idx, t_idx), ent) if ent is not None else None
    kl = full.index_put((b_idx, t_idx), kl) if kl is not None else None
    return TokenLogProbs(logprobs=logprobs, entropy=entropy, mask=mask, full_kl=kl)
