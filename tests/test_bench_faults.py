"""scripts/bench_faults.py: its outcome rules on made-up children (controls of each class), and the script as main on
three cheap cases: classified, written as they finish, not run again, summed in the table."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench_faults.py"


@pytest.fixture(scope="module")
def bench():
    """The script's module with its harness's names (``tests/faults/harness.py``) beside its own."""
    spec = importlib.util.spec_from_file_location("bench_faults", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_faults"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    from faults import harness

    return SimpleNamespace(**{**vars(harness), **vars(module)})


def child(bench, rc=2, err="", out="", timed_out=False, loaded=False):
    marks = [{"event": "model_load"}] if loaded else []
    return bench.Proc(["x"], rc, out, err, 1.0, timed_out, marks)


HYDRA = (
    "Error executing job with overrides: ['beta=-1']\nTraceback (most recent call last):\n  File \"cli.py\", "
    "line 49, in main\n    work(OmegaConf.to_object(cfg), cfg)\nValueError: beta must be >= 0, got -1\n\n"
    "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n"
)
ZERO = (
    'Traceback (most recent call last):\n  File "launch.py", line 3, in f\n    x = beta / 0\n'
    "ZeroDivisionError: division by zero\n"
)


def test_refusal_outcomes(bench):
    judge = bench.judge_refusal
    assert judge(child(bench, 2, "note: x\nerror: beta must be >= 0, got -1\n"), ["beta"]).outcome == "clear_error"
    assert judge(child(bench, 1, "error: beta must be >= 0, got -1\n"), ["beta"]).outcome == "unclear_error"  # code
    assert judge(child(bench, 2, "error: beta must be >= 0\n", loaded=True), ["beta"]).outcome == "unclear_error"
    assert judge(child(bench, 2, "error: beta must be >= 0\n", loaded=True), ["beta"], before_load=False).outcome == (
        "clear_error"
    )
    assert judge(child(bench, 2, "error: a bad value\n"), ["beta"]).outcome == "unclear_error"  # not named
    hydra = judge(child(bench, 1, HYDRA), ["beta"])
    assert hydra.outcome == "unclear_error" and "ValueError: beta must be >= 0" in hydra.detail
    assert judge(child(bench, 1, ZERO), ["beta"]).outcome == "crash"  # source lines naming beta do not count
    assert judge(child(bench, -9), ["beta"]).outcome == "crash"
    assert judge(child(bench, 0), ["beta"]).outcome == "silent_wrong"
    assert judge(child(bench, None, timed_out=True), ["beta"]).outcome == "hang"


def test_result_outcomes(bench):
    assert bench.judge_result(child(bench, 0), lambda: None).outcome == "ok"
    assert bench.judge_result(child(bench, 0), lambda: "2 samples twice").outcome == "silent_wrong"
    assert bench.judge_result(child(bench, 2, "error: no\n"), lambda: None).outcome == "crash"  # a valid input refused
    assert bench.judge_either(child(bench, 2, "error: beta < 0\n"), ["beta"], lambda: "wrong").outcome == "clear_error"
    assert bench.judge_either(child(bench, 0), ["beta"], lambda: None).outcome == "ok"


def test_strict_json(bench, tmp_path):
    good, bad = tmp_path / "a.json", tmp_path / "b.jsonl"
    good.write_text('{"x": null}')
    bad.write_text('{"x": 1}\n{"x": NaN}\n')
    assert bench.strict_file(good) is None and "NaN" in bench.strict_file(bad)


def test_cases_are_named_once(bench):
    cases = bench.all_cases()
    assert len(cases) >= 150 and {c.category for c in cases} == set(bench.CATEGORIES)
    assert bench.select(cases, "rewards/plain-*,harness") == [
        c for c in cases if c.name in ("harness/imports-repo", "rewards/plain-right", "rewards/plain-wrong")
    ]


def test_as_main(tmp_path):
    command = [
        sys.executable,
        str(SCRIPT),
        "--tag",
        "t",
        "--cases",
        "harness/imports-repo,rewards/plain-*",
        "--out",
        str(tmp_path / "out"),
        "--results",
        str(tmp_path / "results"),
    ]
    first = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert first.returncode == 0, first.stderr
    line = json.loads(first.stdout.strip().splitlines()[-1])
    assert line["table"]["total"] == {
        "cases": 3,
        "ok": 3,
        **{o: 0 for o in ("clear_error", "unclear_error", "silent_wrong", "crash", "hang", "data_lost")},
    }
    saved_text = (tmp_path / "results" / "bench_faults_t.json").read_text()
    saved = json.loads(saved_text)
    assert saved["repo"] == f"../{ROOT.name}" and {c["outcome"] for c in saved["cases"]} == {"ok"}
    assert str(ROOT.parent) + "/" not in saved_text  # the committed results name no folder of this machine
    assert "| **total** | 3 | 3 |" in (tmp_path / "results" / "bench_faults_t.md").read_text()
    lines = (tmp_path / "out" / "cases.jsonl").read_text().splitlines()
    assert len(lines) == 3
    again = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert again.returncode == 0 and "[1/3]" not in again.stderr  # finished cases are not run again
    assert (tmp_path / "out" / "cases.jsonl").read_text().splitlines() == lines


def test_the_refusals_view_takes_the_configuration_cases_refused_clearly(bench):
    """Seconds to a clear refusal: only configuration cases refused clearly count (median, 90th percentile, most)."""

    def case(category, outcome, seconds):
        return {"category": category, "outcome": outcome, "seconds": seconds}

    run = {
        "tag": "after",
        "command": "bench_faults.py --tag after",
        "cases": [
            *(case("configuration", "clear_error", s) for s in (4.0, 5.0, 6.0, 7.0, 30.0)),
            case("configuration", "crash", 99.0),  # not refused clearly
            case("state_faults", "clear_error", 99.0),  # not a configuration case
        ],
    }
    table = bench.tables("refusals", [run])
    assert "| after | 5 | 6 | 7 | 30 |" in table and "99" not in table.split("\n\n")[0]
    with pytest.raises(SystemExit, match="refusals"):
        bench.tables("bogus", [run])
