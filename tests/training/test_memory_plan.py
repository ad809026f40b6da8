"""`easyvideor1 plan`'s memory model (`training.plan.memory`) against what the CPU measures.

Three configurations (`benchmarks/plan_check.CHECKS`: float32 without and with gradient
checkpointing, bf16 compute with a shared prompt; different micro-batches; a video in every
prompt) each run one real forward + backward of a Qwen2.5-VL-shaped model (vision tower
included) in a fresh subprocess: state is the exact bytes of
parameters, gradients and AdamW states, activations the peak resident memory above the step's
start. The plan, read from the model's config.json, must be within 25% of both. The same check
fails for a formula without the MLPs' saved tensors (a shape with no intermediate widths).
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import plan_check  # noqa: E402

from easyvideor1.training.plan.memory import layer_bytes  # noqa: E402
from easyvideor1.training.plan.shapes import read_shape  # noqa: E402


@pytest.fixture(scope="module")
def checked():
    """(check, measured figures) of the three configurations, measured in subprocesses."""
    return list(zip(plan_check.CHECKS, plan_check.measure_all(plan_check.CHECKS)))


def _shape(check):
    with tempfile.TemporaryDirectory() as folder:
        plan_check.model_config(check).save_pretrained(folder)
        return read_shape(folder)


@pytest.mark.slow  # 71 s in a make test run on an AVX2-only CPU (emulated): 3 processes, 2 at a time, one step each
def test_plan_is_within_25_percent_of_the_cpu_measurement(checked):
    results = [(c, plan_check.compare(plan_check.plan_figures(_shape(c), c), m)) for c, m in checked]
    print("\n" + plan_check.table(results))
    for check, rows in results:
        for what, (planned, measured, ratio) in rows.items():
            assert abs(ratio - 1) <= plan_check.TOLERANCE, f"{check.name}: {what} planned {planned:.1f} MiB, " \
                                                           f"measured {measured:.1f} MiB"


@pytest.mark.slow  # shares the measurements above
def test_a_formula_without_the_mlp_term_fails_the_check(checked):
    ratios = []
    for check, measured in checked:
        shape = _shape(check)
        no_mlp = dataclasses.replace(shape, intermediate=0, vision_intermediate=0)  # no MLP in layers or blocks
        assert layer_bytes(no_mlp, 4) < layer_bytes(shape, 4)
        ratios.append(plan_check.compare(plan_check.plan_figures(no_mlp, check), measured)["activations"][2])
    assert any(abs(r - 1) > plan_check.TOLERANCE for r in ratios), ratios
