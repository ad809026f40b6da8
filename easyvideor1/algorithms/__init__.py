"""The RL algorithm core: pure tensor functions (no model, engine or I/O), swapped by name.

    rewards -> advantages (advantages.py) -> policy loss (policy_losses.py) -> scalar
                    ^ kl penalty (kl.py)            ^ kl loss (kl.py), aggregation.py

Calling convention (the trainer calls every estimator and every loss the same way, and
never branches on the algorithm's name):

1. Dynamic sampling (when `cfg.online_filtering`), per generated batch::

       result = filter_groups(values=accuracy_per_response, group_ids=uids,
                              low=cfg.filter_low, high=cfg.filter_high)
       done = filler.add(result)    # filler = BatchFiller(target, cfg.max_filter_tries, all_full=distributed.all_true)

2. KL in the reward (when `cfg.kl_in_reward`; `cfg.needs_reference` says whether to run the
   reference model at all)::

       kl_penalty = kl_reward_penalty(old_log_probs, ref_log_probs, response_mask,
                                      kind=cfg.kl_estimator, coef=kl_ctrl.coef,
                                      full_kl=None)   # [N, T]; full_kl [N, T] for 'full'

3. Advantages, once per rollout batch; unused inputs may be None::

       advantages = ADVANTAGES[cfg.adv_estimator](
           rewards=overall,                     # [N] float, one per response
           group_ids=uids,                      # [N] tensor or list; same id = same prompt
           response_mask=response_mask,         # [N, T] 0/1
           kl_penalty=kl_penalty,               # [N, T] or None
           greedy_rewards=greedy,               # [N] or None (ReMax: cfg.needs_greedy_rollout)
           reward_parts=parts,                  # {key: [N]} or None (GDPO)
           all_reduce_floats=all_reduce_floats, # batch whitening over the data-parallel ranks
           **cfg.estimator_kwargs())            # -> [N, T] float32, 0 on padding

4. Loss normaliser, once per mini-batch, over ALL its micro-batches (and ranks)::

       normalizer = loss_normalizer([mb.response_mask for mb in mini_batch], cfg.loss_agg_mode,
                                    max_len=max_response_length, all_reduce=dp_size > 1)

5. Policy loss, per micro-batch; gradients accumulate by plain `backward()` with no further
   division, and the data-parallel all-reduce averages them::

       inputs = LossInputs(
           log_probs=lp, old_log_probs=old_lp, advantages=adv, response_mask=mask,   # [n, T]
           entropy=ent,                          # [n, T] or None (needed if cfg.entropy_coef)
           ref_log_probs=ref_lp,                 # [n, T] or None (needed if cfg.use_kl_loss)
           full_kl=None,                         # [n, T] exact KL, only for kl_estimator 'full'
           offline_mask=off, behaviour_log_probs=None,   # LUFFY's offline tokens, else None
           rollout_weights=corr.weights)         # [n, T] or None: the rollout correction, where
       # corr = rollout_correction.rollout_correction(old_lp, rollout_lp, known, mode, C, geometric)
       loss, metrics = POLICY_LOSSES[cfg.policy_loss](inputs, cfg, normalizer,
                                                      kl_coef=kl_ctrl.coef)   # None: cfg.kl_coef
       loss.backward()

6. After the step, `kl_ctrl.update(mean_kl, n_samples)` (kl_ctrl = make_kl_controller(cfg)).

Unknown inputs raise (`LossInputs` is a dataclass: typos never pass silently); missing
required inputs raise with what to pass. Shapes: N responses, T padded response length, V vocabulary.
"""

from easyvideor1.algorithms.advantages import ADVANTAGES
from easyvideor1.algorithms.aggregation import (
    AGGREGATIONS,
    aggregate,
    loss_normalizer,
    normalizer_count,
    normalizer_from_counts,
)
from easyvideor1.algorithms.config import ALGORITHM_PRESETS, AlgorithmConfig, from_preset, make_kl_controller
from easyvideor1.algorithms.dynamic_sampling import BatchFiller, GroupFilter, filter_groups
from easyvideor1.algorithms.kl import KL_ESTIMATORS, kl_estimate, kl_reward_penalty
from easyvideor1.algorithms.policy_losses import POLICY_LOSSES, LossInputs
from easyvideor1.algorithms.rollout_correction import ROLLOUT_CORRECTIONS

__all__ = [
    "ADVANTAGES", "AGGREGATIONS", "ALGORITHM_PRESETS", "KL_ESTIMATORS", "POLICY_LOSSES", "ROLLOUT_CORRECTIONS",
    "AlgorithmConfig", "LossInputs",
    "BatchFiller", "GroupFilter", "aggregate", "filter_groups", "from_preset", "kl_estimate", "kl_reward_penalty",
    "loss_normalizer", "make_kl_controller", "normalizer_count", "normalizer_from_counts",
]
