"""Long, unequal prompts: padded vs packed vs packed + token-balanced micro-batches, side by side.

A tiny "medium" Qwen2.5-VL (random weights, float32), 8 video prompts of very unequal length
(~200 to ~4,000 tokens: a short clip with a question of a few to thousands of tokens, one clip of
many frames), in a mixed order as a shuffled batch would be, 2 responses each of a fixed set of
lengths (32-128 tokens), one row per response (`training.shared_prefix` off, so rows are the
sequences themselves). One step = the log-prob pass (`all_logprobs`, no gradients) + the update
(`policy_update`: forward, backward, optimizer step; one mini-batch). Modes:

- padded:   `micro_batch_size` = 4 rows per micro-batch, right-padded to the longest (today's path);
- packed:   the same 4 sequences per micro-batch, packed in one row (`padding_free`);
- balanced: packed, and micro-batches filled up to `training.micro_batch_tokens` (= the longest
  row rounded up to 512), longest first (`training.micro_batches`);
- padded+bal: padded rows, micro-batches up to the same budget counted as rows x longest (what a
  family that cannot pack, Qwen3.5, gets from the token budget alone).

Padding fraction: the share of computed tokens that are padding (rows x longest - real tokens,
over rows x longest; packed rows have none), the `perf/padding_fraction` the update logs.
Peak memory: each mode's step in a fresh subprocess, the rise of the process's peak resident set
(Linux VmHWM, reset through /proc/self/clear_refs just before the step) over its resident set
then; torch CPU tensors live in malloc'd memory, so RSS is what they cost.
Times are the minimum over `--repeats` steps, the modes interleaved (load swings on a shared
machine hit all of them); only the ratios mean anything across machines.

Usage: OMP_WAIT_POLICY=PASSIVE python benchmarks/long_video.py [--repeats 3] [--size medium]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import tempfile
import time
from pathlib import Path

import torch

from easyvideor1.algorithms import AlgorithmConfig
from easyvideor1.models.families import get_family
from easyvideor1.models.inputs import build_inputs
from easyvideor1.models.loading import load_policy, load_processor
from easyvideor1.models.mrope import mrope_spec
from easyvideor1.models.packing import use_packed_attention
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.prompts import Prompt
from easyvideor1.records import Frames, Rollout, Sample, VideoMetadata
from easyvideor1.training.micro_batches import balance_metrics
from easyvideor1.training.sequences import ForwardContext, all_logprobs, make_batch, pass_micro_batches
from peak_memory import child_rise, print_rise
from easyvideor1.training.update import policy_update

FAMILY = "qwen2_5_vl"
# (video frames, question words): 112 px frames are 16 merged tokens per 2 frames; the list is in
# batch order (mixed, as a shuffled batch), prompts from ~200 to ~4,000 tokens
PROMPTS = [(8, 1390), (8, 36), (8, 500), (64, 90), (8, 1035), (8, 108), (128, 515), (8, 322)]
RESPONSES = [128, 32, 96, 64, 48, 112, 80, 40, 120, 56, 72, 88, 104, 36, 60, 128]  # 2 per prompt
MODES = ("padded", "packed", "balanced", "padded+bal")
MICRO_BATCH_SIZE = 4


def _setup(model_dir: Path, mode: str):
    model = load_policy(model_dir, dtype="float32")
    processor = load_processor(model_dir)
    family, spec = get_family(FAMILY), mrope_spec(model.config)
    side = 4 * family.grid_factor  # 112 px: 4 x 4 merged tokens per temporal patch
    g = torch.Generator().manual_seed(0)
    prompts = []
    for k, (frames, words) in enumerate(PROMPTS):
        pixels = torch.randint(0, 256, (frames, 3, side, side), dtype=torch.uint8, generator=g)
        meta = VideoMetadata(2.0, frames, list(range(frames)), side, side, frames / 2.0, backend="torchcodec")
        video = Frames(pixels, meta, source=f"clip{k}.mp4")
        question = " ".join(f"w{(k * 7 + i) % 50}" for i in range(words)) + " What happens?"
        sample = Sample(question, "a", "free-form", "video", videos=[video.source], problem_id=f"p{k}")
        prompts.append(Prompt(sample, [video], build_inputs(sample, [video], question, processor, family, spec)))
    special = set(processor.tokenizer.all_special_ids)
    vocab = [i for i in range(len(processor.tokenizer)) if i not in special]
    groups = [[Rollout(k, [vocab[int(j)] for j in torch.randint(0, len(vocab), (RESPONSES[2 * k + r],), generator=g)],
                       "") for r in range(2)] for k in range(len(PROMPTS))]
    batch = make_batch(prompts, groups)
    longest = max(p.inputs.prompt_len for p in prompts) + max(RESPONSES)
    packed = mode in ("packed", "balanced")
    if packed:
        use_packed_attention(model)
    ctx = ForwardContext(family, spec, processor.tokenizer.pad_token_id, micro_batch_size=MICRO_BATCH_SIZE,
                         temperature=1.0, padding_free=packed,
                         micro_batch_tokens=-(-longest // 512) * 512 if mode in ("balanced", "padded+bal") else 0)
    mask = batch.response_mask
    batch.advantages = torch.randn(batch.size, 1, generator=g).expand(mask.shape) * mask
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    return model, batch, ctx, optimizer, [p.inputs.prompt_len for p in prompts]


def _step(model, batch, ctx, optimizer) -> tuple[float, float]:
    """(log-prob pass seconds, update seconds) of one step."""
    t0 = time.perf_counter()
    batch.old_log_probs = all_logprobs(model, batch, ctx)
    t1 = time.perf_counter()
    policy_update(model, optimizer, batch, AlgorithmConfig(disable_kl=True), ctx, ppo_epochs=1, n_mini=1,
                  grad_clip=1.0, max_len=max(RESPONSES), kl_coef=0.0)
    return t1 - t0, time.perf_counter() - t1


def memory_child(model_dir: str, mode: str) -> None:
    """One step in this fresh process; prints {"rise_mib", "method"} as JSON."""
    model, batch, ctx, optimizer, _ = _setup(Path(model_dir), mode)
    print_rise(lambda: _step(model, batch, ctx, optimizer))


def _memory(model_dir: Path, mode: str) -> dict:
    return child_rise(__file__, [str(model_dir), mode])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--size", default="medium", help="tiny model size (models/tiny.py SIZES)")
    ap.add_argument("--work", default=None, help="folder for the model (default: a temp dir)")
    ap.add_argument("--memory-child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_child:
        memory_child(*args.memory_child)
        return
    work = Path(args.work or tempfile.mkdtemp(prefix="long_video_"))
    model_dir = build_tiny_model(FAMILY, work / f"model_{args.size}", seed=0, size=args.size)
    runs = {mode: _setup(model_dir, mode) for mode in MODES}
    _, batch, _, _, prompt_lens = runs["padded"]
    print(f"{FAMILY} tiny '{args.size}', float32, {torch.get_num_threads()} threads; {len(PROMPTS)} video prompts of "
          f"{min(prompt_lens)}-{max(prompt_lens)} tokens ({', '.join(map(str, prompt_lens))}), 2 responses each "
          f"({min(RESPONSES)}-{max(RESPONSES)} tokens), {int(batch.response_mask.sum())} response tokens; "
          f"min of {args.repeats} steps, modes interleaved")
    plans = {}
    for mode, (_, b, ctx, _, _) in runs.items():
        micros = pass_micro_batches(b, list(range(b.size)), ctx)
        plans[mode] = (micros, balance_metrics(micros), ctx.micro_batch_tokens)
    for mode in MODES:  # warm-up
        _step(*[runs[mode][i] for i in (0, 1, 2, 3)])
    times = {mode: {"logprob": [], "update": []} for mode in MODES}
    for _ in range(args.repeats):
        for mode in MODES:
            lp, up = _step(*[runs[mode][i] for i in (0, 1, 2, 3)])
            times[mode]["logprob"].append(lp)
            times[mode]["update"].append(up)
    del runs
    mem = {mode: _memory(model_dir, mode) for mode in MODES}
    base = min(times["padded"]["logprob"]) + min(times["padded"]["update"])
    print(f"{'mode':<10} {'micro':>5} {'computed':>8} {'padding':>7} {'logprob s':>9} {'update s':>8} {'step s':>7} "
          f"{'speed-up':>8} {'peak MiB':>8}")
    for mode in MODES:
        micros, metrics, _ = plans[mode]
        lp, up = min(times[mode]["logprob"]), min(times[mode]["update"])
        print(f"{mode:<10} {len(micros):>5} {sum(m.cost for m in micros):>8} {metrics['perf/padding_fraction']:>7.1%} "
              f"{lp:>9.2f} {up:>8.2f} {lp + up:>7.2f} {base / (lp + up):>7.2f}x {mem[mode]['rise_mib']:>8.1f}",
              flush=True)
    runs_budget = plans["balanced"][2]
    print(f"micro: micro-batches per pass (padded / packed: {MICRO_BATCH_SIZE} sequences each; (padded+)balanced: up "
          f"to {runs_budget} tokens each); computed: tokens the model runs per pass (rows x longest when padded; "
          "without the 1-token masked dummy image of each micro-batch); speed-up: padded step / step")
    print(f"memory: rise of peak RSS during one step, fresh process per mode ({mem['padded']['method']})")
    print("targets: padding fraction below 5% (packed), packed step >= 1.5x faster than padded")
    print(f"load average while running: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
