"""scripts/bench_consistency_length.py as main: every method asked, under both mask backends, holds the bound with
both controls failing, and the table renders a verdict per row."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))


def test_short_run_holds_and_renders(tmp_path):
    from bench_consistency_length import tables

    results = tmp_path / "results.json"
    command = [sys.executable, str(ROOT / "scripts" / "bench_consistency_length.py"), "--new-tokens", "32"]
    command += ["--methods", "gkv", "s4r", "--budget", "16", "--window", "4", "--interval", "8"]
    done = subprocess.run([*command, "--results", str(results)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])  # one line: check's own go to stderr
    assert line == json.loads(results.read_text()) and line["all_hold"]
    assert [(r["method"], r["backend"]) for r in line["rows"]] == [
        ("gkv", "sdpa"),
        ("gkv", "flex"),
        ("s4r", "sdpa"),
        ("s4r", "flex"),
    ]
    assert line["rows"][0]["compressions"] >= 2 and all(r["max_abs_logprob_diff"] <= 1e-4 for r in line["rows"])
    rendered = tables("rows", line)
    assert rendered.count("| yes |") == 4 and "bench_consistency_length.py --new-tokens 32" in rendered
