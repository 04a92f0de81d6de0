"""scripts/bench_methods.py as main: one evaluate.py call per run, each kept in the one results file under its tag as
it ends; a run the file holds is read back, not run again (the benchmark continues across sessions); a run measured
with other settings, or a file that is not the bench's, is refused before any run."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def bench(tmp_path, *extra):
    command = [
        sys.executable,
        str(ROOT / "scripts" / "bench_methods.py"),
        "--model",
        "tiny",
        "--datasets",
        "arithmetic",
        "--limit",
        "2",
        "--samples",
        "1",
        "--max-new-tokens",
        "4",
        "--methods",
        "full",
        "--intervals",
        "8",
        "--results",
        str(tmp_path / "bench_methods.json"),
        "--work-root",
        str(tmp_path / "work"),
        "--tag",
        "t",
        *extra,
    ]
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=600)


def test_runs_once_and_reads_back(tmp_path):
    first = bench(tmp_path)
    assert first.returncode == 0, first.stderr
    results = tmp_path / "bench_methods.json"
    saved = json.loads(results.read_text())
    run = saved["tags"]["t"]["runs"]["arithmetic/full"]
    assert run["problems"] == 2 and len(run["per_problem"]) == 2 and "evaluate.py" in run["command"]
    line = json.loads(first.stdout.strip().splitlines()[-1])
    assert (
        line["runs"]["arithmetic/full"]["pass@1"] == run["pass@1"]
        and "per_problem" not in line["runs"]["arithmetic/full"]
    )
    # a run of an earlier call (other datasets or settings) stays in the tag's summary; another tag is left alone
    saved["tags"]["t"]["runs"]["svamp/gkv-b64-i32"] = {**run, "dataset": "svamp", "run": "gkv-b64-i32"}
    saved["tags"]["before"] = {"runs": {"arithmetic/full": {**run, "pass@1": 0.5}}}
    results.write_text(json.dumps(saved))
    again = bench(tmp_path)
    assert again.returncode == 0 and "evaluate.py" not in again.stderr  # read back, nothing run
    summary = json.loads(again.stdout.strip().splitlines()[-1])
    assert set(summary["runs"]) == {"arithmetic/full", "svamp/gkv-b64-i32"}
    assert json.loads(results.read_text())["tags"]["before"]["runs"]["arithmetic/full"]["pass@1"] == 0.5
    other = bench(tmp_path, "--temperature", "0.3")
    assert other.returncode != 0 and "measured with other settings" in other.stderr


def test_a_results_file_that_is_not_the_benchs_is_refused(tmp_path):
    """Another bench's file, damaged JSON, or a folder as --results: refused naming it, nothing run."""
    (tmp_path / "other.json").write_text('{"bench": "faults", "runs": []}')
    (tmp_path / "damaged.json").write_text('{"benchmark": "methods", "tags": {')
    for name in ("other.json", "damaged.json"):
        done = bench(tmp_path, "--results", str(tmp_path / name))
        assert done.returncode != 0 and f"--results {tmp_path / name}" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and "evaluate.py" not in done.stderr
    done = bench(tmp_path, "--results", str(tmp_path))
    assert done.returncode == 2 and "is a folder" in done.stderr
