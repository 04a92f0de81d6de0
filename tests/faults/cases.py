"""Every case of the fault bench, in its order: ``scripts/bench_faults.py`` runs them against a checkout (before /
after tables), ``tests/test_faults.py`` as tests of this one."""

from __future__ import annotations

from faults.configuration import config_cases
from faults.data import data_cases
from faults.harness import Case
from faults.output import harness_cases, output_cases
from faults.rewards import reward_cases
from faults.round4 import round4_cases
from faults.round5 import round5_cases
from faults.round5_cache import round5_cache_cases
from faults.state import state_cases


def all_cases() -> list[Case]:
    cases = [
        *harness_cases(),
        *reward_cases(),
        *config_cases(),
        *data_cases(),
        *state_cases(),
        *output_cases(),
        *round4_cases(),
        *round5_cases(),
        *round5_cache_cases(),
    ]
    names = [c.name for c in cases]
    assert not any("," in n for n in names), "a comma separates --cases patterns"
    assert len(names) == len(set(names)), [n for n in names if names.count(n) > 1]
    return cases
