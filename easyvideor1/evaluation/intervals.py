"""The 95% confidence interval of every benchmark score and breakdown cell of an `Aggregate`.

A number's `Estimand` (bootstrap.py) comes from its benchmark's `estimands` when the benchmark
declares one for it ("overall", or "<breakdown>=<label>"), else it is the mean over the rows
the number covers (all rows for "overall", the rows carrying the label value for a cell). An
estimand is used only if it gives back the reported number (and, for a cell, its count):
otherwise the number is not the mean its interval would describe, and it gets "not available"
rather than an interval of something else. Numbers in `Aggregate.metrics` get no interval.
"""

from __future__ import annotations

import logging
import math

from easyvideor1.evaluation.adapters.base import Benchmark
from easyvideor1.evaluation.aggregate import Aggregate, groups_of, row_mean
from easyvideor1.evaluation.bootstrap import Estimand, interval, unavailable
from easyvideor1.evaluation.results import ResultRow

log = logging.getLogger(__name__)

MISMATCH = "the score is not a mean of per-sample scores this report can resample"


def add_intervals(bench: Benchmark, rows: list[ResultRow], agg: Aggregate) -> Estimand | None:
    """Set `agg.ci` and every category's `ci`; returns the headline's estimand (for paired tests)."""
    declared = bench.estimands(rows) if bench.estimands is not None else {}
    head = _checked(declared.get("overall") or row_mean(rows), agg.overall, None, f"{bench.name} overall")
    agg.ci = interval(head) if head is not None else unavailable(MISMATCH)
    for name, table in agg.categories.items():
        groups = groups_of(rows, name)
        for label, cell in table.items():
            est = declared.get(f"{name}={label}") or row_mean(groups.get(label, []))
            est = _checked(est, cell.score, cell.count, f"{bench.name} {name}={label}")
            cell.ci = interval(est) if est is not None else unavailable(MISMATCH)
    return head


def _checked(est: Estimand, score: float, count: int | None, what: str) -> Estimand | None:
    units = len(set(zip(est.ids, est.strata)))
    if math.isclose(est.point(), score, abs_tol=1e-9) and (count is None or units == count):
        return est
    log.warning("%s: no interval (its estimand gives %.6f over %d units, the report %.6f over %s)",
                what, est.point(), units, score, count)
    return None
