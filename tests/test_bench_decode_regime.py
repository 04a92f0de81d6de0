"""scripts/bench_decode_regime.py as main (--quick, every stage): the task reached by name through evaluate.py
and train.py, every method's row with its gap and decode-time compressions, the regime's checks, the training
stage's models (untrained included) with their curves and mismatch telemetry, and a second call that reads every
run back."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_bench_reports_every_stage_and_resumes(tmp_path):
    results = tmp_path / "results.json"
    command = [
        sys.executable,
        str(ROOT / "scripts" / "bench_decode_regime.py"),
        "--quick",
        "--output-root",
        str(tmp_path),
        "--results",
        str(results),
    ]
    first = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    assert first.returncode == 0, first.stderr[-3000:]
    line = json.loads(first.stdout.strip().splitlines()[-1])
    assert line["task"]["name"] == "copy_recall"
    assert set(line["methods"]["table"]["methods"]) == {"gkv", "gkv-mean", "s4r", "s4r-refresh"}
    assert line["methods"]["s4r"]["eta"] == {"24": 0.25} and not line["methods"]["partial"]
    s4r = line["methods"]["table"]["methods"]["s4r"]["24"]
    assert 0 < s4r["memory_share"] < 1 and s4r["memory_share"] != s4r["retention"]  # its stored state, not its reads
    assert set(line["methods"]["density"]) == {"full", "gkv", "gkv-mean", "s4r", "s4r-refresh"}
    assert (tmp_path / "methods_density.png").is_file()
    published = json.loads(results.read_text())  # every stage's section, with where it came from
    assert all(published[stage]["commit"] and published[stage]["command"] for stage in ("probe", "methods", "training"))
    # the methods stage continues from the results file alone (another machine: no evaluation folders)
    elsewhere = [
        *command[:3],
        "--output-root",
        str(tmp_path / "elsewhere"),
        "--results",
        str(results),
        "--stages",
        "methods",
    ]
    again = subprocess.run(elsewhere, capture_output=True, text=True, timeout=300, check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "gkv-train evaluate " not in again.stderr  # nothing measured again
    assert json.loads(again.stdout.strip().splitlines()[-1])["methods"]["table"] == line["methods"]["table"]
    (tmp_path / "published").mkdir()  # a benchmark page's tables come from the results file (render_docs.py)
    (tmp_path / "published" / "bench_decode_regime.json").write_text(results.read_text())
    page = "before\n<!-- results:bench_decode_regime.json#methods -->\nstale\n<!-- /results -->\nafter\n"
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT / 'scripts')!r}); from render_docs import render; "
        f"print(render(sys.stdin.read(), __import__('pathlib').Path({str(tmp_path / 'published')!r})), end='')"
    )
    page = subprocess.run(
        [sys.executable, "-c", code], input=page, capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert "stale" not in page and "| s4r |" in page and page.startswith("before") and page.endswith("after\n")
    for stage, split in (("probe", "train"), ("methods", "test")):
        section = line[stage]
        assert section["task"]["split"] == split and "gkv" in section["table"]["methods"]
        for name, by_budget in section["table"]["methods"].items():
            row = by_budget["24"]
            assert row["gap"] == section["table"]["full"]["pass@1"] - row["pass@1"]
            if not name.startswith("s4r"):  # s4r selects at every step, in no rounds: None
                assert row["decode_compressions"] >= 1  # 24 new tokens at interval 8 past a budget of 24
    assert set(line["probe"]["checks"]) == {"full_pass@1_at_least", "decode_compressions_at_least", "some_gap_at_least"}
    models = line["training"]["models"]
    assert list(models) == ["untrained", "rl_sparse"] and models["rl_sparse"]["rollout"] == "gkv"
    assert set(models["rl_sparse"]["compressed"]["gkv"]) == {"24"} and len(models["rl_sparse"]["curve"]["reward"]) == 1
    # the exact record: rounding only, measured (not a constant: fp32 rounding is above 0); the dense learner's
    # real mismatch: test_train.py::test_sparse_rl_dense_learner_through_train_py
    telemetry = models["rl_sparse"]["curve"]["telemetry"]
    assert telemetry["mismatch/agreement_p5"] > 0.999 and 0 < telemetry["mismatch/max_abs"] <= 1e-4
    summary = (tmp_path / "summary.md").read_text()
    assert "| gkv |" in summary and "| rl_sparse | gkv |" in summary and (tmp_path / "training_curves.png").is_file()
    # resumed: every finished train.py and evaluate.py run is read back (the training stage holds both kinds)
    again = subprocess.run([*command, "--stages", "training"], capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout.strip().splitlines()[-1])["training"] == line["training"]
    # extended elsewhere from the results file: a new recipe trained, the untrained model's missing cells added,
    # the earlier trained models (adapters not there) kept as measured, their new cells "-"
    more = [*elsewhere[:-1], "training", "--quick", "--recipes", "rl_sparse_snapkv"]
    again = subprocess.run(more, capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    extended = json.loads(again.stdout.strip().splitlines()[-1])["training"]
    assert list(extended["models"]) == ["untrained", "rl_sparse", "rl_sparse_snapkv"]
    untrained, kept = extended["models"]["untrained"], extended["models"]["rl_sparse"]
    assert set(untrained["compressed"]) == {"gkv", "snapkv"} and "extended" in untrained
    assert untrained["compressed"]["gkv"] == models["untrained"]["compressed"]["gkv"]  # read back, not rerun
    assert untrained["extended"][0]["commit"] and untrained["measured"] == models["untrained"]["measured"]
    assert kept == {**models["rl_sparse"], "measured": kept["measured"]} and "snapkv" not in kept["compressed"]
    assert extended["models"]["rl_sparse_snapkv"]["rollout"] == "snapkv"
    assert "| rl_sparse | gkv |" in (tmp_path / "elsewhere" / "summary.md").read_text()
    # the regime at length: long_recall (the story given, the number sampled), the trained adapter evaluated there
    long = [
        *command[:3],
        "--task",
        "long_recall",
        "--stages",
        "methods",
        "--gkv-forms",
        "max",
        "--s4r-length",
        "0",
        "--adapters",
        f"rl_sparse={tmp_path / 'training' / 'train' / 'rl_sparse'}",
        "--output-root",
        str(tmp_path / "long"),
    ]
    again = subprocess.run(long, capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    methods = json.loads(again.stdout.strip().splitlines()[-1])["methods"]
    assert methods["settings"]["task"] == "long_recall" and "data.name=long_recall" in again.stderr
    assert methods["table"]["full"]["mean_completion_length"] > 40  # the given story (~13 tokens a sentence) is in it
    trained = methods["adapters"]["rl_sparse"]
    assert set(trained["compressed"]) == {"24"} and trained["full"]["mean_completion_length"] > 40
    assert "| rl_sparse (trained), gkv |" in (tmp_path / "long" / "summary.md").read_text()
    refused = subprocess.run([*long, "--stages", "training"], capture_output=True, text=True, timeout=300, check=False)
    assert refused.returncode == 2 and "the probe and methods stages" in refused.stderr
    nowhere = [
        *long[: long.index("--adapters") + 1],
        f"x={tmp_path / 'nowhere'}",
        *long[long.index("--adapters") + 2 :],
    ]
    refused = subprocess.run(nowhere, capture_output=True, text=True, timeout=300, check=False)
    assert refused.returncode == 2 and f"--adapters: adapter={tmp_path / 'nowhere'}: no such folder" in refused.stderr
    # a section measured with other settings is never replaced silently: an error naming them, before any work
    other = subprocess.run([*more, "--lr", "0.001"], capture_output=True, text=True, timeout=300, check=False)
    assert other.returncode != 0 and "other settings (training)" in other.stderr
    assert "gkv-train train " not in other.stderr
    assert json.loads(results.read_text())["training"]["models"].keys() == extended["models"].keys()
