"""KL divergence to the reference policy: per-token estimators and the coefficient controllers.

Estimators (`KL_ESTIMATORS`, name -> function of log-probs `[N, T]`, returning `[N, T]`),
following Schulman's "Approximating KL divergence" (2020), for samples y ~ pi:

- `k1`: log pi(y) - log pi_ref(y) (unbiased, can be negative);
- `abs`: |k1|;
- `mse`: 0.5 * k1^2 (k2);
- `low_var_kl`: pi_ref/pi - log(pi_ref/pi) - 1 (k3, unbiased and >= 0). As in EasyR1, the log
  ratio is clamped to [-20, 20] before exp and the result to [-10, 10], so one wild token
  cannot blow up the loss;
- `full`: the exact KL(pi || pi_ref) summed over the vocabulary; it needs full
  log-distributions `[N, T, V]` for both policies. The trainer never builds those for a
  batch: `models.logprobs` applies `full` to one chunk of response tokens at a time, inside
  the policy's log-prob pass, and hands on the per-token KL `[N, T]` (`full_kl=` below).

The KL is used either as a reward penalty (`kl_reward_penalty`, handed to the advantage
estimators as `kl_penalty=`) or as a loss term (added inside the policy losses when
`use_kl_loss`); `disable_kl` skips the reference model entirely. The coefficient is fixed or
adaptive (Ziegler et al. 2019: move it towards a target KL over a horizon of samples;
`config.make_kl_controller` builds the one a config names); a controller's `state_dict` goes
into every checkpoint, so a resumed run continues with the coefficient the interrupted one had
reached.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOG_RATIO_CLAMP = 20.0  # before exp in k3
K3_CLAMP = 10.0  # on the k3 value


def k1(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """log pi - log pi_ref per token."""
    return log_probs - ref_log_probs


def kl_abs(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """|log pi - log pi_ref| per token."""
    return (log_probs - ref_log_probs).abs()


def mse(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """0.5 * (log pi - log pi_ref)^2 per token (k2)."""
    return 0.5 * (log_probs - ref_log_probs).square()


def low_var_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """k3 = exp(d) - d - 1 with d = log pi_ref - log pi, clamped (see module docstring)."""
    d = (ref_log_probs - log_probs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (d.exp() - d - 1).clamp(-K3_CLAMP, K3_CLAMP)


def full(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """Exact KL(pi || pi_ref) per token from full log-distributions [N, T, V] -> [N, T].

    Vocabulary entries where pi is exactly 0 contribute 0 (not 0 * inf = NaN).
    """
    if log_probs.dim() != 3 or log_probs.shape != ref_log_probs.shape:
        raise ValueError("kl estimator 'full' needs log-distributions of shape [N, T, V] for both "
                         f"policies, got {tuple(log_probs.shape)} and {tuple(ref_log_probs.shape)}; "
                         "pass log_softmax of the logits, or use low_var_kl on token log-probs")
    p = log_probs.exp()
    term = torch.where(p > 0, p * (log_probs - ref_log_probs), torch.zeros_like(p))
    return term.sum(-1)


KL_ESTIMATORS = {"k1": k1, "abs": kl_abs, "mse": mse, "low_var_kl": low_var_kl, "full": full}


def k1_sums(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """(sum of log pi - log pi_ref over `mask`'s tokens, their count): the k1 estimate of
    KL(pi || pi_ref) as sums, so micro-batches and ranks add up exactly (`kl/policy_ref`)."""
    mask = mask.bool()
    return float(torch.where(mask, log_probs - ref_log_probs.to(log_probs.dtype), 0.0).sum()), float(mask.sum())


def kl_estimate(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate `[N, T]` of kind `kind` (a key of `KL_ESTIMATORS`)."""
    try:
        fn = KL_ESTIMATORS[kind]
    except KeyError:
        raise ValueError(f"unknown kl_estimator {kind!r}; valid: {', '.join(KL_ESTIMATORS)}") from None
    if kind != "full" and log_probs.shape != ref_log_probs.shape:
        raise ValueError(f"kl {kind}: log_probs {tuple(log_probs.shape)} and ref_log_probs "
                         f"{tuple(ref_log_probs.shape)} must have the same shape [N, T]")
    return fn(log_probs, ref_log_probs)


@torch.no_grad()
def kl_reward_penalty(
    log_probs: torch.Tensor | None, ref_log_probs: torch.Tensor | None, response_mask: torch.Tensor, *, kind: str,
    coef: float, full_kl: torch.Tensor | None = None,
) -> torch.Tensor:
    """coef * KL per token, zero on padding: `[N, T]`, to pass to an estimator as `kl_penalty=`.

    Estimators subtract it from the reward (REINFORCE++ per token, the others summed per response).
    For `kind="full"` give `full_kl` [N, T], the exact per-token KL of the sampling policy to the
    reference (`training.sequences.all_full_kl` computes it chunk by chunk); the log-probs are
    then not used.
    """
    if kind == "full":
        if full_kl is None:
            raise ValueError("kl_reward_penalty(kind='full') needs full_kl=[N, T]: the exact per-token KL over "
                             "the vocabulary (training.sequences.all_full_kl)")
        kl = full_kl.float()
    else:
        kl = kl_estimate(log_probs.float(), ref_log_probs.float(), kind)  # [N, T]
    return torch.where(response_mask.bool(), coef * kl, torch.zeros_like(kl))


@dataclass
class FixedKLController:
    """A constant KL coefficient."""

    coef: float

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to adapt."""

    def state_dict(self) -> dict[str, float]:
        return {"coef": self.coef}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.coef = float(state["coef"])


@dataclass
class AdaptiveKLController:
    """Ziegler et al. (2019): coef *= 1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon."""

    coef: float
    target: float
    horizon: float

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move the coefficient towards the target KL; `n_steps` = samples in this update."""
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.coef *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"coef": self.coef}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """The coefficient reached so far (target and horizon come from the config)."""
        self.coef = float(state["coef"])


KL_CONTROLLERS = {"fixed": FixedKLController, "adaptive": AdaptiveKLController}
KLController = FixedKLController | AdaptiveKLController
