"""scripts/bench_compress.py as the main module: every eviction method's compression timed at small shapes."""

import json
import subprocess
import sys
from pathlib import Path

from gkv_rollout.registry import eviction_methods

ROOT = Path(__file__).resolve().parents[1]


def test_times_every_eviction_method():
    command = [
        sys.executable,
        str(ROOT / "scripts" / "bench_compress.py"),
        "--layers",
        "2",
        "--batch",
        "2",
        "--repeats",
        "2",
        "--budget",
        "72",  # above random_attention's window of 64
        "--interval",
        "8",
    ]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(line["ms_per_compression"]) == set(eviction_methods())
    assert all(0 < t["min"] <= t["median"] for t in line["ms_per_compression"].values())
    assert all(t["score_median"] > 0 and t["evict_median"] > 0 for t in line["ms_per_compression"].values())
    assert line["slots"] == 80
