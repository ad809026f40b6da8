"""scripts/gpu_check.py (pieces in scripts/gpucheck/), run as on the GPU machine but with tiny
models on CPU (--tiny --cpu): both families and the realistic row's shape train through the real
trainer, every update sees videos and images, and the counts its MFU rests on agree with the
trainer's own token count, with hand-counted params and with attention pairs counted by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"
sys.path.insert(0, str(SCRIPT.parent))

from gpucheck.flops import attention_dims, attention_flops, causal_pairs, piece_pairs, vision_pairs  # noqa: E402
from gpucheck.kernels import a1_check, fused_ran, kind_of  # noqa: E402
from gpucheck.shapes import TINY_SHAPES, hf_config  # noqa: E402


def _run(args: list[str], tmp_path: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1"}
    env.pop("OUT", None)
    return forkserver.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=tmp_path)


@pytest.mark.slow  # ~30 s of CPU time (4 processes importing torch + transformers), 60-90 s wall on 2 shared cores
def test_tiny_cpu_run_counts_what_the_update_processes(tmp_path):
    out = tmp_path / "out"
    # float32: what is counted does not depend on the dtype, and bf16 is ~57x slower than fp32 on a
    # CPU without AVX-512 (the realistic row's 16k-token video)
    p = _run(["--tiny", "--cpu", "--dtype", "float32", "--out", str(out), "--work", str(tmp_path / "work"),
              "--models", "qwen2_5_vl_3b,qwen3_vl_8b,qwen2_5_vl_7b"], tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert [m["model"] for m in report["models"]] == ["qwen2_5_vl_3b", "qwen3_vl_8b", "qwen2_5_vl_7b"]
    assert "qwen2_5_vl_3b" in p.stdout and "MFU" in p.stdout  # the table was printed
    wl = report["workload"]
    for m in report["models"][:2]:
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
    _check_realistic_row(report["models"][2], report["workloads"]["qwen2_5_vl_7b"])


def _check_realistic_row(m, wl):
    """The realistic row's structure (tiny widths): one video prompt, its n responses in one
    group-shared block, gradient checkpointing; attention FLOPs from the counted pairs."""
    assert m["status"] == "ok" and m["shared_prefix"] and m["padding_free"], m
    assert m["attention_kernels"].get("cpu", 0) > 0 and m["fused_attention"] is None  # asserted on CUDA only
    fp = m["flop_params"]
    assert (fp["llm_layers"], fp["llm_width"], fp["vision_full_layers"], fp["vision_window_layers"]) == (2, 64, 1, 1)
    for s in m["steps"]:
        assert s["update_sequences"] == 1 and s["update_videos"] == 1 and s["update_images"] == 0
        assert s["responses"] == wl["n"]
        prompt, resp = s["update_tokens"] - s["response_tokens"], s["response_tokens"]
        # The prompt's pairs once, each response over the prompt and itself (not n prompts).
        assert causal_pairs(prompt) + resp * prompt + resp <= s["llm_pairs"]
        assert s["llm_pairs"] <= causal_pairs(prompt) + resp * prompt + causal_pairs(resp)
        assert s["vision_full_pairs"] > s["vision_window_pairs"] > 0
        assert s["attention_flops"] == pytest.approx(12 * (fp["llm_layers"] * fp["llm_width"] * s["llm_pairs"] + fp[
            "vision_width"] * (s["vision_full_pairs"] + s["vision_window_pairs"])), rel=1e-9)


def test_attention_pairs_match_a_hand_count():
    """`piece_pairs` and `vision_pairs` against the allowed (query, key) pairs of explicit masks."""
    import torch

    def shared_mask(parts):  # prompt causal; response i sees the prompt and itself causally
        n, seg = sum(parts), torch.cat([torch.full((c,), i) for i, c in enumerate(parts)])
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        return causal & ((seg[:, None] == seg[None, :]) | (seg[None, :] == 0))

    for parts in ((7,), (5, 3), (6, 1, 4, 2)):
        assert piece_pairs(parts) == int(shared_mask(parts).sum()), parts
    assert piece_pairs((4, 2, 3)) == 10 + (2 * 4 + 3) + (3 * 4 + 6)  # by hand
    # Qwen2.5-VL-like: 2 temporal patches of 12 x 20 patches, merge 2, windows of 4 x 4 merged
    # tokens: rows 8 + 4 patches, cols 8 + 8 + 4 patches.
    window = torch.zeros(12, 20, dtype=torch.long)
    for a, (r0, r1) in enumerate(((0, 8), (8, 12))):
        for b, (c0, c1) in enumerate(((0, 8), (8, 16), (16, 20))):
            window[r0:r1, c0:c1] = 3 * a + b
    ids = window.flatten()
    full, windowed = vision_pairs((2, 12, 20), window=4, merge=2)
    assert full == 2 * 240**2
    assert windowed == 2 * int((ids[:, None] == ids[None, :]).sum()) == 2 * (8**2 + 4**2) * (8**2 + 8**2 + 4**2)
    assert vision_pairs((3, 4, 4), window=0, merge=2) == (3 * 256, 0)
    assert attention_flops(layers=2, width=64, pairs=100) == 12 * 2 * 64 * 100  # (2 QK^T + 2 AV) x 3 (fwd + bwd)


def test_realistic_shape_dims():
    """The tiny realistic row's attention dims from its HF config (28/4 heads -> 4/2 here)."""
    tokens = {t: i for i, t in enumerate(["<|im_end|>", "<|endoftext|>", "<|image_pad|>", "<|video_pad|>",
                                          "<|vision_start|>", "<|vision_end|>"])}
    dims = attention_dims(hf_config(TINY_SHAPES["qwen2_5_vl_7b"], tokens))
    assert dims == dict(llm_layers=2, llm_width=64, vision_width=32, vision_full_layers=1, vision_window_layers=1)


def test_kernel_kinds_and_the_a1_check_on_cpu():
    names = {"aten::_scaled_dot_product_flash_attention": "flash", "aten::_efficient_attention_backward": "efficient",
             "aten::_scaled_dot_product_cudnn_attention": "cudnn", "aten::_scaled_dot_product_attention_math": "math",
             "aten::_scaled_dot_product_flash_attention_for_cpu": "cpu", "aten::mm": None}
    assert {n: kind_of(n) for n in names} == names
    assert fused_ran({"math": 3}) is not None and fused_ran({"flash": 2, "math": 1}) is None
    (row,) = a1_check("cpu", (1280,))  # section F's code path, small
    assert row["tokens"] == 1280 and row["kernels"].get("cpu", 0) >= 1


def test_without_cuda_it_says_so(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    p = _run(["--out", str(tmp_path)], tmp_path, timeout=120)
    assert p.returncode == 2
    assert "no CUDA device" in p.stdout
    assert "no CUDA device" in json.loads((tmp_path / "gpu_check.json").read_text())["error"]
