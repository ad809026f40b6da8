#!/usr/bin/env bash
# Runs the multi-process tests N times in a row beside busy loops (scripts/test_under_load.sh),
# to show that no run of several processes fails now and then: e.g. a rank that finished its
# work and then aborted at exit (distributed.close explains that abort). Prints each
# iteration's result, then `stress: K of N green`, and exits non-zero if any iteration failed.
#
# Usage: scripts/stress_multiprocess.sh [-n N] [PYTEST_ARGS ...]
#   -n N         iterations (default: $STRESS_N, else 20)
#   PYTEST_ARGS  passed to each pytest run, e.g. -x, or test ids to run instead of TESTS below;
#                after `--` when one starts with -n, e.g. `-n 20 -- -n 2 --dist loadfile`
#   LOAD_PROCS   busy loops beside the tests (default 2)
#   PYTHON       the interpreter (default .venv/bin/python)
#   EV1_TEST_FORKSERVER=0  start every process as a fresh interpreter, as a user's torchrun does
#                (by default the tests fork them from tests/forkserver.py's preloaded servers;
#                the exit path, interpreter shutdown, is the same either way)
#
# CI (`make test`) does not run these tests without the fork server: on an AVX2-only 2-core CPU
# the suite takes ~12 of its 15 minutes, and these tests in fresh interpreters would add several
# more (a test-sized training command costs ~11 CPU-s fresh against ~4 forked). What a
# fork cannot give is covered inside the budget instead: the ranks of test_distributed's first
# test and the halves of test_resume's adaptive-KL test are fresh interpreters with their own
# PYTHONHASHSEED (tests/forkserver.py `hash_seed`). Before a release, or after a change to how
# processes start, run them fresh once:
#   EV1_TEST_FORKSERVER=0 LOAD_PROCS=0 scripts/stress_multiprocess.sh -n 1 -- -n 4 --dist loadfile
#
# The busy loops are test_under_load.sh's: they are killed however this script ends (normal
# end, error, Ctrl-C, SIGTERM), and so is a pytest run in flight.
set -uo pipefail
cd "$(dirname "$0")/.."

# Every test that runs several processes of the package at once. Files whose other tests run
# one process are narrowed to their multi-process tests.
TESTS=(
  # torchrun ranks (torch.distributed, gloo, FSDP2)
  tests/training/test_distributed.py
  tests/training/test_token_balance_distributed.py
  tests/training/test_rank_agreement.py
  tests/training/test_sequence_parallel.py
  tests/training/test_lora.py::test_two_processes_equal_one_process
  tests/training/test_vllm_trainer.py::test_torchrun_engine_per_rank_tensor_parallel_tied_parity
  tests/models/test_ulysses.py
  tests/training/test_sharded_checkpoints.py
  tests/training/test_collective_counts.py
  tests/training/test_export_stream.py
  tests/training/test_rank_memory.py
  tests/models/test_meta_init.py::test_two_processes_each_rank_shard_equal
  tests/rollout/test_tools.py::test_fsdp_ranks_with_unequal_tool_use
  # a trainer and its rollout process (a gloo pair group of their own)
  tests/training/test_async_training.py
  # spawned ranks (torch.multiprocessing, gloo)
  tests/algorithms/test_aggregation.py::test_all_reduce_path_with_two_real_processes
  tests/algorithms/test_global_whitening.py
  # concurrent processes without torch.distributed: data-parallel eval workers, two cache
  # builders in one folder, two evals on one results folder
  tests/evaluation/test_node_scale.py
  tests/vision/test_cache_concurrency.py
  tests/evaluation/test_eval_lock.py
)
# Not here: tests that SIGKILL one process and resume it (test_resume, test_chaos, test_pass_rate,
# test_pipeline_hf, test_results, test_cache_build) run one process at a time.

N="${STRESS_N:-20}"
while getopts "n:" opt; do
  case "$opt" in
    n) N="$OPTARG" ;;
    *) echo "usage: $0 [-n N] [PYTEST_ARGS ...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
case "$N" in ''|*[!0-9]*|0) echo "stress: -n takes a positive whole number, not '$N'" >&2; exit 2 ;; esac

if [ -z "${STRESS_UNDER_LOAD:-}" ]; then  # start the busy loops, then come back below as their command
  export STRESS_UNDER_LOAD=1
  LOAD_PROCS="${LOAD_PROCS:-2}" exec scripts/test_under_load.sh "$0" -n "$N" -- "$@"
fi

PYTHON="${PYTHON:-.venv/bin/python}"
selected=()
extra=()
for a in "$@"; do
  case "$a" in
    tests/*) selected+=("$a") ;;
    *) extra+=("$a") ;;
  esac
done
[ "${#selected[@]}" -eq 0 ] && selected=("${TESTS[@]}")
logs=$(mktemp -d -t stress-multiprocess.XXXXXX)

green=0
for i in $(seq "$N"); do
  log="$logs/iteration-$i.log"
  SECONDS=0
  OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1 "$PYTHON" -m pytest -q -p no:cacheprovider "${extra[@]}" \
    "${selected[@]}" >"$log" 2>&1
  rc=$?
  summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed|error)' "$log" | tail -1 | sed 's/=//g; s/^ *//; s/ *$//')
  if [ "$rc" -eq 0 ]; then
    green=$((green + 1))
    echo "stress: iteration $i of $N green: ${summary:-pytest exit 0} (${SECONDS}s)"
    rm -f "$log"
  else
    echo "stress: iteration $i of $N FAILED (pytest exit $rc): ${summary:-no summary} (${SECONDS}s); log: $log"
    grep -E '^(FAILED|ERROR)|terminate called|exitcode' "$log" | head -20
  fi
done
rmdir "$logs" 2>/dev/null  # kept when a failed iteration's log is in it
echo "stress: $green of $N green"
[ "$green" -eq "$N" ]
