"""Training outputs without a trainer: complete checkpoints, metrics after a resume, output folders, strict JSON."""

import json
import logging
from types import SimpleNamespace

import pytest

from gkv_train.checkpoints import clear_run, complete_checkpoints, truncate_metrics
from gkv_train.config import TrainConfig
from gkv_train.jsonio import dumps, read_jsonl
from gkv_train.launch import prepare_output_dir

STATE = SimpleNamespace(is_main_process=True, wait_for_everyone=lambda: None)


def checkpoint(root, step, complete=True):
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_text("weights")
    if complete:
        (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return path


def test_newest_complete_checkpoint_is_resumed(tmp_path):
    """A checkpoint-N without its trainer state (written half by an older version, or by hand) is never taken."""
    checkpoint(tmp_path, 1)
    second = checkpoint(tmp_path, 2)
    checkpoint(tmp_path, 10, complete=False)
    assert complete_checkpoints(tmp_path) == [tmp_path / "checkpoint-1", second]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 0.1}) + "\n" for s in (1, 2, 3)))
    config = TrainConfig(model="tiny", output_dir=str(tmp_path), resume="last")
    assert prepare_output_dir(config, STATE) == str(second)
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2]  # step 3 is logged again


def test_used_output_folder_is_refused_or_overwritten(tmp_path):
    checkpoint(tmp_path, 1)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="holds another run .*pass resume=last .*overwrite=true"):
        prepare_output_dir(TrainConfig(model="tiny", output_dir=str(tmp_path)), STATE)
    assert prepare_output_dir(TrainConfig(model="tiny", output_dir=str(tmp_path), overwrite=True), STATE) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    with pytest.raises(ValueError, match="contradict"):
        TrainConfig(overwrite=True, resume="last")


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
    assert json.loads(text, parse_constant=lambda name: pytest.fail(name)) == {"a": None, "b": [None, 1.5], "c": {"d": None}}
