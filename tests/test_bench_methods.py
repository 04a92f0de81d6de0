"""scripts/bench_methods.py as main: one evaluate.py call and one result file per run; a run whose file exists is
read back, not run again (the benchmark continues across sessions); a file measured with other settings is
refused."""

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
        str(tmp_path / "results"),
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
    run_file = tmp_path / "results" / "t" / "arithmetic_full.json"
    saved = json.loads(run_file.read_text())
    assert saved["problems"] == 2 and len(saved["per_problem"]) == 2 and "evaluate.py" in saved["command"]
    line = json.loads(first.stdout.strip().splitlines()[-1])
    assert line["runs"]["arithmetic/full"]["pass@1"] == saved["pass@1"]
    # a run file of an earlier call (other datasets or settings) stays in the tag's summary
    other_run = {**saved, "dataset": "svamp", "run": "gkv-b64-i32"}
    (run_file.parent / "svamp_gkv-b64-i32.json").write_text(json.dumps(other_run))
    again = bench(tmp_path)
    assert again.returncode == 0 and "evaluate.py" not in again.stderr  # read back, nothing run
    summary = json.loads((tmp_path / "bench_methods_t.json").read_text())
    assert set(summary["runs"]) == {"arithmetic/full", "svamp/gkv-b64-i32"}
    other = bench(tmp_path, "--temperature", "0.3")
    assert other.returncode != 0 and "measured with other settings" in other.stderr
