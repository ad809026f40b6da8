"""Export the trained policy as an HF-format folder (`from_pretrained` and vLLM load it)."""

from __future__ import annotations

from pathlib import Path

from easyvideor1.models.loading import resolve_dtype
from easyvideor1.training.fsdp import full_state_dict
from easyvideor1.training.run import Run


def export_hf(run: Run, out_dir: str | Path) -> Path | None:
    """Write config, safetensors weights and the processor to `out_dir` (rank 0); all ranks call."""
    state = full_state_dict(run.model)
    if run.rank != 0:
        return None
    # Written in the compute dtype (`model.dtype`), as released checkpoints are, not in the
    # float32 of the master weights.
    dtype = resolve_dtype(run.cfg.model.dtype)
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = run.model
    saved_dtype = model.config.dtype
    model.config.dtype = dtype
    try:
        model.save_pretrained(out, state_dict=state, safe_serialization=True)
    finally:
        model.config.dtype = saved_dtype
    run.prompts.processor.save_pretrained(out)
    return out
