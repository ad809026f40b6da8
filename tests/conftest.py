"""The environment `make test` sets, as defaults, so a plain `pytest tests` runs the same way.

OMP_WAIT_POLICY=PASSIVE: OpenMP threads sleep instead of spinning while they wait; beside
other busy processes spinning made CPU work 10-50x slower (ENVIRONMENT.md). It only changes
speed: no test depends on it (nor on the thread count) for its result. It must be set before
torch is first imported, which this file, loaded before every test module, guarantees; the
subprocesses the tests start inherit it.
HF_HUB_OFFLINE=1: the tests use only models they build; nothing may wait on the network.
EASYVIDEOR1_FUSED_ATTENTION=1: on a CUDA machine, packed attention refuses SDPA's MATH kernel, so
a call that no fused kernel takes fails the test instead of silently using [H, L, L] scores.
OMP_NUM_THREADS under pytest-xdist (`make test` runs `-n 2`): the workers share the cores as
torchrun's ranks do (easyvideor1.threads), so two workers on two cores run one thread each
instead of four threads fighting over two cores. Set before torch is imported, like the rest.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("EASYVIDEOR1_FUSED_ATTENTION", "1")  # on CUDA: SDPA's MATH fallback raises (models.fused_attention)
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    from easyvideor1.threads import intra_op_threads, usable_cores

    os.environ.setdefault("OMP_NUM_THREADS", str(intra_op_threads(
        usable_cores(), 0, local_ranks=int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

import shutil  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture
def ipc_dir():
    """A short new folder for UNIX sockets (vLLM's VLLM_RPC_BASE_PATH): a socket path must fit in
    107 bytes, and pytest's tmp_path (one level deeper under xdist) plus vLLM's uuid can exceed it."""
    path = Path(tempfile.mkdtemp(prefix="ev1-ipc-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
