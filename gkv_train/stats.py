"""The intervals every result here reports: 95 % percentile bootstraps over problems, over seeds then problems,
and of the difference of two recipes (paired by seed, or each recipe's seeds resampled on their own); and the
standard error of a mean.

Samples of one problem are not independent, so problems are resampled, not samples; runs of one seed share their
prompts, initial model and evaluation problems, so seeds are resampled above problems. Each interval is drawn with
its own ``random.Random(seed)``: the same inputs give the same interval.
"""

from __future__ import annotations

import math
import random

QUANTILES = (0.025, 0.975)  # the ends of a 95 % interval


def percentiles(draws: list[float]) -> list[float]:
    """[2.5th, 97.5th] percentile of ``draws`` (sorted in place): the draws at ``int(0.025 n)`` and
    ``int(0.975 n)`` (the last one at most)."""
    draws.sort()
    n = len(draws)
    return [draws[int(QUANTILES[0] * n)], draws[min(n - 1, int(QUANTILES[1] * n))]]


def bootstrap_interval(per_problem: list[float], resamples: int = 4000, seed: int = 0) -> list[float]:
    """95 % percentile bootstrap interval of the mean of ``per_problem`` (each problem's share of correct
    samples), problems resampled; [None, None] for no problems."""
    if not per_problem:
        return [None, None]
    rng = random.Random(seed)
    n = len(per_problem)
    means = sorted(sum(rng.choices(per_problem, k=n)) / n for _ in range(resamples))
    # (its upper end one draw below ``percentiles``': every evaluation's interval so far was computed so)
    return [means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]]


def standard_error(values: list[float]) -> float | None:
    """Standard error of the mean of ``values`` (sample standard deviation / sqrt(n)); None below two values."""
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def hierarchical_interval(per_seed: list[list[float]], draws: int = 2000, seed: int = 0) -> list[float]:
    """95 % interval of the mean over seeds of the mean over problems: resample seeds, then problems within each
    (``per_seed``: per seed, one value per problem)."""
    rng = random.Random(seed)
    means = []
    for _ in range(draws):
        seeds = [per_seed[rng.randrange(len(per_seed))] for _ in per_seed]
        means.append(sum(sum(v[rng.randrange(len(v))] for _ in v) / len(v) for v in seeds) / len(seeds))
    return percentiles(means)


def independent_interval(
    first: list[list[float]], second: list[list[float]], draws: int = 2000, seed: int = 0
) -> list[float]:
    """95 % interval of the mean over ``first``'s seeds minus the mean over ``second``'s (each: per seed, one value
    per problem, the same problems in the same order): per draw, each side's seeds resampled on their own, and one
    resample of the problems shared by both sides (every model answers the same problems)."""
    rng = random.Random(seed)
    n = len(first[0])
    diffs = []
    for _ in range(draws):
        a = [first[rng.randrange(len(first))] for _ in first]
        b = [second[rng.randrange(len(second))] for _ in second]
        problems = [rng.randrange(n) for _ in range(n)]
        mean_a = sum(s[p] for s in a for p in problems) / (len(a) * n)
        mean_b = sum(s[p] for s in b for p in problems) / (len(b) * n)
        diffs.append(mean_a - mean_b)
    return percentiles(diffs)


def mean_of_means(per_seed: list[list[float]]) -> float:
    """The mean over seeds of each seed's mean over problems."""
    return sum(sum(s) / len(s) for s in per_seed) / len(per_seed)


def paired_difference(mine: list[list[float]], other: list[list[float]], draws: int = 2000) -> dict:
    """``mine`` minus ``other`` paired by seed (``mine[i]`` with ``other[i]``: the same seed's runs, with the same
    prompts, initial model and evaluation problems) and by problem: {seeds, difference, ci95} (seed pairs
    resampled, then problems: ``hierarchical_interval`` of the differences); {} for no seeds."""
    pairs = [[a - b for a, b in zip(x, y)] for x, y in zip(mine, other)]
    if not pairs:
        return {}
    return {"seeds": len(pairs), "difference": mean_of_means(pairs), "ci95": hierarchical_interval(pairs, draws)}


def independent_difference(mine: list[list[float]], other: list[list[float]], draws: int = 2000) -> dict:
    """The mean over every seed of ``mine`` minus the mean over every seed of ``other`` (their counts may differ),
    with ``independent_interval``: it assumes nothing about two recipes' runs at one seed being alike, and leaves
    out no seed one recipe has and the other lacks. {} when either has no seed."""
    if not mine or not other:
        return {}
    return {
        "seeds_independent": [len(mine), len(other)],
        "difference_seeds_independent": mean_of_means(mine) - mean_of_means(other),
        "ci95_seeds_independent": independent_interval(mine, other, draws),
    }
