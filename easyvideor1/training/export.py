"""Export the trained policy as an HF-format folder (`from_pretrained` and vLLM load it)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from easyvideor1.training.fsdp import full_state_dict

if TYPE_CHECKING:
    from easyvideor1.training.trainer import Run


def export_hf(run: Run, out_dir: str | Path) -> Path | None:
    """Write config, safetensors weights and the processor to `out_dir` (rank 0); all ranks call."""
    state = full_state_dict(run.model)
    if run.rank != 0:
        return None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = run.model
    model.save_pretrained(out, state_dict=state, safe_serialization=True)
    run.processor.save_pretrained(out)
    return out
