"""The cluster bootstrap on simulated result sets whose truth is known: the 95% interval covers
the true mean 95% of the time, clustering by video widens it exactly when answers within a video
are correlated, and the paired test finds a planted 5-point gain but not a zero one (about 5%
false positives). Fixed seeds: every number here is the same on every run."""

from __future__ import annotations

import numpy as np
import pytest

from easyvideor1.evaluation.bootstrap import (
    MIN_CLUSTERS,
    interval,
    macro,
    paired,
    t_quantile,
    unit_mean,
)

MEAN = 0.4  # Beta(2, 3): mean 0.4, variance 0.04


def video_set(rng, videos: int, per_video: int, shared: float) -> np.ndarray:
    """Scores [videos * per_video] in [0, 1], each Beta(2, 3) (mean 0.4); with probability
    `shared` a question takes its video's draw instead of its own (correlation `shared`**2
    within a video), so the mean stays 0.4 whatever the correlation."""
    own = rng.beta(2, 3, videos * per_video)
    video = np.repeat(rng.beta(2, 3, videos), per_video)
    return np.where(rng.random(videos * per_video) < shared, video, own)


def ids_and_videos(videos: int, per_video: int) -> tuple[list[str], list[str]]:
    n = videos * per_video
    return [f"q{i}" for i in range(n)], [f"v{i // per_video}" for i in range(n)]


def test_t_quantile_matches_the_table():
    for df, exact in ((9, 2.262157), (29, 2.045230), (99, 1.984217)):
        assert t_quantile(df) == pytest.approx(exact, abs=2e-4)


def test_interval_covers_the_true_mean_95_percent_of_the_time():
    # 1,000 simulated benchmarks of 40 videos x 4 correlated questions: the count of intervals
    # covering 0.4 is Binomial(1000, 0.95) when the method is right (sd 0.007), so a coverage in
    # [0.93, 0.97] is what a correct 95% interval shows; a naive per-question interval covers
    # only ~0.85 here (it ignores the correlation).
    rng = np.random.default_rng(7)
    ids, videos = ids_and_videos(40, 4)
    covered = 0
    for k in range(1000):
        ci = interval(unit_mean(ids, video_set(rng, 40, 4, shared=0.7), videos), resamples=1000, seed=k)
        covered += ci.low <= MEAN <= ci.high
    assert 0.93 <= covered / 1000 <= 0.97, covered


def test_clustering_widens_the_interval_only_when_answers_within_a_video_are_correlated():
    ids, videos = ids_and_videos(50, 6)
    rng = np.random.default_rng(3)
    ratios = {}
    for shared in (0.0, 0.8):
        r = []
        for k in range(20):
            scores = video_set(rng, 50, 6, shared)
            by_video, alone = interval(unit_mean(ids, scores, videos)), interval(unit_mean(ids, scores, ids))
            assert (by_video.clusters, alone.clusters, by_video.units) == (50, 300, 300)
            r.append((by_video.high - by_video.low) / (alone.high - alone.low))
        ratios[shared] = float(np.mean(r))
    # independent answers: the same width up to the t factor of 50 vs 300 clusters (1.6%)
    assert 0.95 <= ratios[0.0] <= 1.08, ratios
    # correlation 0.64 among 6 questions: design effect 1 + 5 * 0.64 = 4.2, width ratio ~2
    assert ratios[0.8] >= 1.7, ratios


def test_paired_test_finds_a_planted_5_point_gain_on_500_samples():
    # A and B answer 500 questions (250 videos x 2) alike but for 49: A alone is right on 37,
    # B alone on 12, a gain of exactly 25 / 500 = 5 points for A (two checkpoints of one model
    # disagree on ~10% of the answers)
    ids, videos = ids_and_videos(250, 2)
    found = 0
    for k in range(200):
        rng = np.random.default_rng(1000 + k)
        b = (rng.random(500) < 0.6).astype(float)
        a = b.copy()
        picks = rng.permutation(500)
        a[picks[:37]], b[picks[:37]] = 1.0, 0.0
        a[picks[37:49]], b[picks[37:49]] = 0.0, 1.0
        test = paired(unit_mean(ids, a, videos), unit_mean(ids, b, videos), resamples=500, seed=k)
        assert test.delta == pytest.approx(0.05) and test.verdict != "B better"
        found += test.verdict == "A better"
        if k == 0:
            assert test.shared == 500 and test.clusters == 250
            assert 0 < test.low < test.delta < test.high and test.p_value < 0.05
    assert found >= 180, found


def test_paired_test_false_positive_rate_is_about_5_percent():
    # 1,000 pairs of runs with the same accuracy: ~5% "better" verdicts (sd 0.007); 500 resamples
    # make the test slightly conservative (p < 0.05 needs fewer than 2.3% of them past 0, not 2.5%)
    ids, videos = ids_and_videos(250, 2)
    positives = 0
    for k in range(1000):
        rng = np.random.default_rng(k)
        b = (rng.random(500) < 0.6).astype(float)
        a = b.copy()
        changed = rng.random(500) < 0.3  # 30% redrawn from the same accuracy: ~14% differ, no real difference
        a[changed] = (rng.random(int(changed.sum())) < 0.6).astype(float)
        test = paired(unit_mean(ids, a, videos), unit_mean(ids, b, videos), resamples=500, seed=k)
        positives += test.verdict in ("A better", "B better")
    assert 0.02 <= positives / 1000 <= 0.09, positives


def test_identical_runs_and_tiny_sets():
    ids, videos = ids_and_videos(30, 2)
    scores = video_set(np.random.default_rng(0), 30, 2, 0.5)
    same = paired(unit_mean(ids, scores, videos), unit_mean(ids, scores, videos))
    assert (same.delta, same.low, same.high, same.p_value, same.verdict) == (0.0, 0.0, 0.0, 1.0,
                                                                               "no significant difference")
    few = MIN_CLUSTERS - 1
    small = interval(unit_mean(ids[:2 * few], scores[:2 * few], videos[:2 * few]))
    assert small.low is None and small.note.startswith("n too small") and small.text() == "n too small"
    assert paired(unit_mean(ids[:2 * few], scores[:2 * few], videos[:2 * few]),
                  unit_mean(ids, scores, videos)).verdict.startswith("not tested: n too small")
    assert interval(unit_mean(ids, scores, videos)) == interval(unit_mean(ids, scores, videos))  # fixed seed


def test_macro_estimand_is_the_mean_of_its_parts_and_resamples_them_together():
    ids, videos = ids_and_videos(40, 3)
    scores = video_set(np.random.default_rng(1), 40, 3, 0.5)
    tasks = {t: unit_mean(ids[t::3], scores[t::3], videos[t::3]) for t in range(3)}
    est = macro({"x": tasks[0], "y": macro({"a": tasks[1], "b": tasks[2]})})
    assert est.point() == pytest.approx(scores[0::3].mean() / 2 + (scores[1::3].mean() + scores[2::3].mean()) / 4)
    ci = interval(est)
    assert ci.clusters == 40 and ci.units == 120 and ci.low < est.point() < ci.high
