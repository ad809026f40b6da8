"""`AlgorithmConfig`: which estimator, loss, aggregation and KL to use, and their parameters.

The trainer embeds it as its `algorithm` section. Names are checked against the registries
when the config is built, so a typo fails at load with the list of valid names.
`ALGORITHM_PRESETS` name the common recipes as field overrides; `from_preset("dapo",
kl_coef=...)` builds one; `make_kl_controller(cfg)` builds the KL coefficient controller a
config names.

The loss and KL modules never import this one (it imports their registries): a policy loss
reads its settings through `policy_losses.LossSettings`, which this config satisfies.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from easyvideor1.algorithms.advantages import ADVANTAGES
from easyvideor1.algorithms.aggregation import AGGREGATIONS
from easyvideor1.algorithms.kl import (
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    KLController,
)
from easyvideor1.algorithms.policy_losses import POLICY_LOSSES
from easyvideor1.algorithms.rollout_correction import ROLLOUT_CORRECTIONS

ROUTING_REPLAY = ("none", "rollout")
"""Values of `algorithm.routing_replay` (`models.routing`); here, so that reading a config imports no torch."""


def _check_name(field: str, value: str, registry: dict) -> None:
    if value not in registry:
        raise ValueError(f"algorithm.{field}={value!r} is unknown; valid: {', '.join(registry)}")


@dataclass
class AlgorithmConfig:
    """RL algorithm settings (defaults: GRPO with a k3 KL loss, as in EasyR1)."""

    adv_estimator: str = "grpo"
    """Advantage estimator, a key of `advantages.ADVANTAGES`."""
    policy_loss: str = "ppo_clip"
    """Policy loss, a key of `policy_losses.POLICY_LOSSES`."""
    loss_agg_mode: str = "token_mean"
    """How token losses become one scalar, a key of `aggregation.AGGREGATIONS`."""
    adv_eps: float = 1e-6
    """Added to standard deviations before dividing (GRPO, GDPO, REINFORCE++ whitening)."""
    gamma: float = 1.0
    """Per-token discount of REINFORCE++ returns."""
    gdpo_reward_keys: tuple[str, ...] = ("accuracy", "format")
    """Reward keys GDPO normalises separately (keys of the reward's parts)."""
    gdpo_reward_weights: tuple[float, ...] | None = None
    """Weight of each GDPO key in the sum (None: all 1)."""
    clip_ratio_low: float = 0.2
    """PPO lower clip: ratios below 1 - clip_ratio_low stop pushing A < 0 tokens down."""
    clip_ratio_high: float = 0.2
    """PPO upper clip: ratios above 1 + clip_ratio_high stop pushing A > 0 tokens up (DAPO: 0.28)."""
    clip_ratio_c: float | None = 3.0
    """Dual-clip bound for A < 0 tokens (loss capped at -A * c); None disables dual clip."""
    log_ratio_clamp: float = 20.0
    """Log-ratios are clamped to +-this before exp, for finite ratios and gradients."""
    luffy_gamma: float = 0.1
    """LUFFY policy-shaping constant: f(x) = x / (x + luffy_gamma) on off-policy tokens."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient (0: none; the loss then needs no entropy)."""
    disable_kl: bool = False
    """Skip the reference model and every KL term."""
    use_kl_loss: bool = True
    """KL as a loss term (True) or as a per-token reward penalty given to the estimator (False)."""
    kl_estimator: str = "low_var_kl"
    """KL estimator, a key of `kl.KL_ESTIMATORS` (k1, abs, mse, low_var_kl, full)."""
    kl_coef: float = 1e-2
    """KL coefficient (the starting value when adaptive)."""
    kl_controller: str = "fixed"
    """`fixed` or `adaptive` KL coefficient."""
    kl_target: float = 0.1
    """Target KL of the adaptive controller."""
    kl_horizon: float = 10000.0
    """Horizon (samples) of the adaptive controller."""
    online_filtering: bool = False
    """DAPO dynamic sampling: drop groups whose mean `filter_key` is outside (filter_low, filter_high)."""
    filter_key: str = "accuracy"
    """Reward key whose group mean decides the filtering."""
    filter_low: float = 0.01
    """Groups with mean <= this are dropped (all wrong)."""
    filter_high: float = 0.99
    """Groups with mean >= this are dropped (all correct)."""
    max_filter_tries: int = 20
    """Generation rounds allowed to fill one batch when filtering (<= 0: no limit)."""
    rollout_correction: str = "auto"
    """Rollout correction, a key of `rollout_correction.ROLLOUT_CORRECTIONS` or `auto` (vllm: token_tis, hf: none)."""
    rollout_correction_threshold: float = 2.0
    """C: TIS truncates ratios at C; MIS masks ratios outside [1/C, C]."""
    rollout_correction_geometric: bool = False
    """seq_tis / seq_mis use the geometric mean of the token ratios instead of their product."""
    routing_replay: str = "rollout"
    """MoE models: `rollout` replays the engine's recorded experts in every trainer pass (R3), `none` lets the trainer route; dense models ignore it."""
    router_aux_loss_coef: float | None = None
    """MoE load-balancing loss coefficient (null: the model config's `router_aux_loss_coef`; 0: off)."""

    def __post_init__(self) -> None:
        _check_name("adv_estimator", self.adv_estimator, ADVANTAGES)
        _check_name("policy_loss", self.policy_loss, POLICY_LOSSES)
        _check_name("loss_agg_mode", self.loss_agg_mode, AGGREGATIONS)
        _check_name("kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        _check_name("kl_controller", self.kl_controller, KL_CONTROLLERS)
        _check_name("rollout_correction", self.rollout_correction, {"auto": None, **ROLLOUT_CORRECTIONS})
        self.gdpo_reward_keys = tuple(self.gdpo_reward_keys)
        if self.gdpo_reward_weights is not None:
            self.gdpo_reward_weights = tuple(float(w) for w in self.gdpo_reward_weights)
            if len(self.gdpo_reward_weights) != len(self.gdpo_reward_keys):
                raise ValueError(f"algorithm.gdpo_reward_weights has {len(self.gdpo_reward_weights)} entries for "
                                 f"{len(self.gdpo_reward_keys)} gdpo_reward_keys; give one weight per key")
        if not self.gdpo_reward_keys:
            raise ValueError("algorithm.gdpo_reward_keys is empty; name at least one reward key")
        checks = [
            ("adv_eps", self.adv_eps >= 0, ">= 0"),
            ("gamma", 0 < self.gamma <= 1, "in (0, 1]"),
            ("clip_ratio_low", 0 <= self.clip_ratio_low <= 1, "in [0, 1]"),
            ("clip_ratio_high", self.clip_ratio_high >= 0, ">= 0"),
            ("clip_ratio_c", self.clip_ratio_c is None or self.clip_ratio_c > 1, "> 1 (or null to disable)"),
            ("log_ratio_clamp", self.log_ratio_clamp > 0, "> 0"),
            ("luffy_gamma", self.luffy_gamma > 0, "> 0"),
            ("kl_coef", self.kl_coef >= 0, ">= 0"),
            ("kl_target", self.kl_target > 0, "> 0"),
            ("kl_horizon", self.kl_horizon > 0, "> 0"),
            ("filter_high", self.filter_low < self.filter_high, "> filter_low"),
            ("rollout_correction_threshold", self.rollout_correction_threshold > 1, "> 1"),
            ("routing_replay", self.routing_replay in ROUTING_REPLAY, f"one of {', '.join(ROUTING_REPLAY)}"),
            ("router_aux_loss_coef", self.router_aux_loss_coef is None or self.router_aux_loss_coef >= 0,
             ">= 0 (or null: the model config's)"),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"algorithm.{name}={getattr(self, name)!r} must be {rule}")

    @property
    def needs_reference(self) -> bool:
        """Whether the trainer must compute reference-model log-probs."""
        return not self.disable_kl

    @property
    def kl_in_reward(self) -> bool:
        """Whether the KL enters as a reward penalty (`kl.kl_reward_penalty` -> estimator `kl_penalty=`)."""
        return not self.disable_kl and not self.use_kl_loss

    @property
    def needs_greedy_rollout(self) -> bool:
        """Whether the estimator needs `greedy_rewards` (ReMax's baseline)."""
        return self.adv_estimator == "remax"

    def estimator_kwargs(self) -> dict[str, Any]:
        """The estimator parameters from this config, to splat into any `ADVANTAGES` call."""
        return {"eps": self.adv_eps, "gamma": self.gamma, "reward_keys": self.gdpo_reward_keys,
                "reward_weights": self.gdpo_reward_weights}


ALGORITHM_PRESETS: dict[str, dict[str, Any]] = {
    # DeepSeekMath GRPO: sequence-mean of token-means, k3 KL loss with beta 0.04.
    "grpo": {"adv_estimator": "grpo", "policy_loss": "ppo_clip", "loss_agg_mode": "seq_mean_token_mean",
             "use_kl_loss": True, "kl_estimator": "low_var_kl", "kl_coef": 0.04},
    # DAPO: clip-higher, dynamic sampling, token-level mean, no KL.
    "dapo": {"adv_estimator": "grpo", "policy_loss": "ppo_clip", "loss_agg_mode": "token_mean",
             "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "disable_kl": True, "online_filtering": True},
    # Dr.GRPO: no std, no length normalisation (constant max length), no KL.
    "dr_grpo": {"adv_estimator": "dr_grpo", "policy_loss": "ppo_clip", "loss_agg_mode": "seq_mean_token_sum_norm",
                "disable_kl": True},
    # GSPO: sequence ratio with tight clip ranges (paper: 3e-4 / 4e-4), sequence mean, no KL.
    "gspo": {"adv_estimator": "grpo", "policy_loss": "gspo", "loss_agg_mode": "seq_mean_token_mean",
             "clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4, "clip_ratio_c": None, "disable_kl": True},
    # CISPO (MiniMax-M1): no lower bound on the importance weight, upper bound 1 + 0.28, token mean.
    "cispo": {"adv_estimator": "grpo", "policy_loss": "cispo", "loss_agg_mode": "token_mean",
              "clip_ratio_low": 1.0, "clip_ratio_high": 0.28, "disable_kl": True},
    # REINFORCE++: k1 KL as a per-token reward penalty, batch-whitened returns.
    "reinforce_plus_plus": {"adv_estimator": "reinforce_plus_plus", "policy_loss": "ppo_clip",
                            "loss_agg_mode": "token_mean", "use_kl_loss": False, "kl_estimator": "k1",
                            "kl_coef": 0.01},
    # RLOO: leave-one-out baseline, KL in the reward.
    "rloo": {"adv_estimator": "rloo", "policy_loss": "ppo_clip", "loss_agg_mode": "token_mean",
             "use_kl_loss": False, "kl_estimator": "k1", "kl_coef": 0.01},
    # ReMax: greedy-response baseline, KL in the reward.
    "remax": {"adv_estimator": "remax", "policy_loss": "ppo_clip", "loss_agg_mode": "token_mean",
              "use_kl_loss": False, "kl_estimator": "k1", "kl_coef": 0.01},
    # GDPO: accuracy and format normalised separately, then batch-whitened; GRPO's loss otherwise.
    "gdpo": {"adv_estimator": "gdpo", "policy_loss": "ppo_clip", "loss_agg_mode": "token_mean",
             "gdpo_reward_keys": ("accuracy", "format"), "disable_kl": True},
    # LUFFY: offline trajectories mixed into GRPO groups, shaped off-policy ratio, no KL.
    "luffy": {"adv_estimator": "grpo", "policy_loss": "luffy", "loss_agg_mode": "token_mean",
              "luffy_gamma": 0.1, "disable_kl": True},
}


def make_kl_controller(cfg: AlgorithmConfig) -> KLController:
    """The controller named by `cfg.kl_controller`, starting at `cfg.kl_coef`."""
    if cfg.kl_controller == "adaptive":
        return AdaptiveKLController(cfg.kl_coef, cfg.kl_target, cfg.kl_horizon)
    return FixedKLController(cfg.kl_coef)


def from_preset(name: str, **overrides: Any) -> AlgorithmConfig:
    """The config of preset `name` (a key of `ALGORITHM_PRESETS`), with `overrides` applied on top."""
    if name not in ALGORITHM_PRESETS:
        raise ValueError(f"unknown algorithm preset {name!r}; valid: {', '.join(ALGORITHM_PRESETS)}")
    known = {f.name for f in dataclasses.fields(AlgorithmConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown algorithm field(s) {unknown}; valid: {', '.join(sorted(known))}")
    return AlgorithmConfig(**{**ALGORITHM_PRESETS[name], **overrides})
