"""Checkpoints: save atomically, keep the newest K, resume exactly.

A checkpoint is a folder `step-000010/` holding the model weights (`model.safetensors`; under
LoRA the trainable adapter parameters only), the optimizer state (`optimizer.json` +
`optimizer.safetensors`) and, in `state.json` + `state.safetensors`, the LR schedule, every RNG
state of every rank, the trainer's own state (data-loader position, KL coefficient) and the
step. No file is a pickle (`state_files`): a checkpoint from someone else can hold only data.
A folder with an older version's `state.pt` (a pickle) is refused, never unpickled.
It is written as `step-000010.tmp-<pid>/` and renamed when complete, so a run killed at any
moment leaves either a whole checkpoint or none; leftovers of killed writes are removed.

Under FSDP2 the full (unsharded) states are gathered with torch.distributed.checkpoint's
state-dict helpers and written by rank 0; every rank loads them back the same way.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from easyvideor1 import distributed, testhooks
from easyvideor1.errors import out_of_space
from easyvideor1.models.lora import has_adapters, trainable_names, trainable_state
from easyvideor1.training.state_files import StateFileError, read_state, write_state

_NAME = re.compile(r"^step-(\d{6,})$")
_MARKERS = ("state.json", "state.pt")  # state.pt: an older version's pickle, listed so that it is refused


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def _rng_of_this_rank(saved: list[dict[str, Any]] | dict[str, Any]) -> dict[str, Any]:
    """This rank's saved RNG state; rank 0's when the number of ranks changed (or the
    checkpoint predates per-rank states)."""
    if isinstance(saved, dict):
        return saved
    return saved[distributed.rank()] if len(saved) == distributed.world_size() else saved[0]


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def list_checkpoints(root: str | os.PathLike) -> list[Path]:
    """Complete checkpoints under `root`, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _NAME.match(p.name) and any((p / m).exists() for m in _MARKERS)]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))


def save_checkpoint(root: str | os.PathLike, step: int, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, scheduler: Any, trainer_state: dict[str, Any],
                    keep: int = 2) -> Path | None:
    """Write checkpoint `step` under `root` (rank 0 writes; all ranks must call)."""
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    # LoRA: the adapters only (the frozen base is the model at `model.path`)
    model_sd = trainable_state(model) if has_adapters(model) else get_model_state_dict(model, options=opts)
    optim_sd = get_optimizer_state_dict(model, optimizer, options=opts)
    rngs = distributed.all_gather_objects(rng_state())  # every rank's, in rank order
    final = Path(root) / f"step-{step:06d}"
    failure: Exception | None = None
    if distributed.rank() == 0:
        tmp = Path(root) / f"{final.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir(parents=True)
            _write_model(tmp, model_sd)
            testhooks.hit("checkpoint.write")
            write_state(tmp, "optimizer", optim_sd)
            write_state(tmp, "state", {"scheduler": scheduler.state_dict() if scheduler else None,
                                       "rng": rngs, "trainer": trainer_state, "step": step})
            (tmp / "meta.json").write_text(json.dumps({"step": step}))
        except Exception as e:  # noqa: BLE001 - every rank must learn of it (below), not hang in the barrier
            shutil.rmtree(tmp, ignore_errors=True)  # no half checkpoint is left behind
            failure = out_of_space(e, tmp, "resume (checkpoint.resume=auto): the previous checkpoints are kept") or e
        else:
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            for old in list_checkpoints(root)[:-keep] if keep > 0 else []:
                shutil.rmtree(old, ignore_errors=True)
    if distributed.any_true(failure is not None):  # one decision: every rank stops alike
        raise failure if failure is not None else RuntimeError(f"rank 0 failed to write checkpoint {final}")
    distributed.barrier()
    return final if distributed.rank() == 0 else None


def _write_model(folder: Path, model_sd: dict[str, torch.Tensor]) -> None:
    """The model part of a checkpoint: `model_sd` is the full weights, or under LoRA the trainable parameters."""
    save_file({k: v.detach().clone().contiguous() for k, v in model_sd.items()},  # tied weights share memory
              folder / "model.safetensors")


def _refuse_pickle(path: Path) -> None:
    if (path / "state.pt").exists() and not (path / "state.json").exists():
        raise StateFileError(
            f"checkpoint {path} holds state.pt, a pickle (written by an easyvideor1 before checkpoints were "
            "JSON + safetensors); unpickling a file can run any code, so it is not loaded. Resume with "
            "checkpoint.resume=never and start from its weights (model.path: a folder with its "
            "model.safetensors and the model's configs), or delete the folder")


def clean_partial(root: str | os.PathLike) -> None:
    """Remove folders of checkpoint writes that were killed before their rename."""
    root = Path(root)
    if root.is_dir() and distributed.rank() == 0:
        for p in root.glob("step-*.tmp-*"):
            shutil.rmtree(p, ignore_errors=True)


def resolve_resume(root: str | os.PathLike, resume: str) -> Path | None:
    """The checkpoint to resume from: `auto` -> newest complete one (or None), `never` -> None,
    anything else is a checkpoint folder that must exist."""
    if resume == "never":
        return None
    if resume == "auto":
        found = list_checkpoints(root)
        return found[-1] if found else None
    path = Path(resume)
    if not any((path / m).exists() for m in _MARKERS):
        raise FileNotFoundError(f"checkpoint.resume={resume}: no complete checkpoint there "
                                "(expected state.json); use 'auto' or a step-NNNNNN folder")
    return path


def load_checkpoint(path: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any) -> dict[str, Any]:
    """Restore model, optimizer, scheduler and RNG states; return the trainer state."""
    path = Path(path)
    _refuse_pickle(path)
    state = read_state(path, "state")
    optim_sd = read_state(path, "optimizer")
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
    weights = _read_model(path)
    if has_adapters(model):  # the adapters only, which must be this run's (rank, targets)
        expected = set(trainable_names(model))
        if set(weights) != expected:
            raise StateFileError(f"checkpoint {path} holds {len(weights)} tensors but this run trains {len(expected)} "
                                 f"(e.g. {sorted(set(weights) ^ expected)[:2]}): resume with the model.lora settings "
                                 "it was written with, or checkpoint.resume=never")
        set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, strict=False))
    else:
        set_model_state_dict(model, weights, options=opts)
    set_optimizer_state_dict(model, optimizer, optim_sd, options=opts)
    if scheduler is not None and state["scheduler"] is not None:
        scheduler.load_state_dict(state["scheduler"])
    set_rng_state(_rng_of_this_rank(state["rng"]))
    return state["trainer"]


def _read_model(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(path / "model.safetensors")
    except Exception as e:  # safetensors raises its own error types for damaged files
        raise StateFileError(f"{path / 'model.safetensors'} is not a valid safetensors file ({e}); delete this "
                             "checkpoint folder (an older one is used) or resume with checkpoint.resume=never") from e
