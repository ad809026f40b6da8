"""Where separate placement's processes run: what the config allows, which of torchrun's ranks
are rollout ranks, each rollout process's device, and the names both sides meet under."""

from __future__ import annotations

import os
import socket

import torch

from easyvideor1 import distributed
from easyvideor1.config import Config
from easyvideor1.config_tree import ConfigError
from easyvideor1.models.loading import resolve_dtype

KEY_ENV = "EASYVIDEOR1_ROLLOUT_KEY"  # the connection's key (hex), handed to the rollout process
PAIR_PREFIX = "rollout-pair/"  # the weight group's keys in the store (torchrun's, or the trainer's)
POOL_PREFIX = "rollout-pool/"  # rollout.processes > 1: the rollout processes' own default group
ADDRESS_KEY = "rollout-address"  # under torchrun: + "/i", (host, port, key) of rollout rank i's listener


def rollout_dtype(cfg: Config) -> torch.dtype:
    """What the rollout process holds its weights in: vLLM's `rollout.dtype`, else the compute dtype."""
    return resolve_dtype(cfg.rollout.dtype if cfg.rollout.engine == "vllm" else cfg.model.dtype)


def check_placement(cfg: Config, world: int) -> None:
    """`training.max_staleness` needs separate placement; what that does not run yet, one clear
    error each. `world`: the processes torchrun launched (1 without it), rollout ranks included."""
    r = cfg.rollout
    if r.partial and (r.placement != "separate" or cfg.training.max_staleness < 1):
        raise ConfigError("rollout.partial=true continues responses with weights that arrive during their generation: "
                          "it needs rollout.placement=separate and training.max_staleness >= 1")
    if r.placement != "separate":
        if cfg.training.max_staleness:
            raise ConfigError(f"training.max_staleness={cfg.training.max_staleness} needs rollout.placement=separate "
                              "(colocated generation is always on-policy)")
        return
    if r.processes < 1:
        raise ConfigError(f"rollout.processes={r.processes} must be >= 1")
    if world > 1 and r.processes >= world:
        raise ConfigError(f"rollout.processes={r.processes} under torchrun with {world} processes leaves no trainer "
                          f"rank: launch more than {r.processes} processes")
    if r.engine == "vllm" and r.processes % r.tensor_parallel_size:
        raise ConfigError(f"rollout.tensor_parallel_size={r.tensor_parallel_size} must divide rollout.processes="
                          f"{r.processes} under separate placement (each rollout process is one rank of a vLLM engine)")
    if cfg.training.max_staleness < 0:
        raise ConfigError(f"training.max_staleness={cfg.training.max_staleness} must be >= 0")
    if r.partial and r.engine != "hf":
        raise ConfigError(f"rollout.partial=true runs on rollout.engine=hf only, not {r.engine}: vLLM's offline LLM "
                          "generates each request to its end (pausing takes its AsyncLLM, not built here yet)")
    if r.partial and r.processes > 1:
        raise ConfigError(f"rollout.partial=true runs with rollout.processes=1 only, not {r.processes}: a pool's "
                          "processes would have to switch weights at the same point of unequal shares")


def rollout_ranks(cfg: Config) -> int:
    """How many of torchrun's processes (the last ones) are rollout ranks: `rollout.processes`
    under separate placement when torchrun launched more than one, else 0 (one process starts
    its rollout processes itself)."""
    world = distributed.launched()[1]
    return cfg.rollout.processes if cfg.rollout.placement == "separate" and world > 1 else 0


def is_rollout_rank(cfg: Config) -> bool:
    """This process is one of the last `rollout.processes` ranks of torchrun's world: it only
    generates and scores (`rollout_side.serve_rank`). Checks the placement first (every rank alike)."""
    rank, world = distributed.launched()
    check_placement(cfg, world)
    return rank >= world - rollout_ranks(cfg)


def reachable_host() -> str:
    """This machine's address on the route to torchrun's MASTER_ADDR (127.0.0.1 on one node):
    where trainer ranks on other nodes reach the rollout rank's listener. (A UDP connect sends nothing.)"""
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((master, 1))
        return s.getsockname()[0]


def engine_width(cfg: Config) -> int:
    """Rollout processes (and GPUs) one rollout engine spans: a vLLM tensor-parallel group, else 1."""
    return cfg.rollout.tensor_parallel_size if cfg.rollout.engine == "vllm" else 1


def rollout_env(env: dict[str, str], index: int, processes: int, width: int = 1) -> dict[str, str]:
    """The environment of spawned rollout process `index`: on GPUs, only its engine's devices
    visible (its own, 1 + index, with the `width` - 1 others of its vLLM tensor-parallel group),
    so every engine it builds lands there (`rollout_device`). One GPU for the trainer and each
    rollout process, or a one-line error before anything starts."""
    if not torch.cuda.is_available():
        return env
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()] or \
        [str(k) for k in range(torch.cuda.device_count())]
    if len(visible) < 1 + processes:
        raise ConfigError(f"rollout.placement=separate needs a GPU for the trainer and one for each of its "
                          f"{processes} rollout process(es), {1 + processes} in all; this process sees {len(visible)} "
                          "(two processes on one GPU cannot share NCCL's weight broadcasts): use "
                          "rollout.placement=colocated, or fewer rollout.processes")
    first = 1 + index - index % width
    return {**env, "CUDA_VISIBLE_DEVICES": ",".join(visible[first:first + width])}


def pin_rank_devices(cfg: Config, env=os.environ) -> None:
    """Under torchrun, as a rollout rank, before CUDA initialises (CUDA reads the variable once):
    only its engine's devices visible, as `rollout_env` for a spawned process: LOCAL_RANK's (of
    the variable's list, when set), with the others of its vLLM tensor-parallel group, the ranks
    beside it on the node."""
    if torch.cuda.is_initialized():
        raise RuntimeError("a rollout rank initialised CUDA before pinning its device (placement.pin_rank_devices)")
    rank, world = distributed.launched()
    width = engine_width(cfg)
    first = int(env.get("LOCAL_RANK", "0")) - (rank - (world - cfg.rollout.processes)) % width
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed == "":  # no GPU for this process: nothing to narrow
        return
    visible = [d.strip() for d in listed.split(",")] if listed else [str(d) for d in range(first + width)]
    if first < 0 or first + width > len(visible):
        raise ConfigError(f"rollout.tensor_parallel_size={width}: the rollout ranks of one vLLM engine must be on "
                          f"one node (rank {rank}: LOCAL_RANK {env.get('LOCAL_RANK', '0')}, "
                          f"CUDA_VISIBLE_DEVICES={'unset' if listed is None else listed})")
    env["CUDA_VISIBLE_DEVICES"] = ",".join(visible[first:first + width])


def rollout_device(cfg: Config, index: int) -> torch.device:
    """Rollout process `index`'s GPU, of the ones it sees (only its engine's: `rollout_env`,
    `pin_rank_devices`): its place in its engine's group. vLLM's one-process executor takes
    device 0 of them, `external_launcher` the current one (`vllm_engine._launcher_ranks`). Else
    the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    device = torch.device("cuda", index % engine_width(cfg))
    torch.cuda.set_device(device)
    return device
