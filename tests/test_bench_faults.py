"""scripts/bench_faults.py: its outcome rules on made-up children (controls of each class), the script as main on
three cheap cases (classified, written as they finish, not run again, summed in the table, added to the one results
file), and that file: every round's runs, per-case rows of the latest round only, a foreign file refused."""

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
        str(tmp_path / "results" / "bench_faults.json"),
    ]
    first = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert first.returncode == 0, first.stderr
    line = json.loads(first.stdout.strip().splitlines()[-1])
    assert line["table"]["total"] == {
        "cases": 3,
        "ok": 3,
        **{o: 0 for o in ("clear_error", "unclear_error", "silent_wrong", "crash", "hang", "data_lost")},
    }
    saved_text = (tmp_path / "results" / "bench_faults.json").read_text()
    (saved,) = json.loads(saved_text)["runs"]
    assert saved["tag"] == "t" and saved["round"] == "t"
    assert saved["repo"] == f"../{ROOT.name}" and {c["outcome"] for c in saved["cases"]} == {"ok"}
    assert str(ROOT.parent) + "/" not in saved_text  # the committed results name no folder of this machine
    assert "| **total** | 3 | 3 |" in (tmp_path / "out" / "cases.md").read_text()
    lines = (tmp_path / "out" / "cases.jsonl").read_text().splitlines()
    assert len(lines) == 3
    again = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert again.returncode == 0 and "[1/3]" not in again.stderr  # finished cases are not run again
    assert (tmp_path / "out" / "cases.jsonl").read_text().splitlines() == lines


def test_the_refusals_view_takes_the_configuration_cases_refused_clearly(bench):
    """Seconds to a clear refusal: only configuration cases refused clearly count (median, 90th percentile, most),
    kept with the run so that the view needs no per-case rows."""

    def case(category, outcome, seconds):
        return {"category": category, "outcome": outcome, "seconds": seconds}

    cases = [
        *(case("configuration", "clear_error", s) for s in (4.0, 5.0, 6.0, 7.0, 30.0)),
        case("configuration", "crash", 99.0),  # not refused clearly
        case("state_faults", "clear_error", 99.0),  # not a configuration case
    ]
    run = {
        "tag": "after",
        "round": "9",
        "command": "bench_faults.py --tag after",
        "refusals": bench.refusal_seconds(cases),
    }
    table = bench.tables("refusals_9", {"bench": "faults", "runs": [run]})
    assert "| after | 5 | 6 | 7 | 30 |" in table and "99" not in table.split("\n\n")[0]
    assert bench.refusal_seconds([case("configuration", "crash", 1.0)]) is None


def run_of(tag: str, round_: str, cases: int = 1) -> dict:
    total = {"cases": cases, "ok": cases, **dict.fromkeys(("clear_error", "unclear_error", "silent_wrong"), 0)}
    total |= dict.fromkeys(("crash", "hang", "data_lost"), 0)
    return {
        "tag": tag,
        "round": round_,
        "command": f"bench_faults.py --tag {tag}",
        "date": "2026-12-07T00:00:00+0000",
        "repo_commit": "0123456789",
        "table": {"total": total},
        "table_by_kind": {"total": total},
        "refusals": None,
        "cases": [{"name": f"{tag}/case"}],
    }


def test_a_run_joins_the_results_file_and_only_its_round_keeps_its_cases(bench):
    """A run of a new tag is appended, one of the same tag replaces the old; per-case rows stay only on the runs of
    the round just written (an earlier round keeps its tables)."""
    result = {"bench": "faults", "runs": [run_of("before1", "1"), run_of("after1", "1")]}
    result = bench.with_run(result, run_of("before2", "2"))
    assert [r["tag"] for r in result["runs"]] == ["before1", "after1", "before2"]
    assert ["cases" in r for r in result["runs"]] == [False, False, True]
    result = bench.with_run(result, run_of("after2", "2"))
    result = bench.with_run(result, run_of("before2", "2", cases=5))  # a rerun of a tag replaces it
    assert [r["tag"] for r in result["runs"]] == ["before1", "after1", "after2", "before2"]
    assert [r.get("cases") is not None for r in result["runs"]] == [False, False, True, True]
    assert "| before2 (2026-12-07) | 0123456 | 5 | 5 |" in bench.tables("runs_2", result)
    assert "before1" in bench.tables("runs_1", result) and "before2" not in bench.tables("runs_1", result)
    for view in ("runs_3", "bogus_2", "runs"):
        with pytest.raises(SystemExit, match="rounds: 1, 2"):
            bench.tables(view, result)


def test_a_results_file_that_is_not_the_benchs_is_refused_before_any_case(tmp_path):
    """--results naming another file (another bench's, damaged JSON, a folder): exit 2 naming it, no case run."""
    (tmp_path / "other.json").write_text('{"benchmark": "methods", "runs": {}}')
    (tmp_path / "damaged.json").write_text('{"bench": "faults", "runs": [')
    (tmp_path / "folder.json").mkdir()
    for name in ("other.json", "damaged.json", "folder.json", "results"):
        out = tmp_path / f"out-{name}"
        command = [sys.executable, str(SCRIPT), "--cases", "harness/imports-repo", "--out", str(out)]
        done = subprocess.run(
            [*command, "--results", str(tmp_path / name)], capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 2 and "error: " in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert "--results" in done.stderr and not (out / "cases.jsonl").exists()
