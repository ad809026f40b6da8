"""Checkpoints: save atomically, keep the newest K, resume exactly, on any number of processes.

A checkpoint is a folder `step-000010/` holding per rank the slices of the model weights and
of the optimizer state that rank holds (`shards`: `model.rank00000.safetensors` + `.json`, the
same for `optimizer`; under LoRA the trainable adapter parameters only), the optimizer's
other state (`optimizer.json`: its parameter groups), and in `state.json` + `state.safetensors`
the LR schedule, every RNG state of every rank, the trainer's own state (data-loader position,
KL coefficient) and the step; `config.yaml` holds the run's whole config and `meta.json` the
step, the process count and the working folder its relative paths are relative to, so
`easyvideor1 export CHECKPOINT --out DIR` needs nothing else (`recorded_config`). No file is a
pickle: a checkpoint from someone else can hold only data. A folder with an older version's `state.pt` (a pickle) is refused, never unpickled.

No rank gathers the model or the optimizer: each writes its own shard, then the ranks wait
for each other on a CPU group whose timeout is `checkpoint.timeout_minutes` (a slow write does
not trip the NCCL watchdog), and every rank learns whether all writes succeeded. All ranks
write into `step-000010.tmp-<pid of rank 0>/` (a filesystem every rank sees), renamed by rank 0
once every shard is complete, so a run killed at any moment leaves either a whole checkpoint
or none; leftovers of killed writes are removed. Resuming, each rank reads only the rows it
holds in this run (resharded by global offsets, so 2 processes resume 1 and back).
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
import yaml
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from easyvideor1 import distributed, testhooks
from easyvideor1.config import CheckpointConfig, load_config
from easyvideor1.errors import UserError, out_of_space
from easyvideor1.models.lora import has_adapters, trainable_names
from easyvideor1.training.state.files import StateFileError, read_state, write_state
from easyvideor1.training.state.shards import Shards, shard_files, write_shard

_NAME = re.compile(r"^step-(\d{6,})$")
RUN_CONFIG_FILE = "config.yaml"  # the run's config, in each checkpoint
_MARKERS = ("state.json", "state.pt")  # state.pt: an older version's pickle, listed so that it is refused


def rng_state() -> dict[str, Any]:
    """This process's generators; of CUDA's only its own device's (the one it computes on), so a
    node with fewer GPUs can take it back (`device_rng_state`)."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": [torch.cuda.get_rng_state()] if torch.cuda.is_available() else []}


def device_rng_state(saved: list[torch.Tensor], device: int) -> torch.Tensor | None:
    """The saved CUDA generator state that device `device` of this process takes back: the one
    saved (this format: one per process), or from an older checkpoint's list of every device the
    process saw, that device's entry when the list has it, else the first; None when none was
    saved (a CPU run). Never an index past the list: a node with fewer GPUs resumes."""
    if not saved:
        return None
    return saved[device] if len(saved) > 1 and device < len(saved) else saved[0]


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
    cuda = device_rng_state(state["cuda"], torch.cuda.current_device()) if torch.cuda.is_available() else None
    if cuda is not None:
        torch.cuda.set_rng_state(cuda)


def checkpoint_size(trainable: float, total: float, lora: bool, adam: bool) -> float:
    """Bytes of one checkpoint: the float32 master weights (LoRA: the trained parameters only) and
    AdamW's two float32 moments of what trains (`plan` counts the same)."""
    return 4 * (trainable if lora else total) + (8 * trainable if adam else 0)


def free_disk(path: str | os.PathLike) -> tuple[Path, int]:
    """(the nearest existing folder of `path`, which may not exist yet, and its disk's free bytes)."""
    folder = Path(path).absolute()
    while not folder.is_dir():
        folder = folder.parent
    return folder, shutil.disk_usage(folder).free


def checkpoint_room(cfg, trainable: int, total: int) -> None:
    """Refuse to start a run whose checkpoints cannot fit its disk: `checkpoint.keep` of them plus
    the one being written (the oldest goes only after the new one is complete, `checkpoint_size`
    each), less what the run's checkpoints already on disk take. Every rank looks at its own view
    of the disk and all refuse together (`distributed.all_true`)."""
    c = cfg.checkpoint
    if not c.every:
        return
    one = checkpoint_size(trainable, total, bool(cfg.model.lora.rank), cfg.training.optimizer == "adamw")
    root = Path(cfg.logging.out_dir) / "checkpoints"
    held = sum(f.stat().st_size for d in list_checkpoints(root) for f in d.rglob("*") if f.is_file())
    need = (c.keep + 1) * one - held
    folder, free = free_disk(cfg.logging.out_dir)
    if not distributed.all_true(need <= free):
        gib = 2**30
        raise UserError(f"checkpoints of this run take {one / gib:.1f} GiB each, {(c.keep + 1) * one / gib:.1f} GiB for "
                        f"checkpoint.keep={c.keep} + the one being written ({held / gib:.1f} GiB of them on disk "
                        f"already), but {folder} has {free / gib:.1f} GiB free (on at least one rank): free space, "
                        "lower checkpoint.keep or checkpoint.every=0, or set logging.out_dir on a larger disk")


def list_checkpoints(root: str | os.PathLike) -> list[Path]:
    """Complete checkpoints under `root`, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _NAME.match(p.name) and any((p / m).exists() for m in _MARKERS)]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))


def _sharded() -> StateDictOptions:
    return StateDictOptions(full_state_dict=False)  # DTensors as they are: this rank's shards, no gathering


def _model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model part of a checkpoint (this rank's shards): every weight, or under LoRA the
    trainable parameters only (the frozen base is the model at `model.path`)."""
    state = get_model_state_dict(model, options=_sharded())
    if has_adapters(model):
        keep = set(trainable_names(model))
        state = {k: v for k, v in state.items() if k in keep}
    return state


def _split_optimizer(tree: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(the tensors of the optimizer state, keyed `param/name`; the rest: groups and any non-tensor state)."""
    tensors = {f"{p}/{k}": v for p, st in tree["state"].items() for k, v in st.items() if isinstance(v, torch.Tensor)}
    rest = {"state": {p: {k: v for k, v in st.items() if not isinstance(v, torch.Tensor)}
                      for p, st in tree["state"].items()}, "param_groups": tree["param_groups"]}
    return tensors, rest


def save_checkpoint(root: str | os.PathLike, step: int, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, scheduler: Any, trainer_state: dict[str, Any],
                    keep: int = 2, timeout_minutes: float = CheckpointConfig.timeout_minutes,
                    config: dict[str, Any] | None = None) -> Path | None:
    """Write checkpoint `step` under `root`: every rank writes its shards (all ranks call);
    `timeout_minutes` bounds the wait for the slowest rank's write; `config` (the run's config as
    a dict) is written as `config.yaml`. Returns the folder on rank 0."""
    model_sd = _model_tensors(model)
    optim_tensors, optim_rest = _split_optimizer(get_optimizer_state_dict(model, optimizer, options=_sharded()))
    gathered = distributed.all_gather_objects((rng_state(), os.getpid()))  # every rank's, in rank order
    final = Path(root) / f"step-{step:06d}"
    tmp = Path(root) / f"{final.name}.tmp-{gathered[0][1]}"  # one folder for all ranks: rank 0's pid
    failure: Exception | None = None
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        write_shard(tmp, "model", model_sd)
        testhooks.hit("checkpoint.write")
        write_shard(tmp, "optimizer", optim_tensors)
        if distributed.rank() == 0:
            write_state(tmp, "optimizer", optim_rest)
            write_state(tmp, "state", {"scheduler": scheduler.state_dict() if scheduler else None,
                                       "rng": [r for r, _ in gathered], "trainer": trainer_state, "step": step})
            if config is not None:
                (tmp / RUN_CONFIG_FILE).write_text(yaml.safe_dump(json.loads(json.dumps(config)), sort_keys=False))
            (tmp / "meta.json").write_text(json.dumps({"step": step, "world": distributed.world_size(),
                                                       "cwd": os.getcwd()}))
    except Exception as e:  # noqa: BLE001 - every rank must learn of it (below), not hang in the barrier
        failure = out_of_space(e, tmp, "resume (checkpoint.resume=auto): the previous checkpoints are kept") or e
    wait = distributed.waiting_group(timeout_minutes)  # the slowest write is waited for here, not under NCCL
    if distributed.any_true(failure is not None, group=wait):  # one decision: every rank stops alike
        if distributed.rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)  # no half checkpoint is left behind
        raise failure if failure is not None else RuntimeError(f"another rank failed to write checkpoint {final} "
                                                               "(its log says why)")
    if distributed.rank() == 0:  # every shard is complete: the rename makes the checkpoint visible
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        for old in list_checkpoints(root)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    distributed.barrier(wait)
    return final if distributed.rank() == 0 else None


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


def _refuse_single_file(path: Path) -> None:
    if not shard_files(path, "model") and (path / "model.safetensors").exists():
        raise StateFileError(
            f"checkpoint {path} is in the single-file layout of an easyvideor1 before sharded checkpoints "
            "(model.safetensors) and cannot be resumed; export its weights (`easyvideor1 export CONFIG "
            f"--checkpoint {path} --merge --out DIR`) and train from them (model.path=DIR), or resume with "
            "checkpoint.resume=never")


def load_checkpoint(path: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any) -> dict[str, Any]:
    """Restore model, optimizer, scheduler and RNG states (each rank reads the slices it holds,
    whatever the number of processes that wrote them); return the trainer state."""
    path = Path(path)
    _refuse_pickle(path)
    _refuse_single_file(path)
    state = read_state(path, "state")
    optim_rest = read_state(path, "optimizer")
    weights = _model_tensors(model)
    shards = Shards(path, "model")
    if set(shards.shapes) != set(weights):  # under LoRA the adapters must be this run's (rank, targets)
        raise StateFileError(f"checkpoint {path} holds {len(shards.shapes)} weights but this run has "
                             f"{len(weights)} (e.g. {sorted(set(shards.shapes) ^ set(weights))[:2]}): resume "
                             "with the model and model.lora settings it was written with, or "
                             "checkpoint.resume=never")
    for key, tensor in weights.items():
        shards.fill(key, tensor)
    set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=False, strict=False))
    optim_sd = get_optimizer_state_dict(model, optimizer, options=_sharded())  # creates the states to fill
    shards = Shards(path, "optimizer")
    for p, st in optim_sd["state"].items():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                shards.fill(f"{p}/{k}", v)
            else:
                st[k] = optim_rest["state"][p][k]
    optim_sd["param_groups"] = optim_rest["param_groups"]
    set_optimizer_state_dict(model, optimizer, optim_sd, options=_sharded())
    if scheduler is not None and state["scheduler"] is not None:
        scheduler.load_state_dict(state["scheduler"])
    set_rng_state(_rng_of_this_rank(state["rng"]))
    return state["trainer"]


def is_checkpoint(path: str | os.PathLike) -> bool:
    """Whether `path` is a checkpoint folder (`step-NNNNNN` with its state)."""
    path = Path(path)
    return path.is_dir() and any((path / m).exists() for m in _MARKERS)


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint's `meta.json` ({} when absent)."""
    try:
        return json.loads((Path(path) / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def named_by(folder: str | os.PathLike) -> Path | None:
    """The checkpoint `folder` names: itself, or the newest of a run (`RUN/checkpoints/`) or of a
    demo (`DEMO/train/checkpoints/`); None when it names none."""
    if is_checkpoint(folder):
        return Path(folder)
    for root in (Path(folder) / "checkpoints", Path(folder) / "train" / "checkpoints"):
        found = list_checkpoints(root)
        if found:
            return found[-1]
    return None


def recorded_config(path: str | os.PathLike, overrides: list[str] | None = None):
    """The run's `Config` as checkpoint `path` recorded it (plus `overrides`), its relative paths
    (model, templates) resolved against the folder the run started in; FileNotFoundError for a
    checkpoint of a version that recorded none."""
    file = Path(path) / RUN_CONFIG_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{path} records no config ({RUN_CONFIG_FILE}; an older version wrote it)")
    cfg = load_config(str(file), overrides, check_prompt=False)  # as recorded: an older run may predate the check
    cwd = Path(read_meta(path).get("cwd") or os.getcwd())
    for section, key in (("model", "path"), ("data", "template_dir")):
        value = getattr(getattr(cfg, section), key)
        if value and not Path(value).is_absolute() and not Path(value).exists() and (cwd / value).exists():
            setattr(getattr(cfg, section), key, str(cwd / value))
    return cfg


def read_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The whole model part of checkpoint `path` (for export, in one process): every weight, or
    under LoRA the trainable ones; the single-file layout of older versions too."""
    path = Path(path)
    if shard_files(path, "model"):
        shards = Shards(path, "model")
        return {key: shards.full(key) for key in shards.shapes}
    try:
        return load_file(path / "model.safetensors")
    except Exception as e:  # safetensors raises its own error types for damaged files
        raise StateFileError(f"{path} is not a checkpoint folder (no model shards, no readable model.safetensors: "
                             f"{e}); expected <logging.out_dir>/checkpoints/step-NNNNNN") from e
