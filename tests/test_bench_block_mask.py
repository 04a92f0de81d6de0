"""scripts/bench_block_mask.py at tiny sizes: the record's block masks equal create_block_mask's, timed both ways."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_bench_times_both_builds_and_finds_them_equal(tmp_path):
    results = tmp_path / "block_mask.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_block_mask.py"), "--quick", "--results", str(results)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(results.read_text())
    assert json.loads(done.stdout.strip().splitlines()[-1])["benchmark"] == "block_mask"
    for budget in found["budgets"].values():
        for point in budget["points"]:
            assert point["equal_to_create_block_mask"] and point["after_seconds"] > 0 and point["before_seconds"] > 0
            assert abs(sum(point["tiles"].values()) - 1) < 1e-9 and point["tiles"]["partial"] > 0
    assert set(found["block_mask_build_seconds"]["96"]) == {"256", "384"}
