"""Robust statistics for the measurements: percentiles, step-time summaries, and CIs of a median.

Headline throughput is a median, not a ratio of sums: one slow epoch on a
shared machine (or a first-epoch effect) moves a ratio of sums a lot and a
median over hundreds of steps hardly at all. The ratio of sums is still kept
(`*_mean`) so the two can be compared.

Repeats of one configuration are aggregated by their median with a
distribution-free confidence interval from order statistics: with n samples,
[x_(k), x_(n-k+1)] covers the true median with probability
1 - 2 * P(Binomial(n, 1/2) < k). The widest choice, [min, max], reaches 95 %
only from n = 6 on; below that the interval is [min, max] and its real
coverage (75 % at n = 3) is reported next to it, never a pretended 95 %.
"""

from __future__ import annotations

import math
from typing import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (q in [0, 1]) of `values`; 0.0 when empty."""
    if not len(values):
        return 0.0
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def step_summary(step_ms: Sequence[float], global_batch: int) -> dict:
    """Step-time percentiles and the throughput they imply for one list of step times (ms).

    samples_per_s is the global batch over the MEDIAN step time; its p10/p90 come
    from the p90/p10 step times (a slow step is a low throughput).
    """
    if not len(step_ms):
        return {
            "step_ms_p10": None,
            "step_ms_p50": None,
            "step_ms_p90": None,
            "step_ms_mean": None,
            "samples_per_s": None,
            "samples_per_s_p10": None,
            "samples_per_s_p90": None,
        }
    p10, p50, p90 = (percentile(step_ms, q) for q in (0.1, 0.5, 0.9))
    rate = lambda ms: global_batch * 1e3 / ms if ms > 0 else None  # noqa: E731
    return {
        "step_ms_p10": p10,
        "step_ms_p50": p50,
        "step_ms_p90": p90,
        "step_ms_mean": sum(step_ms) / len(step_ms),
        "samples_per_s": rate(p50),
        "samples_per_s_p10": rate(p90),
        "samples_per_s_p90": rate(p10),
    }


def thin(values: list[float], cap: int) -> list[float]:
    """At most `cap` values, evenly strided (deterministic); all of them when fewer."""
    n = len(values)
    if n <= cap:
        return list(values)
    return [values[(i * n) // cap] for i in range(cap)]


def _binom_cdf_half(k: int, n: int) -> float:
    """P(Binomial(n, 1/2) <= k)."""
    return sum(math.comb(n, i) for i in range(0, k + 1)) / 2**n


def median_ci(values: Sequence[float], level: float = 0.95) -> dict:
    """Median of `values` with the narrowest order-statistic interval covering it at >= `level`.

    Returns median, ci_lo, ci_hi and ci_level (the interval's actual coverage).
    With too few values for `level` the interval is [min, max] with its lower
    coverage; with one value there is no interval (None).
    """
    xs = sorted(float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v)))
    n = len(xs)
    if n == 0:
        return {"median": None, "ci_lo": None, "ci_hi": None, "ci_level": None, "n": 0}
    med = percentile(xs, 0.5)
    if n == 1:
        return {"median": med, "ci_lo": None, "ci_hi": None, "ci_level": None, "n": 1}
    # k from the outside in: [x_(k), x_(n-k+1)] (1-based) has coverage 1 - 2 P(B <= k-1)
    best = (1, 1 - 2 * _binom_cdf_half(0, n))
    for k in range(2, n // 2 + 1):
        cov = 1 - 2 * _binom_cdf_half(k - 1, n)
        if cov < level:
            break
        best = (k, cov)
    k, cov = best
    return {"median": med, "ci_lo": xs[k - 1], "ci_hi": xs[n - k], "ci_level": cov, "n": n}
