"""Where the tests find the real converted benchmark annotation files: the folder named by
$EASYVIDEOR1_BENCHMARK_ANNOTATIONS, else ../shared/benchmark-annotations beside the repository
(outside it: a checkout without that folder skips these tests, and the skip says so)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(os.environ.get("EASYVIDEOR1_BENCHMARK_ANNOTATIONS",
                           Path(__file__).resolve().parents[2] / "shared" / "benchmark-annotations"))
MISSING = (f"needs the real benchmark annotation files: {ROOT} is absent (put them there or point "
           "EASYVIDEOR1_BENCHMARK_ANNOTATIONS at them)")
needs_annotations = pytest.mark.skipif(not ROOT.is_dir(), reason=MISSING)
