"""scripts/bench_training_effect.py --quick: every stage (probe, teacher traces, recipes through train.py (GRPO
and offline distillation: the other two recipes run the same stages), evaluation through scripts/evaluate.py,
KL) on a tiny model, resumable."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # the bench's stages are each tested through their entry points (train.py, evaluate.py)
def test_quick_bench_runs_every_stage_and_resumes(tmp_path):
    script = ROOT / "scripts" / "bench_training_effect.py"
    command = [
        sys.executable,
        str(script),
        "--quick",
        "--output-root",
        str(tmp_path),
        "--recipes",
        "rl_sparse",
        "distill",
    ]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(line["models"]) == {"untrained", "rl_sparse", "distill"}
    for result in line["models"].values():
        for cache in ("full", "compressed"):
            low, high = result[cache]["ci95"]
            assert 0 <= low <= result[cache]["pass@1"] <= high <= 1 and result[cache]["samples"] == 4
        assert result["compressed"]["retention"] < result["full"]["retention"] == 1
        assert result["kl_full_teacher_vs_compressed"]["kl"] >= 0
    assert line["models"]["untrained"]["kl_full_teacher_vs_compressed"]["kl"] > 0  # compression changes the model
    for recipe in ("rl_sparse", "distill"):
        assert (tmp_path / "train" / recipe / "eval.json").is_file()
    assert (tmp_path / "summary.json").is_file() and (tmp_path / "training_effect.png").stat().st_size > 0
    table = (tmp_path / "summary.md").read_text().splitlines()
    assert len(table) == 7 and table[2].startswith("| untrained |")  # header, rule, 3 models, blank, provenance
    assert table[-1].startswith("`python ") and line["commit"] in table[-1]
    # a second call reads every finished stage back instead of recomputing it
    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "train.py" not in again.stderr and "evaluate.py" not in again.stderr
    assert json.loads(again.stdout.strip().splitlines()[-1])["models"] == line["models"]
