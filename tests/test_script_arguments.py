"""The benchmarks' command lines (scripts/_common.py's argument types): a count of 0, a share out of range, a
worker spec that names no worker, a missing input, a results file in a missing folder or an output root that is a
file are refused by argparse before any work (exit 2, one ``error: argument --x`` line), never after it."""

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from gkv_train.argument_types import (  # noqa: E402
    count,
    fraction,
    input_file,
    input_folder,
    natural,
    nonnegative_number,
    output_file,
    output_folder,
    positive_fraction,
    positive_number,
    true_false,
    worker,
)


@pytest.mark.parametrize(
    "kind, good, bad",
    [
        (count, {"1": 1, "32": 32}, {"0": ">= 1", "-3": ">= 1", "abc": "not an integer", "1.5": "not an integer"}),
        (natural, {"0": 0, "7": 7}, {"-1": ">= 0", "x": "not an integer"}),
        (fraction, {"0": 0.0, "1": 1.0, "0.4": 0.4}, {"1.5": r"\[0, 1\]", "nan": r"\[0, 1\]", "-0.1": r"\[0, 1\]"}),
        (positive_fraction, {"1": 1.0, "0.2": 0.2}, {"0": r"\(0, 1\]", "2": r"\(0, 1\]"}),
        (nonnegative_number, {"0": 0.0, "0.6": 0.6}, {"-1": r"\[0, inf\)", "inf": r"\[0, inf\)", "nan": "inf"}),
        (positive_number, {"3e-4": 3e-4}, {"0": r"\(0, inf\)", "abc": "not a number"}),
        (true_false, {"true": True, "false": False}, {"maybe": "true or false", "True": "true or false"}),
        (worker, {"0/1": (0, 1), "1/2": (1, 2)}, {"0/0": "i/n", "1/1": "counted from 0", "abc": "i/n", "-1/2": "i/n"}),
    ],
)
def test_numbers_and_worker_specs(kind, good, bad):
    for text, value in good.items():
        assert kind(text) == value
    for text, message in bad.items():
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            kind(text)


def test_paths(tmp_path):
    a_file = tmp_path / "a.json"
    a_file.write_text("{}")
    assert input_file(str(a_file)) == a_file and input_folder(str(tmp_path)) == tmp_path
    assert output_file(str(tmp_path / "new.json")) == tmp_path / "new.json"
    assert output_folder(str(tmp_path / "new" / "deeper")) == tmp_path / "new" / "deeper"  # created when work starts
    for kind, given, message in [
        (input_file, tmp_path / "none.json", "none.json does not exist"),
        (input_file, tmp_path, "is a folder"),
        (input_folder, a_file, "is a file"),
        (input_folder, tmp_path / "none", "does not exist"),
        (output_file, tmp_path / "no" / "r.json", r"the folder \S+/no does not exist"),
        (output_file, tmp_path, "is a folder: name a file"),
        (output_folder, a_file, "a.json is a file, not a folder"),
        (output_folder, a_file / "inside", "a.json is a file, not a folder"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            kind(str(given))


# Each benchmark with a value its work would fail on (or run wrong with) late, or never refuse: one per script.
HOSTILE = [
    ("bench_block_mask.py", ["--quick", "--rows", "0"], "--rows"),
    ("bench_compress.py", ["--batch", "0"], "--batch"),
    ("bench_consistency_length.py", ["--results", "{tmp}/no/r.json"], "--results"),
    ("bench_decode_regime.py", ["--quick", "--steps", "0"], "--steps"),
    ("bench_lm_eval.py", ["--output-root", "{tmp}/a-file"], "--output-root"),
    ("bench_methods.py", ["--samples", "0", "--plan-only"], "--samples"),
    # its default evaluate.py is the checkout's, relative to the folder it runs from (here one without it)
    ("bench_methods.py", ["--limit", "2", "--plan-only"], "--evaluate"),
    ("bench_retrieval.py", ["--quick", "--results", "{tmp}/no/r.json"], "--results"),
    ("bench_rl_evidence.py", ["--quick", "--seeds", "-1"], "--seeds"),
    ("bench_rl_evidence.py", ["--quick", "--number-in-prompt", "maybe"], "--number-in-prompt"),  # was a KeyError
    ("bench_decode_regime.py", ["--quick", "--number-in-prompt", "no"], "--number-in-prompt"),
    ("bench_rollout.py", ["--batch", "0"], "--batch"),
    ("bench_s4r.py", ["--eta", "0"], "--eta"),
    ("bench_scaling.py", ["--quick", "--batch", "0"], "--batch"),
    ("bench_train_step.py", ["--rows", "0"], "--rows"),
    ("bench_training_effect.py", ["--quick", "--top-p", "0"], "--top-p"),
    ("bench_training_effect.py", ["--quick", "--candidates", "4:gkv:32", "4:gkv"], "--candidates"),
]


@pytest.mark.parametrize("script, argv, flag", HOSTILE, ids=[f"{h[0]}{h[1][-2]}" for h in HOSTILE])
def test_every_benchmark_refuses_a_bad_argument_before_any_work(tmp_path, script, argv, flag):
    (tmp_path / "a-file").write_text("not a folder")
    command = [sys.executable, str(ROOT / "scripts" / script), *(a.replace("{tmp}", str(tmp_path)) for a in argv)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    assert done.returncode == 2 and f"error: argument {flag}" in last, (done.returncode, done.stderr[-800:])
    assert "Traceback" not in done.stderr and sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
