"""A step's responses in "response space", and the log-prob passes over them.

Every per-token quantity of the step (old / reference / current log-probs, advantages,
masks) is an [N, T] tensor: N responses, T the longest response. The forward passes run on
prompt + response sequences built from the step's `Prompt`s (processor outputs reused, never
recomputed) and their results are moved into response space by `to_response_space`.

With `ForwardContext.shared_prefix`, the responses of one group within a micro-batch form one
row, their prompt (and its vision features) computed once (`models.shared_prefix`). Micro-batches
are split as in the plain path (so every rank makes the same calls either way); a group cut by a
micro-batch boundary runs its prompt once per part, which is exact, only less shared: a
`micro_batch_size` that is a multiple of the group size runs each prompt once. With a token
budget (`ForwardContext.micro_batch_tokens`, `training.micro_batches`) whole groups are packed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from easyvideor1.models.collate import collate
from easyvideor1.models.families import Family
from easyvideor1.models.inputs import ModelInputs, append_response
from easyvideor1.models.logprobs import sequence_logprobs
from easyvideor1.models.mrope import MRopeSpec
from easyvideor1.models.routing import ROUTE_FREE, place_routes
from easyvideor1.models.shared_prefix import SharedGroup, collate_shared
from easyvideor1.models.ulysses import SequenceParallel
from easyvideor1.prompts import Prompt
from easyvideor1.records import RewardResult, Rollout
from easyvideor1.rollout.tools.turns import sequence_with_turns
from easyvideor1.training.micro_batches import MicroBatch, micro_batch, plan_micro_batches, response_units


@dataclass
class RolloutBatch:
    """All responses of one step with their groups; tensors filled stage by stage."""

    prompts: list[Prompt]
    rollouts: list[Rollout]  # N, grouped: rollouts of prompt g are contiguous
    group_ids: torch.Tensor  # [N] long: index into `prompts`
    response_ids: torch.Tensor  # [N, T] long, 0-padded
    response_mask: torch.Tensor  # [N, T] bool
    offline: torch.Tensor  # [N] bool: offline trajectory (LUFFY treats it off-policy)
    results: list[RewardResult] = field(default_factory=list)  # N, once scored
    old_log_probs: torch.Tensor | None = None  # [N, T]
    ref_log_probs: torch.Tensor | None = None  # [N, T]
    behaviour_log_probs: torch.Tensor | None = None  # [N, T] engine's, 0 where unknown
    advantages: torch.Tensor | None = None  # [N, T]
    reward_error: torch.Tensor | None = None  # [N] bool: its reward function failed (kept with no tokens)

    @property
    def size(self) -> int:
        return len(self.rollouts)

    def behaviour_known(self) -> torch.Tensor:
        """[N, T] bool: response tokens with the engine's log-probs (not offline trajectories, not
        responses whose reward failed): the tokens the rollout correction applies to."""
        rows = torch.tensor([r.logprobs is not None and not r.offline for r in self.rollouts], dtype=torch.bool)
        return self.response_mask & rows[:, None]

    def statistics_group_ids(self) -> torch.Tensor:
        """[N] group ids for the advantage estimators: a response whose reward failed is alone in
        a group of its own, so its group's mean and std ignore it (no stand-in reward 0)."""
        if self.reward_error is None or not bool(self.reward_error.any()):
            return self.group_ids
        alone = len(self.prompts) + torch.arange(self.size)
        return torch.where(self.reward_error, alone, self.group_ids)


def make_batch(prompts: list[Prompt], groups: list[list[Rollout]],
               results: list[RewardResult] | None = None) -> RolloutBatch:
    """Flatten groups (one per prompt) into a RolloutBatch (`results`: their scores, flattened).

    A response whose reward function failed (`RewardResult.error`) keeps its place with no
    tokens, like a padding response: nothing of it enters the loss, its normaliser or any
    masked statistic, and `statistics_group_ids` leaves it out of its group's statistics."""
    rollouts = [r for g in groups for r in g]
    errors = [x.error is not None for x in results or []]
    if any(errors):
        rollouts = [replace(r, token_ids=[], logprobs=None, versions=None, finish_reason="reward_error",
                            model_mask=None, media=None, routes=None) if bad else r
                    for r, bad in zip(rollouts, errors)]
    if not rollouts:
        raise ValueError("no responses in this step (every prompt failed?)")
    n, t = len(rollouts), max(1, max(len(r.token_ids) for r in rollouts))
    ids = torch.zeros(n, t, dtype=torch.long)
    mask = torch.zeros(n, t, dtype=torch.bool)
    behaviour = torch.zeros(n, t)
    for i, r in enumerate(rollouts):
        ids[i, :len(r.token_ids)] = torch.as_tensor(r.token_ids, dtype=torch.long)
        # multi-turn: the model's own tokens only (tool turns are attended to, never scored)
        mask[i, :len(r.token_ids)] = True if r.model_mask is None else torch.as_tensor(r.model_mask)
        if r.logprobs is not None:
            behaviour[i, :len(r.logprobs)] = torch.as_tensor(r.logprobs)
    group_ids = torch.tensor([g for g, grp in enumerate(groups) for _ in grp], dtype=torch.long)
    offline = torch.tensor([r.offline for r in rollouts], dtype=torch.bool)
    return RolloutBatch(prompts, rollouts, group_ids, ids, mask, offline, results=list(results or []),
                        behaviour_log_probs=behaviour,
                        reward_error=torch.tensor(errors, dtype=torch.bool) if any(errors) else None)


def to_response_space(values: torch.Tensor, mask: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Move the masked entries of `values` [B, L] (row-major: sequence by sequence) to the true
    entries of `response_mask` [n, width] (the same count, in the same order), zeros elsewhere."""
    keep = response_mask.to(values.device)
    out = values.new_zeros(keep.shape)
    out[keep] = values[mask]
    return out


@dataclass
class ForwardContext:
    """What every forward pass over sequences needs; built once per run."""

    family: Family
    spec: MRopeSpec
    pad_token_id: int
    micro_batch_size: int
    temperature: float  # rollout temperature: log-probs of the same distribution as the engine's
    chunk_size: int = 1024
    device: str | torch.device = "cpu"
    pixel_dtype: torch.dtype | None = None
    shared_prefix: bool = False  # one row per group: prompt once (`training.shared_prefix`, where exact)
    padding_free: bool = False  # sequences / group rows packed in one row (`training.padding_free`, where exact)
    micro_batch_tokens: int = 0  # > 0: micro-batches up to this many computed tokens (`training.micro_batches`)
    sequence_parallel: SequenceParallel | None = None  # each row split over a group's ranks (`models.ulysses`)
    banned_ids: tuple[int, ...] = ()  # tokens the engines never sample (vision pads): probability 0 here too
    router_shape: tuple[int, int] | None = None  # MoE: (layers, top_k); batches carry routes (`models.routing`)
    routing_replay: bool = False  # MoE: route with the engine's recorded experts (`algorithm.routing_replay`)


def sequence_inputs(batch: RolloutBatch, indices: list[int], ctx: ForwardContext) -> list[ModelInputs]:
    out = []
    for i in indices:
        prompt, r = batch.prompts[int(batch.group_ids[i])].inputs, batch.rollouts[i]
        if r.model_mask is None:
            out.append(append_response(prompt, r.token_ids, ctx.spec))
        else:  # tool turns: their media and the model-token mask (`rollout.tools.turns`)
            out.append(sequence_with_turns(prompt, r.token_ids, r.model_mask, r.media, ctx.family, ctx.spec))
    return out


def shared_groups(batch: RolloutBatch, indices: list[int]) -> list[SharedGroup]:
    """Runs of consecutive `indices` of one group, each a prompt with its responses, in order."""
    out: list[SharedGroup] = []
    last = None
    for i in indices:
        g = int(batch.group_ids[i])
        if g != last:
            out.append(SharedGroup(batch.prompts[g].inputs, []))
            last = g
        out[-1].responses.append(torch.as_tensor(batch.rollouts[i].token_ids, dtype=torch.long))
    return out


def _recorded(batch: RolloutBatch, i: int, ctx: ForwardContext):
    """Response `i`'s recorded routes [prompt + response, layers, k], or None (no replay, none recorded,
    or tool turns: their tokens were never routed by the engine as one sequence)."""
    r = batch.rollouts[i]
    return r.routes if ctx.routing_replay and r.model_mask is None and r.routes is not None else None


def sequence_routes(batch: RolloutBatch, indices: list[int], ctx: ForwardContext, shared: bool) -> list:
    """Per sequence of the micro-batch (a response, or a group row when `shared`), its routes or None.
    A group row's prompt routes are those of its first response that has routes (every response saw
    the same prompt); a response without (an offline trajectory) routes itself (`ROUTE_FREE`)."""
    if not shared:
        return [_recorded(batch, i, ctx) for i in indices]
    rows: list[tuple[int, list]] = []  # (group, [(response index, routes or None)])
    for i in indices:
        g = int(batch.group_ids[i])
        if not rows or rows[-1][0] != g:
            rows.append((g, []))
        rows[-1][1].append((i, _recorded(batch, i, ctx)))
    out = []
    for g, responses in rows:
        known = [routes for _, routes in responses if routes is not None]
        if not known:
            out.append(None)
            continue
        n = batch.prompts[g].inputs.prompt_len
        free = torch.full((1, *known[0].shape[1:]), ROUTE_FREE, dtype=known[0].dtype)
        out.append(torch.cat([known[0][:n]] + [routes[n:] if routes is not None
                                                else free.expand(len(batch.rollouts[i].token_ids), -1, -1)
                                                for i, routes in responses]))
    return out


def collate_responses(batch: RolloutBatch, indices: list[int], ctx: ForwardContext):
    """The model batch of responses `indices`: group-shared rows or one sequence per response."""
    # a response with tool turns carries media of its own: its micro-batch takes the plain path
    shared = ctx.shared_prefix and all(batch.rollouts[i].model_mask is None for i in indices)
    if shared:
        mb = collate_shared(shared_groups(batch, indices), ctx.family, ctx.spec, ctx.pad_token_id,
                            padding_free=ctx.padding_free)
    else:
        mb = collate(sequence_inputs(batch, indices, ctx), ctx.family, ctx.spec, ctx.pad_token_id,
                     padding_free=ctx.padding_free)
    if ctx.router_shape is not None:  # MoE: the routes ride with the tokens (padding and dummies: ROUTE_PAD)
        per_sequence = sequence_routes(batch, indices, ctx, shared)
        for (_, start, end), routes in zip(mb.seq_spans, per_sequence):
            if routes is not None and routes.shape[0] != end - start:
                raise ValueError(f"routing replay: {routes.shape[0]} recorded routes for a sequence of "
                                 f"{end - start} tokens")
        mb.routes = place_routes(tuple(mb.input_ids.shape), mb.seq_spans, per_sequence, *ctx.router_shape)
    return mb.to(ctx.device, ctx.pixel_dtype)


def micro_batches(indices: list[int], size: int) -> list[list[int]]:
    return [indices[i:i + size] for i in range(0, len(indices), size)]


def pass_micro_batches(batch: RolloutBatch, indices: list[int], ctx: ForwardContext) -> list[MicroBatch]:
    """The micro-batches of one pass over responses `indices`: `micro_batch_size` responses each,
    or packed up to `micro_batch_tokens` (whole groups with `shared_prefix`), as many on every
    rank either way (`training.micro_batches`)."""
    lengths = [len(r.token_ids) for r in batch.rollouts]  # tool turns included: they are computed
    groups = batch.group_ids.tolist()
    prompt = [p.inputs.prompt_len for p in batch.prompts]
    names = [batch.prompts[g].inputs.sample_id for g in groups]

    def units(idx: list[int]):
        if ctx.shared_prefix:  # a group row: its prompt once, then its responses
            return response_units(idx, groups, lengths, names, prompt_tokens=prompt)
        return response_units(idx, groups, [prompt[g] + n for g, n in zip(groups, lengths)], names)

    if ctx.micro_batch_tokens:
        return plan_micro_batches(units(indices), ctx.micro_batch_tokens, ctx.padding_free)
    return [micro_batch(units(idx), ctx.padding_free) for idx in micro_batches(indices, ctx.micro_batch_size)]


def forward_logprobs(model, batch: RolloutBatch, indices: list[int], ctx: ForwardContext,
                     with_entropy: bool = False, reference=None
                     ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Log-probs, entropies (with_entropy) and the exact per-token KL to `reference` (when
    given; `kl_estimator: full`), each [n, T], of responses `indices` under `model` (grad as
    enabled; the reference never has one)."""
    mb = collate_responses(batch, indices, ctx)
    out = sequence_logprobs(model, mb, chunk_size=ctx.chunk_size, temperature=ctx.temperature,
                            with_entropy=with_entropy, reference=reference, sp=ctx.sequence_parallel,
                            banned=ctx.banned_ids)
    rows = batch.response_mask[indices]
    logp = to_response_space(out.logprobs, out.mask, rows)
    ent = to_response_space(out.entropy, out.mask, rows) if out.entropy is not None else None
    kl = to_response_space(out.full_kl, out.mask, rows) if out.full_kl is not None else None
    return logp, ent, kl


@torch.no_grad()
def all_logprobs(model, batch: RolloutBatch, ctx: ForwardContext) -> torch.Tensor:
    """[N, T] log-probs of every response, micro-batch by micro-batch, without gradients."""
    out = torch.zeros(batch.response_mask.shape)
    for mb in pass_micro_batches(batch, list(range(batch.size)), ctx):
        part = forward_logprobs(model, batch, mb.indices, ctx)[0]
        if not mb.filler:
            out[mb.indices] = part.cpu()
    return out


@torch.no_grad()
def all_full_kl(model, reference, batch: RolloutBatch, ctx: ForwardContext) -> torch.Tensor:
    """[N, T] exact KL(model || reference) over the vocabulary at every response token,
    micro-batch by micro-batch (`kl_estimator: full` as a reward penalty)."""
    out = torch.zeros(batch.response_mask.shape)
    for mb in pass_micro_batches(batch, list(range(batch.size)), ctx):
        part = forward_logprobs(model, batch, mb.indices, ctx, reference=reference)[2]
        if not mb.filler:
            out[mb.indices] = part.cpu()
    return out
