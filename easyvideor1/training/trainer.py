"""The RL loop. One function per stage, called top to bottom by `train_step`:

    prompts (frames + processor, once) -> rollout n per prompt -> hybrid slot -> rewards
    -> (dynamic sampling) -> old / ref log-probs -> advantages -> PPO update -> weight sync
    -> metrics -> validation / checkpoint

Everything the loop needs arrives in a `Run` (`training.run`, built by `training.setup`), so a
test can hand in a tiny model, another engine or another score function. Numbers that need all
ranks are reduced where they are made (`distributed`); `StepMetrics` averages the rest.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from easyvideor1 import config_tree, distributed, testhooks
from easyvideor1.algorithms import ADVANTAGES, kl_reward_penalty
from easyvideor1.algorithms.kl import AdaptiveKLController, k1_sums
from easyvideor1.config_tree import ConfigError
from easyvideor1.prompts import Prompt
from easyvideor1.rollout.tools.multiturn import tool_metrics
from easyvideor1.training.groups import ScoredGroups, pad_groups, reward_metrics
from easyvideor1.training.metrics import StageTimer, StepMetrics, console_line, gather_values, skipped_note
from easyvideor1.training.parity import parity_metrics
from easyvideor1.training.rank_balance import rank_slots
from easyvideor1.training.run import Run
from easyvideor1.training.sequence_parallel import share_scored
from easyvideor1.training.sequences import RolloutBatch, all_full_kl, all_logprobs, make_batch
from easyvideor1.training.skips import SHOWN
from easyvideor1.training.state import checkpoint as ckpt
from easyvideor1.training.update import policy_update
from easyvideor1.training.validation import validate

log = logging.getLogger(__name__)


def rollout_stage(run: Run, step: int, timer: StageTimer) -> ScoredGroups:
    """Prompts of this step -> scored groups (with dynamic sampling when enabled).

    Every rank ends with the same number of groups (`training.rollout_batch_size` / ranks): a
    sample that fails to load is reported and its slot padded with a fully masked group, and
    dynamic sampling generates rounds until every rank is full. So every rank runs the same
    micro-batches, and FSDP's collectives stay in step. The step's tried and failed samples of all
    ranks (`data/prompts`, `data/prompt_failures`) and the first failures' reasons come with the
    groups, for the run's skip count (`training.skips`).
    """
    cfg = run.cfg
    dp = run.data_parallel  # the ranks of a sequence-parallel group hold the same prompts
    per_rank, n = cfg.training.rollout_batch_size // dp.world, cfg.rollout.n
    failures: list = []
    tried = [0]  # samples whose prompts this rank built or failed to, every round
    rounds = itertools.count()  # dynamic sampling's generation rounds

    def next_prompts():
        batch = run.loader.next_batch()
        with timer("prepare"):
            # every rank assigns the global batch alike (`training.rank_balance`): equal counts, and
            # with training.balance_ranks, balanced estimated tokens
            slots = rank_slots(batch, dp.rank, dp.world, cfg.vision if cfg.training.balance_ranks else None)
            # Seeds numbered by the global slot (the same in 1 or N processes), new ones each round.
            first = next(rounds) * cfg.training.rollout_batch_size
            prompts, failed = run.prompts.build_many([batch[i] for i in slots],
                                                     seed_offsets=[(first + i) * n for i in slots])
        failures.extend(failed)
        tried[0] += len(slots)
        return prompts

    params = run.rollouts.params(step)
    start = time.perf_counter()
    if cfg.algorithm.online_filtering:
        scored = run.rollouts.filtered_groups(next_prompts, params, per_rank)
    else:
        scored = run.rollouts.groups(next_prompts(), params)
    timer.add("rollout", time.perf_counter() - start - timer.times.get("time/prepare", 0.0))
    scored = share_scored(scored, run.ctx.sequence_parallel)
    pad_groups(scored, per_rank, run.padding, n)
    failed, scored.filter_metrics["data/prompts"] = distributed.all_reduce_floats([len(failures), tried[0]],
                                                                                  group=dp.group)
    scored.filter_metrics["data/prompt_failures"] = failed
    if failed:  # the same on every rank: the first reasons of all ranks, for the run's skip count
        parts = distributed.all_gather_objects([(f.sample_id, f.reason) for f in failures[:SHOWN]], dp.group)
        scored.skipped = [x for part in parts for x in part][:SHOWN]
    return scored


def take_stage(run: Run, step: int, m: StepMetrics) -> ScoredGroups:
    """Separate placement (`training.asynchronous`): the rollout process's scored batch for this
    step, generated with the weights of `weight_version(step)`; the trainer's idle wait is
    `time/rollout_wait`, the rollout process's wait for weights before it `time/train_wait`."""
    with m.timer("rollout_wait"):
        scored, loader_state, trip = run.remote.take(step)
    run.loader.load_state_dict(loader_state)  # what a checkpoint after this step saves
    m.glob.update({"async/staleness_mean": trip.staleness_mean, "async/staleness_max": trip.staleness_max,
                   "time/train_wait": trip.train_wait, **trip.extra})
    return scored


def old_logprob_stage(run: Run, batch: RolloutBatch, parity_step: bool) -> torch.Tensor | None:
    """The old policy's log-probs, or None when strictly on-policy (one update over the whole
    batch): then they are the current ones, detached inside the update, saving a forward pass.

    Under asynchronous training (`training.max_staleness` > 0) these are the proximal policy's
    log-probs (the trainer's current weights, before the update) of decoupled PPO, and the
    responses' own log-probs (`behaviour_log_probs`) are those of the older rollout weights."""
    t = run.cfg.training
    on_policy = t.ppo_epochs == 1 and t.rollout_batch_size == t.mini_batch_size
    if on_policy and not run.cfg.algorithm.kl_in_reward and not parity_step:
        return None
    return all_logprobs(run.model, batch, run.ctx)


def greedy_rewards(run: Run, prompts: list[Prompt], step: int) -> torch.Tensor:
    """ReMax's baseline: one greedy (temperature 0) response per prompt from the engine that
    generated the batch, scored by the same scorer; its reward per prompt [G] (0 for padding
    groups). The greedy responses are never trained on."""
    real = [p for p in prompts if not p.padding]
    greedy = [grp[0] for grp in run.rollouts.generate(real, 1, run.rollouts.params(step, 0.0))]
    results = iter(run.rollouts.score_fn([r.text for r in greedy], [p.sample for p in real]))
    return torch.tensor([0.0 if p.padding else next(results).overall for p in prompts])  # [G]


def greedy_baseline(run: Run, scored: ScoredGroups, step: int) -> tuple[torch.Tensor, dict[str, float]]:
    """ReMax's greedy reward per prompt [G] (`greedy_rewards`: made here, or by the rollout side
    under separate placement, where it comes with the batch) and the global mean greedy reward."""
    per_prompt = greedy_rewards(run, scored.prompts, step) if scored.greedy is None else scored.greedy
    real = sum(not p.padding for p in scored.prompts)
    total, count = distributed.all_reduce_floats([float(per_prompt.sum()), float(real)])
    return per_prompt, {"remax/greedy_reward": total / max(count, 1.0)}


def advantage_stage(run: Run, batch: RolloutBatch, greedy: torch.Tensor | None) -> dict[str, float]:
    """Fill `batch.advantages` with the configured estimator (KL-in-reward when configured);
    `greedy` is ReMax's greedy reward per prompt [G].

    Batch statistics (REINFORCE++ and GDPO whitening) are reduced over every data-parallel rank.
    """
    algo = run.cfg.algorithm
    # over the data-parallel ranks: a sequence-parallel group's ranks hold copies of the same responses
    reduce = partial(distributed.all_reduce_floats, group=run.data_parallel.group)
    rewards = torch.tensor([r.overall for r in batch.results], dtype=torch.float32)
    parts = {k: torch.tensor([r.parts.get(k, getattr(r, k, 0.0)) for r in batch.results], dtype=torch.float32)
             for k in algo.gdpo_reward_keys}
    penalty = None
    if algo.kl_in_reward:
        # `full` needs the old policy's and the reference's distributions at every response token
        full = all_full_kl(run.model, run.reference, batch, run.ctx) if algo.kl_estimator == "full" else None
        penalty = kl_reward_penalty(batch.old_log_probs, batch.ref_log_probs, batch.response_mask,
                                    kind=algo.kl_estimator, coef=run.kl.coef, full_kl=full)
    batch.advantages = ADVANTAGES[algo.adv_estimator](
        rewards=rewards, group_ids=batch.statistics_group_ids(), response_mask=batch.response_mask.float(), kl_penalty=penalty,
        greedy_rewards=None if greedy is None else greedy[batch.group_ids], reward_parts=parts,
        all_reduce_floats=reduce, **algo.estimator_kwargs())
    mask = batch.response_mask
    values = batch.advantages[mask]
    total, tokens = reduce([float(values.sum()), float(values.numel())])
    abs_max = reduce([float(values.abs().max()) if values.numel() else 0.0], "max")[0]
    return {"advantage/mean": total / tokens if tokens else 0.0, "advantage/abs_max": abs_max}


def update_stage(run: Run, batch: RolloutBatch) -> dict[str, float]:
    """The PPO epochs over the batch, then the learning-rate schedule; metrics over all ranks."""
    t = run.cfg.training
    metrics = policy_update(run.model, run.optimizer, batch, run.cfg.algorithm, run.ctx, ppo_epochs=t.ppo_epochs,
                            n_mini=t.rollout_batch_size // t.mini_batch_size, grad_clip=t.grad_clip,
                            max_len=run.cfg.rollout.max_tokens, kl_coef=run.kl.coef, reference=run.reference,
                            correction=run.rollout_correction)
    if run.scheduler is not None:
        run.scheduler.step()
    return metrics


def policy_ref_kl(batch: RolloutBatch) -> float:
    """KL(policy || reference) of the step, the k1 estimate: mean of old - ref log-prob over every
    response token of every rank (what `kl/policy_ref` logs and the adaptive controller reads)."""
    total, tokens = distributed.all_reduce_floats(list(k1_sums(batch.old_log_probs, batch.ref_log_probs,
                                                               batch.response_mask)))
    return total / tokens if tokens else 0.0


def train_step(run: Run, step: int) -> dict[str, float]:
    """One step, stage by stage; returns its metrics (the same on every rank)."""
    m = StepMetrics()
    timer = m.timer
    scored = rollout_stage(run, step, timer) if run.remote is None else take_stage(run, step, m)
    fm = scored.filter_metrics  # every rank's same counts: the same decision (a TooManySkipped) on each
    m.glob.update(run.skips.count(fm.get("data/prompts", 0.0), fm.get("data/prompt_failures", 0.0), scored.skipped,
                                  run.cfg.data.max_skip_fraction))
    greedy = None
    if run.cfg.algorithm.needs_greedy_rollout:
        with timer("greedy_rollout"):
            greedy, greedy_metrics = greedy_baseline(run, scored, step)
        m.glob.update(greedy_metrics)
    run.rollouts.engine.sleep()  # release the engine's memory (vLLM on GPU) for the passes below
    log_examples(run, step, scored)
    m.glob.update(reward_metrics(scored, gather=partial(gather_values, group=run.data_parallel.group)))
    if run.cfg.rollout.tools:
        m.glob.update(tool_metrics(scored.groups, group=run.data_parallel.group))
    batch = make_batch(scored.prompts, scored.groups, [x for res in scored.results for x in res])
    parity_step = bool(run.cfg.rollout.parity_check_every) and step % run.cfg.rollout.parity_check_every == 0
    with timer("old_logprob"):
        batch.old_log_probs = old_logprob_stage(run, batch, parity_step)
    if parity_step:
        m.glob.update(parity_metrics(batch))
    if run.reference is not None:
        with timer("ref_logprob"):
            batch.ref_log_probs = all_logprobs(run.reference, batch, run.ctx)
        if batch.old_log_probs is not None:  # else the update measures it on the same tokens
            m.glob["kl/policy_ref"] = policy_ref_kl(batch)
    if testhooks.armed("trainer.logprobs"):  # tests: which weights generated the batch (test_async_training)
        versions = torch.full_like(batch.response_ids, -1)  # the weights that sampled each token (-1: unknown)
        for i, r in enumerate(batch.rollouts):
            versions[i, :len(r.versions or ())] = torch.tensor(r.versions or [], dtype=torch.long)
        torch.save({"behaviour": batch.behaviour_log_probs, "old": batch.old_log_probs, "ref": batch.ref_log_probs,
                    "known": batch.behaviour_known(), "versions": versions},
                   f"{run.cfg.logging.out_dir}/logprobs-{step:06d}.rank{run.rank}.pt")
    with timer("advantage"):
        m.glob.update(advantage_stage(run, batch, greedy))
    with timer("update"):
        m.glob.update(update_stage(run, batch))
    if run.remote is not None:  # broadcast to the rollout process, when a later batch needs these weights
        with timer("weight_sync"):
            run.remote.publish(step)
    else:
        with timer("sync"):
            run.rollouts.engine.wake_up()
            run.rollouts.engine.update_weights(run.model)
    metrics = m.finish(int(batch.response_mask.sum()) + sum(len(p.inputs.input_ids) for p in batch.prompts),
                       run.data_parallel.world)
    if "kl/policy_ref" in metrics:  # the controller counts the step's real responses, all ranks
        responses = distributed.all_reduce_floats([sum(not p.padding for p in scored.prompts) * run.cfg.rollout.n],
                                                  group=run.data_parallel.group)
        run.kl.update(metrics["kl/policy_ref"], int(responses[0]))
    metrics["lr"] = run.optimizer.param_groups[0]["lr"]
    return metrics


def log_examples(run: Run, step: int, scored: ScoredGroups, groups: int = 1) -> None:
    """Append the first groups' responses and scores to `<out_dir>/examples.jsonl` (rank 0)."""
    if run.rank != 0 or run.sink is None:
        return
    rows = [{"step": step, "sample": p.sample.problem_id, "answer": p.sample.answer, "response": r.text,
             "offline": r.offline, "reward": x.overall, "accuracy": x.accuracy, "format": x.format}
            for p, grp, res in list(zip(scored.prompts, scored.groups, scored.results))[:groups]
            for r, x in zip(grp, res)]
    with open(f"{run.cfg.logging.out_dir}/examples.jsonl", "a", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)


def checkpoint_run(run: Run, step: int) -> None:
    """Everything that lives across steps: loader position, KL coefficient, skip counts, step (model,
    optimizer, schedule and every rank's RNG are saved by `checkpoint.save_checkpoint`)."""
    state = {"loader": run.loader.state_dict(), "kl_controller": run.kl.state_dict(), "step": step,
             "skips": run.skips.state_dict()}
    ckpt.save_checkpoint(f"{run.cfg.logging.out_dir}/checkpoints", step, run.model, run.optimizer,
                         run.scheduler, state, keep=run.cfg.checkpoint.keep,
                         timeout_minutes=run.cfg.checkpoint.timeout_minutes, config=config_tree.to_dict(run.cfg))


def maybe_resume(run: Run) -> int:
    """Restore the newest complete checkpoint (per `checkpoint.resume`) into `run`; return its step."""
    root = f"{run.cfg.logging.out_dir}/checkpoints"
    ckpt.clean_partial(root)
    # Rank 0 chooses (node-local folders may differ); every rank then loads that one, or stops alike.
    choice: tuple[str | None, str | None] = (None, None)
    if run.rank == 0:
        try:
            path = ckpt.resolve_resume(root, run.cfg.checkpoint.resume)
            choice = (None if path is None else str(path), None)
        except FileNotFoundError as e:
            choice = (None, str(e))
    chosen, error = distributed.all_gather_objects(choice)[0]
    if error is not None:
        raise ConfigError(error)
    if chosen is None:
        return 0
    path = Path(chosen)
    state = ckpt.load_checkpoint(path, run.model, run.optimizer, run.scheduler)
    run.loader.load_state_dict(state["loader"])
    if "skips" in state:  # older checkpoints: the count starts afresh
        run.skips.load_state_dict(state["skips"])
    if "kl_controller" in state:
        run.kl.load_state_dict(state["kl_controller"])
    elif isinstance(run.kl, AdaptiveKLController):
        log.warning("checkpoint %s holds no KL controller state (written by an older version): the adaptive "
                    "KL coefficient restarts at algorithm.kl_coef=%g", path, run.kl.coef)
    run.rollouts.engine.update_weights(run.model)
    log.info("resumed from %s (step %d)", path, state["step"])
    return int(state["step"])


def train(run: Run, on_step: Callable[[int, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run the loop to `training.steps` (or `training.max_minutes`); return the final metrics.

    `on_step(step, metrics)` is called on rank 0 after each step is logged (the demo's ETA)."""
    start = maybe_resume(run)
    if run.remote is not None:
        run.remote.start(run.model, start, run.loader.state_dict())
    bar = run.cfg.logging.progress and run.rank == 0
    try:
        with logging_redirect_tqdm() if bar else contextlib.nullcontext():  # log lines above the bar, not in it
            return _loop(run, start, on_step)
    finally:
        if run.remote is not None:
            run.remote.close()


def _loop(run: Run, start: int, on_step: Callable[[int, dict[str, Any]], None] | None) -> dict[str, Any]:
    cfg = run.cfg
    progress = None
    if cfg.logging.progress and run.rank == 0:
        progress = tqdm(total=cfg.training.steps, initial=start, desc="train", unit="step", dynamic_ncols=True)
    began = previous_row = time.monotonic()
    last: dict[str, Any] = {}
    for step in range(start + 1, cfg.training.steps + 1):
        run.step = step
        metrics = train_step(run, step)
        if cfg.training.val_every and step % cfg.training.val_every == 0 and run.val_samples:
            metrics.update(validate(run))
        # Wall clock since the previous row (the first: since the loop began), so what the stage
        # timers of `time/step` leave out (validation, logging, checkpoints) is counted too.
        now = time.monotonic()
        metrics["time/wall"], previous_row = now - previous_row, now
        if run.sink is not None and run.rank == 0:
            run.sink.log(step, metrics)
        run.history.append(metrics)
        last = metrics
        if on_step is not None and run.rank == 0:
            on_step(step, metrics)
        minutes_left = cfg.training.max_minutes - (time.monotonic() - began) / 60
        out_of_time = bool(cfg.training.max_minutes) and distributed.any_true(minutes_left <= 0)  # one decision
        if progress is not None:
            progress.update(1)
            line = console_line(metrics, ("reward/all", "accuracy/all")) + skipped_note(metrics)
            if isinstance(metrics.get("time/step"), (int, float)):  # seconds per step, not a step number
                line += f"  {metrics['time/step']:.3g}s/step"
            if cfg.training.max_minutes:  # the bar's ETA counts to training.steps; the budget may end first
                line += f"  budget_left={max(0.0, minutes_left):.1f}min"
            progress.set_postfix_str(line)
        if cfg.checkpoint.every and step % cfg.checkpoint.every == 0:
            checkpoint_run(run, step)
        if out_of_time:
            log.info("stopping after %.1f minutes (training.max_minutes)", cfg.training.max_minutes)
            break
    if progress is not None:
        progress.close()
    every = cfg.checkpoint.every  # 0: no checkpoints; else every k steps and after the last one
    if every and run.step and run.step % every:
        checkpoint_run(run, run.step)
    if run.sink is not None:
        run.sink.close()  # flushes TensorBoard, finishes the W&B run
    return last
