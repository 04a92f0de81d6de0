"""train.py end to end on a tiny model: outputs, answer checking, crash-safe checkpoints and exact resume, output
folders, two processes, clear config errors."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from entry_points import run_each, run_warm

from gkv_train.jsonio import read_jsonl
from gkv_train.runs.checkpoints import complete_checkpoints
from gkv_train.runs.runlock import RunLock
from gkv_train.storage import filesystem

from verifier_probe import PAIRS, SCRIPT_WITH_ANSWERS, write_problems

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "model=tiny",
    "max_completion_length=24",
    "compression.budget=16",
    "compression.window=4",
    "compression.interval=8",
    "learning_rate=1e-3",
    "eval_data.limit=4",
]
# train.py run as __main__ with torch.save failing inside checkpoint-<step> ($CRASH_SAVE = "<step>:kill" exits at
# once as a SIGKILL would; "<step>:disk-full" raises ENOSPC; "<step>:iostream" raises what torch's C++ writer says
# on a full disk, with the disk's free space reported as 1000 bytes).
CRASH_AT_SAVE = (
    sys.executable,
    "-c",
    """
import collections, errno, os, runpy, shutil, sys, torch
step, how = os.environ["CRASH_SAVE"].split(":")
save = torch.save
def failing_save(obj, f, *args, **kwargs):
    if f"checkpoint-{step}" in str(f):
        if how == "kill":
            os._exit(137)
        if how == "iostream":
            shutil.disk_usage = lambda path: collections.namedtuple("usage", "total used free")(10**9, 10**9, 1000)
            raise RuntimeError("basic_ios::clear: iostream error")
        raise OSError(errno.ENOSPC, "No space left on device", str(f))
    return save(obj, f, *args, **kwargs)
torch.save = failing_save
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
""",
)


def two_processes(*options: str) -> list[str]:
    """``accelerate launch [options] --num_processes 2`` on a free rendezvous port: not the default 29500, which
    another test's run (the other pytest worker's, or one that just ended) may hold."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    accelerate = str(Path(sys.executable).parent / "accelerate")
    return [accelerate, "launch", *options, "--num_processes", "2", "--main_process_port", str(port)]


def run(args, launcher=(sys.executable,), check=True, env=None):
    """``train.py *args`` (through ``launcher``) from the repository root, its output captured; a plain run in a
    fork of a warm interpreter (``entry_points.run_warm``), one with a launcher or more environment fresh."""
    if launcher == (sys.executable,) and not env:
        proc = run_warm(ROOT / "train.py", list(args), ROOT)
    else:
        proc = subprocess.run(
            [*launcher, str(ROOT / "train.py"), *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, **(env or {})},
        )
    if check and proc.returncode != 0:
        raise AssertionError(proc.stdout[-3000:] + proc.stderr[-3000:])
    return proc


def strict_json(text):
    """json.loads that refuses NaN / Infinity, as strict parsers do."""
    return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} written into JSON"))


def metrics(out_dir):
    lines = [strict_json(line) for line in open(Path(out_dir) / "metrics.jsonl")]
    return [r for r in lines if "loss" in r]


@pytest.mark.parametrize("recipe", [pytest.param("rl_sparse", marks=pytest.mark.floor), "rl_full"])
def test_train_writes_logs_checkpoints_and_evaluation(tmp_path, recipe):
    """Also: LaTeX / fraction / interval / set / scientific-notation answers are checked correctly and quickly
    inside train.py (the checker's worker does not re-import train.py), and a local data file leaves no copy in
    the datasets cache."""
    out, cache = tmp_path / "out", tmp_path / "hf-datasets"
    data = write_problems(tmp_path / "latex.jsonl")
    env = {
        "PROBE_OUT": str(tmp_path / "probe.jsonl"),
        "HF_DATASETS_CACHE": str(cache),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
    }
    proc = run(
        [
            f"recipe={recipe}",
            *TINY,
            "max_steps=2",
            f"output_dir={out}",
            "data.name=null",
            f"data.path={data}",
            "rewards=[gkv_rewards.functions.accuracy,verifier_probe.latex_probe]",
        ],
        env=env,
    )
    steps = metrics(out)
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["mismatch/max_abs"] <= 1e-4  # training saw what the rollout saw
        assert {
            "reward",
            "reward_std",
            "rewards/accuracy/mean",
            "completions/mean_length",
            "rollout/retention",
            "rollout/tokens_per_s",
            "forward_backward/tokens_per_s",
            "mismatch/kl",
            "verifier_timeouts",
        } <= set(r)
        assert (r["rollout/retention"] < 1) == (recipe == "rl_sparse")
        assert r["verifier_checks"] > 0 and r["verifier_timeouts"] == 0 and r["verifier_errors"] == 0
        assert "sampling/rollout_is_weight/mean" not in r  # rl.rollout_is=auto is off in fp32
    assert (out / "checkpoint-2" / "optimizer.pt").is_file() and (out / "model.safetensors").is_file()
    assert f"recipe: {recipe}" in (out / "hydra" / "config.yaml").read_text()  # written after the checks
    final = strict_json(proc.stdout.strip().splitlines()[-1])
    assert final["eval"] == "held_out" and final["recipe"] == recipe and 0 <= final["accuracy"] <= 1
    assert final["verifier_timeouts"] == 0 and final["verifier_errors"] == 0
    assert strict_json((out / "eval.json").read_text())["accuracy"] == final["accuracy"]
    probes = [json.loads(line) for line in open(tmp_path / "probe.jsonl")]
    assert len(probes) >= 2
    for probe in probes:
        assert probe["verdicts"] == [float(equal) for _, _, equal in PAIRS]
        assert probe["seconds"] < 60  # ~1 s; a check in the main process could run for minutes
    assert not cache.exists() or not any(p.is_file() for p in cache.rglob("*"))


def test_trl_users_keys_trackers_and_console_log(tmp_path):
    """A TRL user's run: GRPOConfig's fields are keys as they are (num_iterations, weight_decay, log_completions)
    and reach the trainer with the sampling group in TRL's own fields, and with two
    optimizer iterations per generation training still sees what the rollout saw; report_to=[tensorboard,wandb]
    (wandb offline): both receive the step metrics, TensorBoard's tags carry one ``train/`` prefix; everything
    printed is also in train.log, progress bars as their last state. The rollouts run with compile_decode=true
    (compiled decode steps), which keeps training consistent with them. Some keys come from a recipe file of the
    user's own, as TRL users give one (``--config file.yaml``); the model card's quick start names the run's
    folder."""
    import torch
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "out"
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}
    mine = tmp_path / "mine.yaml"
    mine.write_text("recipe: rl_sparse\nnum_iterations: 2\nweight_decay: 0.01\nlog_completions: true\n")
    proc = run(
        [
            "--config",
            str(mine),
            *TINY,
            "max_steps=1",
            f"output_dir={out}",
            "report_to=[tensorboard,wandb]",
            "run_name=probe",
            "max_completion_length=20",
            "num_generations=4",
            "compile_decode=true",
        ],
        env=env,
    )
    assert f'model="{out}"' in (out / "README.md").read_text()
    args = torch.load(out / "checkpoint-1" / "training_args.bin", weights_only=False)
    assert type(args).__name__ == "GRPOTrainConfig" and args.compression.budget == 16
    assert (args.num_iterations, args.weight_decay, args.log_completions) == (2, 0.01, True)
    assert (args.max_completion_length, args.num_generations) == (20, 4)
    steps = metrics(out)
    assert [r["step"] for r in steps] == [1] and steps[0]["mismatch/max_abs"] <= 1e-4

    events = sorted(out.rglob("events.out.tfevents.*"))
    assert events, "no TensorBoard event file"
    tags = EventAccumulator(str(events[0].parent)).Reload().Tags()["scalars"]
    assert {"train/reward", "train/mismatch/max_abs", "train/rollout/retention"} <= set(tags)
    assert not [t for t in tags if t.startswith("train/train/")]
    runs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert runs and list(runs[0].glob("*.wandb")), "no offline wandb run"
    log = (out / "train.log").read_text()
    assert proc.stdout.strip().splitlines()[-1] in log and "\r" not in log
    assert "100%" in log  # the progress bar's final state


def test_console_tee_keeps_a_transcript():
    import io

    from gkv_train.console import LineTee

    console, log = io.StringIO(), io.StringIO()
    tee = LineTee(console, log)
    for text in ["start\n", "\r 10%|#", "\r 50%|#####", "\r100%|##########", "\n", "done: 1", "\n", "bar\r 1/2\r 2/2"]:
        tee.write(text)
    tee.write("\n\x1b[Aeval\x1b[K\n")  # a nested bar's cursor moves
    tee.close_line()
    assert console.getvalue().endswith("\x1b[Aeval\x1b[K\n")  # the console sees everything as written
    assert log.getvalue() == "start\n100%|##########\ndone: 1\n 2/2\neval\n"


def test_the_rollout_bar_stays_out_of_the_log(monkeypatch, tmp_path):
    """The rollout's bar inside a training step is transient: drawn on the terminal, never in train.log."""
    import io

    from gkv_train import console

    monkeypatch.setattr(console, "ROLLOUT_BAR_DELAY", 0.0)
    terminal, log = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", console.LineTee(terminal, log))
    with console.rollout_progress(2, 8) as update:
        for _ in range(16):
            update(1)
    sys.stderr.close_line()
    assert "rollout" in terminal.getvalue() and "rollout" not in log.getvalue()


@pytest.mark.parametrize("recipe", ["distill", pytest.param("distill_onpolicy", marks=pytest.mark.floor)])
def test_distillation_recipes(tmp_path, recipe):
    args = [f"recipe={recipe}", *TINY, "max_steps=2", f"output_dir={tmp_path}"]
    if recipe == "distill":  # a random teacher solves nothing: give it traces with wrong answers kept
        traces = tmp_path / "traces.jsonl"
        subprocess.run(
            [
                sys.executable,
                str(ROOT / "scripts" / "generate_traces.py"),
                "model=tiny",
                "data.limit=4",
                "num_generations=2",
                "max_completion_length=16",
                "keep_incorrect=true",
                f"output={traces}",
            ],
            cwd=ROOT,
            check=True,
            capture_output=True,
            timeout=600,
        )
        args.append(f"distill.traces={traces}")
    proc = run(args)
    steps = metrics(tmp_path)
    assert [r["step"] for r in steps] == [1, 2] and max(r["mismatch/max_abs"] for r in steps) <= 1e-4
    assert json.loads(proc.stdout.strip().splitlines()[-1])["recipe"] == recipe
    assert "is deprecated and will be removed in v6" not in proc.stderr  # upstream warnings filtered once
    # on-policy: the student's own samples are graded, the curve GRPO's "reward" draws (offline: no samples)
    assert all(0 <= r["reward"] <= 1 for r in steps) if recipe == "distill_onpolicy" else "reward" not in steps[0]


def test_a_users_method_through_train_py(tmp_path):
    """``compression.method=module:Class`` from the user's own module (on PYTHONPATH, never in the package): the
    rollout compresses with it, the trainer reproduces it under the record, the held-out evaluation uses it."""
    (tmp_path / "my_methods.py").write_text(
        "from dataclasses import dataclass\n"
        "from gkv_rollout.methods import EvictionMethod\n"
        "@dataclass\n"
        "class KeyNorm(EvictionMethod):\n"
        "    name = 'keynorm'\n"
        "    p: float = 2.0\n"
        "    def score(self, state):\n"
        "        return state.keys.float().norm(p=self.p, dim=-1), None\n"
    )
    out = tmp_path / "out"
    proc = run(
        [
            "recipe=rl_sparse",
            *TINY,
            "compression.method=my_methods:KeyNorm",
            "compression.p=1",
            "max_steps=1",
            "eval_data.limit=1",
            f"output_dir={out}",
        ],
        env={"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])},
    )
    (step,) = metrics(out)
    assert step["mismatch/max_abs"] <= 1e-4 and step["rollout/retention"] < 1
    assert strict_json(proc.stdout.strip().splitlines()[-1])["compression"] == "my_methods:KeyNorm"


@pytest.mark.xdist_group("lora_run")  # one worker builds the shared run
def test_export_writes_a_self_contained_merged_folder(tmp_path, lora_run):
    """``gkv-train export RUN_DIR OUT_DIR`` on a LoRA run: a folder that plain transformers loads (no project
    import, from an empty folder) and whose logits equal base + adapter; an empty run folder is refused by name."""
    (run_dir, _), out = lora_run, tmp_path / "merged"
    cli = [sys.executable, "-m", "gkv_train.cli", "export"]
    proc = subprocess.run([*cli, str(run_dir), str(out)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0 and "is deprecated" not in proc.stderr, proc.stderr
    card = (out / "README.md").read_text()
    assert f'from_pretrained("{out}")' in card and "under the KV-cache compression `gkv`" in card
    version = subprocess.run([sys.executable, "-m", "gkv_train.cli", "--version"], capture_output=True, text=True)
    assert version.stdout.startswith("gkv-train 0.1.0 (gkv-rollout 0.1.0, gkv-rewards 0.1.0)")
    code = (
        "import sys, torch, transformers; m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1]); "
        "assert 'gkv_train' not in sys.modules; print(m(torch.arange(1, 9)[None]).logits.sum().item())"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    loaded = subprocess.run(
        [sys.executable, "-c", code, str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=empty,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert loaded.returncode == 0, loaded.stderr
    from peft import PeftModel

    from gkv_train.models import load_model

    merged = PeftModel.from_pretrained(load_model("tiny")[0], str(run_dir)).merge_and_unload()
    with torch.no_grad():
        expected = merged(torch.arange(1, 9)[None]).logits.sum().item()
    assert abs(float(loaded.stdout.strip()) - expected) <= 1e-3 * max(1.0, abs(expected))
    refused = subprocess.run([*cli, str(empty), str(tmp_path / "x")], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "holds no trained model" in refused.stderr


def test_s4r_through_train_py(tmp_path):
    """RL-Sparse under S4R's record, train.py as the main module: the trainer reproduces the rollout's log-probs,
    and the held-out evaluation runs with the same compression. The control: without the record (plain causal
    attention in the trainer) the same run logs a large mismatch."""
    args = ["recipe=rl_sparse", *TINY, "compression.method=s4r", "max_steps=1"]
    proc = run([*args, f"output_dir={tmp_path / 'record'}"])
    (step,) = metrics(tmp_path / "record")
    assert step["mismatch/max_abs"] <= 1e-4 and step["rollout/retention"] < 1
    final = strict_json(proc.stdout.strip().splitlines()[-1])
    assert final["eval"] == "held_out" and final["compression"] == "s4r" and final["retention"] < 1
    run([*args, "rl.train_with_record=false", "eval_data.limit=1", f"output_dir={tmp_path / 'causal'}"])
    (control,) = metrics(tmp_path / "causal")
    assert control["mismatch/max_abs"] > 1e-2


@pytest.mark.parametrize("recipe", ["rl_sparse", "sparse_rl"])
def test_long_recall_trains_on_the_sampled_answer_through_train_py(tmp_path, recipe):
    """long_recall trains: its story is fed through the compressed cache (RL-Sparse's trainer attends under the
    record, which covers it: the mismatch is rounding), the logged completion length counts the sampled tokens only,
    and the run ends with its evaluation on the task."""
    out = tmp_path / recipe
    run(
        [
            *TINY,
            f"recipe={recipe}",
            "max_steps=1",
            "data.name=long_recall",
            "data.sentences=2",
            "data.limit=4",
            "eval_data.name=long_recall",
            "eval_data.sentences=2",
            "eval_data.limit=1",
            "max_completion_length=200",
            "compression.budget=64",
            f"output_dir={out}",
        ]
    )
    (step,) = metrics(out)
    assert step["rollout/compressions"] >= 10 and step["completions/mean_length"] <= 200 - 150
    if recipe == "rl_sparse":
        assert step["mismatch/max_abs"] <= 1e-4
    assert json.loads((out / "eval.json").read_text())["problems"] == 1


def test_sparse_rl_dense_learner_through_train_py(tmp_path):
    """Sparse-RL's design (recipe sparse_rl): the same compressed rollout, a dense learner, the mismatch corrected
    by truncated, normalised importance weights, token rejection and a sequence veto. Every step logs the ratio
    quantiles and the agreement tail; for the dense learner they show a real mismatch (for RL-Sparse, rounding)."""
    run(["recipe=sparse_rl", *TINY, "max_steps=1", "eval_data.limit=1", f"output_dir={tmp_path}"])
    (step,) = metrics(tmp_path)
    assert step["mismatch/max_abs"] > 1e-2 and step["rollout/retention"] < 1  # dense: attends to evicted keys
    assert step["mismatch/agreement_p5"] < 1 and step["mismatch/ratio_p1"] < 1 < step["mismatch/ratio_p99"]
    assert step["sampling/rollout_is_weight/mean"] > 0 and 0 <= step["sampling/rollout_tokens_dropped"] < 1


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """One LoRA run (2 steps, an evaluation after each) and the folder its built-in model was converted into,
    apart from the run: read by the LoRA test and exported by the export test."""
    root = tmp_path_factory.mktemp("lora")
    run_dir, cache = root / "run", root / "conversion-cache"
    run(
        [
            *TINY,
            "max_steps=2",
            "lora.enabled=true",
            "lora.r=4",
            "eval_steps=1",
            "eval_data.limit=2",
            f"output_dir={run_dir}",
        ],
        env={"GKV_TRAIN_CACHE": str(cache)},
    )
    return run_dir, cache


@pytest.mark.xdist_group("lora_run")
def test_lora_and_periodic_evaluation(lora_run):
    run_dir, cache = lora_run
    lines = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    evals = [r for r in lines if "eval_reward" in r]
    assert [r["step"] for r in evals] == [1, 2]
    assert max(r["mismatch/max_abs"] for r in metrics(run_dir)) <= 1e-4
    assert (run_dir / "adapter_model.safetensors").is_file()
    # the adapter and the model card name the base as given, not the folder it was loaded from
    for folder in (run_dir, run_dir / "checkpoint-2"):
        assert json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"] == "tiny"
    card = (run_dir / "README.md").read_text()
    assert "fine-tuned version of [tiny]" in card and "[None]" not in card
    assert "base_model: tiny" in (run_dir / "checkpoint-2" / "README.md").read_text()  # PEFT's card too
    assert any(cache.iterdir())  # the model was loaded from there, and no written file names it
    named = [f for f in run_dir.rglob("*") if f.is_file() and str(cache).encode() in f.read_bytes()]
    assert not named, named


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


@pytest.mark.xdist_group("lora_run")
@pytest.mark.parametrize("how", ["truncated", "flipped", "state"])
def test_a_finished_run_with_damaged_checkpoints_is_refused_and_left_whole(lora_run, tmp_path, how):
    """A finished run whose every checkpoint is damaged (weights truncated, one byte flipped, trainer state
    overwritten): resume=last is refused before any work, naming each damaged checkpoint and overwrite=true, and
    the folder (final model, metrics, evaluation) is left byte for byte."""
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(lora_run[0], run_dir)
    for checkpoint in complete_checkpoints(run_dir):
        weights = checkpoint / "adapter_model.safetensors"
        if how == "truncated":
            weights.write_bytes(weights.read_bytes()[:1000])
        elif how == "flipped":
            data = bytearray(weights.read_bytes())
            data[len(data) // 2] ^= 0x01
            weights.write_bytes(bytes(data))
        else:
            (checkpoint / "trainer_state.json").write_text('{"global_step": 0}')
    before = folder_bytes(run_dir)
    again = run(
        [*TINY, "max_steps=3", "lora.enabled=true", "lora.r=4", f"output_dir={run_dir}", "resume=last"], check=False
    )
    line = refusal(again)
    assert "checkpoint-1: " in line and "checkpoint-2: " in line and "overwrite=true" in line, line
    assert "adapter_model.safetensors" in line and "eval.json" in line, line
    assert folder_bytes(run_dir) == before


def test_crashed_saves_resume_exactly(tmp_path):
    """A full disk during one save and a kill during another: resume=last continues from the newest complete
    checkpoint, logs no step twice and ends where an uninterrupted run does; then the finished run is not
    extended."""
    whole, split = tmp_path / "whole", tmp_path / "split"
    run([*TINY, "max_steps=3", f"output_dir={whole}"])
    full = run([*TINY, "max_steps=3", f"output_dir={split}"], CRASH_AT_SAVE, False, {"CRASH_SAVE": "2:disk-full"})
    assert full.returncode == 1 and "No space left on device" in full.stderr
    named_full_disk(full.stderr, split)
    assert sorted(p.name for p in split.iterdir() if "checkpoint" in p.name or p.name == ".staging") == ["checkpoint-1"]
    killed = run(
        [*TINY, "max_steps=3", f"output_dir={split}", "resume=last"], CRASH_AT_SAVE, False, {"CRASH_SAVE": "3:kill"}
    )
    assert killed.returncode == 137 and (split / ".staging" / "checkpoint-3").is_dir()
    assert not (split / "checkpoint-3").exists()
    run([*TINY, "max_steps=3", f"output_dir={split}", "resume=last"])
    a, b = metrics(whole), metrics(split)
    assert [r["step"] for r in b] == [1, 2, 3]
    for key in ("loss", "reward", "grad_norm"):
        assert a[1][key] == pytest.approx(b[1][key], rel=1e-5, abs=1e-7)
        assert a[2][key] == pytest.approx(b[2][key], rel=1e-5, abs=1e-7)
    assert not (split / ".staging").exists()

    finished = (split / "eval.json").read_text()
    again = run([*TINY, "max_steps=3", f"output_dir={split}", "resume=last"])
    assert "holds a finished run" in again.stderr and metrics(split) == b
    assert (split / "eval.json").read_text() == finished
    assert strict_json(again.stdout.strip().splitlines()[-1]) == strict_json(finished)
    # (a fresh run into the folder is refused: test_checkpoints.py, in-process)

    # damage, found by the manifests: a truncated newest checkpoint is passed over for the one before, with a line
    weights = whole / "checkpoint-3" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    on = run([*TINY, "max_steps=4", f"output_dir={whole}", "resume=last"])
    assert "checkpoint-3 is damaged" in on.stderr and "resuming from" in on.stderr and "checkpoint-2" in on.stderr
    assert [r["step"] for r in metrics(whole)] == [1, 2, 3, 4]
    # a resume with another learning rate than its checkpoint's is refused (the checkpoint's would be kept)
    faster = run([*TINY, "max_steps=5", f"output_dir={whole}", "resume=last", "learning_rate=1e-2"], check=False)
    assert "learning_rate=0.001 there, 0.01 here" in refusal(faster)
    # export of a damaged final model names the file
    final = whole / "model.safetensors"
    final.write_bytes(final.read_bytes()[:1000])
    done = subprocess.run(
        [sys.executable, "-m", "gkv_train.cli", "export", str(whole), str(tmp_path / "merged")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and f"{final} has 1000 bytes" in done.stderr and not (tmp_path / "merged").exists()


def named_full_disk(stderr, out):
    """The one line a full disk during a checkpoint save ends with: the staging path, its file system, the space
    free and what a checkpoint needs; no traceback."""
    (line,) = [line for line in stderr.splitlines() if line.startswith("error: ")]  # (a progress bar closes after it)
    assert line.startswith("error: No space left on device while writing checkpoint-")
    assert "Traceback" not in stderr
    assert str(out / ".staging") in line and " free; checkpoint-" in line and "needs about" in line
    assert f"{filesystem(out)} has" in line  # the mount point and file system type


def test_full_disk_reported_by_torch_writer_names_the_disk(tmp_path):
    """torch's C++ writer reports a full disk as "basic_ios::clear: iostream error" (no errno): with less space free
    than a checkpoint needs, the error names the disk and the space."""
    proc = run([*TINY, "max_steps=2", f"output_dir={tmp_path}"], CRASH_AT_SAVE, False, {"CRASH_SAVE": "1:iostream"})
    assert proc.returncode == 1
    named_full_disk(proc.stderr, tmp_path)
    assert not (tmp_path / ".staging").exists() and not (tmp_path / "checkpoint-1").exists()


def wait_for_step(out, step, proc, timeout=300):
    """Wait until ``out/metrics.jsonl`` logs a training step >= ``step`` (the run ``proc`` still alive)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended early"
        logged = read_jsonl(out / "metrics.jsonl")
        if any("loss" in r and r["step"] >= step for r in logged):
            return
        time.sleep(0.1)
    raise AssertionError(f"no step {step} within {timeout} s")


def lock_holder(out):
    """The note of the run holding ``out``'s lock (pid, host, started, command)."""
    return json.loads((out / ".run.lock").read_text())


def unlocked(out, timeout=120):
    """Wait until no process holds ``out``'s lock; whether none does."""
    import fcntl

    deadline = time.monotonic() + timeout
    with open(out / ".run.lock") as f:
        while time.monotonic() < deadline:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                time.sleep(0.2)
    return False


def test_sigterm_saves_a_checkpoint_and_resume_continues_exactly(tmp_path):
    """A second train.py into the folder of a live run is refused at once (exit 2), naming the first's PID and
    start time. SIGTERM (a scheduler's preemption) mid-run: the step in flight ends, a complete checkpoint of it
    is written (no periodic save would have: save_steps=100), one line says so, exit 143; resume=last then
    continues, and every step's metrics equal those of an uninterrupted run."""
    split, whole = tmp_path / "split", tmp_path / "whole"
    args = [*TINY, "save_steps=100"]
    with open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "train.py"), *args, "max_steps=200", f"output_dir={split}"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        wait_for_step(split, 1, proc)
        holder = lock_holder(split)
        assert holder["pid"] == proc.pid
        start = time.monotonic()
        second = run([*TINY, "max_steps=2", f"output_dir={split}"], check=False)
        assert second.returncode == 2, second.stderr[-3000:]
        line = second.stderr.strip().splitlines()[-1]
        assert line.startswith(f"error: output_dir {split} is in use by another run (pid {proc.pid} on host ")
        assert holder["started"] in line and "Traceback" not in second.stderr
        assert time.monotonic() - start < 120  # before any model loads (~10 s of imports)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 143
    finally:
        proc.kill()
    stderr = (tmp_path / "stderr").read_text()
    stopped = [r for r in read_jsonl(split / "metrics.jsonl") if "loss" in r][-1]["step"]
    assert f"stopped by SIGTERM after step {stopped}: {split / f'checkpoint-{stopped}'} is complete" in stderr
    assert stderr.count("SIGTERM received") == 1 and "Traceback" not in stderr
    assert [p.name for p in complete_checkpoints(split)] == [f"checkpoint-{stopped}"] and stopped < 200
    assert f"stopped by SIGTERM after step {stopped}" in (split / "train.log").read_text()
    run([*args, f"max_steps={stopped + 2}", "resume=last", f"output_dir={split}"])
    run([*args, f"max_steps={stopped + 2}", f"output_dir={whole}"])
    a, b = metrics(whole), metrics(split)
    assert [r["step"] for r in b] == [r["step"] for r in a] == list(range(1, stopped + 3))
    for before, after in zip(a, b):
        for key in ("loss", "reward", "grad_norm"):
            assert before[key] == pytest.approx(after[key], rel=1e-5, abs=1e-7)


def test_two_processes_hold_one_lock_and_stop_on_sigterm(tmp_path):
    """`accelerate launch --num_processes 2`: the main worker holds the folder's lock (a second run is refused,
    naming it); SIGTERM to the launcher (as a scheduler sends it) reaches the workers (the torch.distributed agent
    forwards it), which agree to stop at the same step and write a complete checkpoint of it."""
    launcher = two_processes()
    proc = subprocess.Popen(
        [*launcher, str(ROOT / "train.py"), *TINY, "max_steps=100000", "save_steps=100000", f"output_dir={tmp_path}"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for_step(tmp_path, 1, proc)
        holder = lock_holder(tmp_path)
        agents = children(proc.pid)
        assert holder["pid"] in children(agents[0])  # a worker, not the launcher
        second = run([*TINY, "max_steps=2", f"output_dir={tmp_path}"], check=False)
        assert second.returncode == 2 and f"in use by another run (pid {holder['pid']} on host " in second.stderr
        os.kill(proc.pid, signal.SIGTERM)
        assert unlocked(tmp_path), "the workers did not stop"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    log = (tmp_path / "train.log").read_text()
    (checkpoint,) = complete_checkpoints(tmp_path)
    step = json.loads((checkpoint / "trainer_state.json").read_text())["global_step"]
    assert f"stopped by SIGTERM after step {step}: {checkpoint} is complete" in log and 1 <= step < 100000
    assert max(r["step"] for r in metrics(tmp_path)) == step


@pytest.mark.parametrize("entry", ["train.py", pytest.param("module", marks=pytest.mark.slow)])
def test_two_processes(tmp_path, entry):
    """`accelerate launch --num_processes 2` on a CPU-only machine: two gloo processes, not one; through train.py
    and through the package's command (`accelerate launch -m gkv_train.cli train`, relaunched as a module)."""
    launcher = two_processes()
    args = [*TINY, "max_steps=1", f"output_dir={tmp_path}"]
    if entry == "train.py":
        run(args, launcher=launcher)
    else:
        command = [*launcher, "-m", "gkv_train.cli", "train", *args]
        proc = subprocess.run(command, check=False, cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
    (step,) = metrics(tmp_path)
    assert step["processes"] == 2 and step["mismatch/max_abs"] <= 1e-4 and step["prompts/distinct"] == 2


@pytest.mark.parametrize("recipe", ["rl_sparse", pytest.param("distill_onpolicy", marks=pytest.mark.slow)])
def test_bf16_end_to_end(tmp_path, recipe):
    """precision=bf16: rollout and trainer forwards under bf16 autocast (so their mismatch is bf16's, above fp32's
    1e-6 but small), the trained weights kept in fp32: at a learning rate of 1e-6 a bf16 weight could not move."""
    import torch
    from safetensors.torch import load_file

    from gkv_train.models import load_model

    args = [a for a in TINY if not a.startswith("learning_rate=")]
    # precision comes from the launcher when the command names none (accelerate passes its mixed_precision on)
    learning_signal = (
        ["rewards=[verifier_probe.completion_length]"] if recipe == "rl_sparse" else []
    )  # weights must move
    proc = run(
        [*args, f"recipe={recipe}", "learning_rate=1e-6", "max_steps=2", f"output_dir={tmp_path}", *learning_signal],
        env={
            "ACCELERATE_MIXED_PRECISION": "bf16",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
        },
    )
    assert "precision=bf16: accelerate launches with mixed_precision=bf16" in proc.stderr
    assert "precision: bf16" in (tmp_path / "hydra" / "config.yaml").read_text()
    steps = metrics(tmp_path)
    assert all(1e-5 < s["mismatch/mean_abs"] < 1e-2 and s["mismatch/max_abs"] < 0.1 for s in steps)
    if recipe == "rl_sparse":  # rl.rollout_is=auto: on in bf16 (off in fp32: test_train_writes_logs_...)
        assert all(abs(s["sampling/rollout_is_weight/mean"] - 1) < 0.05 for s in steps)
    trained, initial = load_file(tmp_path / "model.safetensors"), load_model("tiny")[0].state_dict()
    assert all(trained[name].dtype == torch.float32 for name in trained)
    moved = max((trained[name] - initial[name]).abs().max().item() for name in trained)
    assert 0 < moved < 1e-4  # Adam moves a weight by about the learning rate per step


@pytest.mark.parametrize("stage", ["zero2", pytest.param("zero3", marks=pytest.mark.slow)])
def test_deepspeed(tmp_path, stage):
    """The DeepSpeed recipes through `accelerate launch`, 2 CPU processes (gloo): each trains on its own prompts,
    checkpoints load; ZeRO-2 as the README writes it (the recipe's mixed_precision bf16, no precision key: the run
    takes bf16 from the launcher, its mismatch bf16's), ZeRO-3 with --mixed_precision no (fp32-exact), where the
    rollout engine decodes with the gathered weights (the final evaluation, on the main process alone, deadlocked
    without) and the run resumes."""
    from transformers import AutoModelForCausalLM

    launcher = two_processes(
        "--config_file",
        str(ROOT / "recipes" / "accelerate" / f"{stage}.yaml"),
        *(["--mixed_precision", "no"] if stage == "zero3" else []),
    )
    proc = run([*TINY, "max_steps=2", f"output_dir={tmp_path}"], launcher=launcher)
    steps = metrics(tmp_path)
    assert [s["processes"] for s in steps] == [2, 2]
    assert all(s["prompts/distinct"] == 2 for s in steps)  # prompts_per_step=2: one per process, not the same
    if stage == "zero3":
        assert max(s["mismatch/max_abs"] for s in steps) <= 1e-4
    else:
        assert "precision=bf16: accelerate launches with mixed_precision=bf16" in proc.stderr
        assert "precision: bf16" in (tmp_path / "hydra" / "config.yaml").read_text()
        assert 1e-5 < max(s["mismatch/max_abs"] for s in steps) < 0.1  # bf16 rounding, far below the controls
    assert (tmp_path / "checkpoint-2" / "global_step2").is_dir()  # DeepSpeed's own optimizer shards
    AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoint-2")
    assert json.loads((tmp_path / "eval.json").read_text())["steps"] == 2
    if stage == "zero3":
        resumed = run([*TINY, "max_steps=3", "resume=last", f"output_dir={tmp_path}"], launcher=launcher)
        assert resumed.stderr.count("resuming from") == 1  # said by the main process only
        assert [s["step"] for s in metrics(tmp_path)] == [1, 2, 3]


@pytest.mark.parametrize("precision", ["precision=fp32"])
def test_precision_against_the_launcher_is_refused(tmp_path, precision):
    """A command whose precision contradicts accelerate's mixed precision stops before any work, naming both."""
    proc = run([*TINY, precision, f"output_dir={tmp_path}"], check=False, env={"ACCELERATE_MIXED_PRECISION": "bf16"})
    assert (
        proc.returncode == 2 and f"error: {precision}, but accelerate launches with mixed_precision=bf16" in proc.stderr
    )
    assert not any(tmp_path.iterdir())


def children(pid):
    """Process ids whose parent is ``pid`` (zombies excluded)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def alive(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_killed_agent_takes_its_workers(tmp_path):
    """`accelerate launch --num_processes 2`: when the torch.distributed agent dies, both workers stop at once
    instead of training on."""
    launcher = two_processes()
    proc = subprocess.Popen(
        [*launcher, str(ROOT / "train.py"), *TINY, "max_steps=50", f"output_dir={tmp_path}"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline, workers = time.monotonic() + 300, []
        while time.monotonic() < deadline:
            agents = children(proc.pid)
            workers = children(agents[0]) if agents else []
            started = [w for w in workers if "libtorch" in Path(f"/proc/{w}/maps").read_text(errors="ignore")]
            if len(workers) == 2 and len(started) == 2:  # past start-up: torch loaded
                break
            time.sleep(0.5)
        assert len(workers) == 2, "the two workers did not start"
        os.kill(agents[0], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while any(alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not any(alive(w) for w in workers)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def refusal(proc) -> str:
    """The one line of a run refused before any work: exit code 2, ``error: ...`` last on stderr, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr and "Error executing job" not in proc.stderr, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: "), proc.stderr[-3000:]
    return line


BAD_CONFIGS = [
    ("compression.method=quest", "unknown compression method 'quest'"),
    ("loss_type=ppo", "unknown loss_type 'ppo'"),
    ("data.path=/nonexistent.jsonl", "dataset file /nonexistent.jsonl does not exist"),
    ("data.path={tmp}/folder.jsonl", "dataset file {tmp}/folder.jsonl is a folder, not a file"),
    ("data.path={tmp}/long.jsonl", "the training rollouts: the prompt of problem 1 (5035 tokens) plus 24 new"),
    ("model=/no/such/model", "model path /no/such/model does not exist"),
    ("report_to=[neptune_x]", "unknown tracker 'neptune_x' in report_to"),
    ("max_steps=abc", "max_steps='abc': expected an integer"),
    ("gradient_accumulation_steps=0", "gradient_accumulation_steps must be at least 1, got 0"),
    ("lora.enabled=true lora.r=0", "lora.r must be a finite number >= 1, got 0"),
    ("data.limit=0", "data.limit must be at least 1, or null for every problem; got 0"),
    ("data.levels=[0] data.limit=3000", "so the train split can give at most"),
    ("max_completion_length=1000000000", "max_completion_length=1000000000 does not fit"),
    ("recipe=rl_full compression.method=s4r", "recipe=rl_full trains on full-cache rollouts, but compression"),
    ("output_dir={tmp}/a_file", "output_dir={tmp}/a_file is a file, not a folder"),
    ("rewards=[no.such.reward]", "cannot import reward function 'no.such.reward'"),
    ("data.prompt_template='Q:{foo}'", "data.prompt_template='Q:{foo}' has the field(s) {foo}: its one field"),
    ("eval_data.prompt_template='Q:'", "eval_data.prompt_template='Q:' has no {problem} field"),
    ("eval_data.limit=0", "eval_data.limit must be at least 1, or null for every problem; got 0"),
    ("resume={tmp}/nowhere", "resume={tmp}/nowhere: not a complete checkpoint directory"),  # and no folder left
    ("data.name=niah_single data.context=1000000000", "data.context=1000000000 exceeds"),  # before the prompts
    ("compression.method=gkv_rollout.methods:EvictionMethod", "does not implement score"),
    ("recipe=distill data.name=long_recall", "data.name=long_recall with algorithm=distill: its completions begin"),
    ("eval_data.name=long_recall eval_steps=1", "eval_data.name=long_recall with eval_steps"),
    ("eval_data.name=long_recall eval_data.sentences=2", "the held-out evaluation: the given beginning of problem 0"),
    ("data.copy_required=places", "data.copy_required='places' applies to data.name=copy_recall only"),
    ("data.context=2048", "data.context=2048 applies to data.name=niah_single / niah_multikey"),
]


@pytest.fixture(scope="module")
def bad_config_runs(tmp_path_factory, weightless_model):
    """train.py run once per BAD_CONFIGS entry (one interpreter for all: ``entry_points.run_each``): per override,
    its result and its output folder."""
    tmp = tmp_path_factory.mktemp("bad_configs")
    (tmp / "folder.jsonl").mkdir()
    (tmp / "a_file").write_text("")
    long = [{"question": "1 + 1", "answer": "2"}, {"question": "x" * 5000, "answer": "1"}]
    (tmp / "long.jsonl").write_text("".join(json.dumps(r) + "\n" for r in long))
    argvs, outs = [], []
    for i, (override, _) in enumerate(BAD_CONFIGS):
        outs.append(tmp / f"out{i}")
        argvs.append(
            [
                f"model={weightless_model}",
                f"output_dir={outs[-1]}",
                "max_steps=1",
                "max_completion_length=24",
                *override.replace("{tmp}", str(tmp)).split(),
                *(["data.name=null"] if "data.path" in override else []),
            ]
        )
    results = run_each(ROOT / "train.py", argvs, cwd=ROOT)
    return tmp, {override: (result, out) for (override, _), result, out in zip(BAD_CONFIGS, results, outs)}


@pytest.mark.xdist_group("bad_config_runs")  # one worker runs the shared refusals
@pytest.mark.parametrize("override, message", BAD_CONFIGS)
def test_bad_config_fails_clearly(bad_config_runs, override, message):
    """Every check before work (the schema, values, combinations, data, model, limits, paths) through train.py: one
    line ``error: ...``, exit code 2, no output folder (Hydra's included), and before the model loads (a model
    without weights: loading it would fail otherwise). The other messages are tested in-process (test_config.py,
    test_data.py, test_models.py)."""
    tmp, runs = bad_config_runs
    result, out = runs[override]
    line = refusal(result)
    assert message.replace("{tmp}", str(tmp)) in line
    assert result.seconds < 180  # no model load, no network retries (the first case pays the imports)
    assert not out.exists() and not (ROOT / "outputs" / "rl_sparse" / "weightless_arithmetic").exists()


def test_traces_output_is_checked_before_generation(tmp_path, weightless_model):
    """A folder given as the traces file is refused before the teacher loads (not once generation is done, losing
    it)."""
    command = [
        sys.executable,
        str(ROOT / "scripts" / "generate_traces.py"),
        f"model={weightless_model}",
        "data.limit=2",
        f"output={tmp_path}",
    ]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert f"output={tmp_path} is a folder, not a file" in refusal(proc)
    # long_recall's completions begin with a given story: teacher traces would pass it off as the teacher's
    given = [*command[:-1], "data.name=long_recall", "data.sentences=2", f"output={tmp_path / 'traces.jsonl'}"]
    proc = subprocess.run(given, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert (
        "data: the problems have a 'continuation' column" in refusal(proc) and not (tmp_path / "traces.jsonl").exists()
    )


def traces_command(*args):
    return [sys.executable, str(ROOT / "scripts" / "generate_traces.py"), *args]


def test_traces_check_errors_are_counted_named_and_marked(tmp_path):
    """generate_traces.py with the real worker: a check whose worker dies twice is no wrong answer: it is counted
    (verifier_errors in the JSON line), named on stderr and marked in the traces (check_error); without
    keep_incorrect it is left out, and said so. The other checks keep their verdicts (control)."""
    golds, answers = ["5", "7", "9"], ["5", "die", "8"]
    data = write_problems(tmp_path / "golds.jsonl", golds)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    for keep in (True, False):
        out = tmp_path / f"traces-{keep}.jsonl"
        script = str(ROOT / "scripts" / "generate_traces.py")
        code = SCRIPT_WITH_ANSWERS.format(
            tests=str(ROOT / "tests"), script=script, answers=answers, check="verifier_probe:answers_or_die"
        )
        args = [
            "model=tiny",
            "data.name=null",
            f"data.path={data}",
            "num_generations=1",
            "max_completion_length=4",
            f"keep_incorrect={str(keep).lower()}",
            f"output={out}",
        ]
        proc = subprocess.run(
            [sys.executable, "-c", code, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = strict_json(proc.stdout.strip().splitlines()[-1])
        assert result["verifier_errors"] == 1 and result["verifier_retries"] == 1 and result["correct"] == 1
        rows = read_jsonl(out)
        if keep:
            assert [(r["answer"], r["correct"], r["check_error"]) for r in rows] == [
                ("5", True, False),
                ("7", False, True),
                ("9", False, False),
            ]
            assert (
                "teacher traces: 1 answer checks have no verdict (their worker died twice; scored 0, check_error in"
                " the traces)" in proc.stderr
            )
        else:
            assert [r["answer"] for r in rows] == ["5"]
            assert (
                "teacher traces: 1 answer checks have no verdict" in proc.stderr
                and "left out of the traces" in proc.stderr
            )
        assert "the answer-check worker died again: no verdict, counted as an error (gold '7'" in proc.stderr


def test_a_traces_file_in_use_is_refused(tmp_path, weightless_model):
    """One generate_traces.py call per output file: a second one writing the file a live process holds is refused
    at once, naming the holder (not written over); another file of the same folder stays free (control)."""
    target = tmp_path / "traces.jsonl"
    with RunLock.acquire_file(target, "output"):
        proc = subprocess.run(
            traces_command(f"model={weightless_model}", "data.limit=2", f"output={target}"),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        line = refusal(proc)
        assert f"output {target} is in use by another run (pid {os.getpid()} on host " in line
        RunLock.acquire_file(tmp_path / "other.jsonl", "output").release()
    assert not target.exists()


# generate_traces.py run as __main__ with the write of the traces' temporary file failing on a full disk half-way
# (the disk's free space reported as 999 bytes).
FULL_AT_TRACES = (
    sys.executable,
    "-c",
    """
import collections, errno, pathlib, runpy, shutil, sys
write_text = pathlib.Path.write_text
def failing(self, text, *args, **kwargs):
    if self.name.startswith(".traces.jsonl.tmp"):
        write_text(self, text[: len(text) // 2])
        shutil.disk_usage = lambda path: collections.namedtuple("usage", "total used free")(10**9, 10**9, 999)
        raise OSError(errno.ENOSPC, "No space left on device", str(self))
    return write_text(self, text, *args, **kwargs)
pathlib.Path.write_text = failing
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
""",
)


def test_a_full_disk_keeps_the_earlier_traces_and_leaves_no_temporary_file(tmp_path):
    """A traces file is replaced through a temporary file and a rename: when the write fails on a full disk, the
    earlier file stays whole, the partial temporary file is removed (it would hold the disk), and the
    error names the disk, its free space and what the traces need."""
    target = tmp_path / "traces.jsonl"
    target.write_text('{"id": 0, "prompt": "p", "completion": "c", "completion_ids": [5, 2]}\n')
    earlier = target.read_text()
    command = traces_command(
        "model=tiny",
        "data.limit=2",
        "num_generations=1",
        "max_completion_length=4",
        "keep_incorrect=true",
        f"output={target}",
        "overwrite=true",
    )
    proc = subprocess.run([*FULL_AT_TRACES, *command[1:]], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: No space left on device while writing the traces file to {target}: ")
    assert f"{filesystem(tmp_path)} has 999 B free; the traces file needs about " in line
    assert "Traceback" not in proc.stderr
    assert target.read_text() == earlier
    assert sorted(p.name for p in tmp_path.iterdir()) == [".traces.jsonl.lock", "traces.jsonl"]
