"""The vision tower under sequence parallelism (`models.ulysses`): what a rank pays to encode its
share of a video's temporal patches against the whole video.

Under Ulysses SP the k ranks of a group hold one packed row. Either one rank encodes every frame
and scatters the features (it does the whole tower's compute and holds all its activations while
the others wait), or every rank encodes all (k-fold compute, no exchange), or each encodes 1/k of
the frames and the merged features are all-gathered (what `models.ulysses.encode_vision` does).
The Qwen-VL towers attend within a temporal patch, so the tower's cost is linear in the frames:
this script measures forward + backward time and the activations autograd saves for 1/1, 1/2
and 1/4 of one video (tiny "small" Qwen2.5-VL, random weights, float32, one thread as one rank of
a group), and the bytes of merged features a rank sends in the all-gather.

Usage: OMP_WAIT_POLICY=PASSIVE python benchmarks/ulysses_vision.py [--frames 64] [--side 224] [--repeats 3]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import tempfile
import time

import torch

from easyvideor1.models.families import get_family
from easyvideor1.models.loading import load_policy
from easyvideor1.models.tiny import build_tiny_model


def measure(visual, patch_dim: int, t: int, h: int, w: int, repeats: int) -> tuple[float, float]:
    """(best seconds, MiB saved for backward) of the tower's forward + backward on a t x h x w grid."""
    pixels = torch.randn(t * h * w, patch_dim)
    grid = torch.tensor([[t, h, w]])
    saved, best = [0], float("inf")

    def pack(x):
        saved[0] += x.numel() * x.element_size()
        return x

    for _ in range(repeats):
        saved[0] = 0
        start = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            out = visual(pixels, grid_thw=grid).pooler_output
        out.sum().backward()
        best = min(best, time.perf_counter() - start)
    return best, saved[0] / 2**20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=64)
    ap.add_argument("--side", type=int, default=224, help="frame height = width, pixels")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    family = get_family("qwen2_5_vl")
    with tempfile.TemporaryDirectory() as tmp:
        model = load_policy(build_tiny_model("qwen2_5_vl", tmp, seed=0, size="small"), dtype="float32")
    visual = model.model.visual
    patch_dim = 3 * family.temporal_patch_size * family.patch_size**2
    t, side = args.frames // family.temporal_patch_size, args.side // family.patch_size
    hidden = model.config.get_text_config().hidden_size
    print(f"video: {args.frames} frames of {args.side}x{args.side} = {t} temporal patches of {side}x{side} patches")
    whole = None
    for k in (1, 2, 4):
        seconds, mib = measure(visual, patch_dim, t // k, side, side, args.repeats)
        whole = whole or (seconds, mib)
        sent = t // k * side * side // family.merge_size**2 * hidden * 4 / 2**20
        print(f"share 1/{k}: fwd+bwd {seconds * 1000:7.0f} ms ({whole[0] / seconds:.2f}x faster), "
              f"saved activations {mib:6.0f} MiB ({whole[1] / mib:.2f}x less), features sent {sent:.2f} MiB")


if __name__ == "__main__":
    main()
