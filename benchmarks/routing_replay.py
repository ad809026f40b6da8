"""Rollout routing replay (R3, `models.routing`): engine vs trainer log-probs with and without replay.

A tiny qwen3_vl_moe (4 experts, top-2, float32). The engine (`HFEngine`) decodes with a copy whose
routers pick their top-k from noisy logits (`perturb_selection`: the weights stay the clean
probabilities), so engine and trainer differ in routing only, as bf16 kernels flipping near-tied
experts do. For each noise level it samples n responses per prompt, then scores them in the trainer
(`all_logprobs`) without and with replay, and prints, over the sampled tokens:

- mismatch KL: k3 estimate of KL(engine || trainer), mean of exp(d) - 1 - d with d = trainer - engine;
- the importance ratio's spread: std of d and max |d|;
- router agreement: the share of (token, layer) routes the trainer would have picked itself.

With replay the trainer's log-probs must be the engine's within the dense families' parity bound,
1e-4 (tests/rollout/test_hf_engine.py); the script exits 1 if not.

Usage: OMP_WAIT_POLICY=PASSIVE python benchmarks/routing_replay.py [--n 4] [--tokens 16]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import copy
import sys
import tempfile
from pathlib import Path

import torch

from easyvideor1.models.families import get_family
from easyvideor1.models.inputs import build_inputs
from easyvideor1.models.loading import load_policy, load_processor
from easyvideor1.models.mrope import mrope_spec
from easyvideor1.models.routing import perturb_selection, release, router_settings, router_stats
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.prompts import Prompt
from easyvideor1.records import Frames, Sample, VideoMetadata
from easyvideor1.rollout.base import SamplingParams, banned_token_ids
from easyvideor1.rollout.hf_engine import HFEngine
from easyvideor1.training.sequences import ForwardContext, all_logprobs, forward_logprobs, make_batch

PARITY = 1e-4
NOISE = (0.02, 0.05, 0.1, 0.2)


def bench_prompts(family, processor, spec) -> list[Prompt]:
    """Two text prompts and one 6-frame video prompt."""
    f = family.grid_factor
    pixels = torch.randint(0, 256, (6, 3, 2 * f, 2 * f), dtype=torch.uint8, generator=torch.Generator().manual_seed(7))
    video = Frames(pixels, VideoMetadata(3.0, 12, list(range(0, 12, 2)), 2 * f, 2 * f, 4.0, "torchcodec"), "clip.mp4")
    out = []
    for sample_id, frames, text in (("t1", [], "Name three colors."), ("t2", [], "Add 17 and 25."),
                                    ("v1", [video], "Describe what happens.")):
        sample = Sample(text, "a", "free-form", "video" if frames else "text", problem_id=sample_id,
                        videos=[fr.source for fr in frames])
        out.append(Prompt(sample, frames, build_inputs(sample, frames, text, processor, family, spec)))
    return out


def spread(batch, trainer_logp) -> dict[str, float]:
    d = (trainer_logp - batch.behaviour_log_probs)[batch.response_mask]  # log importance ratio, per token
    return {"kl_k3": float((d.exp() - 1 - d).mean()), "std": float(d.std()), "max_abs": float(d.abs().max())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=4, help="responses per prompt")
    parser.add_argument("--tokens", type=int, default=16, help="response limit")
    args = parser.parse_args()
    path = build_tiny_model("qwen3_vl_moe", Path(tempfile.mkdtemp()) / "moe", seed=0)
    family, model, processor = get_family("qwen3_vl_moe"), load_policy(path, dtype="float32").eval(), load_processor(path)
    spec = mrope_spec(model.config)
    prompts = bench_prompts(family, processor, spec)
    shape, _ = router_settings("rollout", model)

    def ctx(replay: bool) -> ForwardContext:
        return ForwardContext(family=family, spec=spec, pad_token_id=processor.tokenizer.pad_token_id,
                              micro_batch_size=4, temperature=1.0, router_shape=shape, routing_replay=replay,
                              banned_ids=tuple(banned_token_ids(processor.tokenizer)))

    print(f"tiny qwen3_vl_moe, float32, {len(prompts)} prompts x {args.n} responses, up to {args.tokens} tokens; "
          f"CPU {torch.backends.cpu.get_cpu_capability()}")
    print(f"{'noise':>6} {'agree':>6} | {'KL no replay':>12} {'std':>9} {'max|d|':>9} | "
          f"{'KL replay':>10} {'std':>9} {'max|d|':>9}")
    worst = 0.0
    for noise in NOISE:
        engine_model = copy.deepcopy(model)
        perturb_selection(engine_model, noise, seed=3)
        groups = HFEngine(engine_model, processor, family, spec).generate(
            prompts, args.n, SamplingParams(temperature=1.0, max_tokens=args.tokens, seed=1))
        batch = make_batch(prompts, groups)
        plain = spread(batch, all_logprobs(model, batch, ctx(False)))
        replayed = spread(batch, all_logprobs(model, batch, ctx(True)))
        forward_logprobs(model, batch, list(range(batch.size)), ctx(True))  # with gradients: collects, as the update
        agreement = router_stats(model).metrics()["moe/router_agreement"]
        release(model)
        worst = max(worst, replayed["max_abs"])
        print(f"{noise:>6} {agreement:>6.3f} | {plain['kl_k3']:>12.2e} {plain['std']:>9.2e} {plain['max_abs']:>9.2e} | "
              f"{replayed['kl_k3']:>10.2e} {replayed['std']:>9.2e} {replayed['max_abs']:>9.2e}")
    ok = worst < PARITY
    print(f"with replay, max |trainer - engine| log-prob = {worst:.2e} {'<' if ok else '>='} parity bound {PARITY:g}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
