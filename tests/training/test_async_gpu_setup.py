"""What decides where separate placement's processes run and how long their NCCL collectives may
wait, checked on the CPU by what they are handed (review gpu-scale-review-2, N1-N3): a spawned
rollout process sees only its own GPU, one GPU for all is refused in one line before anything
starts, and the weight group and the trainer world get `training.collective_timeout_minutes`
(NCCL's default is 10 minutes). CUDA cannot run here: `torch.cuda` answers as a machine with
GPUs would, and the NCCL group and `init_process_group` record their arguments."""

from __future__ import annotations

import datetime

import pytest
import torch

from easyvideor1 import distributed
from easyvideor1.config import load_config
from easyvideor1.config_tree import ConfigError
from easyvideor1.training import fsdp
from easyvideor1.training.asynchronous import placement, weights


@pytest.fixture
def gpus(monkeypatch):
    def count(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    return count


def test_each_spawned_rollout_process_sees_only_its_own_gpu(gpus):
    gpus(8)
    env = {"PATH": "/bin"}
    assert [placement.rollout_env(env, i, 3)["CUDA_VISIBLE_DEVICES"] for i in range(3)] == ["1", "2", "3"]
    pinned = {"CUDA_VISIBLE_DEVICES": "4,5,6"}  # the launcher's choice is kept: the trainer has 4
    assert [placement.rollout_env(pinned, i, 2)["CUDA_VISIBLE_DEVICES"] for i in range(2)] == ["5", "6"]


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
