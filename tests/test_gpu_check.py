"""scripts/gpu_check.py, run as on the GPU machine but with tiny models on CPU (--tiny --cpu):
both families train through the real trainer, every update sees videos and images, and the
counts its MFU rests on agree with the trainer's own token count and with hand-counted params."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


def _run(args: list[str], tmp_path: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1"}
    env.pop("OUT", None)
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=tmp_path)


@pytest.mark.slow  # ~20 s of CPU time (3 processes importing torch + transformers), 30-60 s wall on 2 shared cores
def test_tiny_cpu_run_counts_what_the_update_processes(tmp_path):
    out = tmp_path / "out"
    p = _run(["--tiny", "--cpu", "--out", str(out), "--work", str(tmp_path / "work")], tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert [m["model"] for m in report["models"]] == ["qwen2_5_vl_3b", "qwen3_vl_8b"]
    assert "qwen2_5_vl_3b" in p.stdout and "MFU" in p.stdout  # the table was printed
    wl = report["workload"]
    for m in report["models"]:
        assert m["status"] == "ok", m
        assert [s["step"] for s in m["steps"]] == [1, 2]
        # Each prompt is answered n times. With the group-shared prefix (on by default; its
        # micro-batches hold whole groups here) the update runs every prompt once, as one row
        # with its n responses; without it, n times, once per response.
        runs = 1 if m["shared_prefix"] else wl["n"]
        assert m["shared_prefix"]  # the default for these families (SDPA, full attention)
        assert m["padding_free"]  # also the default: the group rows are blocks of one packed row
        for s in m["steps"]:
            assert s["responses"] == wl["prompts"] * wl["n"]
            # rows of the update, and both modalities seen (2 of each per step)
            assert s["update_sequences"] == wl["prompts"] * runs
            assert s["update_videos"] == s["update_images"] == wl["prompts"] // 2 * runs
            # The trainer counts each prompt once plus the responses. A hook firing twice (e.g.
            # in checkpoint recomputation) or missing a micro-batch breaks this identity.
            prompt_tokens = s["step_tokens"] - s["response_tokens"]
            assert s["update_tokens"] == pytest.approx(runs * prompt_tokens + s["response_tokens"], abs=0.5)
            assert 0 < s["response_tokens"] <= s["responses"] * wl["max_tokens"]
            assert s["vision_patches"] > 0 and s["mfu"] is None  # no peak on CPU
            # The module docstring's MFU numerator, recomputed from the report's own inputs:
            # 6 x (LLM body x update tokens + lm_head x response tokens + vision blocks and patch
            # embedding x patches + merger x patches / merge). Every term is nonzero here.
            fp = m["flop_params"]
            assert min(fp["llm_body"], fp["lm_head"], fp["vision_per_patch"], fp["vision_per_merged"]) > 0
            flops = 6 * (fp["llm_body"] * s["update_tokens"] + fp["lm_head"] * s["response_tokens"]
                         + fp["vision_per_patch"] * s["vision_patches"]
                         + fp["vision_per_merged"] * s["vision_patches"] / fp["merge"])
            assert s["update_flops"] == pytest.approx(flops, rel=1e-9)
    # Parameter classes of the tiny Qwen2.5-VL (hidden 64, 2 layers, 2 heads, 1 kv head of 32,
    # MLP 128, vocab 4096; vision width 32, MLP 64, 2 blocks, patch 14, merge 2):
    layer = (64 * 64 + 64) + 2 * (64 * 32 + 32) + 64 * 64 + 3 * 64 * 128 + 2 * 64  # q,k,v (bias), o, MLP, norms
    block = 2 * 32 + (32 * 96 + 96) + (32 * 32 + 32) + 2 * (32 * 64 + 64) + (64 * 32 + 32)
    merger = 32 + (128 * 128 + 128) + (128 * 64 + 64)  # norm, then MLP over 4 merged patches
    fp = report["models"][0]["flop_params"]
    assert fp["llm_body"] == 2 * layer + 64  # embeddings are lookups, not FLOPs
    assert fp["lm_head"] == 4096 * 64
    assert fp["vision_per_patch"] == 3 * 2 * 14 * 14 * 32 + 2 * block  # patch embedding + blocks
    assert fp["vision_per_merged"] == merger and fp["merge"] == 4


def test_without_cuda_it_says_so(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    p = _run(["--out", str(tmp_path)], tmp_path, timeout=120)
    assert p.returncode == 2
    assert "no CUDA device" in p.stdout
    assert "no CUDA device" in json.loads((tmp_path / "gpu_check.json").read_text())["error"]
