"""scripts/bench_scaling.py as main (--quick, a part): rollout points per method and length with their marginal
decode time, KV bytes and memory share; a training point through bench_train_step.py with its own peak memory;
the plot; a rerun reads every point back instead of measuring it again."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_scaling_points_and_resume(tmp_path):
    command = [
        sys.executable,
        str(ROOT / "scripts" / "bench_scaling.py"),
        "--quick",
        "--output-root",
        str(tmp_path),
        "--methods",
        "full",
        "s4r",
        "--trainers",
        "rl_sparse",
        "--train-lengths",
        "8",
    ]
    first = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert first.returncode == 0, first.stderr[-3000:]
    line = json.loads(first.stdout.strip().splitlines()[-1])
    rollout = {(p["method"], p["length"]): p for p in line["points"] if p["kind"] == "rollout"}
    assert set(rollout) == {("full", 16), ("full", 32), ("s4r", 16), ("s4r", 32)}
    assert "marginal_decode_seconds_per_token" in rollout["full", 32] and rollout["full", 32]["decode_seconds"] > 0
    assert rollout["full", 32]["kv_cache_peak_bytes"] > rollout["full", 16]["kv_cache_peak_bytes"]  # grows with length
    assert rollout["full", 16]["memory_share"] == 1.0 and 0 < rollout["s4r", 32]["memory_share"] < 1
    (train,) = [p for p in line["points"] if p["kind"] == "training"]
    assert train["trainer"] == "rl_sparse" and train["seconds"] > 0 and train["peak_rss_bytes"] > 0
    assert (tmp_path / "scaling.png").is_file()
    again = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert again.returncode == 0 and "[scaling" not in again.stderr  # nothing measured again
    assert json.loads(again.stdout.strip().splitlines()[-1])["points"] == line["points"]
    # other training settings: a new training point beside the old one, the rollout points read back
    other = [*command, "--train-rows", "4", "--gradient-checkpointing", "--mmap-threshold", "131072"]
    checkpointed = subprocess.run(other, capture_output=True, text=True, timeout=600, check=False)
    assert checkpointed.returncode == 0, checkpointed.stderr[-3000:]
    assert checkpointed.stderr.count("[scaling") == 1 and "training rl_sparse 8" in checkpointed.stderr
    (train,) = [
        p for p in json.loads(checkpointed.stdout.strip().splitlines()[-1])["points"] if p["kind"] == "training"
    ]
    assert (train["rows"], train["gradient_checkpointing"], train["mmap_threshold"]) == (4, True, 131072)
    refused = subprocess.run(
        [*command, "--mmap-threshold", "0"], capture_output=True, text=True, timeout=60, check=False
    )
    assert refused.returncode == 2 and "--mmap-threshold 0" in refused.stderr
