"""Group-shared prompt (`training.shared_prefix`) against one sequence per response, side by side.

One group of n responses to one video prompt, a tiny "medium" Qwen2.5-VL (random weights,
float32), one micro-batch holding the whole group (`micro_batch_size = n`), as in training:

- log-prob pass: `forward_logprobs` without gradients (the old / reference pass);
- update: `forward_logprobs` with gradients + backward of a token-mean loss;
- peak memory of one update: each path in a fresh subprocess, the rise of the process's peak
  resident set (Linux VmHWM, reset through /proc/self/clear_refs just before the update) over
  its resident set then. Torch CPU tensors live in malloc'd memory, so RSS is what they cost.

Cases: n = 8 at prompt : response ~ 8 : 1 (a 1,000-token video prompt, 128-token responses),
n = 4 and n = 16 at the same lengths, and n = 8 at ~ 2 : 1 (a 256-token video prompt).
Times are the minimum over `--repeats` runs, plain and shared interleaved (load swings on a
shared machine hit both); only the ratios mean anything across machines.

Usage: OMP_WAIT_POLICY=PASSIVE python benchmarks/shared_prefix.py [--repeats 3] [--size medium]
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

from easyvideor1.models.families import get_family
from easyvideor1.models.inputs import build_inputs
from easyvideor1.models.loading import load_policy, load_processor
from easyvideor1.models.mrope import mrope_spec
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.prompts import Prompt
from easyvideor1.records import Frames, Rollout, Sample, VideoMetadata
from easyvideor1.training.sequences import ForwardContext, forward_logprobs, make_batch
from peak_memory import child_rise, print_rise

FAMILY = "qwen2_5_vl"
# (name, n, video frames, response tokens): 224x224 frames are 64 merged tokens per 2 frames
CASES = [
    ("n=8  8:1", 8, 32, 128),
    ("n=4  8:1", 4, 32, 128),
    ("n=16 8:1", 16, 32, 128),
    ("n=8  2:1", 8, 8, 128),
]


def _setup(model_dir: Path, n: int, frames: int, response_len: int):
    model = load_policy(model_dir, dtype="float32")
    processor = load_processor(model_dir)
    family, spec = get_family(FAMILY), mrope_spec(model.config)
    side = 8 * family.grid_factor  # 224 px: 8 x 8 merged tokens per temporal patch
    g = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (frames, 3, side, side), dtype=torch.uint8, generator=g)
    meta = VideoMetadata(2.0, frames, list(range(frames)), side, side, frames / 2.0, backend="torchcodec")
    video = Frames(pixels, meta, source="bench.mp4")
    sample = Sample("Describe the video.", "a", "free-form", "video", videos=["bench.mp4"], problem_id="bench")
    prompt = Prompt(sample, [video], build_inputs(sample, [video], "Describe the video.", processor, family, spec))
    special = set(processor.tokenizer.all_special_ids)
    vocab = [i for i in range(len(processor.tokenizer)) if i not in special]
    responses = [[vocab[int(j)] for j in torch.randint(0, len(vocab), (response_len,), generator=g)]
                 for _ in range(n)]
    batch = make_batch([prompt], [[Rollout(0, r, "") for r in responses]])
    ctx = {shared: ForwardContext(family, spec, processor.tokenizer.pad_token_id, micro_batch_size=n,
                                  temperature=1.0, shared_prefix=shared) for shared in (False, True)}
    return model, batch, ctx, prompt.inputs.prompt_len


def _logprob_pass(model, batch, ctx) -> float:
    t0 = time.perf_counter()
    with torch.no_grad():
        forward_logprobs(model, batch, list(range(batch.size)), ctx)
    return time.perf_counter() - t0


def _update(model, batch, ctx) -> float:
    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    logp, _, _ = forward_logprobs(model, batch, list(range(batch.size)), ctx)
    mask = batch.response_mask
    (-(logp * mask).sum() / mask.sum()).backward()
    return time.perf_counter() - t0


def memory_child(model_dir: str, n: int, frames: int, response_len: int, shared: bool) -> None:
    """One update in this fresh process; prints {"rise_mib", "method"} as JSON."""
    model, batch, ctx, _ = _setup(Path(model_dir), n, frames, response_len)
    print_rise(lambda: _update(model, batch, ctx[shared]))


def _memory(model_dir: Path, n: int, frames: int, response_len: int, shared: bool) -> dict:
    return child_rise(__file__, [str(model_dir), str(n), str(frames), str(response_len), str(int(shared))])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--size", default="medium", help="tiny model size (models/tiny.py SIZES)")
    ap.add_argument("--work", default=None, help="folder for the model (default: a temp dir)")
    ap.add_argument("--memory-child", nargs=5, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_child:
        d, n, f, r, s = args.memory_child
        memory_child(d, int(n), int(f), int(r), bool(int(s)))
        return
    work = Path(args.work or tempfile.mkdtemp(prefix="shared_prefix_"))
    model_dir = build_tiny_model(FAMILY, work / f"model_{args.size}", seed=0, size=args.size)
    print(f"{FAMILY} tiny '{args.size}', float32, {torch.get_num_threads()} threads, one micro-batch = one group; "
          f"min of {args.repeats}; ratio = plain / shared")
    print(f"{'case':<10} {'prompt':>6} {'resp':>5} {'logprob x':>9} {'update x':>9} "
          f"{'mem plain MiB':>13} {'mem shared MiB':>14} {'mem ratio':>9}")
    for name, n, frames, response_len in CASES:
        model, batch, ctx, prompt_len = _setup(model_dir, n, frames, response_len)
        _logprob_pass(model, batch, ctx[True])  # warm-up of both paths
        _logprob_pass(model, batch, ctx[False])
        times = {k: {False: [], True: []} for k in ("logprob", "update")}
        for _ in range(args.repeats):
            for shared in (False, True):
                times["logprob"][shared].append(_logprob_pass(model, batch, ctx[shared]))
                times["update"][shared].append(_update(model, batch, ctx[shared]))
        del model
        mem = {shared: _memory(model_dir, n, frames, response_len, shared) for shared in (False, True)}
        lp = min(times["logprob"][False]) / min(times["logprob"][True])
        up = min(times["update"][False]) / min(times["update"][True])
        mp, ms = mem[False]["rise_mib"], mem[True]["rise_mib"]
        print(f"{name:<10} {prompt_len:>6} {response_len:>5} {lp:>9.2f} {up:>9.2f} {mp:>13.1f} {ms:>14.1f} "
              f"{mp / max(ms, 1e-9):>9.2f}", flush=True)
    print(f"memory: rise of peak RSS during one update, fresh process per path ({mem[True]['method']})")
    print("targets at n=8 8:1: log-prob pass >= 3x, update >= 2x, update peak memory lower than plain")


if __name__ == "__main__":
    main()
