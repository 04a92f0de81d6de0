"""The hostile cases (``tests/faults/``; ``scripts/bench_faults.py`` runs them against any checkout) as tests:
each case runs on this checkout through the real entry points (``train.py``, ``scripts/evaluate.py``,
``scripts/generate_traces.py``, ``gkv-train``, the reward functions; one thread, an 8 GB address-space cap) and must
come out right: ``ok`` (the right result) or ``clear_error`` (exit 2 and an ``error:`` line naming the problem,
before any work).

Here each child is forked from a warm interpreter of the checkout (``faults.harness.Forks``: torch, transformers
and the entry points' modules imported once) where it can be: a refusal then costs about 0.5 s instead of the
~5 s of a fresh interpreter, so every ``make test`` runs every row but those of ``state_faults`` (signals,
concurrent runs, full disks, damaged and resumed runs: processes started and stopped mid-run, about 3 minutes of one
core), marked ``faults``: ``make test-faults`` runs every row, and ``scripts/bench_faults.py`` starts every child
fresh. Measured on the 2-core machine (2026-12-07): every row of an earlier probe took 73 min of one core started
fresh (``results/bench_faults.json``, after64), 14 min forked; the 397 rows of ``make test`` take 5.1 min on its two
workers (the 64 rows it ran before, about 1 min). A new option, task, file format or API argument adds its rows to
``tests/faults/`` in the same change.
"""

import sys
from pathlib import Path

import pytest

from faults.cases import all_cases
from faults.harness import ROOT, Forks, run_case, write_site

MEMORY = 8 * 2**30  # RLIMIT_AS of every child, as the bench's default
SLOW = ("state_faults",)  # the categories only `make test-faults` runs (CI time: .ci/run stays under 30 minutes)


def quick(case) -> bool:
    return case.category not in SLOW


CASES = [pytest.param(case, id=case.name, marks=() if quick(case) else pytest.mark.faults) for case in all_cases()]


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    return write_site(tmp_path_factory.mktemp("faults-site"))


@pytest.fixture(scope="session")
def forks(site, tmp_path_factory):
    warm = Forks(ROOT, sys.executable, site, tmp_path_factory.mktemp("faults-forks"))
    yield warm
    warm.close()


@pytest.mark.parametrize("case", CASES)
def test_case_comes_out_right(case, site, forks, tmp_path):
    record = run_case(case, ROOT, sys.executable, tmp_path, site, MEMORY, None, keep=False, forks=forks)
    assert record["outcome"] in ("ok", "clear_error"), f"{case.name}: {record['outcome']}: {record['detail']}"


def test_the_split_runs_some_rows_in_every_run_and_marks_the_rest():
    quick_rows = [c for c in all_cases() if quick(c)]
    assert 0 < len(quick_rows) < len(all_cases())
    assert {c.category for c in quick_rows} >= {"rewards"}
