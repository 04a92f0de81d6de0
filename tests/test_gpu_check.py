"""scripts/gpu_check.py --tiny: the GPU machine's one-command check runs on CPU, as main, and its figures hold."""

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_tiny():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--tiny", "--shapes", "tiny-qwen2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = proc.stdout.strip().splitlines()
    shape = json.loads(line)["shapes"]["tiny-qwen2"]
    for method in ("gkv", "s4r"):
        fp32, bf16 = shape[f"consistency/{method}/fp32"], shape[f"consistency/{method}/bf16"]
        assert fp32["max_abs_logprob_diff"] <= 1e-4
        assert min(fp32["causal_mask_diff"], fp32["rotated_layers_diff"]) > 1e-2  # the controls fail
        assert 1e-4 < bf16["max_abs_logprob_diff"] < 0.1 < min(bf16["causal_mask_diff"], bf16["rotated_layers_diff"])
    assert shape["training_cost/bf16"]["masked_seconds"] > 0
    rollout = shape["rollout/bf16"]
    assert rollout["engine_gkv"]["compressions"] >= 1 and rollout["hf_generate"]["tokens_per_s"] > 0


def test_gpu_check_needs_cuda_or_tiny(monkeypatch, capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    monkeypatch.setattr(sys, "argv", ["gpu_check.py"])
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(ROOT / "scripts" / "gpu_check.py"), run_name="__main__")
    assert stop.value.code != 0 and "no CUDA device: run with --tiny on CPU" in capsys.readouterr().err
