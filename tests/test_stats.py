"""gkv_train.stats against hand-computed cases, and the committed long_recall evidence recomputed from its cells."""

import json
import sys
from pathlib import Path

import pytest

from gkv_train.stats import (
    bootstrap_interval,
    hierarchical_interval,
    independent_difference,
    independent_interval,
    paired_difference,
    percentiles,
    standard_error,
)

ROOT = Path(__file__).resolve().parents[1]


def test_percentiles_take_the_draws_at_2_5_and_97_5_percent():
    assert percentiles(list(range(40))[::-1]) == [1, 39]  # int(0.025 * 40) = 1, int(0.975 * 40) = 39
    assert percentiles(list(range(2000))) == [50, 1950]
    assert percentiles([7.0]) == [7.0, 7.0]


def test_standard_error_by_hand():
    assert standard_error([1.0, 3.0]) == pytest.approx(1.0)  # sd sqrt(2), / sqrt(2)
    assert standard_error([2.0, 2.0, 2.0]) == 0.0
    assert standard_error([5.0]) is None and standard_error([]) is None


def test_bootstrap_over_problems_by_hand():
    assert bootstrap_interval([]) == [None, None]
    assert bootstrap_interval([0.25, 0.25, 0.25]) == [0.25, 0.25]  # every resample has the same mean
    # two problems, 0 and 1: a resample's mean is 0, 1/2 or 1 with chances 1/4, 1/2, 1/4, so each end of the
    # interval (2.5 % in each tail) is an extreme
    assert bootstrap_interval([0.0, 1.0]) == [0.0, 1.0]
    # one problem of 40 right: all 40 drawn wrong has chance (39/40)^40 = 36 % > 2.5 %; at least 4 drawn right
    # (mean 0.1) has chance 1.9 % < 2.5 %, at least 3 has 7.5 %
    assert bootstrap_interval([0.0] * 39 + [1.0]) == [0.0, 0.075]


def test_seeds_then_problems_by_hand():
    assert hierarchical_interval([[0.5, 0.5], [0.5, 0.5]]) == [0.5, 0.5]
    # two seeds of one problem each, 0 and 1: a draw's mean is 0, 1/2 or 1 (chances 1/4, 1/2, 1/4)
    assert hierarchical_interval([[0.0], [1.0]]) == [0.0, 1.0]
    # one seed: problems alone are resampled, as the bootstrap over problems does
    low, high = hierarchical_interval([[0.0, 1.0]])
    assert (low, high) == (0.0, 1.0)
    assert hierarchical_interval([[0.2, 0.4]], seed=3) == hierarchical_interval([[0.2, 0.4]], seed=3)


def test_differences_by_hand():
    base = [[0.2, 0.6], [0.4, 0.8], [0.1, 0.3]]
    shifted = [[v + 0.25 for v in s] for s in base]
    paired = paired_difference(shifted, base)
    assert paired["seeds"] == 3 and paired["difference"] == pytest.approx(0.25)
    assert paired["ci95"] == pytest.approx([0.25, 0.25])  # every pair differs by the same amount
    apart = independent_difference(shifted, base)
    assert apart["seeds_independent"] == [3, 3] and apart["difference_seeds_independent"] == pytest.approx(0.25)
    low, high = apart["ci95_seeds_independent"]
    assert low < 0.25 < high  # the seeds' and problems' spread, which pairing removes
    assert independent_interval([[1.0, 1.0]], [[0.0, 0.0], [0.0, 0.0]]) == [1.0, 1.0]
    assert paired_difference([], []) == {} and independent_difference([], base) == {}
    # a recipe with more seeds is compared over all of them
    assert independent_difference(base + [[0.9, 0.9]], base)["seeds_independent"] == [4, 3]


def test_the_committed_long_recall_differences_recompute_from_their_cells():
    """results/bench_rl_evidence_long_recall.json's pre-registered differences, recomputed from each model's
    per-problem cells by this module: the intervals moved here unchanged."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from gkv_train.evidence.summary import compare

    training = json.loads((ROOT / "results" / "bench_rl_evidence_long_recall.json").read_text())["training"]
    recorded = training["differences"]["gkv-b128"]["rl_sparse_noclip - rl_full_noclip"]
    by_seed = {
        recipe: {m["seed"]: m["cells"]["gkv-b128"] for m in training["models"].values() if m.get("recipe") == recipe}
        for recipe in ("rl_sparse_noclip", "rl_full_noclip")
    }
    assert compare(by_seed["rl_sparse_noclip"], by_seed["rl_full_noclip"]) == recorded
    assert recorded["difference_seeds_independent"] == pytest.approx(0.367, abs=5e-4)
