"""A machine-speed reference: a fixed small workload whose time is the unit of the test suite's time
figures (tests/budget.py), so figures from different machines (or one machine on different days) compare.

Machines of one kind differ: on an AVX2-only EPYC one thread of fp32 matmul took twice as long as on
the CPU of the README's figures, and `import torch, transformers` ~10 s. The unit is the best of
three timings of what a tiny run spends its time on: 10 one-thread fp32 matmuls of 2048x512 @
512x1536 (~0.24 s on an AVX-512 Xeon, ~0.28 s capped to AVX2) plus a pure-Python loop of dict updates and
string joins (~0.3 s there). A machine that stays busy measures slower, as its work then runs.

    >>> from easyvideor1.speed import reference
    >>> reference()  # doctest: +SKIP
    {'matmul': 0.24, 'python': 0.31, 'unit': 0.55}
"""

from __future__ import annotations

import time


def _matmul_s(a, b) -> float:
    t = time.perf_counter()
    for _ in range(10):
        a @ b
    return time.perf_counter() - t


def _python_s() -> float:
    t = time.perf_counter()
    d: dict[int, int] = {}
    for i in range(2_000_000):
        d[i % 1000] = d.get(i % 1000, 0) + i
    "".join(str(i) for i in range(800_000))
    return time.perf_counter() - t


def reference() -> dict[str, float]:
    """Seconds of each part and their sum (`unit`), measured in this process on one intra-op thread
    (the thread count is restored)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(2048, 512, generator=g), torch.randn(512, 1536, generator=g)
        a @ b  # first call: kernel selection, allocation
        matmul = min(_matmul_s(a, b) for _ in range(3))
    finally:
        torch.set_num_threads(threads)
    python = min(_python_s() for _ in range(3))
    return {"matmul": matmul, "python": python, "unit": matmul + python}


def describe_reference(ref: dict[str, float]) -> str:
    """`1 unit = 0.55 s here (matmul 0.24 s + Python 0.31 s, one thread)`."""
    return (f"1 unit = {ref['unit']:.2f} s here (matmul {ref['matmul']:.2f} s + Python {ref['python']:.2f} s, "
            "one thread)")


if __name__ == "__main__":  # python -m easyvideor1.speed: the reference as JSON (tests/budget.py reads it)
    import json

    print(json.dumps(reference()))
