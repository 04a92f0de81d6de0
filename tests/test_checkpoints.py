"""Training outputs without a trainer: complete checkpoints, metrics after a resume, output folders, strict JSON."""

import json
import logging
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from gkv_rollout.config import CompressionConfig
from gkv_train.config.options import DistillOptions, LoraOptions
from gkv_train.config.train_config import DistillTrainConfig, GRPOTrainConfig
from gkv_train.jsonio import dumps, read_jsonl
from gkv_train.manifest import damage, write_manifest
from gkv_train.runs.checkpoints import (
    clear_run,
    complete_checkpoints,
    resume_settings,
    run_artefacts,
    truncate_metrics,
)
from gkv_train.runs.output_dir import finished_whole, prepare_output_dir, resume_checkpoint
from gkv_train.training.launch import run_folder

STATE = SimpleNamespace(is_main_process=True, wait_for_everyone=lambda: None)


def resume(config: GRPOTrainConfig, args) -> str | None:
    """``resume_checkpoint`` as the launcher calls it: the run folder's part of ``config``, the trainer's arguments
    (the launcher's: ``config`` itself; None: none to compare), its model and LoRA."""
    return resume_checkpoint(run_folder(config), args, config.model, config.lora.settings())


def prepare(config: GRPOTrainConfig, checkpoint: str | None) -> None:
    """``prepare_output_dir`` as the launcher calls it (one process)."""
    prepare_output_dir(run_folder(config), STATE, checkpoint)


def checkpoint(root, step, complete=True):
    """A checkpoint's folder: weights, and (``complete``) the trainer state and an (empty) optimizer and scheduler
    state."""
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    save_file({"w": torch.zeros(2)}, path / "model.safetensors")
    if complete:
        (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        for name in ("optimizer.pt", "scheduler.pt"):
            torch.save({}, path / name)
    return path


def test_newest_complete_checkpoint_is_resumed(tmp_path):
    """A checkpoint-N without its trainer state (written half by an older version, or by hand) is never taken."""
    checkpoint(tmp_path, 1)
    second = checkpoint(tmp_path, 2)
    checkpoint(tmp_path, 10, complete=False)
    assert complete_checkpoints(tmp_path) == [tmp_path / "checkpoint-1", second]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 0.1}) + "\n" for s in (1, 2, 3)))
    config = GRPOTrainConfig(model="tiny", output_dir=str(tmp_path), resume="last")
    assert resume(config, None) == str(second)
    prepare(config, str(second))
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2]  # step 3 is logged again


def saved(root, step, args, model="smollm2-135m"):
    """A checkpoint with its manifest, as training writes it."""
    path = checkpoint(root, step)
    (path / "optimizer.pt").write_bytes(b"x" * 100)
    write_manifest(path, [f for f in path.iterdir() if f.is_file()], resume_settings(args, model))
    return path


def test_damaged_checkpoints_are_found_by_their_manifest(tmp_path, capsys):
    """A checkpoint whose files no longer match its manifest (truncated, overwritten, missing): resume=last takes the
    one before and says so; resume=<it> and its damage are named; a whole one resumes."""
    config = GRPOTrainConfig(model="smollm2-135m", output_dir=str(tmp_path), resume="last")
    args = config
    first, second = saved(tmp_path, 1, args), saved(tmp_path, 2, args)
    assert damage(second) is None and resume(config, args) == str(second)
    (second / "optimizer.pt").write_bytes(b"x" * 10)  # truncated
    assert "optimizer.pt has 10 bytes, 100 when it was saved" in damage(second)
    assert resume(config, args) == str(first)
    assert "checkpoint-2 is damaged" in capsys.readouterr().err
    (first / "trainer_state.json").write_text(json.dumps({"global_step": 9}))  # same size, other content
    assert "differs from what was saved" in damage(first)
    (first / "manifest.json").write_text("{garbage")
    assert f"{first / 'manifest.json'} is damaged" in damage(first)
    (first / "manifest.json").unlink()  # an earlier version's checkpoint: its trainer state must read
    (first / "trainer_state.json").write_text("{garbage")
    assert f"{first / 'trainer_state.json'} is damaged" in damage(first)
    with pytest.raises(ValueError, match="checkpoint-2: the checkpoint is damaged .*optimizer.pt"):
        resume(GRPOTrainConfig(model="smollm2-135m", output_dir=str(tmp_path), resume=str(second)), args)


def test_a_run_without_a_whole_checkpoint_is_never_replaced_by_resume_last(tmp_path):
    """resume=last with every checkpoint damaged, or none left beside a final model or evaluation, is refused naming
    each checkpoint's damage and overwrite=true (starting from scratch would replace them); a folder with only what a
    run stopped before its first checkpoint leaves (metrics, staging) starts from scratch."""
    config = GRPOTrainConfig(model="smollm2-135m", output_dir=str(tmp_path), resume="last")
    args = config
    first, second = saved(tmp_path, 1, args), saved(tmp_path, 2, args)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    (first / "optimizer.pt").write_bytes(b"x" * 10)
    (second / "trainer_state.json").write_text("{garbage")
    with pytest.raises(ValueError) as refused:
        resume(config, args)
    message = str(refused.value)
    assert "checkpoint-1: " in message and "optimizer.pt has 10 bytes" in message
    assert "checkpoint-2: " in message and "trainer_state.json" in message and "overwrite=true" in message
    clear_run(tmp_path)
    (tmp_path / "eval.json").write_text("{}")
    (tmp_path / "model.safetensors").write_text("weights")
    with pytest.raises(ValueError, match=r"no checkpoint\), and it holds a run's results \(eval.json, model.safe"):
        resume(config, args)
    clear_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / ".staging" / "checkpoint-1").mkdir(parents=True)
    assert resume(config, args) is None  # stopped before its first checkpoint: from scratch


def test_a_checkpoint_without_its_manifest_is_checked_by_its_contents(tmp_path):
    """Without a manifest (copied without it, or an earlier version's) a checkpoint is checked by what it holds:
    weights against their safetensors header, torch's archives against their CRCs, and the settings its optimizer
    state was made with against this run's (another run's checkpoint at 2e-06 resumed under learning_rate=1e-3 is
    refused). A manifest that lists no weights, or an entry without its size and hash, is damaged."""
    config = GRPOTrainConfig(model="smollm2-135m", output_dir=str(tmp_path), resume="last")
    args = config
    path = checkpoint(tmp_path, 1)
    weights = torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.AdamW([weights], lr=2e-6, eps=1e-8, weight_decay=0.0)
    torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)  # sets initial_lr, as the trainer's does
    torch.save(optimizer.state_dict(), path / "optimizer.pt")
    assert damage(path) is None and resume(config, args) == str(path)
    faster = GRPOTrainConfig(model="smollm2-135m", output_dir=str(tmp_path), resume="last", learning_rate=1e-3)
    with pytest.raises(ValueError, match=r"learning_rate=2e-06 there, 0.001 here"):
        resume(faster, faster)
    saved_weights = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(saved_weights[:-3])
    assert "model.safetensors has" in damage(path) and "as its header describes it" in damage(path)
    (path / "model.safetensors").write_bytes(saved_weights)
    archive = bytearray((path / "optimizer.pt").read_bytes())
    (path / "optimizer.pt").write_bytes(bytes(archive[: len(archive) // 2]))
    assert f"{path / 'optimizer.pt'} is damaged" in damage(path)
    (path / "model.safetensors").unlink()
    (path / "optimizer.pt").write_bytes(bytes(archive))
    assert "holds no weights" in damage(path)

    save_file({"w": torch.zeros(2)}, path / "model.safetensors")
    for files, message in [({"optimizer.pt": 5}, "entry 'optimizer.pt' is not a file"), ({}, "lists no weights")]:
        (path / "manifest.json").write_text(json.dumps({"files": files}))
        assert "manifest.json is damaged" in damage(path) and message in damage(path)
    entry = {"bytes": 1, "sha256": "0"}
    (path / "manifest.json").write_text(json.dumps({"files": {"../../etc/passwd": entry, "model.safetensors": entry}}))
    assert "'../../etc/passwd' is not a file of the folder" in damage(path)


def test_a_resume_keeps_its_checkpoints_settings_or_is_refused(tmp_path):
    """A resumed run keeps the checkpoint's optimizer and scheduler, so another learning rate, base model or LoRA is
    refused, naming both values; another run's checkpoint only with resume_other_run=true."""
    other = tmp_path / "other"
    config = GRPOTrainConfig(model="smollm2-135m", output_dir=str(other), resume="last")
    saved(other, 1, config)
    here = dict(model="smollm2-135m", output_dir=str(tmp_path / "new"), resume=str(other / "checkpoint-1"))
    with pytest.raises(ValueError, match="checkpoint of another run .*resume_other_run=true"):
        resume(GRPOTrainConfig(**here), None)
    allowed = GRPOTrainConfig(**here, resume_other_run=True)
    assert resume(allowed, allowed) == str(other / "checkpoint-1")
    faster = GRPOTrainConfig(**here, resume_other_run=True, learning_rate=1e-3)
    with pytest.raises(ValueError, match=r"learning_rate=2e-06 there, 0.001 here"):
        resume(faster, faster)
    snapkv = GRPOTrainConfig(**here, resume_other_run=True, compression=CompressionConfig("snapkv", budget=64))
    with pytest.raises(ValueError, match=r"compression.method='gkv' there, 'snapkv' here, compression.window="):
        resume(snapkv, snapkv)
    own = CompressionConfig("gkv", budget=64, window=8, interval=16, options={"alpha": 0.5})
    alpha = GRPOTrainConfig(**here, resume_other_run=True, compression=own)
    with pytest.raises(ValueError, match=r"other settings \(compression.alpha=0.8 there, 0.5 here\)"):
        resume(alpha, alpha)  # a method's own option by the key that sets it
    lora = GRPOTrainConfig(**here, resume_other_run=True, lora=LoraOptions(enabled=True))
    with pytest.raises(ValueError, match="lora=None there"):
        resume(lora, lora)
    with pytest.raises(ValueError, match="resume_other_run=true applies to"):
        GRPOTrainConfig(model="tiny", resume="last", resume_other_run=True)


def test_used_output_folder_is_refused_or_overwritten(tmp_path):
    checkpoint(tmp_path, 1)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="holds another run .*pass resume=last .*overwrite=true"):
        prepare(GRPOTrainConfig(model="tiny", output_dir=str(tmp_path)), None)
    prepare(GRPOTrainConfig(model="tiny", output_dir=str(tmp_path), overwrite=True), None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    with pytest.raises(ValueError, match="contradict"):
        GRPOTrainConfig(overwrite=True, resume="last")


def test_metrics_truncation_drops_damaged_lines(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 2}\n')
    with caplog.at_level(logging.WARNING):
        truncate_metrics(path, 5)
    assert f"{path}:2" in caplog.text
    assert read_jsonl(path) == [{"step": 1}, {"step": 2}]
    clear_run(tmp_path)
    assert not path.exists()


def test_json_outputs_are_strict():
    text = dumps({"a": float("nan"), "b": [float("inf"), 1.5], "c": {"d": -float("inf")}})
    assert json.loads(text, parse_constant=lambda name: pytest.fail(name)) == {
        "a": None,
        "b": [None, 1.5],
        "c": {"d": None},
    }


def test_given_traces_file_in_the_output_folder_is_an_input(tmp_path):
    traces = tmp_path / "traces.jsonl"
    traces.write_text('{"prompt": "p", "completion_ids": [3]}\n')
    config = DistillTrainConfig(
        model="tiny", output_dir=str(tmp_path), distill=DistillOptions(traces=str(traces)), overwrite=True
    )
    prepare(
        DistillTrainConfig(model="tiny", output_dir=str(tmp_path), distill=DistillOptions(traces=str(traces))), None
    )
    prepare(config, None)
    assert traces.is_file()
    with pytest.raises(FileExistsError, match=r"\(traces.jsonl\)"):  # generated by an earlier run: not ours
        prepare(GRPOTrainConfig(model="tiny", output_dir=str(tmp_path)), None)


def test_run_lock_names_a_live_holder_and_outlives_no_process(tmp_path):
    """One holder at a time, named in the refusal; a holder killed with SIGKILL leaves its note in the file, but
    the kernel has dropped its lock: the next run takes the folder."""
    import os
    import signal
    import subprocess
    import sys

    from gkv_train.exits import RunLocked
    from gkv_train.runs.runlock import RunLock

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from gkv_train.runs.runlock import RunLock; "
            f"RunLock.acquire({str(tmp_path)!r}); print('locked', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(
            RunLocked,
            match=rf"output_dir {tmp_path} is in use by another run \(pid {holder.pid} on "
            r"host .*, started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d .*: .*python -c",
        ):
            RunLock.acquire(tmp_path, "output_dir")
        note = (tmp_path / ".run.lock").read_bytes()
        with pytest.raises(RunLocked, match=rf"output_dir {tmp_path} is in use by another run \(pid {holder.pid} "):
            RunLock.check_free(tmp_path, "output_dir")  # the probe of a job's first checks: it writes nothing
        assert (tmp_path / ".run.lock").read_bytes() == note
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    assert f'"pid": {holder.pid}' in (tmp_path / ".run.lock").read_text()  # the dead holder's note stays
    RunLock.check_free(tmp_path, "output_dir")  # free once its holder is gone
    RunLock.check_free(tmp_path / "nowhere", "output_dir")  # no lock file: free, and none made
    assert not (tmp_path / "nowhere").exists()
    with RunLock.acquire(tmp_path, "output_dir"):
        assert f'"pid": {os.getpid()}' in (tmp_path / ".run.lock").read_text()
        with pytest.raises(RunLocked):  # the same process cannot take it twice either
            RunLock.acquire(tmp_path, "output_dir")
    RunLock.acquire(tmp_path).release()  # released with the block
    assert run_artefacts(tmp_path) == []  # the lock file is not a run's output


def test_full_disk_errors_name_the_disk(tmp_path):
    import errno

    from gkv_train.storage import DiskFull, filesystem, naming_full_disk

    with pytest.raises(DiskFull) as err:
        with naming_full_disk(tmp_path / "metrics.jsonl", "the metrics log", needed=3 * 10**9):
            raise OSError(errno.ENOSPC, "No space left on device")
    message = str(err.value)
    path = tmp_path / "metrics.jsonl"
    assert message.startswith(f"No space left on device while writing the metrics log to {path}: ")
    assert f"{filesystem(tmp_path)} has " in message and " free; the metrics log needs about 3.0 GB" in message
    assert err.value.errno == errno.ENOSPC and "(" in filesystem(tmp_path)  # mount point (type, source)
    with pytest.raises(DiskFull, match=f"File too large while writing the metrics log to {path}: .*ulimit -f"):
        with naming_full_disk(path, "the metrics log"):  # a file-size limit: EFBIG, not ENOSPC
            raise OSError(errno.EFBIG, "File too large")
    with pytest.raises(PermissionError):  # other errors pass unchanged
        with naming_full_disk(tmp_path, "x"):
            raise PermissionError(errno.EACCES, "denied")


def test_a_signal_stops_training_at_the_step_boundary_and_elsewhere_at_once():
    """SIGINT (Ctrl-C) and SIGTERM: inside the training loop the handler only notes the signal and the step's end
    asks the trainer to save and stop (exit code 130 / 143 with the checkpoint named); outside it the signal stops
    at once; the previous handlers come back afterwards. (Through train.py, with resume: test_train.py.)"""
    import os
    import signal
    import time

    from transformers import TrainerControl

    from gkv_train.exits import Preempted
    from gkv_train.runs.checkpoints import StopOnSignal

    before = signal.getsignal(signal.SIGINT)
    with StopOnSignal() as stop:
        stop.on_train_begin(None, None, None)
        control = TrainerControl()
        stop.on_step_end(SimpleNamespace(device="cpu"), SimpleNamespace(global_step=3), control)
        assert not (control.should_save or control.should_training_stop)  # control: no signal, no stop
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)  # the handler runs in the main thread between bytecodes
        os.kill(os.getpid(), signal.SIGTERM)  # a second signal while stopping: ignored
        time.sleep(0.1)
        stop.on_step_end(SimpleNamespace(device="cpu"), SimpleNamespace(global_step=4), control)
        assert control.should_save and control.should_training_stop and stop.stopped_at == 4
        stop.on_train_end(None, None, None)
        preempted = stop.preempted("out", 4, "cpu")
        assert preempted.code == 130 and str(preempted) == (
            "stopped by SIGINT after step 4: out/checkpoint-4 is complete; resume=last continues from it"
        )
    assert signal.getsignal(signal.SIGINT) is before
    with pytest.raises(Preempted) as err, StopOnSignal():  # outside the loop (loading, final evaluation): at once
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    assert err.value.code == 143 and "stopped by SIGTERM outside training" in str(err.value)


def test_a_resume_needs_the_checkpoints_optimizer_state_or_says_it_starts_afresh(tmp_path):
    """A checkpoint without its optimizer and scheduler state (save_only_model=true) is refused, naming both files
    and resume_model_only=true, which accepts it (and is refused where the state is there, or without a resume);
    DeepSpeed's checkpoint keeps both in its global_step folder (control); a file the manifest does not list is
    damage, named."""
    from gkv_train.manifest import missing_training_state

    config = GRPOTrainConfig(model="tiny", output_dir=str(tmp_path), resume="last")
    path = checkpoint(tmp_path, 1)
    (path / "optimizer.pt").unlink()
    (path / "scheduler.pt").unlink()
    with pytest.raises(ValueError, match=r"holds no optimizer or scheduler state \(optimizer.pt, scheduler.pt miss"):
        resume(config, None)
    accepted = GRPOTrainConfig(model="tiny", output_dir=str(tmp_path), resume="last", resume_model_only=True)
    assert resume(accepted, None) == str(path)
    (path / "global_step1").mkdir()
    assert missing_training_state(path) == []  # DeepSpeed's engine state
    with pytest.raises(ValueError, match="holds its optimizer and scheduler state, which a resume continues"):
        resume(accepted, None)
    with pytest.raises(ValueError, match="resume_model_only=true applies to resume=last or resume=<checkpoint>"):
        GRPOTrainConfig(model="tiny", resume_model_only=True)
    second = saved(tmp_path, 2, config)
    torch.save({}, second / "rng_state.pth")  # written after the manifest: not what was saved
    assert damage(second) == f"{second / 'rng_state.pth'} is not listed in its manifest (not what was saved: " + (
        "added, or the manifest replaced, after the save)"
    )


def test_a_file_a_resume_never_reads_is_no_damage(tmp_path, capsys):
    """A file a checkpoint's manifest does not list is damage only where a resume reads it (the weights, the trainer,
    optimizer, scheduler and RNG states, ...): a README.md, .DS_Store or an NFS leftover is named in a warning, and
    resume=last keeps the checkpoint instead of dropping back to the one before."""
    config = GRPOTrainConfig(model="smollm2-135m", output_dir=str(tmp_path), resume="last")
    first, second = saved(tmp_path, 1, config), saved(tmp_path, 2, config)
    for name in ("README.md", ".DS_Store", ".nfs0000000001"):
        (second / name).write_text("not saved by the trainer")
    assert damage(second) is None
    assert ".DS_Store, .nfs0000000001, README.md" in capsys.readouterr().err
    assert resume(config, config) == str(second)
    torch.save({}, second / "scaler.pt")  # read by a resume: damage
    assert damage(second).startswith(f"{second / 'scaler.pt'} is not listed in its manifest")
    assert resume(config, config) == str(first)


def test_a_lock_held_for_an_instant_is_tried_again(tmp_path):
    """Another job's probe (``check_free``: the lock taken shared for an instant) does not refuse a run taking the
    lock then, and a run that holds the lock for an instant while it starts (its note not yet written: a stale
    holder's there) does not refuse a probe; a lock held longer is refused, naming its holder."""
    import fcntl
    import os
    import threading

    from gkv_train.exits import RunLocked
    from gkv_train.runs.runlock import LOCK_FILE, RunLock

    (tmp_path / LOCK_FILE).write_text('{"pid": 1, "host": "h", "started": "long ago", "command": "stale"}\n')

    def held_for(kind: int, seconds: float) -> threading.Thread:
        fd = os.open(tmp_path / LOCK_FILE, os.O_RDONLY)
        fcntl.flock(fd, kind)
        thread = threading.Timer(seconds, os.close, [fd])  # closing drops the lock
        thread.start()
        return thread

    probe = held_for(fcntl.LOCK_SH, 0.05)
    RunLock.acquire(tmp_path, "output_dir").release()
    probe.join()
    starting = held_for(fcntl.LOCK_EX, 0.05)
    RunLock.check_free(tmp_path, "output_dir")
    starting.join()
    holder = held_for(fcntl.LOCK_EX, 1)
    with pytest.raises(RunLocked, match="in use by another run"):
        RunLock.check_free(tmp_path, "output_dir")
    holder.join()


def test_a_resume_on_another_task_is_refused_naming_both(tmp_path):
    """``resume=last`` under another ``data.name`` (or ``data.path``) went on training the checkpoint on the new
    task: refused naming the key and both values; the same task resumes, and a checkpoint saved before the task was
    recorded still does (its manifest does not say)."""
    from gkv_train.problems.data import DataConfig

    config = GRPOTrainConfig(model="smollm2-135m", output_dir=str(tmp_path), resume="last")
    first = saved(tmp_path, 1, config)
    assert resume(config, config) == str(first)
    for data, message in (
        (DataConfig(name="copy_recall"), r"\(data.name='arithmetic' there, 'copy_recall' here\)"),
        (DataConfig(path=str(tmp_path / "mine.jsonl")), r"\(data.path=None there, '\S+/mine.jsonl' here\)"),
    ):
        other = GRPOTrainConfig(model="smollm2-135m", output_dir=str(tmp_path), resume="last", data=data)
        with pytest.raises(ValueError, match=message):
            resume(other, other)
    manifest = json.loads((first / "manifest.json").read_text())
    del manifest["settings"]["data"]  # an earlier checkpoint's
    (first / "manifest.json").write_text(json.dumps(manifest))
    other = GRPOTrainConfig(model="smollm2-135m", output_dir=str(tmp_path), resume="last", data=DataConfig("x.jsonl"))
    assert resume(other, other) == str(first)


def test_a_finished_runs_damaged_final_model_is_seen(tmp_path, capsys):
    """A finished run (its evaluation written) whose final weights were cut answered "nothing to do": its final model
    is checked against its manifest (without one, by its contents), and a damaged one is named, so that the run saves
    it again from its last checkpoint; a whole one, or one without its evaluation, is as before."""
    weights = tmp_path / "model.safetensors"
    save_file({"w": torch.zeros(64)}, weights)
    write_manifest(tmp_path, [weights], {})
    assert not finished_whole(tmp_path, True)  # no evaluation: stopped before its final save and evaluation
    (tmp_path / "eval.json").write_text("{}")
    assert finished_whole(tmp_path, True) and capsys.readouterr().err == ""
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[: size // 2])
    assert not finished_whole(tmp_path, False) and capsys.readouterr().err == ""  # another process says nothing
    assert not finished_whole(tmp_path, True)
    assert f"warning: the final model of {tmp_path} is damaged ({weights} has {size // 2} bytes, {size} when it" in (
        capsys.readouterr().err
    )
    (tmp_path / "manifest.json").unlink()  # a run saved before final models had manifests: its contents
    assert not finished_whole(tmp_path, True) and "as its header describes it" in capsys.readouterr().err
