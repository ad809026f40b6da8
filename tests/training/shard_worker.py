"""Save or resume a checkpoint of a plain model, in one process (unsharded, as a float32 run is)
or under torchrun (FSDP2-sharded). A test helper, run as a script:

    shard_worker.py save ROOT OUT   one AdamW step, then `save_checkpoint(ROOT, 1, ...)`; rank 0 also
                                    writes the whole parameters and optimizer states to OUT/expected.safetensors
    shard_worker.py load CKPT OUT   ("{rank}" in CKPT: each rank its own copy) the model built on the meta device and sharded (no full copy on any
                                    rank), then `load_checkpoint(CKPT, ...)`; rank 0 writes what was loaded
                                    to OUT/loaded.safetensors, each rank its RSS (VmRSS before the load,
                                    peak after it, bytes) to OUT/rss-rank<r>.json

The shapes are uneven on purpose: 999 rows split 500 / 499, and a 1-row weight that leaves rank 1
an empty shard.
"""

import json
import os
import resource
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from easyvideor1 import distributed
from easyvideor1.training.fsdp import init_distributed
from easyvideor1.training.state import checkpoint as ckpt

WIDTH, DEPTH = 999, 12  # 12 M parameters: 48 MB of weights, 144 MB with AdamW's two states


def build(meta: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.device("meta" if meta else "cpu"):
        layers = [torch.nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH)] + [torch.nn.Linear(WIDTH, 1)]
        model = torch.nn.Sequential(*layers)
    if distributed.is_distributed():
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            fully_shard(layer)
        fully_shard(model)
    if meta:
        model.to_empty(device="cpu")
    return model


def whole(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Every parameter and optimizer state, gathered whole (a collective under FSDP2)."""
    out = {}
    for name, p in model.named_parameters():
        out[f"param/{name}"] = p
        out.update({f"{k}/{name}": v for k, v in opt.state[p].items()})
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone() for k, v in out.items()}


def rss_kib() -> int:
    return int(next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmRSS")).split()[1])


def main(mode: str, path: str, out: str) -> None:
    if "WORLD_SIZE" in os.environ:
        init_distributed()
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = build(meta=mode == "load")
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    if mode == "save":
        model(torch.randn(4, WIDTH)).sum().backward()
        opt.step()
        ckpt.save_checkpoint(path, 1, model, opt, None, {"step": 1})
        expected = whole(model, opt)
        if distributed.rank() == 0:
            save_file(expected, out_dir / "expected.safetensors")
    else:
        before = rss_kib()
        ckpt.load_checkpoint(path.format(rank=distributed.rank()), model, opt, None)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        (out_dir / f"rss-rank{distributed.rank()}.json").write_text(json.dumps({"before": before * 1024,
                                                                                "peak": peak * 1024}))
        loaded = whole(model, opt)
        if distributed.rank() == 0:
            save_file(loaded, out_dir / "loaded.safetensors")
    distributed.close()


if __name__ == "__main__":
    main(*sys.argv[1:4])
