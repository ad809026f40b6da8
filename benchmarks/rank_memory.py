"""Maximum resident memory of each rank of a 2-process CPU training run (torchrun, FSDP2, gloo)
on a Qwen2.5-VL-shaped model built from the tiny one's config with larger text dims (~60M
parameters by default): 2 training steps (start-up included), the same with a checkpoint at step 2, and resuming from that checkpoint for a third step. No HF export at the
end (`checkpoint.export_hf=false`): it is measured elsewhere.

    python benchmarks/rank_memory.py [--hidden 768] [--layers 12] [--keep DIR]

Each rank runs the `train` command in its own process (`--rank-child`) and records its
`ru_maxrss` at exit. Prints one row per run: each rank's maximum RSS in MiB, and the full fp32
state (parameters + AdamW's two moments) for scale. To measure another checkout, put it first
on PYTHONPATH (the children inherit it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

RANKS = 2


def rank_child(out: str, label: str, argv: list[str]) -> int:
    from easyvideor1 import cli

    try:
        code = cli.main(argv)
    finally:
        rank = os.environ.get("RANK", "0")
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        Path(out, f"{label}-rank{rank}.json").write_text(json.dumps({"max_rss": peak}))
    return code


def build_model(root: Path, hidden: int, layers: int) -> tuple[Path, int]:
    """The tiny Qwen2.5-VL with `layers` text layers of width `hidden` (random weights); returns
    (its folder, its parameter count)."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoTokenizer, GenerationConfig

    from easyvideor1.models.tiny import SPECIAL_TOKENS, TINY_CONFIGS, SIZES, TinySize, build_tiny_model

    out = root / "model"
    if (out / "model.safetensors").exists():  # --keep DIR of an earlier run (another checkout): the same model
        from safetensors import safe_open

        with safe_open(str(out / "model.safetensors"), "pt") as f:
            return out, sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    tiny = build_tiny_model("qwen2_5_vl", root / "tiny", seed=0)
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    tokens = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    base = SIZES["tiny"]
    size = TinySize(hidden, layers, hidden // 64, 2, base.vision_width, base.vision_depth, base.vision_heads,
                    base.vocab_size)
    config = TINY_CONFIGS["qwen2_5_vl"](size, tokens)
    config.architectures = ["Qwen2_5_VLForConditionalGeneration"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig.from_pretrained(tiny)
    shutil.copytree(tiny, out)
    model.save_pretrained(out)
    return out, sum(p.numel() for p in model.parameters())


def write_config(root: Path, model: Path, data: Path, out: Path, steps: int, every: int) -> Path:
    import yaml

    cfg = {
        "vision": {"family": "qwen2_5_vl", "max_frames": 4, "video_min_pixels": 3136, "video_max_pixels": 3136,
                   "image_min_pixels": 3136, "image_max_pixels": 3136},
        "model": {"path": str(model), "dtype": "float32"},
        "rollout": {"engine": "hf", "n": 2, "max_tokens": 8, "temperature": 1.0},
        "algorithm": {"adv_estimator": "grpo", "policy_loss": "ppo_clip", "loss_agg_mode": "token_mean",
                      "disable_kl": True},
        "training": {"steps": steps, "rollout_batch_size": 2, "mini_batch_size": 2, "micro_batch_size": 1,
                     "lr": 1e-4, "seed": 0},
        "data": {"train_files": [str(data)], "shuffle": False},
        "logging": {"out_dir": str(out), "progress": False},
        "checkpoint": {"every": every, "resume": "auto", "keep": 2, "export_hf": False},
    }
    path = root / f"{out.name}-{steps}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run(label: str, cfg: Path, rss_dir: Path) -> list[float]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(RANKS),
           __file__, "--rank-child", str(rss_dir), label, "train", str(cfg)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"{label} failed:\n{proc.stderr[-4000:]}")
    return [json.loads((rss_dir / f"{label}-rank{r}.json").read_text())["max_rss"] / 2**20 for r in range(RANKS)]


def main() -> None:
    if sys.argv[1:2] == ["--rank-child"]:
        raise SystemExit(rank_child(sys.argv[2], sys.argv[3], sys.argv[4:]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=768, help="text hidden size")
    parser.add_argument("--layers", type=int, default=12, help="text decoder layers")
    parser.add_argument("--keep", type=Path, default=None, help="work in DIR and keep it (default: a temp dir)")
    args = parser.parse_args()
    from easyvideor1.data.synth import write_suite

    root = args.keep or Path(tempfile.mkdtemp(prefix="rank_memory-"))
    root.mkdir(parents=True, exist_ok=True)
    model, params = build_model(root, args.hidden, args.layers)
    data = write_suite(root / "synth", num_train=8, num_val=0, seed=0)["train"]
    rss = root / "rss"
    rss.mkdir(exist_ok=True)
    rows = [("train 2 steps", write_config(root, model, data, root / "train", 2, 0)),
            ("train 2 steps, checkpoint at 2", write_config(root, model, data, root / "ckpt", 2, 2)),
            ("resume at 2, train step 3", write_config(root, model, data, root / "ckpt", 3, 0))]
    full = params * 4 * 3 / 2**30
    print(f"model: {params / 1e6:.1f}M parameters; full fp32 state (params + AdamW) {full:.2f} GiB; {RANKS} ranks")
    print(f"{'run':34s} " + " ".join(f"rank {r} MiB" for r in range(RANKS)))
    for i, (label, cfg) in enumerate(rows):
        mib = run(f"run{i}", cfg, rss)
        print(f"{label:34s} " + " ".join(f"{m:10.0f}" for m in mib), flush=True)
    if args.keep is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
