#!/usr/bin/env bash
# Runs the README's test command (`make test`) while busy loops keep every core loaded, to show
# that the suite passes on a busy machine; prints the suite's wall time and exits with its code.
#
# Usage: scripts/test_under_load.sh [COMMAND ...]
#   COMMAND      what to run under load instead of `make test`, e.g. one test file:
#                scripts/test_under_load.sh .venv/bin/python -m pytest -q tests/rewards/test_judge.py
#   LOAD_PROCS   number of busy loops (default: one per core, `nproc`)
#
# The busy loops are plain shell loops (no Python needed). They are killed when this script
# exits, however it exits (normal end, error, Ctrl-C, SIGTERM, SIGHUP; the command is then
# stopped too). Should the script be SIGKILLed, each loop sees within a fraction of a second
# that its parent is gone and exits.
set -uo pipefail
cd "$(dirname "$0")/.."

LOAD_PROCS="${LOAD_PROCS:-$(nproc)}"
# No per-test limit here either: the summary names the tests over a budget scaled by the run's own
# reference workload (tests/budget.py), which the busy loops slow as they slow the tests.
if [ "$#" -eq 0 ]; then
  set -- make test
fi

set -m  # every background job in its own process group: one kill stops a whole tree
burners=()
cmd=""
cleanup() {
  trap - EXIT INT TERM HUP
  if [ -n "$cmd" ] && kill -0 "$cmd" 2>/dev/null; then
    kill -TERM -- "-$cmd" 2>/dev/null  # the command and everything it started
    wait "$cmd" 2>/dev/null
  fi
  if [ "${#burners[@]}" -gt 0 ]; then
    kill "${burners[@]}" 2>/dev/null
    wait "${burners[@]}" 2>/dev/null
  fi
}
trap cleanup EXIT
trap 'echo "[test_under_load] interrupted" >&2; exit 130' INT
trap 'echo "[test_under_load] terminated" >&2; exit 143' TERM
trap 'exit 129' HUP

# Each loop counts in the shell (pure CPU) and checks every 100k rounds that this script is alive.
BURN='n=0; while :; do n=$((n + 1)); if [ "$n" -ge 100000 ]; then kill -0 "$PPID" 2>/dev/null || exit 0; n=0; fi; done'
for _ in $(seq "$LOAD_PROCS"); do
  sh -c "$BURN" &
  burners+=("$!")
done
echo "[test_under_load] $LOAD_PROCS busy loop(s) (pids ${burners[*]}) beside: $*"

SECONDS=0
"$@" </dev/null &
cmd=$!
wait "$cmd"
rc=$?
cmd=""
elapsed=$SECONDS

printf '[test_under_load] exit code %d, wall time %dm%02ds, with %d busy loop(s) on %d core(s)\n' \
  "$rc" $((elapsed / 60)) $((elapsed % 60)) "$LOAD_PROCS" "$(nproc)"
exit "$rc"
