"""The RL loop. One function per stage, called top to bottom:

    prompts (frames + processor, once) -> rollout n per prompt -> hybrid slot -> rewards
    -> (dynamic sampling) -> old / ref log-probs -> advantages -> PPO update -> weight sync
    -> metrics -> validation / checkpoint

Everything the loop needs arrives in a `Run` (built by `training.setup.build_run`), so a
test can hand in a tiny model, another engine or another score function.
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from easyvideor1 import distributed
from easyvideor1.algorithms import ADVANTAGES, kl_reward_penalty, make_kl_controller
from easyvideor1.algorithms.kl import AdaptiveKLController, KLController
from easyvideor1.config import Config
from easyvideor1.records import Sample
from easyvideor1.rollout.base import Prompt, RolloutEngine, SamplingParams
from easyvideor1.training import checkpoint as ckpt
from easyvideor1.training.groups import (
    BatchScoreFn,
    ScoredGroups,
    fill_filtered_batch,
    generate_scored_groups,
    pad_groups,
    reward_metrics,
)
from easyvideor1.training.loader import PromptLoader, rank_slice
from easyvideor1.training.metrics import MetricsSink, console_line, gather_values, mean_over_ranks
from easyvideor1.training.prompts import prepare_prompts
from easyvideor1.training.sequences import ForwardContext, RolloutBatch, all_full_kl, all_logprobs, make_batch
from easyvideor1.training.update import policy_update
from easyvideor1.training.validation import validate
from easyvideor1.vision.cache import FrameSource

log = logging.getLogger(__name__)


@dataclass
class Run:
    """Everything one training run uses; built once by `setup.build_run`."""

    cfg: Config
    model: torch.nn.Module  # the policy (FSDP2-sharded when distributed)
    reference: torch.nn.Module | None  # frozen reference (None when KL is off)
    engine: RolloutEngine
    processor: Any
    ctx: ForwardContext
    frames: FrameSource
    score_fn: BatchScoreFn
    optimizer: torch.optim.Optimizer
    scheduler: Any
    loader: PromptLoader
    padding: Prompt | None = None  # fully masked stand-in for samples that failed (`rollout.base.empty_prompt`)
    val_samples: list[Sample] = field(default_factory=list)
    sink: MetricsSink | None = None
    rank: int = 0
    world: int = 1
    end_token: str = "<|im_end|>"
    step: int = 0
    history: list[dict[str, float]] = field(default_factory=list)


class StageTimer:
    def __init__(self):
        self.times: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        yield
        self.times[f"time/{name}"] = self.times.get(f"time/{name}", 0.0) + time.perf_counter() - start


def stop_token_ids(cfg: Config, tokenizer) -> tuple[int, ...]:
    """Ids of `rollout.stop_tokens`; each must be one token of the tokenizer."""
    vocab = tokenizer.get_vocab()
    missing = [t for t in cfg.rollout.stop_tokens if t not in vocab]
    if missing:
        raise ValueError(f"rollout.stop_tokens {missing} are not single tokens of the model's tokenizer")
    return tuple(vocab[t] for t in cfg.rollout.stop_tokens)


def sampling_params(cfg: Config, step: int, tokenizer, temperature: float | None = None) -> SamplingParams:
    r = cfg.rollout
    greedy = temperature == 0.0
    return SamplingParams(temperature=r.temperature if temperature is None else temperature,
                          top_p=1.0 if greedy else r.top_p, top_k=-1 if greedy else r.top_k,
                          max_tokens=r.max_tokens, seed=cfg.training.seed * 1_000_003 + step,
                          stop_token_ids=stop_token_ids(cfg, tokenizer), include_stop_str_in_output=True)


def rollout_stage(run: Run, step: int, timer: StageTimer) -> ScoredGroups:
    """Prompts of this step -> scored groups (with dynamic sampling when enabled).

    Every rank ends with the same number of groups (`training.rollout_batch_size` / ranks): a
    sample that fails to load is reported and its slot padded with a fully masked group, and
    dynamic sampling generates rounds until every rank is full. So every rank runs the same
    micro-batches, and FSDP's collectives stay in step.
    """
    cfg = run.cfg
    tokenizer = run.processor.tokenizer
    per_rank, n = cfg.training.rollout_batch_size // run.world, cfg.rollout.n
    run_failures: list = []

    def next_prompts():
        samples = rank_slice(run.loader.next_batch(), run.rank, run.world)
        with timer("prepare"):  # seeds numbered by the global slot: the same in 1 or N processes
            prompts, failures = prepare_prompts(samples, run.frames, run.processor, run.ctx.family, run.ctx.spec,
                                                cfg.data.template_dir, cfg.data.max_prompt_tokens,
                                                seed_slots=(run.rank * per_rank * n, n))
        run_failures.extend(failures)
        return prompts

    params = sampling_params(cfg, step, tokenizer)
    prepared_before = timer.times.get("time/prepare", 0.0)
    with timer("rollout"):  # prepare runs inside it (per round when filtering): subtracted below
        if cfg.algorithm.online_filtering:
            scored = fill_filtered_batch(next_prompts, run.engine, params, n, cfg.hybrid, cfg.algorithm,
                                         run.score_fn, tokenizer, run.end_token, per_rank)
        else:
            scored = generate_scored_groups(next_prompts(), run.engine, params, n, cfg.hybrid,
                                            run.score_fn, tokenizer, run.end_token)
    timer.times["time/rollout"] -= timer.times.get("time/prepare", 0.0) - prepared_before
    pad_groups(scored, per_rank, run.padding, n)
    scored.filter_metrics["data/prompt_failures"] = distributed.all_reduce_floats([len(run_failures)])[0]
    return scored


def greedy_baseline(run: Run, batch: RolloutBatch) -> tuple[torch.Tensor, dict[str, float]]:
    """ReMax's baseline: one greedy (temperature 0) response per prompt from the same engine,
    scored by the same `score_fn`; returns its reward per response [N] and the global mean
    greedy reward. The greedy responses are never trained on."""
    params = sampling_params(run.cfg, run.step, run.processor.tokenizer, temperature=0.0)
    start = time.perf_counter()
    greedy = [grp[0] for grp in run.engine.generate(batch.prompts, 1, params)]
    results = run.score_fn([r.text for r in greedy], [p.sample for p in batch.prompts])
    per_prompt = torch.tensor([x.overall for x in results], dtype=torch.float32)  # [G]
    total, count = distributed.all_reduce_floats([float(per_prompt.sum()), float(per_prompt.numel())])
    return per_prompt[batch.group_ids], {"remax/greedy_reward": total / max(count, 1.0),
                                         "time/greedy_rollout": time.perf_counter() - start}


def advantage_stage(run: Run, batch: RolloutBatch, kl_coef: float) -> dict[str, float]:
    """Fill `batch.advantages` with the configured estimator (KL-in-reward when configured).

    Batch statistics (REINFORCE++ and GDPO whitening) are reduced over every data-parallel rank.
    """
    algo = run.cfg.algorithm
    rewards = torch.tensor([r.overall for r in batch.results], dtype=torch.float32)
    parts = {k: torch.tensor([r.parts.get(k, getattr(r, k, 0.0)) for r in batch.results], dtype=torch.float32)
             for k in algo.gdpo_reward_keys}
    metrics: dict[str, float] = {}
    penalty = None
    if algo.kl_in_reward:
        # `full` needs the old policy's and the reference's distributions at every response token
        full = all_full_kl(run.model, run.reference, batch, run.ctx) if algo.kl_estimator == "full" else None
        penalty = kl_reward_penalty(batch.old_log_probs, batch.ref_log_probs, batch.response_mask,
                                    kind=algo.kl_estimator, coef=kl_coef, full_kl=full)
    greedy = None
    if algo.needs_greedy_rollout:
        greedy, greedy_metrics = greedy_baseline(run, batch)
        metrics.update(greedy_metrics)
    batch.advantages = ADVANTAGES[algo.adv_estimator](
        rewards=rewards, group_ids=batch.group_ids, response_mask=batch.response_mask.float(), kl_penalty=penalty,
        greedy_rewards=greedy, reward_parts=parts, all_reduce_floats=distributed.all_reduce_floats,
        **algo.estimator_kwargs())
    mask = batch.response_mask
    metrics["advantage/mean"] = float(batch.advantages[mask].mean()) if mask.any() else 0.0
    metrics["advantage/abs_max"] = float(batch.advantages[mask].abs().max()) if mask.any() else 0.0
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


def parity_metrics(batch: RolloutBatch) -> dict[str, float]:
    """Engine vs trainer log-probs of the generated tokens, max / mean gap per modality."""
    gaps: dict[str, list[torch.Tensor]] = {}
    for i, r in enumerate(batch.rollouts):
        if r.offline or r.logprobs is None:
            continue
        n = len(r.token_ids)
        gap = (batch.behaviour_log_probs[i, :n] - batch.old_log_probs[i, :n]).abs()
        gaps.setdefault(batch.prompts[int(batch.group_ids[i])].modality, []).append(gap)
    out = {}
    for modality, parts in gaps.items():
        g = torch.cat(parts)
        out[f"parity/max_gap/{modality}"] = float(g.max()) if g.numel() else 0.0
        out[f"parity/mean_gap/{modality}"] = float(g.mean()) if g.numel() else 0.0
    return out


def policy_ref_kl(batch: RolloutBatch) -> float:
    """KL(policy || reference) of the step, the k1 estimate: mean of old - ref log-prob over every
    response token of every rank (what `kl/policy_ref` logs and the adaptive controller reads)."""
    mask = batch.response_mask
    total, tokens = distributed.all_reduce_floats(
        [float(torch.where(mask, batch.old_log_probs - batch.ref_log_probs, 0.0).sum()), float(mask.sum())])
    return total / tokens if tokens else 0.0


def train_step(run: Run, step: int, kl_ctrl) -> dict[str, float]:
    cfg, timer = run.cfg, StageTimer()
    scored = rollout_stage(run, step, timer)
    log_examples(run, step, scored)
    metrics = reward_metrics(scored, gather=gather_values)
    local: dict[str, float] = {}  # per-rank numbers, averaged over ranks below
    batch = make_batch(scored.prompts, scored.groups)
    batch.results = [x for res in scored.results for x in res]

    n_mini = cfg.training.rollout_batch_size // cfg.training.mini_batch_size
    on_policy = cfg.training.ppo_epochs == 1 and n_mini == 1
    parity_step = bool(cfg.rollout.parity_check_every) and step % cfg.rollout.parity_check_every == 0
    with timer("old_logprob"):
        # Strictly on-policy (one update over the whole batch) the old log-probs are the
        # current ones, detached: computed inside the update, saving a forward pass.
        skip = on_policy and not cfg.algorithm.kl_in_reward and not parity_step
        batch.old_log_probs = None if skip else all_logprobs(run.model, batch, run.ctx)
    if parity_step:
        local.update(parity_metrics(batch))
    if run.reference is not None:
        with timer("ref_logprob"):
            batch.ref_log_probs = all_logprobs(run.reference, batch, run.ctx)
    with timer("advantage"):
        local.update(advantage_stage(run, batch, kl_ctrl.coef))
    with timer("update"):
        local.update(policy_update(run.model, run.optimizer, batch, cfg.algorithm, run.ctx,
                                     ppo_epochs=cfg.training.ppo_epochs, n_mini=n_mini,
                                     grad_clip=cfg.training.grad_clip, max_len=cfg.rollout.max_tokens,
                                     kl_coef=kl_ctrl.coef, reference=run.reference))
    if run.scheduler is not None:
        run.scheduler.step()
    with timer("sync"):
        run.engine.update_weights(run.model)
    if batch.ref_log_probs is not None and batch.old_log_probs is not None:
        local["kl/policy_ref"] = policy_ref_kl(batch)  # else the update measured it on the same tokens
    local.update(timer.times)
    step_time = sum(timer.times.values())
    tokens = int(batch.response_mask.sum()) + sum(len(p.inputs.input_ids) for p in batch.prompts)
    local.update({"time/step": step_time, "perf/tokens_per_s": tokens / max(step_time, 1e-9)})
    metrics.update(mean_over_ranks(local))
    if "kl/policy_ref" in metrics:
        kl_ctrl.update(metrics["kl/policy_ref"], batch.size * run.world)
    metrics["perf/tokens_per_s"] *= run.world  # every rank processed its share in that time
    metrics["lr"] = run.optimizer.param_groups[0]["lr"]
    return metrics


def _checkpoint(run: Run, step: int, kl_ctrl: KLController) -> None:
    """Everything that lives across steps: loader position, KL coefficient, step (model,
    optimizer, schedule and every rank's RNG are saved by `checkpoint.save_checkpoint`)."""
    state = {"loader": run.loader.state_dict(), "kl_controller": kl_ctrl.state_dict(), "step": step}
    ckpt.save_checkpoint(f"{run.cfg.logging.out_dir}/checkpoints", step, run.model, run.optimizer,
                         run.scheduler, state, keep=run.cfg.checkpoint.keep)


def maybe_resume(run: Run, kl_ctrl: KLController) -> int:
    """Restore the newest complete checkpoint (per `checkpoint.resume`) into `run` and
    `kl_ctrl`; return its step."""
    root = f"{run.cfg.logging.out_dir}/checkpoints"
    ckpt.clean_partial(root)
    path = ckpt.resolve_resume(root, run.cfg.checkpoint.resume)
    if path is None:
        return 0
    state = ckpt.load_checkpoint(path, run.model, run.optimizer, run.scheduler)
    run.loader.load_state_dict(state["loader"])
    if "kl_controller" in state:
        kl_ctrl.load_state_dict(state["kl_controller"])
    elif isinstance(kl_ctrl, AdaptiveKLController):
        log.warning("checkpoint %s holds no KL controller state (written by an older version): the adaptive "
                    "KL coefficient restarts at algorithm.kl_coef=%g", path, kl_ctrl.coef)
    run.engine.update_weights(run.model)
    log.info("resumed from %s (step %d)", path, state["step"])
    return int(state["step"])


def train(run: Run) -> dict[str, Any]:
    """Run the loop to `training.steps` (or `training.max_minutes`); return the final metrics."""
    cfg = run.cfg
    kl_ctrl = make_kl_controller(cfg.algorithm)
    start = maybe_resume(run, kl_ctrl)
    progress = None
    if cfg.logging.progress and run.rank == 0:
        from tqdm import tqdm

        progress = tqdm(total=cfg.training.steps, initial=start, desc="train", unit="step", dynamic_ncols=True)
    began = previous_row = time.monotonic()
    last: dict[str, Any] = {}
    for step in range(start + 1, cfg.training.steps + 1):
        run.step = step
        metrics = train_step(run, step, kl_ctrl)
        if cfg.training.val_every and step % cfg.training.val_every == 0 and run.val_samples:
            metrics.update(validate(run, step))
        # Wall clock since the previous row (the first: since the loop began), so what the stage
        # timers of `time/step` leave out (validation, logging, checkpoints) is counted too.
        now = time.monotonic()
        metrics["time/wall"], previous_row = now - previous_row, now
        if run.sink is not None and run.rank == 0:
            run.sink.log(step, metrics)
        run.history.append(metrics)
        last = metrics
        minutes_left = cfg.training.max_minutes - (time.monotonic() - began) / 60
        if progress is not None:
            progress.update(1)
            line = console_line(metrics, ("reward/all", "accuracy/all", "time/step"))
            if cfg.training.max_minutes:  # the bar's ETA counts to training.steps; the budget may end first
                line += f"  budget_left={max(0.0, minutes_left):.1f}min"
            progress.set_postfix_str(line)
        if cfg.checkpoint.every and step % cfg.checkpoint.every == 0:
            _checkpoint(run, step, kl_ctrl)
        if cfg.training.max_minutes and minutes_left <= 0:
            log.info("stopping after %.1f minutes (training.max_minutes)", cfg.training.max_minutes)
            break
    if progress is not None:
        progress.close()
    every = cfg.checkpoint.every  # 0: no checkpoints; else every k steps and after the last one
    if every and run.step and run.step % every:
        _checkpoint(run, run.step, kl_ctrl)
    return last
