"""Whether the policy recomputes its activations in backward (gradient checkpointing).

`model.gradient_checkpointing`: true, false, or `auto` (the default): on when the longest row a
rank forwards, `data.max_prompt_tokens + rollout.max_tokens` over `training.sequence_parallel_size`,
is over `AUTO_TOKENS`. Why on by default there: without it a 7-8B decoder keeps about 5.8 MB of
activations per token for backward (the GPU-scale review's finding 10a), over 100 GB for a 16-20k-token
video row, far past any GPU; with it, one layer's worth. Below the threshold the activations fit
beside the state and recompute would only cost time (about a third more update compute).
A warning alone was the other choice; it would leave the default run to run out of memory.
"""

from __future__ import annotations

from easyvideor1.config import Config

AUTO_TOKENS = 4096  # `auto` turns gradient checkpointing on for rows longer than this


def longest_row_tokens(cfg: Config) -> int:
    """Tokens of the longest row one rank forwards: the longest prompt plus the longest response,
    split over the sequence-parallel group."""
    total = cfg.data.max_prompt_tokens + cfg.rollout.max_tokens
    return -(-total // cfg.training.sequence_parallel_size)


def gradient_checkpointing(cfg: Config) -> tuple[bool, str]:
    """(on, why) for `model.gradient_checkpointing` (module docstring)."""
    setting = cfg.model.gradient_checkpointing
    if setting != "auto":
        return bool(setting), f"model.gradient_checkpointing={str(setting).lower()}"
    tokens = longest_row_tokens(cfg)
    rows = (f"rows of up to {tokens} tokens per rank (data.max_prompt_tokens + rollout.max_tokens"
            + (" over training.sequence_parallel_size" if cfg.training.sequence_parallel_size > 1 else "") + ")")
    if tokens > AUTO_TOKENS:
        return True, f"auto: {rows} > {AUTO_TOKENS}"
    return False, f"auto: {rows} <= {AUTO_TOKENS}"
