"""scripts/bench_decode_regime.py as main (--quick): the task reached by name through evaluate.py, every method's
row with its gap and decode-time compressions, the regime's checks, and a second call that reads the runs back."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_bench_reports_every_method_and_resumes(tmp_path):
    command = [sys.executable, str(ROOT / "scripts" / "bench_decode_regime.py"), "--quick",
               "--output-root", str(tmp_path)]  # fmt: skip
    first = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert first.returncode == 0, first.stderr[-3000:]
    line = json.loads(first.stdout.strip().splitlines()[-1])
    assert line["task"]["name"] == "copy_recall" and set(line["table"]["methods"]) == {"gkv", "random"}
    for by_budget in line["table"]["methods"].values():
        row = by_budget["24"]
        assert row["gap"] == line["table"]["full"]["pass@1"] - row["pass@1"]
        assert row["decode_compressions"] >= 1  # 24 new tokens at interval 8 past a budget of 24
    assert set(line["checks"]) == {"full_pass@1_at_least", "decode_compressions_at_least", "some_gap_at_least"}
    assert "| gkv |" in (tmp_path / "summary.md").read_text()
    again = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout.strip().splitlines()[-1])["table"] == line["table"]
