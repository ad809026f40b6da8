"""`model.dtype: bfloat16` trains with float32 master weights: FSDP2's mixed-precision policy
computes in bf16 over float32 parameters and AdamW states, so an lr-1e-6 step moves most
weights (bf16 parameters would round almost all of them away). One process, a one-rank gloo
group made by `build_run`, a real tiny model and real videos."""

import torch

from test_distributed import write_config

from easyvideor1 import distributed
from easyvideor1.config import load_config
from easyvideor1.data.synth import write_suite
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.training.setup import build_run
from easyvideor1.training.trainer import train


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def test_bf16_compute_over_fp32_master_weights(tmp_path):
    model_dir = build_tiny_model("qwen2_5_vl", tmp_path / "model", seed=0)
    data = write_suite(tmp_path / "synth", num_train=8, num_val=0, seed=0)["train"]
    path = write_config(tmp_path, model_dir, data, tmp_path / "out", steps=1, model__dtype="bfloat16",
                        training__lr=1e-6, training__grad_clip=1e9)
    cfg = load_config(str(path), ["checkpoint.export_hf=false"])
    try:
        run = build_run(cfg)
        layer_dtypes, vision_dtypes = [], []
        run.model.model.language_model.layers[0].register_forward_hook(
            lambda mod, args, out: layer_dtypes.append((out[0] if isinstance(out, tuple) else out).dtype))
        run.model.model.visual.blocks[0].register_forward_hook(
            lambda mod, args, out: vision_dtypes.append((out[0] if isinstance(out, tuple) else out).dtype))
        before = {n: _full(p) for n, p in run.model.named_parameters()}
        train(run)
        after = {n: _full(p) for n, p in run.model.named_parameters()}
    finally:
        distributed.close()
    assert {p.dtype for p in before.values()} == {torch.float32}
    states = [v for s in run.optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.numel() > 1]
    assert states and {v.dtype for v in states} == {torch.float32}
    assert layer_dtypes and set(layer_dtypes) == {torch.bfloat16}  # compute in bf16
    assert vision_dtypes and set(vision_dtypes) == {torch.bfloat16}
    changed = sum(int((after[n] != before[n]).sum()) for n in before)
    total = sum(t.numel() for t in before.values())
    # Elements whose gradient is exactly 0 (embedding rows of tokens never seen) only decay, which at
    # lr 1e-6 is below float32 resolution; every other element moves.
    print(f"changed {changed}/{total} = {changed / total:.4f}")
    assert changed / total > 0.5, f"only {changed}/{total} weights changed"
