"""Headline figures are medians with their spread; repeats get an honest interval."""

from __future__ import annotations

import math
import random

import pytest

from kernels.base.stats import median_ci, percentile, step_summary, thin

pytestmark = pytest.mark.unit


def test_headline_follows_the_steady_steps_not_one_slow_epoch():
    """The demo's old headline: epochs at 70, 793, 801 samples/s gave 204 as a ratio of sums.

    Here 17 slow steps (a first-epoch effect) and 44 steady ones: the median-based
    headline is the steady rate, the ratio of sums is dragged far below it.
    """
    batch = 64
    slow = [batch * 1e3 / 70.0] * 17  # ~914 ms per step
    steady = [batch * 1e3 / 797.0 + (i % 5 - 2) * 0.5 for i in range(44)]  # ~80 ms, a little noise
    s = step_summary(slow + steady, batch)
    assert 780 < s["samples_per_s"] < 815
    ratio_of_sums = len(slow + steady) * batch * 1e3 / sum(slow + steady)
    assert ratio_of_sums < 250  # what the old record printed as the headline
    # the spread says the run had slow steps: p10 of the throughput is the slow rate
    assert s["samples_per_s_p10"] < 100 < 780 < s["samples_per_s_p90"]
    assert s["step_ms_p10"] <= s["step_ms_p50"] <= s["step_ms_p90"]


def test_step_summary_of_nothing_is_empty_not_zero():
    s = step_summary([], 64)
    assert all(v is None for v in s.values())


def test_percentile_interpolates():
    assert percentile([1, 2, 3, 4], 0.5) == 2.5
    assert percentile([5], 0.9) == 5
    assert percentile([], 0.5) == 0.0


def test_thin_keeps_order_and_bound():
    xs = list(range(10_000))
    t = thin(xs, 100)
    assert len(t) == 100 and t == sorted(t) and t[0] == 0 and t[-1] >= 9_900
    assert thin([3, 1], 100) == [3, 1]


@pytest.mark.parametrize("n,level", [(2, 0.5), (3, 0.75), (5, 0.9375)])
def test_few_repeats_give_min_max_with_its_real_coverage(n, level):
    xs = [float(i) for i in range(n)]
    ci = median_ci(xs)
    assert ci["ci_lo"] == 0 and ci["ci_hi"] == n - 1
    assert math.isclose(ci["ci_level"], level)  # never a pretended 95 %


def test_six_or_more_repeats_reach_95_percent_and_cover_the_median_as_promised():
    assert median_ci(range(6))["ci_level"] >= 0.95
    ci = median_ci(list(range(20)))
    assert ci["ci_level"] >= 0.95 and ci["ci_lo"] > 0 and ci["ci_hi"] < 19  # narrower than the range
    # coverage check by simulation: the interval contains the true median at least as often as stated
    rng = random.Random(0)
    hits, trials = 0, 2000
    for _ in range(trials):
        ci = median_ci([rng.gauss(10.0, 1.0) for _ in range(11)])
        hits += ci["ci_lo"] <= 10.0 <= ci["ci_hi"]
    assert hits / trials >= ci["ci_level"] - 0.02


def test_single_value_has_no_interval():
    ci = median_ci([3.0])
    assert ci["median"] == 3.0 and ci["ci_lo"] is None and ci["ci_level"] is None
    assert median_ci([])["median"] is None
