"""The environment `make test` sets, as defaults, so a plain `pytest tests` runs the same way.

OMP_WAIT_POLICY=PASSIVE: OpenMP threads sleep instead of spinning while they wait; beside
other busy processes spinning made CPU work 10-50x slower (ENVIRONMENT.md). It only changes
speed: no test depends on it (nor on the thread count) for its result. It must be set before
torch is first imported, which this file, loaded before every test module, guarantees; the
subprocesses the tests start inherit it.
HF_HUB_OFFLINE=1: the tests use only models they build; nothing may wait on the network.
EASYVIDEOR1_FUSED_ATTENTION=1: on a CUDA machine, packed attention refuses SDPA's MATH kernel, so
a call that no fused kernel takes fails the test instead of silently using [H, L, L] scores.
OMP_NUM_THREADS under pytest-xdist (`make test` runs a worker per core): the workers share the
cores as torchrun's ranks do (easyvideor1.threads), cores // workers threads each, at least one,
instead of a thread per core in every worker fighting over the cores. Set before torch is
imported, like the rest.
VLLM_CACHE_ROOT: one folder for the whole run, made by the first process that loads this file
(pytest, or xdist's master, whose workers and their subprocesses inherit it) and removed at its
end. vLLM inspects a model class in a subprocess of its own (~10 s of CPU: it imports vLLM again)
unless this folder holds the class's description from an earlier engine start; with a folder per
test every vLLM start paid it. The description is keyed by the hash of vLLM's model file.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("EASYVIDEOR1_FUSED_ATTENTION", "1")  # on CUDA: SDPA's MATH fallback raises (models.fused_attention)
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    from easyvideor1.threads import intra_op_threads, usable_cores

    os.environ.setdefault("OMP_NUM_THREADS", str(intra_op_threads(
        usable_cores(), 0, local_ranks=int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

import collections  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

_OWN_VLLM_CACHE = "EV1_TEST_VLLM_CACHE_ROOT" not in os.environ  # the first process: xdist's master or a plain pytest
if _OWN_VLLM_CACHE:
    os.environ["EV1_TEST_VLLM_CACHE_ROOT"] = tempfile.mkdtemp(prefix="ev1-vllm-cache-")
_OWN_PYCACHE = "EV1_TEST_PYCACHE" not in os.environ
if _OWN_PYCACHE:
    os.environ["EV1_TEST_PYCACHE"] = tempfile.mkdtemp(prefix="ev1-pycache-")
os.environ["VLLM_CACHE_ROOT"] = os.environ["EV1_TEST_VLLM_CACHE_ROOT"]
# Compiled bytecode for the run, in one folder of its own (not the clone's __pycache__), written even
# where the machine sets PYTHONDONTWRITEBYTECODE: each of the suite's ~300 processes imports ~150
# modules of this package fresh (a forked child too: tests/forkserver.py), 0.35 CPU-s from source
# against 0.11 from bytecode. Compiling is deterministic, so no test can see the difference.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
os.environ["PYTHONPYCACHEPREFIX"] = os.environ["EV1_TEST_PYCACHE"]
sys.dont_write_bytecode = False
sys.pycache_prefix = os.environ["PYTHONPYCACHEPREFIX"]

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

import budget  # noqa: E402  (the reference, wall and CPU time, tests over budget: tests/budget.py)


def pytest_configure(config):
    if not config.pluginmanager.has_plugin("budget"):  # `-p budget` registers it already
        config.pluginmanager.register(budget, "budget")


def _process_group_alive() -> bool:
    dist = sys.modules.get("torch.distributed")  # a process that never imported it made no group
    return dist is not None and dist.is_available() and dist.is_initialized()


def _leave_process_groups() -> None:
    import torch.distributed as dist

    from easyvideor1 import distributed

    distributed.close()
    if dist.is_initialized():
        dist.destroy_process_group()


def _left_a_group(what: str) -> str:
    return (f"{what} left a torch.distributed process group alive (destroyed now, so the next test starts "
            f"clean): leave it where it was made (easyvideor1.distributed.close(), or dist.destroy_process_group(); "
            f"an in-process vLLM engine leaves its group at engine.close())")


# A test or a module that leaves a torch.distributed process group alive in the worker fails: a
# group inherited by a later test's forked process crashed it (issue 54: a segfault in
# `~ProcessGroupGloo` in a cache worker). A test body is checked around its call (a group its
# fixtures hold, such as an in-process vLLM engine's, was there before it and stays); a module
# after its last fixture is torn down. In-process training leaves its groups with
# `easyvideor1.distributed.close()`, as `cli.main` does.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    before = _process_group_alive()
    result = yield
    if not before and _process_group_alive():
        _leave_process_groups()
        raise AssertionError(_left_a_group(f"the test {item.nodeid}"))
    return result


@pytest.fixture(scope="module", autouse=True)
def _no_process_group_left_by_the_module(request):
    before = _process_group_alive()
    yield
    if not before and _process_group_alive():
        _leave_process_groups()
        pytest.fail(_left_a_group(f"the module {request.node.nodeid} (a fixture of it)"), pytrace=False)


@pytest.fixture
def ipc_dir():
    """A short new folder for UNIX sockets (vLLM's VLLM_RPC_BASE_PATH): a socket path must fit in
    107 bytes, and pytest's tmp_path (one level deeper under xdist) plus vLLM's uuid can exceed it."""
    path = Path(tempfile.mkdtemp(prefix="ev1-ipc-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


# The longest test files, longest first (measured: `make test`'s durations summed per file, those
# over 40 s in a capped fresh clone of 5ba6e32).
# Under `-n 2 --dist loadfile --no-loadscope-reorder` (`make test`; without the last flag xdist
# sorts files by their number of tests) a worker takes whole files in this order as it frees up, so
# starting with the longest ones keeps one long file from running alone at the end while the
# other worker idles (the tail was ~3 minutes of a 13-minute suite). Order only: every test runs.
LONGEST_FILES = (
    "tests/training/test_async_training.py",
    "tests/training/test_sequence_parallel.py",
    "tests/training/test_vllm_trainer.py",
    "tests/test_forkserver.py",
    "tests/rewards/test_properties.py",
    "tests/evaluation/test_eval_tools.py",  # one vLLM start and a tool-calling eval
    "tests/models/test_ulysses.py",
    "tests/training/test_lora.py",
    "tests/training/test_families.py",
    "tests/test_docs_run.py",  # getting-started and the README tour as processes
    "tests/training/test_sharded_checkpoints.py",
    "tests/training/test_long_prompt_memory.py",
    "tests/evaluation/test_pipeline_vllm.py",
    "tests/rollout/test_vllm_moe.py",
    "tests/training/test_token_balance_distributed.py",
    "tests/rollout/test_tools.py",
    "tests/training/test_memory_plan.py",
    "tests/training/test_distributed.py",
    "tests/training/test_resume.py",
    "tests/rollout/test_vllm_engine.py",
    "tests/training/test_tools_training.py",
    "tests/test_chaos.py",
    "tests/training/test_demo_smoke.py",
    "tests/test_gpu_check.py",
    "tests/training/test_rank_agreement.py",
    "tests/test_threads.py",
    "tests/data/test_bad_corpus.py",
    "tests/training/test_moe_families.py",
    "tests/test_cli_errors.py",
)


def pytest_unconfigure(config):
    if _OWN_VLLM_CACHE:
        shutil.rmtree(os.environ["EV1_TEST_VLLM_CACHE_ROOT"], ignore_errors=True)
    if _OWN_PYCACHE:
        shutil.rmtree(os.environ["EV1_TEST_PYCACHE"], ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    """Longest files first (`LONGEST_FILES`), the rest in their usual order."""
    rank = {name: k for k, name in enumerate(LONGEST_FILES)}
    root = Path(str(config.rootpath))

    def key(item):
        return rank.get(Path(str(item.path)).relative_to(root).as_posix(), len(rank))

    items.sort(key=key)


_FORKSERVER_COUNTS = [collections.Counter(), collections.Counter(), collections.Counter()]  # preloaded, fresh, servers


def pytest_sessionfinish(session):
    """Stop this process's fork server (tests/forkserver.py) and keep its counts for the summary."""
    forkserver = sys.modules.get("forkserver")
    if forkserver is None:
        return
    forkserver.close_server()
    counts = [dict(forkserver.LAUNCHED), dict(forkserver.FALLBACKS), {"servers": forkserver.SERVERS_STARTED[0]}]
    if hasattr(session.config, "workeroutput"):  # an xdist worker: the master adds it up
        session.config.workeroutput["forkserver"] = counts
    else:
        _add_counts(counts)


def _add_counts(counts):
    for total, part in zip(_FORKSERVER_COUNTS, counts):
        total.update(part)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    _add_counts(getattr(node, "workeroutput", {}).get("forkserver", [{}, {}, {}]))


def _cpu_line() -> str:
    """The CPU the suite ran on, as its figures need it: AVX-512 and bf16 support decide its speed,
    and the two variables that cap them (README, Tests)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "CPU: unknown"
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []))
    caps = " ".join(f"{k}={os.environ[k]}" for k in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY") if os.environ.get(k))
    return (f"CPU: {name}, {os.cpu_count()} cores, AVX-512 {'yes' if 'avx512f' in flags else 'no'}, "
            f"AVX512-BF16 {'yes' if 'avx512_bf16' in flags else 'no'}" + (f"; capped by {caps}" if caps else ""))


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(_cpu_line())
    preloaded, fresh, servers = _FORKSERVER_COUNTS
    if preloaded or fresh:
        why = ", ".join(f"{n} {reason}" for reason, n in fresh.most_common())
        terminalreporter.write_line(f"tests/forkserver.py: {sum(preloaded.values())} test subprocesses started "
                                    f"preloaded by {servers['servers']} servers, {sum(fresh.values())} fresh "
                                    f"({why or 'none'})")
