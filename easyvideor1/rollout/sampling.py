"""Next-token sampling of the HF engine, written to match vLLM's sampler step by step.

    logits -> ban (vision pad ids = -inf) -> / temperature -> top-k -> top-p -> log_softmax
           -> argmax (greedy) or one draw per row from its own generator

The log-probs returned are those of the distribution the token was drawn from (vLLM's
`processed_logprobs`, see `rollout/base.py`). Top-k keeps every token tied with the k-th
value, top-p drops the low tail whose cumulative probability is <= 1 - p (always keeping the
most likely token): both as vLLM's `apply_top_k_top_p_pytorch`. Random draws use the
exponential race (argmax of p / Exp(1)), also vLLM's method, but the random streams differ,
so a seed reproduces samples within one engine, not across engines.
"""

from __future__ import annotations

import torch

from easyvideor1.rollout.base import SamplingParams


def ban_tokens(logits: torch.Tensor, banned: torch.Tensor | None) -> torch.Tensor:
    """`logits` [B, V] float32 with the `banned` ids set to -inf (a new tensor)."""
    logits = logits.float().clone()
    if banned is not None and banned.numel():
        logits[:, banned] = float("-inf")
    return logits


def top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """`logits` [B, V] with tokens outside the top-k / top-p set at -inf (vLLM's rules)."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=False)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)  # ascending: the low tail first
        drop = cum <= 1.0 - top_p
        drop[:, -1] = False
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(-1, order, sorted_logits)
    return logits


def sampling_logprobs(
    logits: torch.Tensor, params: SamplingParams, banned: torch.Tensor | None
) -> torch.Tensor:
    """[B, V] float32 log-probs of the distribution tokens are drawn from (greedy: T = 1)."""
    logits = ban_tokens(logits, banned)
    if params.greedy:
        return logits.log_softmax(dim=-1)
    logits = logits / params.temperature
    return top_k_top_p(logits, params.top_k, params.top_p).log_softmax(dim=-1)


def draw(logprobs: torch.Tensor, greedy: bool, generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row of `logprobs` [B, V]: argmax, or a draw with the row's generator."""
    if greedy:
        return logprobs.argmax(dim=-1)
    probs = logprobs.exp()
    if all(g is None for g in generators):  # one draw for the whole batch from the global RNG
        return (probs / torch.empty_like(probs).exponential_()).argmax(dim=-1)
    tokens = []
    for row, gen in zip(probs, generators):
        noise = torch.empty_like(row).exponential_(generator=gen)  # Exp(1) race = categorical draw
        tokens.append((row / noise).argmax())
    return torch.stack(tokens)


def next_tokens(
    logits: torch.Tensor,
    params: SamplingParams,
    banned: torch.Tensor | None,
    generators: list[torch.Generator | None],
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [B], their log-probs [B]) drawn from `logits` [B, V] under `params`."""
    logprobs = sampling_logprobs(logits, params, banned)
    tokens = draw(logprobs, params.greedy, generators)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)
