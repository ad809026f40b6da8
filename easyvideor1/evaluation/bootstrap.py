"""Confidence intervals and paired tests for benchmark scores: the cluster bootstrap by video.

Many questions of a benchmark share one video, and a model that misreads the video tends to
miss all of them: the answers are correlated, and an interval that treats them as independent
is too narrow. So every resample here draws whole clusters (a sample's video; a sample without
one is its own cluster) with replacement, `RESAMPLES` times with the fixed seed `SEED`, and the
95% interval is the 2.5th to 97.5th percentile of the resampled scores (percentile bootstrap),
clipped to the score's range [0, 1] (a difference's: [-1, 1]): the small-sample widening can
push a bound past it, and an accuracy near 0 must not get an interval below 0.

A score is written as an `Estimand`: the weighted mean, over strata, of the mean unit value in
each stratum. That covers a plain accuracy (one stratum, the rows), a mean of task accuracies
(MVBench: one stratum per task, equal weights), nested means (OVO-Bench: tasks in modes) and
group scores (Video-MME-v2: a unit is a group of 4 questions). A stratum a resample does not
draw drops out and the weights of the others are renormalized, as the benchmark's own summary
averages over the categories present.

The paired test (`paired`) resamples the clusters of the units both runs scored, with the same
draws for both runs, and reads the difference's interval and a two-sided p-value off the
resampled differences. Fewer than `MIN_CLUSTERS` clusters give no interval ("n too small").
Vectorized: a resample is a row of cluster counts; the stratum sums of all resamples are one
matrix product (counts [B, C] @ cluster sums [C, K]).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

LEVEL = 0.95  # coverage of every interval
RESAMPLES = 2000  # bootstrap resamples per interval or test
SEED = 0  # every interval and test draws from a generator seeded with this: reports are reproducible
MIN_CLUSTERS = 10  # fewer clusters than this: "n too small", no interval
SCORE_RANGE = (0.0, 1.0)  # every unit value (ResultRow.score) lies in it, so every score and bound does
_BLOCK = 4_000_000  # resamples x clusters per block of the count matrix (bounds memory)
METHOD = (f"cluster bootstrap by video (percentile, {RESAMPLES} resamples, seed {SEED}, "
          "spread by sqrt(C/(C-1)) t/z for C clusters)")


@dataclass(frozen=True)
class Estimand:
    """A score as sum_k w_k * mean(values of the units in stratum k) / sum of the w_k present."""

    ids: tuple[str, ...]
    """Unit ids [n] (sample ids; group ids where the unit is a group), the pairing key."""
    values: np.ndarray
    """Unit scores [n] in [0, 1]."""
    clusters: tuple[str, ...]
    """Cluster key per unit [n] (the video; a unit without one is its own cluster)."""
    strata: tuple[str, ...]
    """Stratum name per unit [n] (a unit may appear in several strata, once per stratum)."""
    weights: dict[str, float]
    """Stratum name -> weight."""

    def point(self) -> float:
        """The score itself (every unit once)."""
        index = {c: i for i, c in enumerate(dict.fromkeys(self.clusters))}
        sums, counts, w = _design(self, np.array([index[c] for c in self.clusters], dtype=np.int64), len(index))
        return float(_statistic(sums.sum(0, keepdims=True), counts.sum(0, keepdims=True), w)[0])


def unit_mean(ids: Sequence[str], values: Sequence[float], clusters: Sequence[str], stratum: str = "") -> Estimand:
    """The plain mean of some units' values (one stratum)."""
    return Estimand(tuple(ids), np.asarray(values, dtype=np.float64), tuple(clusters),
                    (stratum,) * len(ids), {stratum: 1.0})


def macro(parts: dict[str, Estimand]) -> Estimand:
    """The unweighted mean of several estimands (e.g. of task accuracies); nests."""
    if not parts:
        return unit_mean([], [], [])
    share = 1.0 / len(parts)
    return Estimand(
        ids=tuple(i for e in parts.values() for i in e.ids),
        values=np.concatenate([e.values for e in parts.values()]),
        clusters=tuple(c for e in parts.values() for c in e.clusters),
        strata=tuple(f"{name}/{s}" for name, e in parts.items() for s in e.strata),
        weights={f"{name}/{s}": share * w for name, e in parts.items() for s, w in e.weights.items()})


@dataclass
class ScoreInterval:
    """A score's confidence interval (`low`/`high` None where there is none; `note` says why)."""

    low: float | None
    """Lower bound in [0, 1]."""
    high: float | None
    """Upper bound in [0, 1]."""
    clusters: int
    """Clusters (videos) the units fall in."""
    units: int
    """Distinct units resampled (samples, or groups for group scores)."""
    note: str = ""
    """Why there is no interval ("n too small ..." / "not available ...")."""

    def text(self) -> str:
        """'41.2–58.8' (percent, one decimal), 'n too small' or 'n/a'."""
        if self.low is None or self.high is None:
            return "n too small" if self.note.startswith("n too small") else "n/a"
        return f"{100 * self.low:.1f}–{100 * self.high:.1f}"


@dataclass
class PairedTest:
    """A minus B over the units both runs scored, with its interval, p-value and verdict."""

    delta: float | None
    """score_A - score_B over the shared units, in [-1, 1] (None: no shared units)."""
    low: float | None
    """Lower bound of the difference's interval."""
    high: float | None
    """Upper bound."""
    p_value: float | None
    """Two-sided bootstrap p-value of "no difference"."""
    shared: int
    """Units both runs scored."""
    clusters: int
    """Clusters of the shared units."""
    verdict: str
    """"A better", "B better" (p_value < 1 - LEVEL), "no significant difference", or
    "not tested: why"."""


def interval_text(ci: ScoreInterval | None) -> str:
    """A table cell: `ci.text()`, or 'n/a' when there is no interval at all."""
    return ci.text() if ci is not None else "n/a"


def unavailable(why: str) -> ScoreInterval:
    """An interval that cannot be given, with the reason."""
    return ScoreInterval(None, None, 0, 0, note=f"not available: {why}")


def interval(est: Estimand, resamples: int = RESAMPLES, seed: int = SEED) -> ScoreInterval:
    """The percentile cluster-bootstrap interval of `est`."""
    index = {c: i for i, c in enumerate(dict.fromkeys(est.clusters))}
    n_clusters = len(index)
    if n_clusters < MIN_CLUSTERS:
        return ScoreInterval(None, None, n_clusters, len(set(est.ids)),
                        note=f"n too small ({n_clusters} clusters < {MIN_CLUSTERS})")
    sums, counts, w = _design(est, np.array([index[c] for c in est.clusters], dtype=np.int64), n_clusters)
    point = float(_statistic(sums.sum(0, keepdims=True), counts.sum(0, keepdims=True), w)[0])
    reps = _widen(_replicates([(sums, counts, w)], n_clusters, resamples, seed)[0], point, n_clusters)
    low, high = np.clip(np.quantile(reps, [(1 - LEVEL) / 2, (1 + LEVEL) / 2]), *SCORE_RANGE)
    return ScoreInterval(float(low), float(high), n_clusters, len(set(est.ids)))


def paired(a: Estimand, b: Estimand, resamples: int = RESAMPLES, seed: int = SEED) -> PairedTest:
    """Paired cluster bootstrap of score(a) - score(b) over the unit ids both hold (clusters as in
    `a`): the same resampled clusters for both, so what the two runs share cancels."""
    in_b = set(b.ids)
    shared = {i: c for i, c in zip(a.ids, a.clusters) if i in in_b}
    a, b = _restrict(a, shared), _restrict(b, shared)
    if not shared:
        return PairedTest(None, None, None, None, 0, 0, "not tested: no sample ids in common")
    delta = a.point() - b.point()
    index = {c: i for i, c in enumerate(dict.fromkeys(shared.values()))}
    n_clusters = len(index)
    if n_clusters < MIN_CLUSTERS:
        return PairedTest(delta, None, None, None, len(shared), n_clusters,
                          f"not tested: n too small ({n_clusters} clusters < {MIN_CLUSTERS})")
    designs = [_design(e, np.array([index[shared[i]] for i in e.ids], dtype=np.int64), n_clusters) for e in (a, b)]
    rep_a, rep_b = _replicates(designs, n_clusters, resamples, seed)
    diffs = _widen(rep_a - rep_b, delta, n_clusters)  # [B]
    span = SCORE_RANGE[1] - SCORE_RANGE[0]
    low, high = np.clip(np.quantile(diffs, [(1 - LEVEL) / 2, (1 + LEVEL) / 2]), -span, span)
    ties = int((diffs == 0).sum())  # half on each side (mid-p): scores are often 0/1, so resampled ties are common
    tail = min(int((diffs < 0).sum()), int((diffs > 0).sum())) + ties / 2
    p = min(1.0, 2 * (tail + 1) / (resamples + 1))
    verdict = "no significant difference"
    if p < 1 - LEVEL:
        verdict = "A better" if delta > 0 else "B better"
    return PairedTest(delta, float(low), float(high), p, len(shared), n_clusters, verdict)


def _widen(reps: np.ndarray, point: float, n_clusters: int) -> np.ndarray:
    """Spread the replicates about the point by sqrt(C / (C - 1)) * t_{C-1} / z: the bootstrap
    variance of a mean over C clusters is (C - 1) / C of the unbiased one (the CR1 factor of
    clustered standard errors), and with few clusters the reference is Student's t, not normal."""
    z = NormalDist().inv_cdf((1 + LEVEL) / 2)
    return point + (reps - point) * np.sqrt(n_clusters / (n_clusters - 1)) * t_quantile(n_clusters - 1) / z


def t_quantile(df: int, level: float = LEVEL) -> float:
    """Two-sided `level` quantile of Student's t with `df` degrees of freedom (Cornish-Fisher
    expansion, Abramowitz & Stegun 26.7.5: within 2e-3 of the exact value for df >= 9)."""
    z = NormalDist().inv_cdf((1 + level) / 2)
    g = ((z**3 + z) / 4, (5 * z**5 + 16 * z**3 + 3 * z) / 96,
         (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
         (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160)
    return z + sum(gk / df ** (k + 1) for k, gk in enumerate(g))


def _restrict(est: Estimand, keep: dict[str, str]) -> Estimand:
    if len(keep) == len(est.ids) and all(i in keep for i in est.ids):
        return est
    picks = [j for j, i in enumerate(est.ids) if i in keep]
    return Estimand(tuple(est.ids[j] for j in picks), est.values[picks], tuple(est.clusters[j] for j in picks),
                    tuple(est.strata[j] for j in picks), est.weights)


def _design(est: Estimand, cluster_idx: np.ndarray, n_clusters: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per cluster and stratum: value sums [C, K] and unit counts [C, K]; weights [K]."""
    names = list(est.weights)
    col = {s: k for k, s in enumerate(names)}
    strata = np.array([col[s] for s in est.strata], dtype=np.int64)
    sums = np.zeros((n_clusters, len(names)))
    counts = np.zeros((n_clusters, len(names)))
    np.add.at(sums, (cluster_idx, strata), est.values)
    np.add.at(counts, (cluster_idx, strata), 1.0)
    return sums, counts, np.array([est.weights[s] for s in names])


def _statistic(sums: np.ndarray, counts: np.ndarray, w: np.ndarray) -> np.ndarray:
    """[B, K] stratum sums and counts -> [B] weighted mean of the stratum means present."""
    present = counts > 0
    means = np.divide(sums, counts, out=np.zeros_like(sums), where=present)
    total = (present * w).sum(1)
    return np.divide((means * w).sum(1), total, out=np.zeros_like(total), where=total > 0)


def _replicates(designs: list[tuple[np.ndarray, np.ndarray, np.ndarray]], n_clusters: int,
                resamples: int, seed: int) -> list[np.ndarray]:
    """Bootstrap replicates [B] of each design, all under the same cluster draws."""
    rng = np.random.default_rng(seed)
    out: list[list[np.ndarray]] = [[] for _ in designs]
    block = max(1, _BLOCK // n_clusters)
    for start in range(0, resamples, block):
        b = min(block, resamples - start)
        draws = rng.integers(0, n_clusters, size=(b, n_clusters))  # [b, C] cluster drawn at each position
        if all(sums.shape[1] == 1 for sums, _, _ in designs):  # one stratum: gathering is cheapest
            for k, (sums, counts, w) in enumerate(designs):
                out[k].append(_statistic(sums[:, 0][draws].sum(1, keepdims=True),
                                         counts[:, 0][draws].sum(1, keepdims=True), w))
            continue
        draws += np.arange(b)[:, None] * n_clusters
        times = np.bincount(draws.ravel(), minlength=b * n_clusters).reshape(b, n_clusters)  # [b, C]
        times = times.astype(np.float64)
        for k, (sums, counts, w) in enumerate(designs):
            out[k].append(_statistic(times @ sums, times @ counts, w))
    return [np.concatenate(r) for r in out]
