"""train.py end to end on a tiny model: outputs, exact resume, two processes, clear config errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "model=tiny", "max_new_tokens=24", "compression.budget=16", "compression.window=4", "compression.interval=8",
    "learning_rate=1e-3", "eval_data.limit=4",
]


def run(args, launcher=(sys.executable,), check=True):
    proc = subprocess.run([*launcher, str(ROOT / "train.py"), *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(proc.stdout[-3000:] + proc.stderr[-3000:])
    return proc


def metrics(out_dir):
    lines = [json.loads(line) for line in open(Path(out_dir) / "metrics.jsonl")]
    return [r for r in lines if "loss" in r]


@pytest.mark.parametrize("recipe", ["rl_sparse", "rl_full"])
def test_train_writes_logs_checkpoints_and_evaluation(tmp_path, recipe):
    proc = run([f"recipe={recipe}", *TINY, "max_steps=2", f"output_dir={tmp_path}"])
    steps = metrics(tmp_path)
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["mismatch/max_abs"] <= 1e-4  # training saw what the rollout saw
        assert {"reward", "reward_std", "rewards/accuracy/mean", "completions/mean_length", "rollout/retention",
                "rollout/tokens_per_s", "train/tokens_per_s", "mismatch/kl", "verifier_timeouts"} <= set(r)
        assert (r["rollout/retention"] < 1) == (recipe == "rl_sparse")
    assert (tmp_path / "checkpoint-2" / "optimizer.pt").is_file() and (tmp_path / "model.safetensors").is_file()
    final = json.loads(proc.stdout.strip().splitlines()[-1])
    assert final["eval"] == "held_out" and final["recipe"] == recipe and 0 <= final["accuracy"] <= 1
    assert json.loads((tmp_path / "eval.json").read_text())["accuracy"] == final["accuracy"]


@pytest.mark.parametrize("recipe", ["distill", "distill_onpolicy"])
def test_distillation_recipes(tmp_path, recipe):
    args = [f"recipe={recipe}", *TINY, "max_steps=2", f"output_dir={tmp_path}"]
    if recipe == "distill":  # a random teacher solves nothing: give it traces with wrong answers kept
        traces = tmp_path / "traces.jsonl"
        subprocess.run([sys.executable, str(ROOT / "scripts" / "generate_traces.py"), "--model", "tiny", "--limit", "4",
                        "--samples", "2", "--max-new-tokens", "16", "--keep-incorrect", "--output", str(traces)],
                       cwd=ROOT, check=True, capture_output=True, timeout=600)
        args.append(f"traces={traces}")
    proc = run(args)
    steps = metrics(tmp_path)
    assert [r["step"] for r in steps] == [1, 2] and max(r["mismatch/max_abs"] for r in steps) <= 1e-4
    assert json.loads(proc.stdout.strip().splitlines()[-1])["recipe"] == recipe


def test_lora_and_periodic_evaluation(tmp_path):
    run([*TINY, "max_steps=2", "lora.enabled=true", "lora.r=4", "eval_steps=1", "eval_data.limit=2",
         f"output_dir={tmp_path}"])
    lines = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    evals = [r for r in lines if "eval_reward" in r]
    assert [r["step"] for r in evals] == [1, 2]
    assert max(r["mismatch/max_abs"] for r in metrics(tmp_path)) <= 1e-4
    assert (tmp_path / "adapter_model.safetensors").is_file()


def test_resume_continues_exactly(tmp_path):
    whole, split = tmp_path / "whole", tmp_path / "split"
    run([*TINY, "max_steps=3", f"output_dir={whole}"])
    run([*TINY, "max_steps=2", f"output_dir={split}"])
    run([*TINY, "max_steps=3", f"output_dir={split}", "resume=last"])
    a, b = metrics(whole), metrics(split)
    assert [r["step"] for r in b] == [1, 2, 3]
    for key in ("loss", "reward", "grad_norm"):
        assert a[2][key] == pytest.approx(b[2][key], rel=1e-5, abs=1e-7)


def test_two_processes(tmp_path):
    """`accelerate launch --num_processes 2` on a CPU-only machine: two gloo processes, not one."""
    launcher = (str(Path(sys.executable).parent / "accelerate"), "launch", "--num_processes", "2")
    run([*TINY, "max_steps=1", f"output_dir={tmp_path}"], launcher=launcher)
    (step,) = metrics(tmp_path)
    assert step["processes"] == 2 and step["mismatch/max_abs"] <= 1e-4


@pytest.mark.parametrize(
    "override, message",
    [
        ("compression.method=quest", "unknown compression method 'quest'"),
        ("compression.budget=4", "budget (4) must be larger than window (8)"),
        ("loss_type=ppo", "unknown loss_type 'ppo'"),
        ("data.path=/nonexistent.jsonl", "dataset file /nonexistent.jsonl does not exist"),
        ("model=/no/such/model", "model path /no/such/model does not exist"),
    ],
)
def test_bad_config_fails_clearly(tmp_path, override, message):
    args = ["model=tiny", f"output_dir={tmp_path}", "max_steps=1", override]
    if override.startswith("data.path"):
        args.append("data.name=null")
    proc = run(args, check=False)
    assert proc.returncode != 0 and message in proc.stderr + proc.stdout
