"""The environment `make test` sets, as defaults, so a plain `pytest tests` runs the same way.

OMP_WAIT_POLICY=PASSIVE: OpenMP threads sleep instead of spinning while they wait; beside
other busy processes spinning made CPU work 10-50x slower (ENVIRONMENT.md). It only changes
speed: no test depends on it (nor on the thread count) for its result. It must be set before
torch is first imported, which this file, loaded before every test module, guarantees; the
subprocesses the tests start inherit it.
HF_HUB_OFFLINE=1: the tests use only models they build; nothing may wait on the network.
EASYVIDEOR1_FUSED_ATTENTION=1: on a CUDA machine, packed attention refuses SDPA's MATH kernel, so
a call that no fused kernel takes fails the test instead of silently using [H, L, L] scores.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("EASYVIDEOR1_FUSED_ATTENTION", "1")  # on CUDA: SDPA's MATH fallback raises (models.fused_attention)
