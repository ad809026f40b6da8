"""Validation during training: greedy responses on held-out samples, scored per problem_type."""

from __future__ import annotations

from collections import defaultdict

from easyvideor1 import distributed
from easyvideor1.training.metrics import gather_values
from easyvideor1.training.run import Run


def task_of(sample) -> str:
    """The breakdown key of a sample: its `task` field when present (synthetic suite), else problem_type."""
    return str(sample.extra.get("task") or sample.problem_type).lower().replace(" ", "_")


def validate(run: Run) -> dict[str, float]:
    """Mean accuracy / reward / format per task and overall on `run.val_samples` (greedy unless
    `rollout.val_temperature` > 0), and with `rollout.tools` the share of responses that called a
    tool (`val/tool_call_rate/<task>`). Samples that fail to load count as wrong (and no call)."""
    cfg = run.cfg
    samples = run.val_samples[: cfg.training.val_max_samples or None]
    mine = samples[run.rank::run.world]
    prompts, failures = run.prompts.build_many(mine)
    params = run.rollouts.params(0, temperature=cfg.rollout.val_temperature)
    rollouts = run.rollouts.generate(prompts, 1, params)  # every rank joins: lockstep / TP groups
    responses = [grp[0].text for grp in rollouts]
    tools = bool(cfg.rollout.tools)  # multi-turn: also the share of responses that called a tool
    results = run.rollouts.score_fn(responses, [p.sample for p in prompts]) if prompts else []
    sums: dict[str, list[float]] = defaultdict(list)
    for prompt, res, grp in zip(prompts, results, rollouts):
        for key in (task_of(prompt.sample), "all"):
            if tools:
                sums[f"val/tool_call_rate/{key}"].append(float(bool(grp[0].tool_calls)))
            sums[f"val/accuracy/{key}"].append(res.accuracy)
            sums[f"val/reward/{key}"].append(res.overall)
            sums[f"val/format/{key}"].append(res.format)
    failed = {f.sample_id for f in failures}
    for sample in mine:
        if sample.problem_id in failed:
            for key in (task_of(sample), "all"):
                for name in ("accuracy", "reward", "format") + (("tool_call_rate",) if tools else ()):
                    sums[f"val/{name}/{key}"].append(0.0)
    n_failed = len(failures)
    sums = gather_values(sums)  # every rank scored its share: the raw scores of all
    n_failed = distributed.all_reduce_floats([n_failed])[0]
    metrics = {k: sum(v) / len(v) for k, v in sums.items()}
    metrics["val/failed"] = float(n_failed)
    return metrics
