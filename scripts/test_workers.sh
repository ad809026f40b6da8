#!/usr/bin/env bash
# How many pytest-xdist workers `make test` starts (TEST_WORKERS=N overrides it): one per core,
# at most one per 3 GiB of available memory, at least one.
#
# Usage: scripts/test_workers.sh [CORES MEM_AVAILABLE_KIB]
#   Defaults: `nproc` and /proc/meminfo's MemAvailable, each lowered to this process's cgroup
#   limits where a container sets them (CPU quota; memory limit less the memory in use), read
#   under CGROUP (default /sys/fs/cgroup; cgroup v2, else v1).
#
# One per core: the suite's time is CPU time (the processes its tests start), and on a slow
# 2-core CPU alone the run is bound by it. Each worker keeps its own fork servers
# (tests/forkserver.py: a server per set of import-time variables, ~7 CPU-s to start), so a
# second worker per core adds servers and contention without adding cores. Measured on 2 cores,
# one fresh clone of a0cde60 (2026-12-04), runs one after another: alone 9 min 15 s with 2
# workers, 9 min 38 s with 4, which took ~7% more CPU; beside two busy loops 4 workers were
# faster (13 min 22 s against 15 min 40 s: they get a larger share of a busy machine), so on a
# machine shared with other work TEST_WORKERS=4 may pay.
# 3 GiB: the peak with 4 workers was ~12 GiB in use (torchrun ranks and vLLM engines at once).
set -euo pipefail
CGROUP="${CGROUP:-/sys/fs/cgroup}"

# The cgroup's CPU quota in whole cores, rounded up; nothing if it sets none.
quota_cores() {
  local quota period
  if [ -r "$CGROUP/cpu.max" ]; then
    read -r quota period < "$CGROUP/cpu.max"
  elif [ -r "$CGROUP/cpu/cpu.cfs_quota_us" ]; then
    quota=$(cat "$CGROUP/cpu/cpu.cfs_quota_us") period=$(cat "$CGROUP/cpu/cpu.cfs_period_us")
  fi
  case "${quota:-max}" in max | -*) return ;; esac
  echo $(((quota + period - 1) / period))
}

# The cgroup's memory limit less its usage, in KiB; nothing if it sets none.
quota_free_kib() {
  local limit used
  if [ -r "$CGROUP/memory.max" ]; then
    limit=$(cat "$CGROUP/memory.max") used=$(cat "$CGROUP/memory.current")
  elif [ -r "$CGROUP/memory/memory.limit_in_bytes" ]; then
    limit=$(cat "$CGROUP/memory/memory.limit_in_bytes") used=$(cat "$CGROUP/memory/memory.usage_in_bytes")
  fi
  case "${limit:-max}" in max) return ;; esac
  echo $(((limit - used) / 1024))  # v1's "no limit" is a number near 2^63: larger than any MemAvailable
}

smaller() { if [ -n "$2" ] && [ "$2" -lt "$1" ]; then echo "$2"; else echo "$1"; fi; }

cores="${1:-$(smaller "$(nproc)" "$(quota_cores)")}"
mem_kib="${2:-$(smaller "$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)" "$(quota_free_kib)")}"
workers=$cores
by_memory=$((mem_kib / (3 * 1024 * 1024)))
if [ "$by_memory" -lt "$workers" ]; then
  workers=$by_memory
fi
if [ "$workers" -lt 1 ]; then
  workers=1
fi
echo "$workers"
