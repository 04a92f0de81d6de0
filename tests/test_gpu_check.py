"""scripts/gpu_check.py --tiny: the GPU machine's one-command check runs on CPU, as main, and its figures hold."""

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_tiny(tmp_path):
    """Every section, in order, written under --out as it finishes; the consistency controls fail; the rollout
    and training figures carry their roofline; one GRPO step through train.py."""
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "gpu_check.py"),
            "--tiny",
            "--shapes",
            "tiny-qwen2",
            "--rollout-tokens",
            "24",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])  # the JSON line is the last
    assert json.loads((tmp_path / "gpu_check.json").read_text()) == result
    sections = result["sections"]
    assert list(sections)[0] == "hardware" and sections["hardware"]["bf16_matmul_flops_per_s"] > 0
    for method in ("gkv", "s4r"):
        fp32, bf16 = (sections[f"consistency/tiny-qwen2/{method}/{p}"] for p in ("fp32", "bf16"))
        assert fp32["max_abs_logprob_diff"] <= 1e-4 and fp32["controls_fail"] and bf16["controls_fail"]
        assert 1e-4 < bf16["max_abs_logprob_diff"] < 0.1 < min(bf16["causal_mask_diff"], bf16["rotated_layers_diff"])
    rollout = sections["rollout/tiny-qwen2/bf16/batch4"]
    assert rollout["new_tokens"] == 24
    assert rollout["engine_gkv"]["compressions"] >= 1 and rollout["hf_generate"]["tokens_per_s"] > 0
    assert 0 < rollout["engine_gkv"]["roofline"]["achieved_over_ceiling"] < 1
    cost = sections["training_cost/tiny-qwen2/bf16/96"]  # both record paths against causal SDPA
    assert cost["causal_sdpa_seconds"] > 0 and cost["roofline_causal_sdpa"]["flops"] > 0
    assert cost["record"]["flex"]["forward_only"] and cost["record_over_causal"]["flex"] is None  # CPU: no backward
    assert not cost["record"]["sdpa"]["forward_only"] and cost["record_over_causal"]["sdpa"] > 0
    grpo = sections["grpo_step/tiny-qwen2"]
    assert grpo["ok"] and grpo["mismatch/max_abs"] <= 1e-4, grpo
    summary = (tmp_path / "gpu_check.md").read_text()  # the docs' view of this run (gpu_check.tables)
    assert summary.startswith("# gpu_check on cpu") and "| tiny-qwen2 | gkv | fp32 |" in summary
    assert "engine_gkv " in summary and "hf_generate " in summary and "| grpo_step/tiny-qwen2 | 1 | ran in" in summary


def test_gpu_check_skips_what_does_not_fit_the_time_budget(tmp_path):
    """A run past --budget-s starts nothing more: the sections asked for (--sections) still come, marked
    skipped, in the order asked (one name per training length); the others do not come."""
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "gpu_check.py"),
            "--tiny",
            "--shapes",
            "tiny-qwen2",
            "--budget-s",
            "0",
            "--sections",
            "grpo_step",
            "consistency",
            "training_cost",
            "--train-tokens",
            "96",
            "160",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    sections = json.loads(proc.stdout.strip().splitlines()[-1])["sections"]
    assert sections["hardware"]["memory_bytes_per_s"] > 0
    skipped = [name for name, value in sections.items() if value.get("skipped") == "time budget"]
    assert skipped[0] == "grpo_step/tiny-qwen2" and skipped[1] == "consistency/tiny-qwen2/gkv/fp32"
    assert skipped[-2:] == ["training_cost/tiny-qwen2/bf16/96", "training_cost/tiny-qwen2/bf16/160"]
    assert not [name for name in sections if name.startswith("rollout/")], sections
    assert "skipped (time budget)" in (tmp_path / "gpu_check.md").read_text()


def test_gpu_check_needs_cuda_or_tiny(monkeypatch, capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    monkeypatch.setattr(sys, "argv", ["gpu_check.py"])
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(ROOT / "scripts" / "gpu_check.py"), run_name="__main__")
    assert stop.value.code != 0 and "no CUDA device: run with --tiny on CPU" in capsys.readouterr().err
