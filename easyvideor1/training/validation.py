"""Validation during training: greedy responses on held-out samples, scored per problem_type."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from easyvideor1 import distributed
from easyvideor1.training.prompts import prepare_prompts

if TYPE_CHECKING:
    from easyvideor1.training.trainer import Run


def task_of(sample) -> str:
    """The breakdown key of a sample: its `task` field when present (synthetic suite), else problem_type."""
    return str(sample.extra.get("task") or sample.problem_type).lower().replace(" ", "_")


def validate(run: Run, step: int) -> dict[str, float]:
    from easyvideor1.training.trainer import sampling_params

    """Mean accuracy / reward / format per task and overall on `run.val_samples` (greedy unless
    `rollout.val_temperature` > 0). Samples that fail to load count as wrong."""
    cfg = run.cfg
    samples = run.val_samples[: cfg.training.val_max_samples or None]
    mine = samples[run.rank::run.world]
    prompts, failures = prepare_prompts(mine, run.frames, run.processor, run.ctx.family, run.ctx.spec,
                                        cfg.data.template_dir, cfg.data.max_prompt_tokens)
    params = sampling_params(cfg, 0, run.processor.tokenizer, temperature=cfg.rollout.val_temperature)
    rollouts = run.engine.generate(prompts, 1, params)  # every rank calls: a vLLM TP group gathers inside
    responses = [grp[0].text for grp in rollouts]
    results = run.score_fn(responses, [p.sample for p in prompts]) if prompts else []
    sums: dict[str, list[float]] = defaultdict(list)
    for prompt, res in zip(prompts, results):
        for key in (task_of(prompt.sample), "all"):
            sums[f"val/accuracy/{key}"].append(res.accuracy)
            sums[f"val/reward/{key}"].append(res.overall)
            sums[f"val/format/{key}"].append(res.format)
    failed = {f.sample_id for f in failures}
    for sample in mine:
        if sample.problem_id in failed:
            for key in (task_of(sample), "all"):
                for name in ("accuracy", "reward", "format"):
                    sums[f"val/{name}/{key}"].append(0.0)
    n_failed = len(failures)
    if run.world > 1:  # every rank scored its share: gather the raw scores
        gathered = distributed.all_gather_objects((dict(sums), n_failed))
        sums, n_failed = defaultdict(list), sum(f for _, f in gathered)
        for part, _ in gathered:
            for k, v in part.items():
                sums[k].extend(v)
    metrics = {k: sum(v) / len(v) for k, v in sums.items()}
    metrics["val/failed"] = float(n_failed)
    return metrics
