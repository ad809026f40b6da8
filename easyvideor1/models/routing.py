"""Rollout routing replay (R3) for mixture-of-experts models: record each token's experts, replay them.

The engine's forward records, per MoE layer, the top-k experts each token was routed to
(`recording`); the trainer's passes route with those experts (`routes_applied`), so the tokens it
scores went through the same experts as when they were sampled (Megatron-LM #4168). The router's
own probabilities still weight the replayed experts, so its gate trains (R3's formula):

    p = softmax(x W_g^T)                     # [E], the router's own probabilities
    w_i = p[e_i] / sum_j p[e_j],  i < k      # e: the recorded experts, renormalised as norm_topk_prob

Tokens without a recorded route (`ROUTE_FREE`, `ROUTE_PAD`) take the router's own top-k, whose weights
this formula reproduces bit for bit. Nothing in transformers is patched: each router module gets an
instance-level `forward` (`install`), which is HF's own computation while no routes are set.
The routes stay set after `routes_applied` exits while gradients are on, so that a backward with
activation recompute routes as the forward did; `release` clears them after the backward.
"""

from __future__ import annotations

import types
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from easyvideor1.config_tree import ConfigError

ROUTE_FREE = -1
"""A real token without a recorded route: its router picks its own top-k (counted in the metrics)."""
ROUTE_PAD = -2
"""Padding or a masked dummy vision token: routed freely, left out of the metrics and the aux loss."""


@dataclass
class _RouterState:
    """What one router instance carries (attribute `_ev1_routing`)."""

    layer: int
    routes: torch.Tensor | None = None  # [N, k] long: the experts to use per row of the next forward
    recording: list[torch.Tensor] | None = None  # the experts used by each forward while recording
    collect: bool = False  # keep this forward's router outputs for the metrics / aux loss
    seen: tuple | None = None  # (probs [N, E] float32, chosen [N, k], own [N, k], routes [N, k] or None)
    noise: tuple[float, torch.Tensor] | None = None  # `perturb_selection`: (scale, projection [H, E])


def moe_routers(model) -> list[torch.nn.Module]:
    """The language model's top-k routers of `model`, in layer order (empty for a dense model)."""
    return [m for _, m in model.named_modules()
            if type(m).__name__.endswith("TopKRouter") and hasattr(m, "top_k") and hasattr(m, "num_experts")]


def _routed_forward(self, hidden_states):
    """HF's `TopKRouter.forward` (logits, renormalised top-k weights, indices) with replayed experts."""
    state: _RouterState = self._ev1_routing
    hidden = hidden_states.reshape(-1, self.hidden_dim)
    logits = F.linear(hidden, self.weight)  # [N, E]
    probs = torch.softmax(logits, dtype=torch.float, dim=-1)
    scores = probs
    if state.noise is not None:  # an engine whose kernels break near-ties differently (`perturb_selection`)
        scale, projection = state.noise
        scores = logits.float() + scale * torch.sin(1e3 * hidden.float() @ projection.to(hidden.device))
    own = torch.topk(scores, self.top_k, dim=-1).indices  # [N, k]
    chosen, routes = own, state.routes
    if routes is not None:
        if routes.shape != own.shape:
            raise ValueError(f"routing replay: layer {state.layer} got routes {tuple(routes.shape)} for "
                             f"{tuple(own.shape)} router rows (the routes are not of this batch)")
        routes = routes.to(own.device)
        chosen = torch.where(routes[:, :1] >= 0, routes, own)
    weights = probs.gather(-1, chosen)
    weights = (weights / weights.sum(dim=-1, keepdim=True)).to(logits.dtype)
    if state.recording is not None:
        state.recording.append(chosen.detach())
    if state.collect:
        state.seen = (probs, chosen.detach(), own, routes)
    return logits, weights, chosen


def router_settings(replay: str, model, sequence_parallel: bool = False) -> tuple[tuple[int, int] | None, bool]:
    """(layers, top_k) of `model`'s routers (None: dense) and whether the trainer replays the engine's
    routes (`algorithm.routing_replay`; a dense model ignores it). Sequence parallelism splits a row
    over ranks, which the routes do not follow yet: refused with replay, no router metrics without."""
    routers = moe_routers(model)
    if not routers:
        return None, False
    if sequence_parallel:
        if replay == "rollout":
            raise ConfigError("algorithm.routing_replay=rollout does not support training.sequence_parallel_size > 1 "
                              "yet; set algorithm.routing_replay=none or training.sequence_parallel_size=1")
        return None, False
    return (len(routers), int(routers[0].top_k)), replay == "rollout"


def install(model) -> list[torch.nn.Module]:
    """Give every router of `model` the replaying forward (once); returns the routers."""
    routers = moe_routers(model)
    for layer, router in enumerate(routers):
        if not hasattr(router, "_ev1_routing"):
            router._ev1_routing = _RouterState(layer)
            router.forward = types.MethodType(_routed_forward, router)
    return routers


def perturb_selection(model, scale: float, seed: int = 0) -> None:
    """Make `model`'s routers pick their top-k from logits + noise of amplitude `scale` (weights still
    from the clean probabilities): the engine side of `benchmarks/routing_replay.py` and its tests, where
    engine and trainer route differently (as bf16 kernels flip near-tied experts) and nothing else.
    The noise is pseudo-random but a function of the token's hidden state, as a kernel's rounding is:
    copies of one prompt route alike."""
    generator = torch.Generator().manual_seed(seed)
    for router in install(model):
        projection = torch.randn(router.hidden_dim, router.num_experts, generator=generator)
        router._ev1_routing.noise = (scale, projection) if scale > 0 else None


def release(model) -> None:
    """Clear the routes set by `routes_applied` (call after the backward of a replayed forward)."""
    for router in install(model):
        state = router._ev1_routing
        state.routes, state.collect, state.seen = None, False, None


class Recorder:
    """The experts each forward used, taken forward by forward (`recording`)."""

    def __init__(self, routers: list[torch.nn.Module]):
        self.routers = routers

    def take(self, shape: tuple[int, int]) -> torch.Tensor:
        """The last forward's routes as [B, L, layers, k] int16 (CPU) for its [B, L] input."""
        last = [router._ev1_routing.recording[-1:] for router in self.routers]
        if not all(last) or last[0][0].shape[0] != shape[0] * shape[1]:
            raise ValueError(f"routing replay: no recorded forward over a {shape[0]}x{shape[1]} batch")
        for router in self.routers:
            router._ev1_routing.recording.clear()
        routes = torch.stack([part[0] for part in last], dim=1).to("cpu", torch.int16)  # [N, layers, k]
        return routes.reshape(*shape, *routes.shape[1:])


@contextmanager
def recording(model):
    """Record the experts of every forward inside (yields a `Recorder`; routes set earlier are cleared)."""
    routers = install(model)
    release(model)
    for router in routers:
        router._ev1_routing.recording = []
    try:
        yield Recorder(routers)
    finally:
        for router in routers:
            router._ev1_routing.recording = None


@contextmanager
def routes_applied(model, routes: torch.Tensor | None, collect: bool = False, keep: bool = False):
    """Forwards inside route with `routes` [B, L, layers, k] (`ROUTE_FREE` / `ROUTE_PAD` rows: the
    router's own top-k; None: every token routes itself). `collect`: keep the router outputs for
    `router_stats` / `aux_loss`. With gradients on (or `keep`: a reference sharing the policy's
    routers), the routes stay set after exit (module docstring)."""
    routers = install(model)
    if routes is not None and routes.shape[2] != len(routers):
        raise ValueError(f"routing replay: routes for {routes.shape[2]} layers, the model has {len(routers)} routers")
    for layer, router in enumerate(routers):
        state = router._ev1_routing
        state.routes = None if routes is None else routes[:, :, layer].reshape(-1, routes.shape[-1])
        state.collect = collect
        if collect:  # a non-collecting forward (a LoRA reference view's) leaves the policy's outputs alone
            state.seen = None
    try:
        yield
    finally:
        for router in routers:
            router._ev1_routing.collect = False
        if not (keep or torch.is_grad_enabled()):
            release(model)


@dataclass
class RouterStats:
    """Router numbers of one or more replayed forwards, summed for `metrics`."""

    agreed: float = 0.0  # (token, layer) routes whose own top-k set equals the recorded set
    replayed: float = 0.0  # (token, layer) routes with a recorded set
    cv_sum: float = 0.0  # coefficient of variation of tokens per expert, summed over (forward, layer)
    layers: int = 0
    aux: list[float] = field(default_factory=list)  # the aux loss of each forward

    def metrics(self) -> dict[str, float]:
        """`moe/router_agreement` (where routes were replayed), `moe/expert_load_cv`, `moe/aux_loss`."""
        out = {}
        if self.replayed:
            out["moe/router_agreement"] = self.agreed / self.replayed
        if self.layers:
            out["moe/expert_load_cv"] = self.cv_sum / self.layers
        if self.aux:
            out["moe/aux_loss"] = sum(self.aux) / len(self.aux)
        return out


def _seen(model) -> list[tuple]:
    seen = [router._ev1_routing.seen for router in install(model)]
    return [s for s in seen if s is not None]


def _real_rows(chosen: torch.Tensor, routes: torch.Tensor | None) -> torch.Tensor:
    return torch.ones(chosen.shape[0], dtype=torch.bool, device=chosen.device) if routes is None \
        else routes[:, 0] != ROUTE_PAD


def router_stats(model, stats: RouterStats | None = None) -> RouterStats:
    """Add the last collected forward's agreement and expert load to `stats` (a new one when None)."""
    stats = stats or RouterStats()
    for probs, chosen, own, routes in _seen(model):
        real = _real_rows(chosen, routes)
        if routes is not None:
            replayed = routes[:, 0] >= 0
            same = (own.sort(-1).values == routes.sort(-1).values).all(-1)
            stats.agreed += float((same & replayed).sum())
            stats.replayed += float(replayed.sum())
        load = torch.bincount(chosen[real].reshape(-1), minlength=probs.shape[-1]).float()  # [E]
        if load.sum() > 0:
            stats.cv_sum += float(load.std(unbiased=False) / load.mean())
            stats.layers += 1
    return stats


def aux_loss(model) -> torch.Tensor | None:
    """The Switch load-balancing loss of the last collected forward, as transformers'
    `load_balancing_loss_func` (padding left out): E * sum_e f_e * P_e, with f_e the share of
    (token, layer) top-k slots sent to expert e and P_e the mean router probability of e, both over
    every layer's real tokens. Under replay f_e counts the replayed experts (what the tokens used),
    P_e the router's own probabilities (its gradient path). None when nothing was collected."""
    seen = _seen(model)
    if not seen:
        return None
    experts = seen[0][0].shape[-1]
    counts = seen[0][0].new_zeros(experts)
    prob_sum = seen[0][0].new_zeros(experts)
    rows = 0.0
    for probs, chosen, _, routes in seen:
        real = _real_rows(chosen, routes)
        counts = counts + torch.bincount(chosen[real].reshape(-1), minlength=experts).float()
        prob_sum = prob_sum + probs[real].sum(0)
        rows += float(real.sum())
    if rows == 0:
        return prob_sum.sum() * 0.0
    return (counts / rows * prob_sum / rows).sum() * experts


def aux_loss_coef(setting: float | None, model) -> float:
    """`algorithm.router_aux_loss_coef`, or the model config's `router_aux_loss_coef` when None."""
    if setting is not None:
        return float(setting)
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return float(getattr(config, "router_aux_loss_coef", 0.0) or 0.0)


def place_routes(shape: tuple[int, int], spans: list[tuple[int, int, int]], per_sequence: list[torch.Tensor | None],
                 layers: int, top_k: int) -> torch.Tensor:
    """A batch's [B, L, layers, k] routes: each sequence's [n, layers, k] routes at its span (row, start,
    end) of the batch; `ROUTE_FREE` for a sequence without (None) or past the routes' end, `ROUTE_PAD`
    outside every span (padding, dummies)."""
    out = torch.full((*shape, layers, top_k), ROUTE_PAD, dtype=torch.long)
    for (row, start, end), routes in zip(spans, per_sequence):
        out[row, start:end] = ROUTE_FREE
        if routes is not None:
            n = min(end - start, routes.shape[0])
            out[row, start:start + n] = routes[:n].long()
    return out


def routes_from_vllm(routed_experts, prompt_len: int, response_len: int) -> torch.Tensor | None:
    """vLLM's `CompletionOutput.routed_experts` ([seq_len, layers, k] from the first prompt token, with
    `routed_experts_prompt_start` 0) as a rollout's routes [prompt_len + response_len, layers, k]
    (int16): `ROUTE_FREE` for tokens vLLM never forwarded (the last sampled token); None without routes."""
    if routed_experts is None:
        return None
    given = torch.as_tensor(routed_experts).long()
    n = prompt_len + response_len
    out = torch.full((n, *given.shape[1:]), ROUTE_FREE, dtype=torch.int16)
    out[:min(n, given.shape[0])] = given[:n].to(torch.int16)
    return out
