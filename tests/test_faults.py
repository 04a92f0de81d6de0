"""The hostile cases (``tests/faults/``; ``scripts/bench_faults.py`` runs them against any checkout) as tests:
each case runs on this checkout through the real entry points (``train.py``, ``scripts/evaluate.py``,
``scripts/generate_traces.py``, ``gkv-train``, the reward functions; one thread, an 8 GB address-space cap) and must
come out right: ``ok`` (the right result) or ``clear_error`` (exit 2 and an ``error:`` line naming the problem,
before any work).

Here each child is forked from a warm interpreter of the checkout (``faults.harness.Forks``: torch, transformers
and the entry points' modules imported once) where it can be: a refusal then costs about 0.5 s instead of the ~5 s
of a fresh interpreter. Every ``make test`` runs the quick rows: each case that is one child refused before any
work with nothing run before it (``Case.quick``: the refusal tables, round four's and five's refusal rows without a
setup), those with a time limit of at most a minute (the reward functions'), and every data-loss case
(``state_faults``: runs killed, interrupted, damaged, run twice into one folder or on a full disk). The others
(results of runs trained or evaluated first, refusals after a finished run) are marked ``faults``: ``make
test-faults`` runs every row, and ``scripts/bench_faults.py`` starts every child fresh. Measured on the 2-core
machine (2026-12-07, its two workers): the 319 rows of ``make test`` in 204 s, a fresh-clone ``.ci/run`` with them
25.9 min (271 without the data-loss cases in 80 s, ``.ci/run`` 23.7 min; the 64 rows of the earlier split took
about 60 s started fresh). With the 397 rows of all but ``state_faults`` it took 31.6 min, over its 30-minute
bound: the rows that run a model first stay in the ``faults`` lane. A new option, task, file format or API argument
adds its rows to ``tests/faults/`` in the same change.
"""

import sys
from pathlib import Path

import pytest

from faults.cases import all_cases
from faults.harness import ROOT, Forks, run_case, write_site

MEMORY = 8 * 2**30  # RLIMIT_AS of every child, as the bench's default
QUICK_LIMIT = 60.0  # seconds: a case allowed at most this long is quick too (the reward functions' cases)
DATA_LOSS = ("state_faults",)  # runs killed, interrupted, damaged, run twice or on a full disk: always run


def quick(case) -> bool:
    """A case every ``make test`` runs (CI time: ``.ci/run`` stays under 30 minutes)."""
    return case.quick or case.timeout <= QUICK_LIMIT or case.category in DATA_LOSS


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
    assert {c.category for c in quick_rows} >= {"rewards", "configuration", "data", "output", "state_faults"}
