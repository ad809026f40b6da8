"""Start-up memory of each rank under torchrun (2 processes, a 47M-parameter Qwen2.5-VL-shaped
model, policy + bf16 reference): the peak RSS of the start-up phase above its entry stays below the
rank's resident shard (float32 policy / 2 + bf16 reference / 2) plus the largest tensor plus a
128 MiB margin (FSDP2's first root pass gathers one unit at a time, tokenizer, data, allocator
slack; measured ~60 MiB), and below the whole policy + reference each rank used to read. The
previous start-up (every rank loading the whole model, then sharding) fails both. Measured by
`benchmarks/rank_memory_phases.py` (VmHWM reset per phase with /proc/self/clear_refs)."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "benchmarks" / "rank_memory_phases.py"
MARGIN = 128 << 20


@pytest.fixture(scope="module")
def rank_memory():
    spec = importlib.util.spec_from_file_location("rank_memory_phases", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc/self/clear_refs")
def test_start_up_holds_only_the_rank_shard(tmp_path, rank_memory):
    fig = rank_memory.measure(tmp_path, procs=2, until="start-up", hidden=512, layers=12, mlp=2048)
    n = fig["params"]
    resident = (4 * n + 2 * n) / 2  # float32 policy and bf16 reference, halved
    whole = 4 * n + 2 * n
    print(rank_memory.report(fig), file=sys.stderr)
    for rank in fig["ranks"]:
        above = rank["start-up"]["above"]
        assert above < resident + fig["largest_tensor"] + MARGIN, rank_memory.report(fig)
        assert above < whole, rank_memory.report(fig)
