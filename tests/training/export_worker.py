"""Worker of test_export_stream.py: a tiny policy (LoRA with non-zero adapters, or full), made the
same way in every process, sharded by FSDP2 under torchrun, written by `write_hf` in bf16.

    python export_worker.py MODEL_DIR OUT_DIR CASE[,CASE] SHARD_BYTES    CASE: full | lora (OUT_DIR/CASE)
"""

from __future__ import annotations

import sys

import torch

from easyvideor1.models.loading import load_policy, load_processor
from easyvideor1.models.lora import apply_lora
from easyvideor1.training.fsdp import init_distributed, shard
from easyvideor1.training.state.export import write_hf


def policy(path: str, case: str):
    """The policy both the worker and the test build: LoRA adapters drawn non-zero (seeded)."""
    torch.manual_seed(0)
    model = load_policy(path, "float32")
    if case == "lora":
        apply_lora(model, 4, 8.0, 0.0, [], True, ["lm_head"], base_dtype=torch.bfloat16)
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad:
                    p.normal_(0, 0.02)
    return model


def main() -> None:
    path, out, case, shard_bytes = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    init_distributed(need_group=True)
    for name in case.split(","):
        model = shard(policy(path, name), param_dtype=torch.bfloat16)
        write_hf(model, load_processor(path), "bfloat16", f"{out}/{name}", shard_bytes=shard_bytes)


if __name__ == "__main__":
    main()
