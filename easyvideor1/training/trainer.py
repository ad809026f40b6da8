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

from easyvideor1.algorithms import ADVANTAGES, kl_estimate, kl_reward_penalty, make_kl_controller
from easyvideor1.config import Config
from easyvideor1.records import Sample
from easyvideor1.rollout.base import RolloutEngine, SamplingParams
from easyvideor1.training import checkpoint as ckpt
from easyvideor1.training.groups import ScoredGroups, ScoreFn, fill_filtered_batch, generate_scored_groups, reward_metrics
from easyvideor1.training.loader import PromptLoader, rank_slice
from easyvideor1.training.metrics import MetricsSink, console_line, gather_values, mean_over_ranks
from easyvideor1.training.prompts import prepare_prompts
from easyvideor1.training.sequences import ForwardContext, RolloutBatch, all_logprobs, make_batch
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
    score_fn: ScoreFn
    optimizer: torch.optim.Optimizer
    scheduler: Any
    loader: PromptLoader
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


def rank_seed_offset(run: Run, n: int) -> int:
    """Responses the ranks before this one generate from the current global batch (vLLM's
    per-request seed rule: the seed of a sample is base + its position in the global batch)."""
    from easyvideor1.training.hybrid import online_count

    batch = run.loader.peek_batch()
    per = len(batch) // run.world
    return sum(online_count(s, n, run.cfg.hybrid) for s in batch[: run.rank * per])


def rollout_stage(run: Run, step: int, timer: StageTimer) -> ScoredGroups:
    """Prompts of this step -> scored groups (with dynamic sampling when enabled)."""
    cfg = run.cfg
    tokenizer = run.processor.tokenizer

    def next_prompts():
        batch = run.loader.next_batch()
        samples = rank_slice(batch, run.rank, run.world)
        with timer("prepare"):
            prompts, failures = prepare_prompts(samples, run.frames, run.processor, run.ctx.family, run.ctx.spec,
                                                cfg.data.template_dir, cfg.data.max_prompt_tokens)
        run_failures.extend(failures)
        return prompts

    run_failures: list = []
    params = sampling_params(cfg, step, tokenizer)
    if run.world > 1:  # per-sample seeds as in one process: offset by the earlier ranks' samples
        params.seed += rank_seed_offset(run, cfg.rollout.n)
    prepared_before = timer.times.get("time/prepare", 0.0)
    with timer("rollout"):  # prepare runs inside it (per round when filtering): subtracted below
        if cfg.algorithm.online_filtering:
            target = cfg.training.rollout_batch_size // run.world
            scored = fill_filtered_batch(next_prompts, run.engine, params, cfg.rollout.n, cfg.hybrid, cfg.algorithm,
                                         run.score_fn, tokenizer, run.end_token, target)
        else:
            scored = generate_scored_groups(next_prompts(), run.engine, params, cfg.rollout.n, cfg.hybrid,
                                            run.score_fn, tokenizer, run.end_token)
    timer.times["time/rollout"] -= timer.times.get("time/prepare", 0.0) - prepared_before
    scored.filter_metrics["data/prompt_failures"] = float(len(run_failures))
    return scored


def advantage_stage(run: Run, batch: RolloutBatch, kl_coef: float) -> dict[str, float]:
    """Fill `batch.advantages` with the configured estimator (KL-in-reward when configured)."""
    algo = run.cfg.algorithm
    rewards = torch.tensor([r.overall for r in batch.results], dtype=torch.float32)
    parts = {k: torch.tensor([r.parts.get(k, getattr(r, k, 0.0)) for r in batch.results], dtype=torch.float32)
             for k in algo.gdpo_reward_keys}
    penalty = None
    if algo.kl_in_reward:
        penalty = kl_reward_penalty(batch.old_log_probs, batch.ref_log_probs, batch.response_mask,
                                    kind=algo.kl_estimator, coef=kl_coef)
    batch.advantages = ADVANTAGES[algo.adv_estimator](
        rewards=rewards, group_ids=batch.group_ids, response_mask=batch.response_mask.float(), kl_penalty=penalty,
        greedy_rewards=None, reward_parts=parts, **algo.estimator_kwargs())
    mask = batch.response_mask
    return {"advantage/mean": float(batch.advantages[mask].mean()) if mask.any() else 0.0,
            "advantage/abs_max": float(batch.advantages[mask].abs().max()) if mask.any() else 0.0}


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


def train_step(run: Run, step: int, kl_ctrl) -> dict[str, float]:
    cfg, timer = run.cfg, StageTimer()
    scored = rollout_stage(run, step, timer)
    run.engine.sleep()  # the engine's memory goes to the log-prob passes and the update
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
                                     kl_coef=kl_ctrl.coef))
    if run.scheduler is not None:
        run.scheduler.step()
    with timer("sync"):
        run.engine.wake_up()
        run.engine.update_weights(run.model)
    if batch.ref_log_probs is not None:
        if batch.old_log_probs is not None:
            kl = kl_estimate(batch.old_log_probs, batch.ref_log_probs, "k1")
            local["kl/policy_ref"] = float(kl[batch.response_mask].mean()) if batch.response_mask.any() else 0.0
        else:
            local["kl/policy_ref"] = local.get("actor/kl_loss", 0.0)
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


def _checkpoint(run: Run, step: int) -> None:
    state = {"loader": run.loader.state_dict(), "step": step}
    ckpt.save_checkpoint(f"{run.cfg.logging.out_dir}/checkpoints", step, run.model, run.optimizer,
                         run.scheduler, state, keep=run.cfg.checkpoint.keep)


def maybe_resume(run: Run) -> int:
    """Restore the newest complete checkpoint (per `checkpoint.resume`); return its step."""
    root = f"{run.cfg.logging.out_dir}/checkpoints"
    ckpt.clean_partial(root)
    path = ckpt.resolve_resume(root, run.cfg.checkpoint.resume)
    if path is None:
        return 0
    state = ckpt.load_checkpoint(path, run.model, run.optimizer, run.scheduler)
    run.loader.load_state_dict(state["loader"])
    run.engine.update_weights(run.model)
    log.info("resumed from %s (step %d)", path, state["step"])
    return int(state["step"])


def train(run: Run) -> dict[str, Any]:
    """Run the loop to `training.steps` (or `training.max_minutes`); return the final metrics."""
    cfg = run.cfg
    start = maybe_resume(run)
    kl_ctrl = make_kl_controller(cfg.algorithm)
    progress = None
    if cfg.logging.progress and run.rank == 0:
        from tqdm import tqdm

        progress = tqdm(total=cfg.training.steps, initial=start, desc="train", unit="step", dynamic_ncols=True)
    began = time.monotonic()
    last: dict[str, Any] = {}
    for step in range(start + 1, cfg.training.steps + 1):
        run.step = step
        metrics = train_step(run, step, kl_ctrl)
        if cfg.training.val_every and step % cfg.training.val_every == 0 and run.val_samples:
            metrics.update(validate(run, step))
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
            _checkpoint(run, step)
        if cfg.training.max_minutes and minutes_left <= 0:
            log.info("stopping after %.1f minutes (training.max_minutes)", cfg.training.max_minutes)
            break
    if progress is not None:
        progress.close()
    if run.step and (not cfg.checkpoint.every or run.step % cfg.checkpoint.every):
        _checkpoint(run, run.step)
    return last
