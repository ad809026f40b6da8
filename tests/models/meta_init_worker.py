"""Worker of test_meta_init.py: the previous start-up (the whole model loaded on CPU, LoRA, then
FSDP2) and the meta-device one (built empty, LoRA, FSDP2, then each rank's rows read) side by side
in one process (under torchrun: each rank), compared tensor by tensor on the rank's own shard.

    python meta_init_worker.py MODEL_DIR OUT_JSON CASE[,CASE...]     CASE: policy | lora | reference

Writes {case: {"tensors": n, "differ": [names], "tied": [old, new], "rng": same}} for this rank.
"""

from __future__ import annotations

import json
import sys

import torch

from easyvideor1.models.loading import load_policy, load_reference
from easyvideor1.models.lora import apply_lora
from easyvideor1.models.meta_init import WeightSource, fill_weights
from easyvideor1.training.fsdp import init_distributed, shard


def build(path: str, case: str, device: str):
    torch.manual_seed(0)
    if case == "reference":
        model = load_reference(path, "bfloat16", "sdpa", device)
    else:
        model = load_policy(path, "float32", "sdpa", False, False, device)
    source = WeightSource(path, model) if device == "meta" else None
    if case == "lora":
        apply_lora(model, 4, 8.0, 0.0, [], True, ["lm_head"], base_dtype=torch.bfloat16)
    shard(model, param_dtype=None if case == "reference" else torch.bfloat16)
    if source is not None:
        fill_weights(model, source, "cpu")
    return model, torch.get_rng_state()


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def compare(path: str, case: str) -> dict:
    old, old_rng = build(path, case, "cpu")
    new, new_rng = build(path, case, "meta")
    a = dict(old.named_parameters(remove_duplicate=False)) | dict(old.named_buffers())
    b = dict(new.named_parameters(remove_duplicate=False)) | dict(new.named_buffers())
    differ = sorted(set(a) ^ set(b))
    for name in set(a) & set(b):
        x, y = local(a[name]), local(b[name])
        if (x.dtype != y.dtype or x.shape != y.shape or not torch.equal(x, y)
                or a[name].requires_grad != b[name].requires_grad):
            differ.append(name)
    tied = [m.lm_head.weight is m.get_input_embeddings().weight for m in (old, new)]
    return {"tensors": len(a), "differ": sorted(differ), "tied": tied, "rng": torch.equal(old_rng, new_rng),
            "config": old.config.to_dict() == new.config.to_dict()}


def main() -> None:
    path, out, cases = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    rank, _, _ = init_distributed(need_group=True)
    result = {case: compare(path, case) for case in cases}
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
