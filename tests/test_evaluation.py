import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gkv_train.data import arithmetic_task
from gkv_train.evaluation import evaluate_compression, pass_at_k, read_jsonl
from gkv_train.models import load_model
from rollout.config import CompressionConfig, SamplingConfig
from rollout.engine import RolloutEngine

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("n, c", [(4, 0), (4, 1), (4, 3), (5, 2), (6, 6), (7, 3)])
def test_pass_at_k_matches_brute_force(n, c):
    """pass@k = probability that a random k-subset of the n samples holds a correct one."""
    samples = [True] * c + [False] * (n - c)
    for k in range(1, n + 1):
        subsets = list(itertools.combinations(samples, k))
        brute = sum(any(s) for s in subsets) / len(subsets)
        assert pass_at_k(n, c, k) == pytest.approx(brute)


def test_evaluate_script_writes_every_output(tmp_path):
    args = [
        "model=tiny", "data.limit=5", "n_samples=2", "max_new_tokens=12", "methods=[full,gkv,streaming]",
        "budgets=[8,10]", "compression.window=2", "compression.interval=4", f"output_dir={tmp_path}",
    ]
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "evaluate.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [r["run"] for r in result["runs"]] == ["full", "gkv-b8", "gkv-b10", "streaming-b8", "streaming-b10"]
    for run in result["runs"]:
        samples = read_jsonl(tmp_path / run["run"] / "samples.jsonl")
        assert len(samples) == 10 and {s["problem_id"] for s in samples} == set(range(5))
        assert set(samples[0]) >= {"problem_id", "completion", "extracted", "correct", "length", "retention"}
        assert {"pass@1", "pass@2", "retention", "retention_correct", "mean_completion_length", "tokens_per_s"} <= set(run)
        assert (run["retention"] == 1.0) == (run["run"] == "full")
    assert (tmp_path / "pass_at_1_vs_budget.png").stat().st_size > 0
    assert (tmp_path / "retained_density.png").stat().st_size > 0


def test_interrupted_evaluation_resumes_without_recomputing(tmp_path, monkeypatch):
    model, tokenizer = load_model("tiny")
    problems = arithmetic_task(6, "test")
    compression = CompressionConfig("gkv", budget=10, window=2, interval=4)
    sampling = SamplingConfig(max_new_tokens=10, num_samples=2, seed=1)
    template = "{problem}"
    whole = evaluate_compression(model, tokenizer, problems, compression, sampling, tmp_path / "a", 2, template)

    # Interrupted after the first batch, in the middle of writing the second.
    lines = (tmp_path / "a" / "samples.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "samples.jsonl").write_text("".join(lines[:5]) + lines[5][:20])
    (tmp_path / "b" / "density.jsonl").write_text((tmp_path / "a" / "density.jsonl").read_text().splitlines()[0] + "\n")
    calls = []
    original = RolloutEngine.generate
    monkeypatch.setattr(RolloutEngine, "generate", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    resumed = evaluate_compression(model, tokenizer, problems, compression, sampling, tmp_path / "b", 2, template)
    assert len(calls) == 2  # batches 1 and 2 of 3; batch 0 was finished
    def outcome(run):  # everything but the timing
        return [{k: v for k, v in s.items() if k != "tokens_per_s"} for s in read_jsonl(tmp_path / run / "samples.jsonl")]

    assert outcome("b") == outcome("a")
    for key in ("pass@1", "pass@2", "retention"):
        assert resumed[key] == pytest.approx(whole[key])
