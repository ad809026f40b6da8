#!/usr/bin/env bash
# How many pytest-xdist workers `make test` starts (TEST_WORKERS=N overrides it): two per core,
# at most one per 3 GiB of available memory, at least one.
#
# Usage: scripts/test_workers.sh [CORES MEM_AVAILABLE_KIB]   (default: `nproc`, /proc/meminfo)
#
# Two per core: each worker runs one thread (tests/conftest.py sets OMP_NUM_THREADS to cores //
# workers, at least 1) and spends much of its time waiting on the processes its tests start
# (training commands, torchrun ranks, vLLM engines), so a second worker per core fills that time.
# On a busy machine the kernel shares the cores among runnable threads, so four workers beside
# two busy loops get up to two thirds of a 2-core machine, two workers half of it. Measured on
# 2 cores, one fresh clone of a0cde60 (2026-12-04), runs one after another: beside two busy loops
# 13 min 22 s with 4 workers, 15 min 40 s with 2; alone 9 min 38 s with 4, 9 min 15 s with 2
# (within this machine's noise; 4 workers take ~7% more CPU: more fork servers to start).
# 3 GiB: the peak with 4 workers was ~12 GiB in use (torchrun ranks and vLLM engines at once).
set -euo pipefail
cores="${1:-$(nproc)}"
mem_kib="${2:-$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)}"
workers=$((2 * cores))
by_memory=$((mem_kib / (3 * 1024 * 1024)))
if [ "$by_memory" -lt "$workers" ]; then
  workers=$by_memory
fi
if [ "$workers" -lt 1 ]; then
  workers=1
fi
echo "$workers"
