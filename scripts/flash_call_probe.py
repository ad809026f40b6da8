"""Can the demo's tiny model learn to copy the flash window into its `crop_video` call?

Supervised only (no RL): the demo's tiny model, tools and prompt, a suite of flash samples
(256 training, 24 held-out), and the loss on the call alone (`data.synth.flash_call`, 55
tokens), 16 samples a step at the demo's learning rate. Every 50 steps it prints the held-out
(and 24 training samples') teacher-forced accuracy of the call's two digits, start and end.

    python scripts/flash_call_probe.py --wording one --steps 1000      # as `synth` words it
    python scripts/flash_call_probe.py --wording two --steps 1000      # "between second w and second w+1"

Measured on a 2-core AMD EPYC, one thread (2026-12-02): with two numbers in the question the
start stayed at chance (0.04-0.25) through step 800 while the end (start + 1, 7 tokens back) was
learnt at ~600; with one number both reached 1.00 held-out by step 650 (chance until ~500).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
from pathlib import Path

import torch

from easyvideor1.config import demo_config_path, load_config
from easyvideor1.data.loading import load_samples
from easyvideor1.data.synth import FLASH_WINDOW_RE, flash_call, write_suite
from easyvideor1.models.collate import collate
from easyvideor1.models.inputs import append_response
from easyvideor1.models.logprobs import sequence_logprobs
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.training.demo import TOOL_OVERRIDES, demo_overrides
from easyvideor1.training.setup import build_run
from easyvideor1.vision.cache_build import build_cache


def worded(sample, wording: str):
    """The sample with its question worded by `wording`, and its window's start."""
    w = int(FLASH_WINDOW_RE.search(sample.problem).group(1))
    if wording == "two":
        sample = dataclasses.replace(sample, problem=f"A square flashes briefly between second {w} and second {w + 1}. "
                                                     "What colour is it?")
    return sample, w


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wording", choices=("one", "two"), default="one")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--size", default="tiny", help="tiny model size (models.tiny.SIZES)")
    ap.add_argument("--out", default="flash_call_probe")
    args = ap.parse_args()
    torch.manual_seed(0)
    out = Path(args.out)
    paths = {"train": out / "data/train.jsonl", "val": out / "data/val.jsonl"}
    if not paths["val"].exists():
        write_suite(out / "data", num_train=256, num_val=24, seed=0, tasks=("flash",))
    model_dir = build_tiny_model("qwen2_5_vl", out / f"model-{args.size}", seed=0, size=args.size)
    cfg = load_config(demo_config_path(), [*demo_overrides(model_dir, paths, out / "cache", out / "train", 0),
                                           *TOOL_OVERRIDES])
    train, val = load_samples(paths["train"]), load_samples(paths["val"])
    build_cache(train + val, cfg.vision, out / "cache", workers=2, progress=False)
    run = build_run(cfg)
    builder, tok = run.prompts, run.prompts.processor.tokenizer

    def item(sample):
        sample, w = worded(sample, args.wording)
        ids = tok(flash_call(w), add_special_tokens=False)["input_ids"]
        pieces = [tok.decode([i]) for i in ids]
        digits = [i for i in range(2, len(pieces)) if pieces[i].isdigit() and pieces[i - 2] == '":']
        return append_response(builder.build(sample).inputs, ids, builder.spec), digits

    def batch(items):
        return collate([it for it, _ in items], builder.family, builder.spec, tok.pad_token_id or 0, "right")

    def digit_accuracy(items) -> list[float]:
        run.model.eval()
        with torch.no_grad():
            b = batch(items)
            logits = run.model(**b.model_kwargs()).logits
        right = [0, 0]
        for (it, digits), (row, start, _) in zip(items, b.seq_spans):
            for j, d in enumerate(digits):
                t = start + it.prompt_len + d
                right[j] += int(logits[row, t - 1].argmax()) == int(b.input_ids[row, t])
        run.model.train()
        return [round(r / len(items), 2) for r in right]

    train_items, val_items = [item(s) for s in train], [item(s) for s in val]
    opt = torch.optim.AdamW([p for p in run.model.parameters() if p.requires_grad], lr=cfg.training.lr)
    rng = random.Random(0)
    for step in range(1, args.steps + 1):
        lp = sequence_logprobs(run.model, batch(rng.sample(train_items, 16)))
        loss = -(lp.logprobs * lp.mask).sum() / lp.mask.sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), cfg.training.grad_clip)
        opt.step()
        if step % 50 == 0:
            print(f"step {step}: loss {loss.item():.3f}, digit accuracy (start, end) held-out "
                  f"{digit_accuracy(val_items)}, training {digit_accuracy(train_items[:24])}", flush=True)


if __name__ == "__main__":
    main()
