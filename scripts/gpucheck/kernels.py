"""Which attention kernels ran, and the 60-second device check of review finding A1.

`KernelLog` profiles a stretch of work (torch.profiler, operator names only) and counts SDPA's
backend operators by kind: flash, efficient (memory-efficient), cudnn, math, flex
(FlexAttention's compiled kernels), cpu (the CPU kernels, whatever their name). On CUDA the child
runs with `EASYVIDEOR1_FUSED_ATTENTION=1` (`easyvideor1.models.fused_attention.kernel_policy`: a
call only MATH could run raises), and `fused_ran` asserts that fused kernels ran.

`a1_check` is section F of `../shared/reviews/gpu-scale-review.md`: one GQA group-shared block of
4k and 8k tokens (28 query / 4 key-value heads, head dim 128, bf16) through `packed_attention`,
forward and backward, its peak memory, and whether it runs with MATH refused.
"""

from __future__ import annotations

import contextlib

KINDS = {  # operator name fragment -> kind (first match wins)
    "_for_cpu": "cpu",
    "_attention_math": "math",
    "flash": "flash",
    "efficient": "efficient",
    "cudnn": "cudnn",
    "flex_attention": "flex",
}


def kind_of(name: str) -> str | None:
    """The attention backend an operator name belongs to, or None."""
    if "attention" not in name and "flex" not in name:
        return None
    return next((kind for frag, kind in KINDS.items() if frag in name), None)


class KernelLog(contextlib.AbstractContextManager):
    """`with KernelLog() as k:` ... `k.counts`: backend kind -> operator calls."""

    def __enter__(self):
        from torch.profiler import ProfilerActivity, profile

        self._prof = profile(activities=[ProfilerActivity.CPU])
        self._prof.__enter__()
        return self

    def __exit__(self, *exc):
        self._prof.__exit__(*exc)
        self.counts: dict[str, int] = {}
        for event in self._prof.key_averages():
            kind = kind_of(event.key)
            if kind is not None:
                self.counts[kind] = self.counts.get(kind, 0) + event.count
        return False


def fused_ran(counts: dict[str, int]) -> str | None:
    """Why `counts` (of a CUDA step) show no fused attention kernel, or None. MATH calls are not
    an error here: the policed call sites (packed rows, the vision tower) raise on MATH by
    themselves (`kernel_policy`); the HF engine's padded decoding is not policed and may use it."""
    fused = sum(counts.get(k, 0) for k in ("flash", "efficient", "cudnn", "flex"))
    return None if fused else f"no fused attention kernel ran: {counts}"


def a1_check(device: str = "cuda", sizes=(4096, 8192)) -> list[dict]:
    """Section F of the review: peak memory of one GQA group-shared block, and its kernel."""
    import torch
    from torch.nn.attention import sdpa_kernel

    from easyvideor1.models.fused_attention import FUSED_BACKENDS
    from easyvideor1.models.packing import Packing, packed_attention

    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    rows = []
    for n in sizes:
        q = torch.randn(1, 28, n, 128, device=device, dtype=dtype, requires_grad=True)
        k = torch.randn(1, 4, n, 128, device=device, dtype=dtype, requires_grad=True)
        v = torch.randn_like(k, requires_grad=True)
        seg = torch.cat([torch.zeros(n - 4 * 256), torch.arange(1, 5).repeat_interleave(256)]).long().to(device)
        pk = Packing((0, n), seg, (True,))
        row = {"tokens": n}
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        with KernelLog() as log:
            out, _ = packed_attention(None, q, k, v, None, packing=pk)
            out.sum().backward()
        row["kernels"] = log.counts
        if device == "cuda":
            row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
            try:  # no MATH allowed: raises if only MATH could run it
                with sdpa_kernel(FUSED_BACKENDS):
                    packed_attention(None, q, k, v, None, packing=pk)
                row["fused"] = True
            except RuntimeError as e:
                row["fused"], row["error"] = False, str(e)[:200]
        rows.append(row)
        print(f"gpu_check a1: {row}", flush=True)
    return rows
