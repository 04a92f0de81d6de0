"""The hostile cases (``tests/faults/``; ``scripts/bench_faults.py`` runs them against any checkout) as tests:
each case runs on this checkout exactly as the bench runs it (its own child processes through the real entry
points: ``train.py``, ``scripts/evaluate.py``, ``scripts/generate_traces.py``, ``gkv-train``, the reward
functions; one thread, an 8 GB address-space cap) and must come out right: ``ok`` (the right result) or
``clear_error`` (exit 2 and an ``error:`` line naming the problem, before any work).

Every ``make test`` runs the quick rows (``quick``: a time limit, ``Case.timeout``, of at most a minute: 64 of 444,
the reward functions' cases, the harness's control and two data cases, about a minute on two workers); the others
are marked ``faults`` (each a fresh interpreter of ``train.py`` or ``evaluate.py``, about 4 s for a refusal and more
for a run: the 380 of them take about an hour of one core): ``make test-faults`` runs every row. With the
configuration's refusals in it too (179 rows), ``make test`` took 23.6 min on the 2-core machine (15.2 min before
the fault rows, on a faster hour of the same host), which with the floor lane put CI at its 30-minute bound. A new
option, task, file format or API argument adds its rows to ``tests/faults/`` in the same change.
"""

import sys
from pathlib import Path

import pytest

from faults.cases import all_cases
from faults.harness import ROOT, run_case, write_site

MEMORY = 8 * 2**30  # RLIMIT_AS of every child, as the bench's default
QUICK_LIMIT = 60.0  # seconds: a case allowed at most this long is quick (CI time: .ci/run stays under 30 minutes)


def quick(case) -> bool:
    return case.timeout <= QUICK_LIMIT


CASES = [pytest.param(case, id=case.name, marks=() if quick(case) else pytest.mark.faults) for case in all_cases()]


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    return write_site(tmp_path_factory.mktemp("faults-site"))


@pytest.mark.parametrize("case", CASES)
def test_case_comes_out_right(case, site, tmp_path):
    record = run_case(case, ROOT, sys.executable, tmp_path, site, MEMORY, None, keep=False)
    assert record["outcome"] in ("ok", "clear_error"), f"{case.name}: {record['outcome']}: {record['detail']}"


def test_the_split_runs_some_rows_in_every_run_and_marks_the_rest():
    quick_rows = [c for c in all_cases() if quick(c)]
    assert 0 < len(quick_rows) < len(all_cases())
    assert {c.category for c in quick_rows} >= {"rewards"}
