"""The embedded default: everything from nothing on a laptop CPU.

tiny model -> synthetic tasks -> frame cache -> validation before -> GRPO + hybrid groups
-> validation after -> report (table beside chance levels, curves as PNG) -> the trained model
as an HF folder carrying its settings (`hf_model/`), and the `eval` line that scores it.
"""

from __future__ import annotations

import json
import logging
import time
from importlib import resources
from pathlib import Path

from tqdm import tqdm

from easyvideor1.config import demo_config_path, load_config
from easyvideor1.data.loading import load_samples
from easyvideor1.data.synth import (CHANCE, DEMO_TOOLS_MIX, DEMO_TRAIN, DEMO_TRAIN_MIX, DEMO_VAL, OPT_IN_TASKS, TASKS,
                                   write_suite)
from easyvideor1.models import model_settings
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.training.report import write_training_report
from easyvideor1.training.setup import build_run
from easyvideor1.training.state.export import eval_command, export_model
from easyvideor1.training.trainer import train
from easyvideor1.training.validation import validate
from easyvideor1.vision.cache_build import build_cache

log = logging.getLogger(__name__)

LIMIT_MINUTES = 15.0  # the whole demo on a 2-core CPU; the ETA warns past it
ETA_FIRST = 20  # steps measured before the first ETA
GROUNDING = ("when", "where")
ASYNC_OVERRIDES = ["rollout.placement=separate", "training.max_staleness=1"]  # `demo --async`
CLASSIFICATION = ("colour", "motion", "count", "presence", "image_colour", "image_count")
# `demo --tools`: the flash task joins the suite (five shares of training, `DEMO_TOOLS_MIX`; 24 held-out samples like
# every task) and the model may call crop_video on flash samples (the suite gives the other rows
# `tools: []`): a call, a tool turn with the window's clip (16 visual tokens per two frames) and the answer
# share `rollout.max_tokens` (a flash sample's correct trajectory: 225 tokens).
# Padding-free rows: a flash prompt (the tools' system text, the clip) is ~4x as long as the
# others, and padded rows were 63% padding (update 2.3 s of a 3.9 s step).
# Token-mean loss: a flash trajectory has ~65 own tokens against ~15 for an answer alone, and its
# two window digits are what it has to learn; averaging each response first gave each of those
# tokens a quarter of an answer token's weight.
# Full learning rate for 60% of the steps, then the cosine decay: with the decay from step 0 the
# window digits began to be copied only at step ~900, when the rate was already halved, and were
# still being learnt at the end (docs/concepts/video-tools.md).
TOOL_OVERRIDES = ["rollout.tools=[crop_video]", "rollout.max_turns=2", "rollout.max_tokens=400",
                  "training.padding_free=true", "algorithm.loss_agg_mode=token_mean", "training.lr_decay_start=0.6"]


def demo_template_path() -> str:
    """The demo's prompt: question and options only (see the template's comment)."""
    return str(resources.files("easyvideor1") / "templates" / "demo_terse.jinja")


def demo_overrides(model_dir: str | Path, paths: dict[str, Path], cache_dir: str | Path, out_dir: str | Path,
                   seed: int) -> list[str]:
    """What the demo sets on top of `demo_cpu.yaml`: its model, data, cache, run folder, seed, prompt."""
    return [f"model.path={model_dir}", f"data.train_files=[{paths['train']}]", f"data.val_files=[{paths['val']}]",
            f"data.cache_dir={cache_dir}", f"logging.out_dir={out_dir}", f"training.seed={seed}",
            f"data.template_dir={demo_template_path()}"]


def summary(metrics: dict[str, float]) -> tuple[float, float]:
    """(mean accuracy of the classification tasks, mean IoU of the grounding tasks)."""
    cls = [metrics.get(f"val/accuracy/{t}", 0.0) for t in CLASSIFICATION]
    grd = [metrics.get(f"val/accuracy/{t}", 0.0) for t in GROUNDING]
    return sum(cls) / len(cls), sum(grd) / len(grd)


def _table(before: dict[str, float], after: dict[str, float]) -> str:
    lines = ["| task | metric | chance | before | after |", "| --- | --- | --- | --- | --- |"]
    for task in TASKS + tuple(t for t in OPT_IN_TASKS if f"val/accuracy/{t}" in after):
        metric = "mean IoU" if task in GROUNDING else "accuracy"
        chance = f"{CHANCE[task]:.2f}" if task in CHANCE else "~0"
        key = f"val/accuracy/{task}"
        lines.append(f"| {task} | {metric} | {chance} | {before.get(key, 0):.2f} | {after.get(key, 0):.2f} |")
        if task in OPT_IN_TASKS and f"val/tool_call_rate/{task}" in after:
            rate = f"val/tool_call_rate/{task}"
            lines.append(f"| {task} | tool-call rate | | {before.get(rate, 0):.2f} | {after.get(rate, 0):.2f} |")
    (cls_b, grd_b), (cls, grd) = summary(before), summary(after)
    lines.append(f"| **classification (mean)** | accuracy | | {cls_b:.2f} | {cls:.2f} |")
    lines.append(f"| **grounding (mean)** | mean IoU | | {grd_b:.2f} | {grd:.2f} |")
    return "\n".join(lines)


class Eta:
    """Prints when the demo should end, from the measured step rate; warns past `LIMIT_MINUTES`.

    Only what is printed depends on the clock: the run always trains all its steps, so a slow or
    busy machine only ends later.
    """

    def __init__(self, began: float, steps: int, tail_s: float, first: int = ETA_FIRST):
        self.began, self.steps, self.tail_s = began, steps, tail_s
        self.at = ({min(first, steps)} | {steps * k // 4 for k in (1, 2, 3)}) - {steps}  # none once trained
        self.walls: list[float] = []
        self.warned = False

    def __call__(self, step: int, metrics: dict[str, float]) -> None:
        self.walls.append(metrics.get("time/wall", 0.0))
        if step not in self.at:
            return
        timed = sorted(self.walls[1:] or self.walls)  # the first step warms up
        rate = timed[len(timed) // 2]  # the median: one slow step (a checkpoint) does not move it
        elapsed = time.monotonic() - self.began
        whole = (elapsed + (self.steps - step) * rate + self.tail_s) / 60
        tqdm.write(f"[demo] ETA: step {step}/{self.steps} at {rate:.2f} s/step; training ends in "
                   f"~{(self.steps - step) * rate / 60:.1f} min, the demo in ~{whole:.1f} min in all")
        if whole > LIMIT_MINUTES and not self.warned:
            self.warned = True
            tqdm.write(f"[demo] WARNING: the demo will take ~{whole:.0f} min, over {LIMIT_MINUTES:g} min: this machine is "
                  f"slower or busier than the one it was sized on. It still trains all {self.steps} steps, only "
                       "slower; --steps N trains fewer (a weaker result).")


def run_demo(out: str | Path, steps: int | None = None, hybrid: bool = True, seed: int = 0,
             overrides: list[str] | None = None, num_train: int = DEMO_TRAIN, num_val: int = DEMO_VAL,
             model_size: str = "tiny", asynchronous: bool = False, tools: bool = False) -> dict[str, float]:
    """Run the whole demo under `out`; return the validation metrics after training.

    `asynchronous`: a rollout process generates and scores while the trainer updates, one step
    stale (`ASYNC_OVERRIDES`). `tools`: the flash task joins the suite and responses may call
    crop_video (`TOOL_OVERRIDES`; the default held-out count then grows to keep 24 per task).

    Trains a fixed number of steps (`steps`, default the demo config's `training.steps`), so one
    seed gives one table whatever the machine's speed or load."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    out = Path(out)
    t0 = time.monotonic()
    print(f"[demo] 1/6 tiny model -> {out / 'model'}")
    model_dir = build_tiny_model("qwen2_5_vl", out / "model", seed=seed, size=model_size)
    print(f"[demo] 2/6 synthetic tasks -> {out / 'data'}")
    tasks, mix = (TASKS + OPT_IN_TASKS, DEMO_TOOLS_MIX) if tools else (TASKS, DEMO_TRAIN_MIX)
    if tools and num_val == DEMO_VAL:
        num_val = DEMO_VAL // len(TASKS) * len(tasks)
    paths = write_suite(out / "data", num_train=num_train, num_val=num_val, seed=seed, tasks=tasks, train_mix=mix)
    cfg = load_config(demo_config_path(), [
        *demo_overrides(model_dir, paths, out / "cache", out / "train", seed), f"hybrid.enable={str(hybrid).lower()}",
        *(TOOL_OVERRIDES if tools else []),
        *([f"training.steps={steps}"] if steps is not None else []), *(ASYNC_OVERRIDES if asynchronous else []),
        *(overrides or [])])
    print(f"[demo] 3/6 frame cache -> {out / 'cache'}")
    samples = load_samples(paths["train"]) + load_samples(paths["val"])
    build_cache(samples, cfg.vision, out / "cache", workers=2)
    run = build_run(cfg)
    print("[demo] 4/6 validation before training")
    t_val = time.monotonic()
    before = validate(run)
    t_val = time.monotonic() - t_val
    print(f"[demo] 5/6 training ({cfg.training.steps} steps)")
    train(run, on_step=Eta(t0, cfg.training.steps, tail_s=t_val + 5.0))
    print("[demo] 6/6 validation after training")
    after = validate(run)
    table = _table(before, after)
    (out / "train").mkdir(parents=True, exist_ok=True)
    (out / "train" / "demo_results.json").write_text(json.dumps({"before": before, "after": after}, indent=1))
    made = write_training_report(out / "train", extra_markdown="## Validation (greedy)\n\n" + table)
    hf_model = export_model(run, out / "hf_model", "easyvideor1 demo") if cfg.checkpoint.export_hf else None
    print(table)
    print(f"[demo] done in {(time.monotonic() - t0) / 60:.1f} min; report: {made['markdown']}")
    for name, path in made.items():
        print(f"  {name}: {path}")
    if hf_model is not None:
        print(f"  HF model (with the settings it was trained at, {model_settings.MODEL_SETTINGS_FILE}): {hf_model}")
        print("[demo] next, score the trained model on the held-out file at its training settings:\n"
              f"  {eval_command(hf_model, paths['val'], out / 'cache', out / 'eval')}")
    return after
