"""The gradients an optimizer step sees. `policy_update` frees gradients right after each step
(`zero_grad(set_to_none=True)`, so they do not sit through the rollout); tests that compare
the gradients of an update read them here, at the step, through the optimizer's public
step pre-hook."""

from __future__ import annotations

import torch


def record_step_gradients(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[dict[str, torch.Tensor]]:
    """A list that gets, at each `optimizer.step()`, a copy of every parameter's gradient by name."""
    seen: list[dict[str, torch.Tensor]] = []

    def hook(_optimizer, _args, _kwargs) -> None:
        seen.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})

    optimizer.register_step_pre_hook(hook)
    return seen


def one_step_gradients(seen: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The gradients of the one step an update made (fails if it made another number)."""
    assert len(seen) == 1, f"expected one optimizer step, saw {len(seen)}"
    return seen[0]
